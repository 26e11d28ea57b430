"""More rows of the Paddle table: ops that Paddle's layers and tensor functions write
less often (the PIR reader produces their legacy types too), each composed of our ops.

Activations (brelu = hardtanh, celu, selu, softsign, tanh_shrink, thresholded_relu,
round), tests of values (isnan_v2 / isinf_v2 / isfinite_v2 elementwise; the older
isnan / isinf / isfinite, which answer for the whole tensor), search and scans
(argsort, cumprod, logsumexp), indexing (gather_nd, take_along_axis, roll, unbind,
tril_triu), linspace, share_data, and sync_batch_norm (batch norm on one device).
See `progdesc.paddle.rules` for how rows are written; attributes default as Paddle's
op definitions say.
"""
import math

import numpy as np

from progdesc.paddle import rules_nn
from progdesc.paddle.rule_args import axis_of, dims_of, dtype_name, ints_of, numpy_dtype, reshape_to
from progdesc.paddle.table import RULES
from progdesc.translate import Unsupported


def _const(t, x, value):
    """A scalar constant of x's element type."""
    return t.constant(np.asarray(value, numpy_dtype(t.var(x)[1])))


def _is_float(t, x):
    return t.var(x)[1].startswith(("float", "bfloat", "complex"))


# --- activations ---
@RULES.rule("brelu")
def brelu(t, x, *, t_min=0.0, t_max=24.0):
    """hardtanh: x clipped to [t_min, t_max]."""
    return t.call("clip", x, min=float(t_min), max=float(t_max))


@RULES.rule("celu")
def celu(t, x, *, alpha=1.0):
    """max(0, x) + min(0, alpha (exp(x / alpha) - 1))."""
    if alpha == 0:
        raise Unsupported("alpha=0 (CELU divides by alpha)")
    neg = t.call("scale", t.call("expm1", t.call("scale", t.call("minimum", x, _const(t, x, 0)),
                                                 scale=1.0 / float(alpha))), scale=float(alpha))
    return t.call("add", t.call("maximum", x, _const(t, x, 0)), neg)


@RULES.rule("selu")
def selu(t, x, *, scale=1.0507009873554804934193349852946,
         alpha=1.6732632423543772848170429916717):
    """scale * (x where x > 0, else alpha (exp(x) - 1))."""
    neg = t.call("scale", t.call("expm1", t.call("minimum", x, _const(t, x, 0))),
                 scale=float(alpha))
    pos = t.call("greater_than", x, _const(t, x, 0))
    return t.call("scale", t.call("where", pos, x, neg), scale=float(scale))


@RULES.rule("softsign")
def softsign(t, x):
    """x / (1 + |x|)."""
    return t.call("div", x, t.call("scale", t.call("abs", x), bias=1.0))


@RULES.rule("tanh_shrink")
def tanh_shrink(t, x):
    """x - tanh(x)."""
    return t.call("sub", x, t.call("tanh", x))


@RULES.rule("thresholded_relu")
def thresholded_relu(t, x, *, threshold=1.0, value=0.0):
    """x where x > threshold, else `value`."""
    above = t.call("greater_than", x, _const(t, x, threshold))
    return t.call("where", above, x, _const(t, x, value))


@RULES.rule("round")
def round_(t, x, *, decimals=0):
    """Rounded to `decimals` places, halves away from zero (ints unchanged)."""
    if not _is_float(t, x):
        return t.call("assign", x)
    if decimals == 0:
        return t.call("round", x, rounding_method="away_from_zero")
    factor = float(10.0 ** int(decimals))
    scaled = t.call("round", t.call("scale", x, scale=factor), rounding_method="away_from_zero")
    return t.call("scale", scaled, scale=1.0 / factor)


# --- tests of values ---
@RULES.rule("isnan_v2")
def isnan_v2(t, x):
    """Elementwise: x is NaN (never, for ints)."""
    return t.call("not_equal", x, x)


@RULES.rule("isinf_v2")
def isinf_v2(t, x):
    """Elementwise: x is +inf or -inf (never, for ints)."""
    if not _is_float(t, x):
        return t.call("not_equal", x, x)
    return t.call("equal", t.call("abs", x), _const(t, x, np.inf))


@RULES.rule("isfinite_v2")
def isfinite_v2(t, x):
    """Elementwise: x is neither NaN nor infinite (always, for ints)."""
    if not _is_float(t, x):
        return t.call("equal", x, x)
    return t.call("is_finite", x)


def _whole(t, x, elementwise, reduce):
    """The older ops: one answer for the whole tensor, a bool of shape [1]."""
    return t.call("reshape", t.call(reduce, elementwise(t, x), axis=[], keep_dim=False),
                  shape=[1])


@RULES.rule("isnan")
def isnan(t, x):
    """Whether any element of x is NaN (shape [1])."""
    return _whole(t, x, isnan_v2, "reduce_any")


@RULES.rule("isinf")
def isinf(t, x):
    """Whether any element of x is infinite (shape [1])."""
    return _whole(t, x, isinf_v2, "reduce_any")


@RULES.rule("isfinite")
def isfinite(t, x):
    """Whether every element of x is finite (shape [1])."""
    return _whole(t, x, isfinite_v2, "reduce_all")


# --- search, scans, reductions ---
@RULES.rule("argsort", outputs=("Out", "Indices"))
def argsort(t, x, *, axis=-1, descending=False, stable=False):
    """x sorted along `axis` and the int64 positions the entries came from (ties in
    their order: a stable sort serves both of Paddle's modes)."""
    axis = axis_of(axis, t.rank(x))
    if descending:
        dtype = t.var(x)[1]
        if dtype == "bool" or dtype.startswith("uint"):
            raise Unsupported(f"a descending argsort of {dtype}")
        outs, idx = t.call("sort", [t.call("neg", x)], axis=axis, is_stable=True)
        return t.call("neg", outs[0]), idx
    outs, idx = t.call("sort", [x], axis=axis, is_stable=True)
    return outs[0], idx


@RULES.rule("cumprod")
def cumprod(t, x, *, dim=-1, exclusive=False, reverse=False):
    """Running products along `dim` (from the end when `reverse`; each excluding its own
    element when `exclusive`)."""
    axis = axis_of(dim, t.rank(x))
    if exclusive:
        n = dims_of(t, x)[axis]
        if n == -1:
            raise Unsupported("an exclusive cumprod along an unknown dim")
        if n == 0:
            return t.call("assign", x)
        one = t.call("fill_zeros_like", t.call("slice", x, axes=[axis], starts=[0], ends=[1]))
        one = t.call("scale", one, bias=1.0)
        body = (t.call("slice", x, axes=[axis], starts=[1], ends=[n]) if reverse
                else t.call("slice", x, axes=[axis], starts=[0], ends=[n - 1]))
        x = t.call("concat", [body, one] if reverse else [one, body], axis=axis)
    return t.call("cumprod", x, axis=axis, reverse=bool(reverse))


@RULES.rule("logsumexp")
def logsumexp(t, x, *, axis=(0,), keepdim=False, reduce_all=False):
    """log(sum(exp(x))) over `axis` (all axes with reduce_all or an empty list), computed
    as max + log(sum(exp(x - max))) (a max that is not finite is taken as 0)."""
    rank = t.rank(x)
    axes = [] if reduce_all else sorted({axis_of(a, rank) for a in axis})
    if len(axes) == rank:
        axes = []
    every = axes or list(range(rank))
    peak = t.call("reduce_max", x, axis=every, keep_dim=True)
    peak = t.call("where", t.call("is_finite", peak), peak, _const(t, x, 0))
    total = t.call("reduce_sum", t.call("exp", t.call("sub", x, peak)), axis=every,
                   keep_dim=True)
    out = t.call("add", t.call("log", total), peak)
    if keepdim:
        return out
    if not every:
        return out
    return t.call("squeeze", out, axes=every)


# --- indexing ---
@RULES.rule("gather_nd", inputs=("X", "Index"))
def gather_nd(t, x, index):
    """Out[i...] = X[Index[i..., 0], ..., Index[i..., k-1], ...]: the first k dims of X
    addressed by the last dim of Index (k of them), as one flat index into them."""
    xd, idx_dims = dims_of(t, x), dims_of(t, index)
    k = idx_dims[-1] if idx_dims else -1
    if k < 1 or k > len(xd):
        raise Unsupported(f"gather_nd with an Index of shape {idx_dims} into X {xd}")
    lead = xd[:k]
    if -1 in lead or xd[k:].count(-1) > 1:
        raise Unsupported(f"gather_nd over unknown dims of X {xd} (at most one, past the "
                          "indexed ones)")
    strides = [math.prod(lead[i + 1:]) for i in range(k)]
    itype = t.var(index)[1]
    flat = t.call("reduce_sum", t.call("mul", index, t.constant(np.asarray(strides, itype))),
                  axis=[len(idx_dims) - 1], keep_dim=False)
    table = t.call("reshape", x, shape=[math.prod(lead)] + xd[k:])
    got = t.call("gather", table, t.call("reshape", flat, shape=[-1]), axis=0)
    return reshape_to(t, got, idx_dims[:-1] + xd[k:])


@RULES.rule("take_along_axis", inputs=("Input", "Index"), outputs=("Result",))
def take_along_axis(t, x, index, *, Axis=0):  # noqa: N803  (Paddle's name)
    """Result[..., i, ...] = Input[..., Index[..., i, ...], ...] along `Axis`."""
    return t.call("take_along_axis", x, index, axis=axis_of(Axis, t.rank(x)))


def _roll_axis(t, x, shift, axis):
    n = dims_of(t, x)[axis]
    if n == -1:
        raise Unsupported("roll along an unknown dim")
    s = shift % n if n else 0
    if s == 0:
        return x
    tail = t.call("slice", x, axes=[axis], starts=[n - s], ends=[n])
    head = t.call("slice", x, axes=[axis], starts=[0], ends=[n - s])
    return t.call("concat", [tail, head], axis=axis)


@RULES.rule("roll", inputs=("X", "ShiftsTensor"))
def roll(t, x, shifts_t, *, shifts=(), axis=()):
    """x's elements moved `shifts` places along each of `axis` (wrapping round); with no
    axis, along x flattened, and reshaped back."""
    if shifts_t is not None:
        shifts = ints_of(t, shifts_t, "ShiftsTensor")
    shifts = [int(s) for s in shifts]
    if not axis:
        if len(shifts) != 1:
            raise Unsupported(f"{len(shifts)} shifts with no axis")
        dims = dims_of(t, x)
        if -1 in dims:
            raise Unsupported("roll of a flattened tensor with unknown dims")
        flat = t.call("reshape", x, shape=[math.prod(dims)])
        return t.call("reshape", _roll_axis(t, flat, shifts[0], 0), shape=dims)
    if len(shifts) != len(axis):
        raise Unsupported(f"{len(shifts)} shifts for {len(axis)} axes")
    out = x
    for s, a in zip(shifts, axis):
        out = _roll_axis(t, out, s, axis_of(int(a), t.rank(x)))
    return out if out != x else t.call("assign", x)


@RULES.rule("unbind", outputs=("Out*",))
def unbind(t, x, *, axis=0):
    """x split along `axis` into its slices, that dim removed."""
    axis = axis_of(axis, t.rank(x))
    n = dims_of(t, x)[axis]
    if n == -1:
        raise Unsupported("unbind along an unknown dim")
    if n == 1:
        return [t.call("squeeze", x, axes=[axis])]
    return [t.call("squeeze", p, axes=[axis]) for p in t.call("split", x, num=n, axis=axis)]


@RULES.rule("tril_triu")
def tril_triu(t, x, *, diagonal=0, lower=True):
    """The lower (tril) or upper (triu) triangle of the last two dims from `diagonal`."""
    return t.call("tril" if lower else "triu", x, diagonal=int(diagonal))


# --- making tensors ---
@RULES.rule("linspace", inputs=("Start", "Stop", "Num"))
def linspace(t, start, stop, num_t, *, dtype=5):
    """`Num` evenly spaced values from Start to Stop, both included (Num must be known):
    NumPy's linspace in float64 when Start and Stop are constants, else
    start + i (stop - start) / (num - 1) in the output's precision."""
    num = ints_of(t, num_t, "Num")[0]
    if num < 1:
        raise Unsupported(f"Num={num}")
    out_type = dtype_name(dtype)
    lo, hi = t.value_of(start), t.value_of(stop)
    if lo is not None and hi is not None:
        values = np.linspace(float(np.asarray(lo).reshape(-1)[0]),
                             float(np.asarray(hi).reshape(-1)[0]), num, dtype=np.float64)
        return t.constant(values.astype(numpy_dtype(out_type)))
    work = "float64" if out_type == "float64" else "float32"
    lo = t.call("reshape", t.call("cast", start, dtype=work), shape=[1])
    hi = t.call("reshape", t.call("cast", stop, dtype=work), shape=[1])
    steps = t.call("iota", shape=[num], dtype=work, dimension=0)
    step = t.call("scale", t.call("sub", hi, lo), scale=1.0 / max(num - 1, 1))
    out = t.call("add", lo, t.call("mul", steps, step))
    return out if out_type == work else t.call("cast", out, dtype=out_type)


@RULES.rule("share_data")
def share_data(t, x):
    """The same values (Paddle shares the buffer; ours is a copy)."""
    return t.call("assign", x)


# sync_batch_norm: batch norm whose statistics Paddle gathers across devices; on one
# device (an imported inference or fine-tuning program) it is batch_norm itself.
RULES.rule("sync_batch_norm", inputs=("X", "Scale", "Bias", "Mean", "Variance"),
           outputs=("Y", "MeanOut", "VarianceOut", "SavedMean", "SavedVariance"))(
    rules_nn.batch_norm)
