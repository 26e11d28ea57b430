"""Everything else of the default domain: random draws, TopK, the losses
NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss, CausalConvWithState, TensorScatter,
windows, LpNormalization; quantization and integer products (`rules_quantize`, imported here);
and the ops refused with their reason (sequences, optionals, NonMaxSuppression).

Random ops draw from the program's RNG state (`Program.random_seed`), so they cannot
reproduce ONNX's reference numbers bit for bit; their `seed` attribute is not used (a
program's draws are reproducible from its own seed). Windows depend only on sizes
known at import and become constants.
"""
import numpy as np

from progdesc.onnx import model as onnx_model
from progdesc.onnx.rules_quantize import onnx_dtype  # and its rows
from progdesc.onnx.table import RULES
from progdesc.translate import Unsupported

_FLOATS = ("float16", "bfloat16", "float32", "float64")


def _static_dims(t, name, what):
    dims = t.var(name)[0]
    if any(d < 0 for d in dims):
        raise Unsupported(f"{what} has dims {list(dims)}, not all known at import")
    return [int(d) for d in dims]


def _float_dtype(dtype, what):
    if dtype not in _FLOATS:
        raise Unsupported(f"{what} is {dtype}; random draws are floats")
    return dtype


# --- random draws ---
@RULES.rule("RandomNormal")
def random_normal(t, *, shape, dtype=1, mean=0.0, scale=1.0, seed=None):
    return t.call("gaussian_random", shape=[int(d) for d in shape],
                  dtype=_float_dtype(onnx_dtype(dtype, "dtype"), "dtype"),
                  mean=float(mean), std=float(scale))


@RULES.rule("RandomUniform")
def random_uniform(t, *, shape, dtype=1, high=1.0, low=0.0, seed=None):
    return t.call("uniform_random", shape=[int(d) for d in shape],
                  dtype=_float_dtype(onnx_dtype(dtype, "dtype"), "dtype"),
                  min=float(low), max=float(high))


def _like_dtype(t, x, dtype):
    return _float_dtype(t.var(x)[1] if dtype is None else onnx_dtype(dtype, "dtype"),
                        "the element type of the result")


@RULES.rule("RandomNormalLike")
def random_normal_like(t, x, *, dtype=None, mean=0.0, scale=1.0, seed=None):
    return t.call("gaussian_random", shape=_static_dims(t, x, "the input"),
                  dtype=_like_dtype(t, x, dtype), mean=float(mean), std=float(scale))


@RULES.rule("RandomUniformLike")
def random_uniform_like(t, x, *, dtype=None, high=1.0, low=0.0, seed=None):
    return t.call("uniform_random", shape=_static_dims(t, x, "the input"),
                  dtype=_like_dtype(t, x, dtype), min=float(low), max=float(high))


@RULES.rule("Bernoulli")
def bernoulli(t, p, *, dtype=None, seed=None):
    # floor(u + p) with u uniform in [0, 1) is 1 exactly when u >= 1 - p: probability p
    out_dtype = t.var(p)[1] if dtype is None else onnx_dtype(dtype, "dtype")
    u = t.call("uniform_random", shape=_static_dims(t, p, "the input"), dtype="float32",
               min=0.0, max=1.0)
    if t.var(p)[1] != "float32":
        p = t.call("cast", p, dtype="float32")
    draw = t.call("floor", t.call("add", u, p))
    return t.call("cast", draw, dtype=out_dtype)


@RULES.rule("Multinomial")
def multinomial(t, x, *, dtype=6, sample_size=1, seed=None):
    # the Gumbel-max trick: argmax(logits + Gumbel noise) draws from softmax(logits)
    batch, classes = _static_dims(t, x, "the input")
    u = t.call("uniform_random", shape=[batch, int(sample_size), classes], dtype="float32",
               min=float(np.finfo(np.float32).tiny), max=1.0)
    gumbel = t.call("neg", t.call("log", t.call("neg", t.call("log", u))))
    if t.var(x)[1] != "float32":
        x = t.call("cast", x, dtype="float32")
    scores = t.call("add", t.call("unsqueeze", x, axes=[1]), gumbel)
    out_dtype = onnx_dtype(dtype, "dtype")
    if out_dtype not in ("int32", "int64"):
        raise Unsupported(f"dtype {out_dtype}: Multinomial gives int32 or int64")
    return t.call("argmax", scores, axis=-1, keep_dim=False, dtype=out_dtype)


# --- TopK ---
@RULES.rule("TopK")
def top_k(t, x, k, *, axis=-1, largest=1, sorted=1):  # noqa: A002 - ONNX's name
    value = t.value_of(k)
    if value is None:
        raise Unsupported("its K is computed at run time")
    count = int(np.asarray(value).reshape(-1)[0])
    if count <= 0:
        raise Unsupported(f"K = {count}: an empty result")
    # sorted=0 lets any order through: the sorted one is among them
    values, indices = t.call("top_k", x, k=count, axis=int(axis), largest=bool(largest))
    return values, indices


# --- losses ---
@RULES.rule("NegativeLogLikelihoodLoss")
def nll_loss(t, x, target, weight=None, *, reduction="mean", ignore_index=None):
    return _nll(t, x, target, weight, reduction, ignore_index)


@RULES.rule("SoftmaxCrossEntropyLoss")
def softmax_cross_entropy_loss(t, scores, labels, weights=None, *, reduction="mean",
                               ignore_index=None):
    log_prob = t.call("log_softmax", scores, axis=1)
    return _nll(t, log_prob, labels, weights, reduction, ignore_index), log_prob


def _nll(t, x, target, weight, reduction, ignore_index):
    """ONNX's negative log-likelihood of `x` ([N, C, d...], log-probabilities) at the class
    indices `target` ([N, d...]), each weighted by `weight[target]`; entries whose target
    is `ignore_index` count neither in the loss nor in the mean's weight."""
    if reduction not in ("none", "sum", "mean"):
        raise Unsupported(f"reduction '{reduction}': ONNX defines none, sum and mean")
    dims, dtype = t.var(x)
    classes = dims[1] if len(dims) > 1 else -1
    if classes < 0:
        raise Unsupported("its class dim (1) is not known at import")
    mask = None
    if ignore_index is not None:
        mask = t.call("not_equal", target, t.constant(
            np.asarray(ignore_index, onnx_model.as_numpy_dtype(t.var(target)[1]))))
        target = t.call("where", mask, target, t.call("fill_zeros_like", target))
    picked = t.call("squeeze", t.call("take_along_axis", x, t.call("unsqueeze", target,
                                                                     axes=[1]), axis=1),
                    axes=[1])
    count = None   # the weight of each entry in the mean
    if weight is not None:
        count = t.call("matmul", t.call("one_hot", target, depth=classes, dtype=dtype), weight)
    if mask is not None:
        kept = t.call("cast", mask, dtype=dtype)
        count = kept if count is None else t.call("mul", count, kept)
    loss = t.call("neg", picked if count is None else t.call("mul", picked, count))
    if reduction == "none":
        return loss
    total = t.call("reduce_sum", loss, axis=[], keep_dim=False)
    if reduction == "sum":
        return total
    if count is None:
        return t.call("reduce_mean", loss, axis=[], keep_dim=False)
    return t.call("div", total, t.call("reduce_sum", count, axis=[], keep_dim=False))


# --- causal depthwise convolution with a carried state (opset 27) ---
@RULES.rule("CausalConvWithState")
def causal_conv_with_state(t, x, w, b=None, past_state=None, *, activation="none"):
    # the last k-1 positions of [past_state, x] are the next call's state
    if activation not in ("none", "silu", "swish"):
        raise Unsupported(f"activation '{activation}': ONNX defines none, silu and swish")
    (batch, channels, length), dtype = t.var(x)
    kernel = t.var(w)[0][-1]
    if channels < 0 or length < 0 or kernel < 0:
        raise Unsupported("its channels, length and kernel size must be known at import")
    if past_state is None:   # zeros before the first position
        zero = t.constant(np.zeros((), onnx_model.as_numpy_dtype(dtype)))
        padded = t.call("pad", x, zero, padding_config=[0, 0, 0, 0, 0, 0, kernel - 1, 0, 0])
    else:
        padded = t.call("concat", [past_state, x], axis=2)
    y = t.call("conv_general_dilated", padded, w, lhs_spec=[0, 1, 2], rhs_spec=[0, 1, 2],
               out_spec=[0, 1, 2], feature_group_count=int(channels))
    if b is not None:
        y = t.call("add", y, t.call("unsqueeze", b, axes=[1]))
    if activation != "none":
        y = t.call("silu", y)
    state = t.call("slice", padded, axes=[2], starts=[length], ends=[length + kernel - 1])
    return y, state


# --- a KV cache's update (opset 24) ---
@RULES.rule("TensorScatter")
def tensor_scatter(t, past, update, write_indices=None, *, mode="linear", axis=-2):
    # each cache position p of sample b reads update[p - w[b]] (mod the cache length when
    # circular) where that index falls inside the update, else keeps the past value
    if mode not in ("linear", "circular"):
        raise Unsupported(f"mode '{mode}': ONNX defines linear and circular")
    dims = t.var(past)[0]
    rank = len(dims)
    axis = int(axis) % rank
    length, count = dims[axis], t.var(update)[0][axis]
    if length < 0 or count < 0:
        raise Unsupported("its sequence dims must be known at import")
    shape = [1] * rank
    shape[axis] = length
    offset = t.constant(np.arange(length, dtype=np.int32).reshape(shape))
    if write_indices is not None:
        start = t.call("reshape", t.call("cast", write_indices, dtype="int32"),
                       shape=[-1] + [1] * (rank - 1))
        offset = t.call("sub", offset, start)
    if mode == "circular":
        cycle = t.constant(np.int32(length))
        offset = t.call("rem", t.call("add", offset, cycle), cycle)
    inside = t.call("logical_and",
                    t.call("greater_equal", offset, t.constant(np.int32(0))),
                    t.call("less_than", offset, t.constant(np.int32(count))))
    index = t.call("expand_as", t.call("clip", offset, min=0.0, max=float(count - 1)),
                   past)
    picked = t.call("take_along_axis", update, index, axis=axis)
    return t.call("where", inside, picked, past)


# --- sizes known at import ---
def _window_size(t, size):
    value = t.value_of(size)
    if value is None:
        raise Unsupported("its size is computed at run time")
    return int(np.asarray(value).reshape(-1)[0])


def _window(t, size, output_datatype, periodic, terms):
    """The constant window sum_k terms[k] * cos(2 pi k n / N), N = size if periodic else
    size - 1, as ONNX defines Hann, Hamming and Blackman windows."""
    n = _window_size(t, size)
    span = n if periodic else n - 1
    phase = 2 * np.pi * np.arange(n, dtype=np.float64) / max(span, 1)
    window = sum(c * np.cos(k * phase) for k, c in enumerate(terms))
    dtype = onnx_model.as_numpy_dtype(onnx_dtype(output_datatype, "output_datatype"))
    return t.constant(np.asarray(window).astype(dtype))


@RULES.rule("HannWindow")
def hann_window(t, size, *, output_datatype=1, periodic=1):
    return _window(t, size, output_datatype, periodic, (0.5, -0.5))


@RULES.rule("HammingWindow")
def hamming_window(t, size, *, output_datatype=1, periodic=1):
    return _window(t, size, output_datatype, periodic, (25 / 46, -(1 - 25 / 46)))


@RULES.rule("BlackmanWindow")
def blackman_window(t, size, *, output_datatype=1, periodic=1):
    return _window(t, size, output_datatype, periodic, (0.42, -0.5, 0.08))


@RULES.rule("LpNormalization")
def lp_normalization(t, x, *, axis=-1, p=2):
    if p == 1:
        norm = t.call("reduce_sum", t.call("abs", x), axis=[int(axis)], keep_dim=True)
    elif p == 2:
        norm = t.call("sqrt", t.call("reduce_sum", t.call("square", x), axis=[int(axis)],
                                     keep_dim=True))
    else:
        raise Unsupported(f"p = {p}: ONNX defines 1 and 2")
    # a zero norm (every entry zero) divides by the smallest normal number: zeros
    tiny = np.finfo(_np_dtype(t, x)).tiny
    norm = t.call("maximum", norm, t.constant(np.asarray(tiny, _np_dtype(t, x))))
    return t.call("div", x, norm)


def _np_dtype(t, x):
    """The NumPy dtype of our variable `x`."""
    return onnx_model.as_numpy_dtype(t.var(x)[1])


# --- refused ---
def _refuse(why):
    def rule(t, *args):
        raise Unsupported(why)
    return rule


_SEQUENCES = ("SequenceConstruct", "SequenceEmpty", "SequenceAt", "SequenceInsert",
              "SequenceErase", "SequenceLength", "SplitToSequence", "ConcatFromSequence",
              "SequenceMap")
for _type in _SEQUENCES:
    RULES.rule(_type)(_refuse("ONNX sequences have no form in progdesc: its programs hold "
                              "tensors only"))
for _type in ("Optional", "OptionalHasElement", "OptionalGetElement"):
    RULES.rule(_type)(_refuse("ONNX optionals have no form in progdesc: its programs hold "
                              "tensors only"))
RULES.rule("NonMaxSuppression")(_refuse("how many boxes it keeps depends on their values: "
                                        "a run-time shape, which XLA cannot compile"))
