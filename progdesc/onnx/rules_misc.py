"""Everything else of the default domain: random draws, TopK, quantization (QuantizeLinear,
DequantizeLinear, DynamicQuantizeLinear, QLinearMatMul, QLinearConv), integer matmul and
convolution, CausalConvWithState, windows, LpNormalization, the losses
NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss; and the ops refused with
their reason (sequences, optionals, NonMaxSuppression).

Random ops draw from the program's RNG state (`Program.random_seed`), so they cannot
reproduce ONNX's reference numbers bit for bit; their `seed` attribute is not used (a
program's draws are reproducible from its own seed). Windows depend only on sizes
known at import and become constants.
"""
import numpy as np

from progdesc.onnx import model as onnx_model
from progdesc.onnx.table import RULES
from progdesc.translate import Unsupported

_FLOATS = ("float16", "bfloat16", "float32", "float64")
_QUANTIZED = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767)}


def _onnx_dtype(elem_type, what):
    """Our dtype name of the ONNX element type `elem_type`; Unsupported if we lack it."""
    try:
        return onnx_model.dtype_name(int(elem_type))
    except Exception:   # noqa: BLE001 - FormatError, or an enum value ONNX lacks
        raise Unsupported(f"{what} has element type {elem_type}, which progdesc has no "
                          "dtype for") from None


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
                  dtype=_float_dtype(_onnx_dtype(dtype, "dtype"), "dtype"),
                  mean=float(mean), std=float(scale))


@RULES.rule("RandomUniform")
def random_uniform(t, *, shape, dtype=1, high=1.0, low=0.0, seed=None):
    return t.call("uniform_random", shape=[int(d) for d in shape],
                  dtype=_float_dtype(_onnx_dtype(dtype, "dtype"), "dtype"),
                  min=float(low), max=float(high))


def _like_dtype(t, x, dtype):
    return _float_dtype(t.var(x)[1] if dtype is None else _onnx_dtype(dtype, "dtype"),
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
    out_dtype = t.var(p)[1] if dtype is None else _onnx_dtype(dtype, "dtype")
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
    out_dtype = _onnx_dtype(dtype, "dtype")
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


# --- quantization ---
def _per_axis(t, v, x, axis, block_size, what):
    """`v` (a scale or zero point) shaped to broadcast against `x`: a scalar as it is, a
    1-D one along `axis`; a blocked one (block_size > 0) repeated along `axis`."""
    dims = t.var(v)[0]
    rank = len(t.var(x)[0])
    if len(dims) == 0 or (len(dims) == 1 and dims[0] == 1 and not block_size):
        return v
    axis = int(axis) % rank
    if block_size:
        size = t.var(x)[0][axis]
        if size < 0 or len(dims) != rank:
            raise Unsupported(f"blocked quantization needs {what} of rank {rank} and a "
                              "known size along the axis")
        index = t.constant(np.arange(size, dtype=np.int32) // int(block_size))
        return t.call("gather", v, index, axis=axis)
    if len(dims) != 1:
        raise Unsupported(f"{what} of dims {list(dims)}: a scalar or a 1-D array along the "
                          "axis")
    shape = [1] * rank
    shape[axis] = -1
    return t.call("reshape", v, shape=shape)


def _as_float32(t, v):
    return v if t.var(v)[1] == "float32" else t.call("cast", v, dtype="float32")


def _quantize(t, x, scale, zero_point, dtype):
    """saturate(round(x / scale) + zero_point) as `dtype` (scale, zero point broadcast)."""
    low, high = _QUANTIZED[dtype]
    q = t.call("round", t.call("div", _as_float32(t, x), _as_float32(t, scale)))
    if zero_point is not None:
        q = t.call("add", q, _as_float32(t, zero_point))
    return t.call("cast", t.call("clip", q, min=float(low), max=float(high)), dtype=dtype)


def _quantized_dtype(dtype, what):
    if dtype not in _QUANTIZED:
        raise Unsupported(f"{what} is {dtype}: int8, uint8 and int16 are quantized to")
    return dtype


@RULES.rule("QuantizeLinear")
def quantize_linear(t, x, y_scale, y_zero_point=None, *, axis=1, saturate=1, block_size=0,
                    output_dtype=0, precision=0):
    if precision:
        raise Unsupported(f"precision {precision}: the division is computed in float32")
    if y_zero_point is not None:
        dtype = t.var(y_zero_point)[1]
    else:
        dtype = _onnx_dtype(output_dtype, "output_dtype") if output_dtype else "uint8"
    dtype = _quantized_dtype(dtype, "the quantized type")
    scale = _per_axis(t, y_scale, x, axis, block_size, "y_scale")
    zero = None if y_zero_point is None else _per_axis(t, y_zero_point, x, axis, block_size,
                                                       "y_zero_point")
    return _quantize(t, x, scale, zero, dtype)


@RULES.rule("DequantizeLinear")
def dequantize_linear(t, x, x_scale, x_zero_point=None, *, axis=1, block_size=0,
                      output_dtype=0):
    kind = t.var(x)[1]
    if kind not in _QUANTIZED and kind != "int32":
        raise Unsupported(f"x is {kind}: int8, uint8, int16 and int32 are dequantized")
    out_dtype = _onnx_dtype(output_dtype, "output_dtype") if output_dtype else t.var(x_scale)[1]
    y = _as_float32(t, x)
    if x_zero_point is not None:
        y = t.call("sub", y, _as_float32(t, _per_axis(t, x_zero_point, x, axis, block_size,
                                                     "x_zero_point")))
    y = t.call("mul", y, _as_float32(t, _per_axis(t, x_scale, x, axis, block_size,
                                                  "x_scale")))
    return y if out_dtype == "float32" else t.call("cast", y, dtype=out_dtype)


@RULES.rule("DynamicQuantizeLinear")
def dynamic_quantize_linear(t, x):
    x = _as_float32(t, x)
    zero = t.constant(np.float32(0))
    low = t.call("minimum", t.call("reduce_min", x, axis=[], keep_dim=False), zero)
    high = t.call("maximum", t.call("reduce_max", x, axis=[], keep_dim=False), zero)
    scale = t.call("div", t.call("sub", high, low), t.constant(np.float32(255)))
    point = t.call("round", t.call("clip", t.call("neg", t.call("div", low, scale)),
                                   min=0.0, max=255.0))
    y = _quantize(t, x, scale, point, "uint8")
    return y, scale, t.call("cast", point, dtype="uint8")


def _centered(t, v, zero_point, row_axis=None):
    """int32 `v` minus its zero point (a scalar, or 1-D along `row_axis` of a matrix)."""
    v = t.call("cast", v, dtype="int32")
    if zero_point is None:
        return v
    zero_point = t.call("cast", zero_point, dtype="int32")
    if row_axis is not None and len(t.var(zero_point)[0]) == 1:
        zero_point = t.call("unsqueeze", zero_point, axes=[row_axis])
    return t.call("sub", v, zero_point)


@RULES.rule("MatMulInteger")
def matmul_integer(t, a, b, a_zero_point=None, b_zero_point=None):
    # a's zero point runs along its rows (a column vector), b's along its columns
    return t.call("matmul", _centered(t, a, a_zero_point, row_axis=-1),
                  _centered(t, b, b_zero_point))


def _requantized(t, accumulated, scales, y_scale, y_zero_point):
    """The int32 `accumulated` times the product of `scales` over `y_scale`, rounded,
    shifted by `y_zero_point` and saturated to its type (uint8 without one)."""
    dtype = _quantized_dtype(t.var(y_zero_point)[1] if y_zero_point is not None else "uint8",
                             "the quantized type")
    factor = _as_float32(t, scales[0])
    for other in scales[1:]:
        factor = t.call("mul", factor, _as_float32(t, other))
    factor = t.call("div", factor, _as_float32(t, y_scale))
    low, high = _QUANTIZED[dtype]
    q = t.call("round", t.call("mul", _as_float32(t, accumulated), factor))
    if y_zero_point is not None:
        q = t.call("add", q, _as_float32(t, y_zero_point))
    return t.call("cast", t.call("clip", q, min=float(low), max=float(high)), dtype=dtype)


@RULES.rule("QLinearMatMul")
def qlinear_matmul(t, a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale,
                   y_zero_point=None):
    # a's scale and zero point run along its rows, b's along its columns
    rows = len(t.var(a_scale)[0]) == 1 and len(t.var(a)[0]) >= 2
    a_scale = t.call("unsqueeze", a_scale, axes=[-1]) if rows else a_scale
    accumulated = t.call("matmul", _centered(t, a, a_zero_point, row_axis=-1),
                         _centered(t, b, b_zero_point))
    return _requantized(t, accumulated, (a_scale, b_scale), y_scale, y_zero_point)


_EXACT_FAN_IN = (1 << 24) // (255 * 255)
"""The most products of two zero-centered 8-bit values (each within [-255, 255]) whose sum
float32 holds exactly."""


def _integer_conv(t, x, w, x_zero_point, w_zero_point):
    """The Conv row applied to the zero-centered operands, with the node's attributes (w's
    zero point runs along its output channels), as int32. Our convolution is of floats:
    it runs in float32, exact where each output sums at most `_EXACT_FAN_IN` products."""
    conv = RULES.lookup("Conv", t.version)
    if conv is None:
        raise Unsupported("it is translated through the Conv row, which the table lacks")
    dims = t.var(w)[0]
    fan_in = int(np.prod(dims[1:]))
    if any(d < 0 for d in dims) or fan_in > _EXACT_FAN_IN:
        raise Unsupported(f"each output sums {fan_in} products: float32 (our convolution's "
                          f"type) sums at most {_EXACT_FAN_IN} 8-bit ones exactly")
    if w_zero_point is not None and len(t.var(w_zero_point)[0]) == 1:
        w_zero_point = t.call("reshape", w_zero_point, shape=[-1] + [1] * (len(dims) - 1))
    x = _as_float32(t, _centered(t, x, x_zero_point))
    w = _as_float32(t, _centered(t, w, w_zero_point))
    attrs = {a.name: onnx_model.attribute_value(a) for a in t.node_proto.attribute}
    y = conv.fn(t, x, w, None, **conv.arguments(attrs))
    return t.call("cast", t.call("round", y), dtype="int32")


@RULES.rule("ConvInteger")
def conv_integer(t, x, w, x_zero_point=None, w_zero_point=None):
    return _integer_conv(t, x, w, x_zero_point, w_zero_point)


@RULES.rule("QLinearConv")
def qlinear_conv(t, x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale,
                 y_zero_point=None, b=None):
    accumulated = _integer_conv(t, x, w, x_zero_point, w_zero_point)
    if b is not None:   # int32, one per output channel
        rank = len(t.var(w)[0])
        accumulated = t.call("add", accumulated,
                             t.call("reshape", b, shape=[-1] + [1] * (rank - 2)))
    if len(t.var(w_scale)[0]) == 1:   # per output channel: dim 1 of the result
        w_scale = t.call("reshape", w_scale, shape=[-1] + [1] * (len(t.var(w)[0]) - 2))
    return _requantized(t, accumulated, (x_scale, w_scale), y_scale, y_zero_point)


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
    dtype = onnx_model.as_numpy_dtype(_onnx_dtype(output_datatype, "output_datatype"))
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
