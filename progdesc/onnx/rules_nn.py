"""Neural-network ops: convolutions, pooling, normalizations, Gemm, Softmax, Dropout, LRN.

Resize is in rules_resize.py, Attention and RotaryEmbedding in rules_attention.py."""
import math

import numpy as np

from progdesc.onnx import rules_attention, rules_resize  # noqa: F401  (their rows)
from progdesc.onnx.table import RULES
from progdesc.translate import Unsupported


# --- helpers ---
def _rank(t, x):
    return len(t.var(x)[0])


def _dtype(t, x):
    return t.var(x)[1]


def _ints(values, n, default, what):
    """An int attribute holding one value per spatial dim (`default` when absent)."""
    if values is None or len(values) == 0:
        return [default] * n
    values = [int(v) for v in values]
    if len(values) != n:
        raise Unsupported(f"{what}={values} for {n} spatial dims")
    return values


def _pads(pads, n):
    """ONNX pads [x1_begin, x2_begin, ..., x1_end, x2_end] -> [(lo, hi)] per spatial dim."""
    if not pads:
        return [(0, 0)] * n
    pads = [int(p) for p in pads]
    if len(pads) != 2 * n:
        raise Unsupported(f"pads={pads} for {n} spatial dims")
    return list(zip(pads[:n], pads[n:]))


def _spatial_sizes(t, x, why):
    """The spatial dims of x (after N, C) as ints; Unsupported if one is unknown."""
    dims = t.var(x)[0][2:]
    if any(d < 0 for d in dims):
        raise Unsupported(f"{why} needs the spatial dims of its input, unknown at import "
                          f"({list(dims)})")
    return list(dims)


def _auto_pads(t, x, auto_pad, pads, kernel, strides, dilations, why):
    """[(lo, hi)] per spatial dim as `auto_pad` resolves them (SAME_*: the output is
    ceil(size / stride) long)."""
    n = len(kernel)
    if auto_pad in ("NOTSET", "", None):
        return _pads(pads, n)
    if auto_pad == "VALID":
        return [(0, 0)] * n
    if auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        raise Unsupported(f"auto_pad={auto_pad!r}")
    pairs = []
    for size, k, s, d in zip(_spatial_sizes(t, x, f"auto_pad={auto_pad}"), kernel, strides,
                             dilations):
        total = max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
        small, big = total // 2, total - total // 2
        pairs.append((small, big) if auto_pad == "SAME_UPPER" else (big, small))
    return pairs


def _per_channel(t, v, rank):
    """A [C] vector shaped to broadcast against an [N, C, ...] tensor of `rank` dims."""
    return t.call("unsqueeze", v, axes=list(range(1, rank - 1))) if rank > 2 else v


def _statistic(t, name):
    """Mark the initializer `name` (a running mean or variance) as state, not trained."""
    block = t.program.global_block()
    if name in block.vars and block.var(name).persistable:
        var = block.var(name)
        var.desc.is_parameter = False
        var.stop_gradient = True


# --- convolution ---
@RULES.rule("Conv")
def conv(t, x, w, b=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
         pads=None, strides=None):
    rank = _rank(t, x)
    n = rank - 2
    if n < 1:
        raise Unsupported(f"a {rank}-D input (N, C and at least one spatial dim)")
    kernel = [int(k) for k in (kernel_shape or t.var(w)[0][2:])]
    strides = _ints(strides, n, 1, "strides")
    dilations = _ints(dilations, n, 1, "dilations")
    pairs = _auto_pads(t, x, auto_pad, pads, kernel, strides, dilations, "Conv")
    spec = list(range(rank))
    y = t.call("conv_general_dilated", x, w, window_strides=strides,
               padding=[p for pair in pairs for p in pair], rhs_dilation=dilations,
               lhs_spec=spec, rhs_spec=spec, out_spec=spec, feature_group_count=int(group))
    return y if b is None else t.call("add", y, _per_channel(t, b, rank))


@RULES.rule("ConvTranspose")
def conv_transpose(t, x, w, b=None, *, auto_pad="NOTSET", dilations=None, group=1,
                   kernel_shape=None, output_padding=None, output_shape=None, pads=None,
                   strides=None):
    rank = _rank(t, x)
    n = rank - 2
    if not 1 <= n <= 3:
        raise Unsupported(f"a {rank}-D input (1 to 3 spatial dims)")
    kernel = [int(k) for k in (kernel_shape or t.var(w)[0][2:])]
    strides = _ints(strides, n, 1, "strides")
    dilations = _ints(dilations, n, 1, "dilations")
    extra = _ints(output_padding, n, 0, "output_padding")
    attrs = dict(strides=strides, dilations=dilations, groups=int(group))
    if output_shape or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        sizes = _spatial_sizes(t, x, "ConvTranspose with output_shape or auto_pad SAME")
        if output_shape:
            wanted = [int(v) for v in output_shape][-n:]
        else:
            wanted = [size * s for size, s in zip(sizes, strides)]
        pairs = []
        for size, k, s, d, e, out in zip(sizes, kernel, strides, dilations, extra, wanted):
            total = s * (size - 1) + e + (k - 1) * d + 1 - out
            if total < -(s - 1):
                raise Unsupported(f"output_shape {list(wanted)} more than stride - 1 beyond "
                                  "the full transposed convolution")
            total = max(total, 0)   # a longer output: zeros at the high end
            small, big = total // 2, total - total // 2
            pairs.append((small, big) if auto_pad == "SAME_UPPER" else (big, small))
        attrs.update(paddings=[p for pair in pairs for p in pair], output_size=wanted)
    else:
        pairs = [(0, 0)] * n if auto_pad == "VALID" else _pads(pads, n)
        if auto_pad not in ("NOTSET", "VALID", "", None):
            raise Unsupported(f"auto_pad={auto_pad!r}")
        attrs.update(paddings=[p for pair in pairs for p in pair], output_padding=extra)
    if n == 1:   # as a 2-D one over a height of 1
        for key, one in (("strides", 1), ("dilations", 1), ("output_padding", 0)):
            if attrs.get(key):
                attrs[key] = [one] + attrs[key]
        attrs["paddings"] = [0, 0] + attrs["paddings"]
        if attrs.get("output_size"):
            attrs["output_size"] = [1] + attrs["output_size"]
        y = t.call("conv2d_transpose", t.call("unsqueeze", x, axes=[2]),
                   t.call("unsqueeze", w, axes=[2]), **attrs)
        y = t.call("squeeze", y, axes=[2])
    else:
        y = t.call("conv2d_transpose" if n == 2 else "conv3d_transpose", x, w, **attrs)
    return y if b is None else t.call("add", y, _per_channel(t, b, rank))


# --- pooling ---
def _window(t, x, auto_pad, ceil_mode, dilations, kernel_shape, pads, strides, what):
    """(kernel, strides, dilations, [(lo, hi)] explicit pads, [extra high pad for
    ceil_mode]) of a pooling node over x's spatial dims."""
    n = _rank(t, x) - 2
    if kernel_shape is None or len(kernel_shape) != n:
        raise Unsupported(f"kernel_shape={kernel_shape} for {n} spatial dims")
    kernel = [int(k) for k in kernel_shape]
    strides = _ints(strides, n, 1, "strides")
    dilations = _ints(dilations, n, 1, "dilations")
    pairs = _auto_pads(t, x, auto_pad, pads, kernel, strides, dilations, what)
    extra = [0] * n
    if ceil_mode:
        sizes = _spatial_sizes(t, x, f"{what} with ceil_mode")
        for i, (size, k, s, d, (lo, hi)) in enumerate(zip(sizes, kernel, strides, dilations,
                                                          pairs)):
            span = size + lo + hi - (k - 1) * d - 1
            out = -(-span // s) + 1
            if (out - 1) * s >= size + lo:   # the last window would start in the padding
                out -= 1
            extra[i] = max((out - 1) * s + (k - 1) * d + 1 - (size + lo + hi), 0)
    return kernel, strides, dilations, pairs, extra


def _reduce_window(t, x, computation, kernel, strides, dilations, pads):
    return t.call("reduce_window", x, computation=computation,
                  window_dimensions=[1, 1] + kernel, window_strides=[1, 1] + strides,
                  padding=[0, 0, 0, 0] + [p for pair in pads for p in pair],
                  window_dilation=[1, 1] + dilations)


@RULES.rule("MaxPool")
def max_pool(t, x, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None,
             pads=None, storage_order=0, strides=None):
    kernel, strides, dilations, pairs, extra = _window(t, x, auto_pad, ceil_mode, dilations,
                                                       kernel_shape, pads, strides, "MaxPool")
    pads = [(lo, hi + e) for (lo, hi), e in zip(pairs, extra)]
    y = _reduce_window(t, x, "max", kernel, strides, dilations, pads)
    outputs = t.node_proto.output
    if len(outputs) < 2 or not outputs[1]:
        return y, None
    return y, _max_indices(t, x, kernel, strides, dilations, pads, storage_order)


def _max_indices(t, x, kernel, strides, dilations, pads, storage_order):
    """MaxPool's Indices: where in x (flattened, its spatial dims in row-major order, or
    column-major with storage_order=1) each window's first maximum is. The windows are
    stacked as slices of the padded x; their argmax picks among constant index patches."""
    dims, dtype = t.var(x)
    dims = list(dims)
    if any(d < 0 for d in dims[1:]):
        raise Unsupported(f"Indices of an input of dims unknown at import ({list(dims)})")
    if not dtype.startswith("float"):
        raise Unsupported(f"Indices of {dtype} values")
    spatial = dims[2:]
    size = math.prod(spatial)
    flat = np.arange(size).reshape(spatial[::-1]).T if storage_order else \
        np.arange(size).reshape(spatial)
    flat = np.pad(flat, pads)
    config = [0, 0, 0, 0, 0, 0] + [v for lo, hi in pads for v in (lo, hi, 0)]
    padded = t.call("pad", x, t.constant(np.asarray(-np.inf, dtype)), padding_config=config)
    outs = [(n + lo + hi - (k - 1) * d - 1) // s + 1
            for n, (lo, hi), k, d, s in zip(spatial, pads, kernel, dilations, strides)]
    axes = list(range(2, len(dims)))
    slices, patches = [], []
    for offset in np.ndindex(*kernel):
        starts = [o * d for o, d in zip(offset, dilations)]
        ends = [b + (m - 1) * s + 1 for b, m, s in zip(starts, outs, strides)]
        slices.append(t.call("slice", padded, axes=axes, starts=starts, ends=ends,
                             strides=strides))
        patches.append(flat[tuple(slice(b, e, s) for b, e, s in zip(starts, ends, strides))])
    which = t.call("argmax", t.call("stack", slices, axis=len(dims)), axis=len(dims),
                   dtype="int64")
    hot = t.call("one_hot", which, depth=len(slices), dtype="int64")
    patch = t.constant(np.stack(patches, axis=-1).astype(np.int64))
    index = t.call("reduce_sum", t.call("mul", hot, patch), axis=[len(dims)])
    rest = [1] * len(spatial)
    channel = np.arange(dims[1], dtype=np.int64).reshape([1, -1] + rest) * size
    index = t.call("add", index, t.constant(channel))
    # + n * C * size for the sample n (the batch may be symbolic: n counted at run time)
    first = t.call("slice", x, axes=list(range(1, len(dims))), starts=[0] * (len(dims) - 1),
                   ends=[1] * (len(dims) - 1))
    ones = t.call("cast", t.call("scale", t.call("fill_zeros_like", first), bias=1.0),
                  dtype="int64")
    count = t.call("cumsum", ones, axis=0)   # n + 1, in integers (exact past 2 ** 24)
    stride = t.constant(np.asarray(dims[1] * size, np.int64))
    sample = t.call("mul", t.call("sub", count, ones), stride)
    return t.call("add", index, sample)


def _window_counts(sizes, kernel, strides, dilations, pads, counted):
    """How many counted elements each window of a pooling over `sizes` holds: the input's,
    and the padding's in `counted` [(lo, hi)] (the explicit pads, or none); `pads` also
    holds ceil_mode's extra padding, never counted."""
    ones = np.zeros([n + lo + hi for n, (lo, hi) in zip(sizes, pads)], np.float32)
    ones[tuple(slice(lo - c_lo, lo + n + c_hi)
               for n, (lo, _), (c_lo, c_hi) in zip(sizes, pads, counted))] = 1
    counts = ones
    for axis, (k, s, d) in enumerate(zip(kernel, strides, dilations)):
        steps = (counts.shape[axis] - (k - 1) * d - 1) // s + 1
        taken = [np.take(counts, np.arange(steps) * s + j * d, axis=axis) for j in range(k)]
        counts = np.sum(taken, axis=0)
    return counts


@RULES.rule("AveragePool")
def average_pool(t, x, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None,
                 kernel_shape=None, pads=None, strides=None):
    kernel, strides, dilations, pairs, extra = _window(
        t, x, auto_pad, ceil_mode, dilations, kernel_shape, pads, strides, "AveragePool")
    full = [(lo, hi + e) for (lo, hi), e in zip(pairs, extra)]
    total = _reduce_window(t, x, "sum", kernel, strides, dilations, full)
    padded = any(lo or hi for lo, hi in full)
    if not padded or (count_include_pad and not any(extra)):
        return t.call("scale", total, scale=1.0 / math.prod(kernel))
    sizes = _spatial_sizes(t, x, "AveragePool over padding")
    counts = _window_counts(sizes, kernel, strides, dilations, full,
                            pairs if count_include_pad else [(0, 0)] * len(sizes))
    return t.call("div", total, t.constant(counts.astype(_dtype(t, x))))


@RULES.rule("LpPool")
def lp_pool(t, x, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None,
            p=2, pads=None, strides=None):
    kernel, strides, dilations, pairs, extra = _window(t, x, auto_pad, ceil_mode, dilations,
                                                       kernel_shape, pads, strides, "LpPool")
    pads = [(lo, hi + e) for (lo, hi), e in zip(pairs, extra)]
    return _lp(t, x, p, lambda v: _reduce_window(t, v, "sum", kernel, strides, dilations, pads))


def _lp(t, x, p, total):
    """(total(|x| ** p)) ** (1 / p)."""
    p = int(p)
    if p < 1:
        raise Unsupported(f"p={p}")
    powered = t.call("integer_pow", t.call("abs", x), y=p) if p != 1 else t.call("abs", x)
    summed = total(powered)
    if p == 1:
        return summed
    if p == 2:
        return t.call("sqrt", summed)
    return t.call("pow", summed, t.constant(np.asarray(1.0 / p, _dtype(t, x))))


def _spatial_axes(t, x):
    return list(range(2, _rank(t, x)))


@RULES.rule("GlobalAveragePool")
def global_average_pool(t, x):
    return t.call("reduce_mean", x, axis=_spatial_axes(t, x), keep_dim=True)


@RULES.rule("GlobalMaxPool")
def global_max_pool(t, x):
    return t.call("reduce_max", x, axis=_spatial_axes(t, x), keep_dim=True)


@RULES.rule("GlobalLpPool")
def global_lp_pool(t, x, *, p=2):
    return _lp(t, x, p, lambda v: t.call("reduce_sum", v, axis=_spatial_axes(t, x),
                                         keep_dim=True))


# --- normalization ---
@RULES.rule("BatchNormalization")
def batch_normalization(t, x, scale, b, mean, var, *, epsilon=1e-5, momentum=0.9,
                        training_mode=0):
    outputs = [o for o in t.node_proto.output]
    training = bool(training_mode) or (t.version < 14 and len(outputs) > 1 and any(outputs[1:]))
    training = training or t.for_training
    if _rank(t, x) < 2:
        raise Unsupported("an input of fewer than 2 dims")
    for v in (mean, var):
        _statistic(t, v)
    y, mean_out, var_out, saved_mean, saved_var = t.call(
        "batch_norm", x, scale, b, mean, var, momentum=float(momentum),
        epsilon=float(epsilon), is_test=not training)
    if training and t.for_training:   # the running statistics are updated in place
        block = t.program.global_block()
        if mean in block.vars and block.var(mean).persistable:
            _assign(t, mean_out, mean)
            _assign(t, var_out, var)
    return y, mean_out, var_out, saved_mean, saved_var


def _assign(t, src, dst):
    t.block.append_op("assign", {"X": src}, {"Out": dst})


def standardize(t, x, axes, epsilon):
    """((x - mean) * rsqrt(var + eps), mean, rsqrt(var + eps)), statistics over `axes`
    kept as size 1."""
    mean = t.call("reduce_mean", x, axis=axes, keep_dim=True)
    centered = t.call("sub", x, mean)
    var = t.call("reduce_mean", t.call("square", centered), axis=axes, keep_dim=True)
    inv_std = t.call("rsqrt", t.call("scale", var, bias=float(epsilon)))
    return t.call("mul", centered, inv_std), mean, inv_std


@RULES.rule("InstanceNormalization")
def instance_normalization(t, x, scale, b, *, epsilon=1e-5):
    rank = _rank(t, x)
    y, _, _ = standardize(t, x, list(range(2, rank)), epsilon)
    return t.call("add", t.call("mul", y, _per_channel(t, scale, rank)), _per_channel(t, b, rank))


@RULES.rule("MeanVarianceNormalization")
def mean_variance_normalization(t, x, *, axes=(0, 2, 3)):
    rank = _rank(t, x)
    y, _, _ = standardize(t, x, sorted(int(a) % rank for a in axes), 1e-9)
    return y


def stashed(t, x, stash_type):
    """x in the precision its statistics are computed in (stash_type 1: float32, for a
    half-precision x), and the function casting a result back to x's dtype."""
    dtype = _dtype(t, x)
    if int(stash_type) == 1 and dtype in ("float16", "bfloat16"):
        return t.call("cast", x, dtype="float32"), lambda y: t.call("cast", y, dtype=dtype)
    return x, lambda y: y


@RULES.rule("LayerNormalization")
def layer_normalization(t, x, scale, b=None, *, axis=-1, epsilon=1e-5, stash_type=1):
    dims = t.var(x)[0]
    rank = len(dims)
    if not -rank <= axis < rank:
        raise Unsupported(f"axis={axis} for a {rank}-D input")
    axis %= rank
    outputs = t.node_proto.output
    stats_read = len(outputs) > 1 and any(outputs[1:])
    full = [list(t.var(v)[0]) == list(dims[axis:]) for v in (scale, b) if v is not None]
    stashed_x, back = stashed(t, x, stash_type)
    if stashed_x == x and not stats_read and all(full) and -1 not in dims[axis:]:   # our op
        flat = [v if v is None or rank - axis == 1 else t.call("reshape", v, shape=[-1])
                for v in (scale, b)]
        return t.call("layer_norm", x, *flat, begin_norm_axis=axis, epsilon=float(epsilon))[0]
    y, mean, inv_std = standardize(t, stashed_x, list(range(axis, rank)), epsilon)
    y = t.call("mul", back(y), scale)
    if b is not None:
        y = t.call("add", y, b)
    return y, mean, inv_std


@RULES.rule("RMSNormalization")
def rms_normalization(t, x, scale, *, axis=-1, epsilon=1e-5, stash_type=1):
    rank = _rank(t, x)
    if not -rank <= axis < rank:
        raise Unsupported(f"axis={axis} for a {rank}-D input")
    axes = list(range(axis % rank, rank))
    stashed_x, back = stashed(t, x, stash_type)
    ms = t.call("reduce_mean", t.call("square", stashed_x), axis=axes, keep_dim=True)
    y = t.call("mul", stashed_x, t.call("rsqrt", t.call("scale", ms, bias=float(epsilon))))
    return t.call("mul", back(y), scale)


@RULES.rule("GroupNormalization")
def group_normalization(t, x, scale, b, *, epsilon=1e-5, num_groups=None, stash_type=1):
    if num_groups is None:
        raise Unsupported("no attribute 'num_groups'")
    rank = _rank(t, x)
    groups = int(num_groups)
    stashed_x, back = stashed(t, x, stash_type)
    grouped = t.call("reshape", stashed_x, shape=[0, groups, -1])
    y, _, _ = standardize(t, grouped, [2], epsilon)
    y = back(y)
    if t.version < 21:   # scale and bias per group
        y = t.call("add", t.call("mul", y, t.call("unsqueeze", scale, axes=[1])),
                   t.call("unsqueeze", b, axes=[1]))
        return t.call("reshape_as", y, x)
    y = t.call("reshape_as", y, x)
    return t.call("add", t.call("mul", y, _per_channel(t, scale, rank)), _per_channel(t, b, rank))


@RULES.rule("LRN")
def lrn(t, x, *, alpha=1e-4, beta=0.75, bias=1.0, size=None):
    if size is None:
        raise Unsupported("no attribute 'size'")
    rank = _rank(t, x)
    size = int(size)
    lo, hi = (size - 1) // 2, size // 2   # the channels around c: floor before, ceil after
    square = t.call("square", x)
    total = t.call("reduce_window", square, computation="sum",
                   window_dimensions=[1, size] + [1] * (rank - 2),
                   padding=[0, 0, lo, hi] + [0, 0] * (rank - 2))
    base = t.call("scale", total, scale=float(alpha) / size, bias=float(bias))
    return t.call("div", x, t.call("pow", base, t.constant(np.asarray(beta, _dtype(t, x)))))


# --- softmax ---
@RULES.rule("Softmax", since=13)
def softmax(t, x, *, axis=-1):
    return t.call("softmax", x, axis=int(axis))


@RULES.rule("LogSoftmax", since=13)
def log_softmax(t, x, *, axis=-1):
    return t.call("log_softmax", x, axis=int(axis))


@RULES.rule("Hardmax", since=13)
def hardmax(t, x, *, axis=-1):
    dims, dtype = t.var(x)
    rank = len(dims)
    axis = int(axis) % rank
    if dims[axis] < 0:
        raise Unsupported(f"Hardmax over axis {axis} of unknown size")
    hot = t.call("one_hot", t.call("argmax", x, axis=axis), depth=int(dims[axis]), dtype=dtype)
    if axis == rank - 1:
        return hot
    perm = list(range(axis)) + [rank - 1] + list(range(axis, rank - 1))
    return t.call("transpose", hot, perm=perm)


# --- dense ---
@RULES.rule("Gemm")
def gemm(t, a, b, c=None, *, alpha=1.0, beta=1.0, transA=0, transB=0):
    out = t.call("matmul", a, b, transpose_x=bool(transA), transpose_y=bool(transB),
                 alpha=float(alpha))
    if c is None or beta == 0.0:
        return out
    if beta != 1.0:
        c = t.call("scale", c, scale=float(beta))
    return t.call("add", out, c)


# --- dropout ---
@RULES.rule("Dropout")
def dropout(t, x, ratio=None, training_mode=None, *, seed=None):
    p = 0.5
    if ratio is not None:
        value = t.value_of(ratio)
        p = None if value is None else float(np.asarray(value).reshape(()))
    training = t.for_training
    if training_mode is not None:
        value = t.value_of(training_mode)
        if value is None:
            raise Unsupported("its training_mode is computed at run time")
        training = training or bool(np.asarray(value).reshape(()))
    wants_mask = len(t.node_proto.output) > 1 and bool(t.node_proto.output[1])
    if not training and not wants_mask:
        return x, None
    if training and p is None:
        raise Unsupported("its ratio is computed at run time")
    if training and p == 0.0 and not t.for_training:
        out, mask = x, None
    else:
        out, mask = t.call("dropout", x, dropout_prob=p or 0.0, is_test=not training)
    if not wants_mask:
        return out, None
    if mask is None:
        mask = t.call("dropout", x, dropout_prob=0.0, is_test=True)[1]
    return out, t.call("cast", mask, dtype="bool")
