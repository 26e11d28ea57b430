"""Rows of the Paddle table: convolution, pooling, normalisation, dropout, embeddings,
interpolation (see `progdesc.paddle.rules` for how rows are written)."""
import math

import numpy as np

from progdesc.paddle.rule_args import (axis_of, dtype_name, ints_of, list_ints, dims_of)
from progdesc.paddle.table import RULES
from progdesc.translate import Unsupported


# --- convolution and pooling ---
def _to_nchw(t, x, data_format):
    """x in NCHW, our ops' layout: an NHWC input is transposed (and its result back, by
    `_from_nchw`)."""
    if data_format in ("NCHW", "AnyLayout"):
        return x
    if data_format != "NHWC":
        raise Unsupported(f"data_format={data_format!r}")
    return t.call("transpose", x, perm=[0, 3, 1, 2])


def _from_nchw(t, y, data_format):
    return t.call("transpose", y, perm=[0, 2, 3, 1]) if data_format == "NHWC" else y


@RULES.rule("conv2d", "depthwise_conv2d", inputs=("Input", "Filter"), outputs=("Output",))
def conv2d(t, x, w, *, strides=(1, 1), paddings=(0, 0), dilations=(1, 1), groups=1,
           padding_algorithm="EXPLICIT", data_format="NCHW"):
    y = t.call("conv2d", _to_nchw(t, x, data_format), w, strides=list(strides),
               paddings=list(paddings), dilations=list(dilations), groups=max(int(groups), 1),
               padding_algorithm=padding_algorithm)
    return _from_nchw(t, y, data_format)


def _same_pads(n, k, s):
    total = max((-(-n // s) - 1) * s + k - n, 0)
    return total // 2, total - total // 2


@RULES.rule("pool2d")
def pool2d(t, x, *, pooling_type="max", ksize=(1, 1), global_pooling=False, strides=(1, 1),
           paddings=(0, 0), exclusive=True, adaptive=False, ceil_mode=False,
           data_format="NCHW", padding_algorithm="EXPLICIT"):
    y = _pool2d(t, _to_nchw(t, x, data_format), pooling_type, list(ksize), global_pooling,
                list(strides), list(paddings), exclusive, adaptive, ceil_mode,
                padding_algorithm)
    return _from_nchw(t, y, data_format)


def _pool2d(t, x, pooling_type, ksize, global_pooling, strides, paddings, exclusive, adaptive,
            ceil_mode, padding_algorithm):
    if pooling_type not in ("max", "avg"):
        raise Unsupported(f"pooling_type={pooling_type!r}")
    spatial = dims_of(t, x)[2:]
    if global_pooling or (adaptive and list(ksize) == [1, 1]):
        return t.call("pool2d", x, pooling_type=pooling_type, ksize=[1, 1], global_pooling=True)
    if adaptive:
        return _adaptive_pool(t, x, pooling_type, list(ksize), spatial)
    paddings = list(paddings)
    if padding_algorithm == "VALID":
        paddings = [0, 0]
    elif padding_algorithm == "SAME":
        if -1 in spatial:
            raise Unsupported("SAME padding of unknown spatial dims")
        pads = [_same_pads(n, k, s) for n, k, s in zip(spatial, ksize, strides)]
        paddings = [pads[0][0], pads[0][1], pads[1][0], pads[1][1]]
    return t.call("pool2d", x, pooling_type=pooling_type, ksize=list(ksize),
                  strides=list(strides), paddings=paddings, exclusive=bool(exclusive),
                  ceil_mode=bool(ceil_mode))


def _adaptive_pool(t, x, pooling_type, out, spatial):
    """Adaptive pooling: windows [floor(i n / o), ceil((i + 1) n / o)) along each of H, W;
    a plain pooling where o divides n."""
    if -1 in spatial:
        raise Unsupported("adaptive pooling of unknown spatial dims")
    if all(n % o == 0 for n, o in zip(spatial, out)):
        k = [n // o for n, o in zip(spatial, out)]
        return t.call("pool2d", x, pooling_type=pooling_type, ksize=k, strides=k)
    reduce = "reduce_max" if pooling_type == "max" else "reduce_mean"
    for axis, (n, o) in zip((2, 3), zip(spatial, out)):
        if n % o == 0:
            k = [1, 1]
            k[axis - 2] = n // o
            x = t.call("pool2d", x, pooling_type=pooling_type, ksize=k, strides=k)
            continue
        parts = []
        for i in range(o):
            lo, hi = (i * n) // o, -(-((i + 1) * n) // o)
            part = t.call("slice", x, axes=[axis], starts=[lo], ends=[hi])
            parts.append(t.call(reduce, part, axis=[axis], keep_dim=True))
        x = t.call("concat", parts, axis=axis)
    return x


# --- normalisation, dropout, embedding ---
@RULES.rule("batch_norm", inputs=("X", "Scale", "Bias", "Mean", "Variance"),
            outputs=("Y", "MeanOut", "VarianceOut", "SavedMean", "SavedVariance"))
def batch_norm(t, x, scale, bias, mean, variance, *, momentum=0.9, epsilon=1e-5,
               is_test=False, data_layout="NCHW", use_global_stats=False,
               trainable_statistics=False):
    if data_layout not in ("NCHW", "NHWC", "AnyLayout"):
        raise Unsupported(f"data_layout={data_layout!r}")
    if t.for_training:
        is_test = bool(use_global_stats)
    elif trainable_statistics:
        is_test = False
    op = t.block.append_op(
        "batch_norm", {"X": x, "Scale": scale, "Bias": bias, "Mean": mean,
                       "Variance": variance},
        attrs={"momentum": float(momentum), "epsilon": float(epsilon),
               "is_test": bool(is_test),
               "data_layout": "NCHW" if data_layout == "AnyLayout" else data_layout},
        callsite="")
    y = op.output("Y")[0]
    if not is_test:   # training: the running statistics are updated in place
        t.block.append_op("assign", {"X": op.output("MeanOut")[0]}, {"Out": mean}, callsite="")
        t.block.append_op("assign", {"X": op.output("VarianceOut")[0]}, {"Out": variance},
                          callsite="")
    return y, None, None, None, None


@RULES.rule("layer_norm", inputs=("X", "Scale", "Bias"), outputs=("Y", "Mean", "Variance"))
def layer_norm(t, x, scale, bias, *, begin_norm_axis=1, epsilon=1e-5):
    y = t.call("layer_norm", x, scale, bias, begin_norm_axis=axis_of(begin_norm_axis, t.rank(x)),
               epsilon=float(epsilon))
    return y[0], None, None


@RULES.rule("dropout", inputs=("X", "Seed"), outputs=("Out", "Mask"))
def dropout(t, x, seed, *, dropout_prob=0.5, is_test=False,
            dropout_implementation="downgrade_in_infer"):
    if t.for_training:
        is_test = False
    out = t.call("dropout", x, dropout_prob=float(dropout_prob), is_test=bool(is_test),
                 dropout_implementation=dropout_implementation)
    return out[0], None


@RULES.rule("lookup_table_v2", "embedding", inputs=("W", "Ids"))
def lookup_table_v2(t, w, ids, *, padding_idx=-1):
    return t.call("lookup_table", w, ids, padding_idx=int(padding_idx))


@RULES.rule("lookup_table", inputs=("W", "Ids"))
def lookup_table(t, w, ids, *, padding_idx=-1):
    dims = dims_of(t, ids)
    if dims and dims[-1] == 1:
        ids = t.call("squeeze", ids, axes=[len(dims) - 1])
    return t.call("lookup_table", w, ids, padding_idx=int(padding_idx))


@RULES.rule("one_hot_v2", inputs=("X", "depth_tensor"))
def one_hot_v2(t, x, depth_tensor, *, depth=-1, dtype=5, allow_out_of_range=False):
    if depth_tensor is not None:
        depth = ints_of(t, depth_tensor, "depth_tensor")[0]
    return t.call("one_hot", x, depth=int(depth), dtype=dtype_name(dtype))


# --- ops of ours added for Paddle (lowering/ops/conv_transpose.py, interpolate.py) ---
@RULES.rule("conv2d_transpose", "depthwise_conv2d_transpose", inputs=("Input", "Filter"),
            outputs=("Output",))
def conv2d_transpose(t, x, w, *, strides=(1, 1), paddings=(0, 0), output_padding=(),
                     output_size=(), dilations=(1, 1), groups=1, padding_algorithm="EXPLICIT",
                     data_format="NCHW"):
    return t.call("conv2d_transpose", x, w, strides=list(strides), paddings=list(paddings),
                  output_padding=list(output_padding), output_size=list(output_size),
                  dilations=list(dilations), groups=max(int(groups), 1),
                  padding_algorithm=padding_algorithm,
                  data_format="NCHW" if data_format == "AnyLayout" else data_format)


_SPATIAL = {"linear": 1, "bilinear": 2, "bicubic": 2, "trilinear": 3}


def _interp(method):
    def rule(t, x, out_size, size_list, scale_t, *, data_layout="NCHW", out_d=-1, out_h=-1,
             out_w=-1, scale=(), align_corners=True, align_mode=1):
        spatial = t.rank(x) - 2
        if spatial != _SPATIAL.get(method, spatial) or not 1 <= spatial <= 3:
            raise Unsupported(f"{method} interpolation of a {t.rank(x)}-D input")
        sizes = None
        if out_size is not None:
            sizes = ints_of(t, out_size, "OutSize")
        elif size_list:
            sizes = list_ints(t, size_list, "SizeTensor")
        elif scale_t is not None:
            value = t.value_of(scale_t)
            if value is None:
                raise Unsupported("Scale is computed at run time")
            scale = [float(v) for v in np.asarray(value).reshape(-1)]
            scale = scale * spatial if len(scale) == 1 else scale   # one factor for all
        elif isinstance(scale, (int, float)):   # the v1 ops: one factor for every dim
            scale = [float(scale)] * spatial
        elif len(scale) not in (0, spatial):   # Paddle refuses these too
            raise Unsupported(f"scale {list(scale)} for {spatial} spatial dims")
        if sizes is not None:
            if len(sizes) != spatial:
                raise Unsupported(f"{len(sizes)} output sizes for {spatial} spatial dims")
            out_d, out_h, out_w = ([-1, -1] + sizes)[-3:]
            scale = ()
        scale = [float(s) for s in scale]
        if scale and all(s <= 0 for s in scale):
            scale = []
        layout = "NHWC" if data_layout in ("NHWC", "NWC", "NDHWC") else "NCHW"
        return t.call("interpolate", x, data_layout=layout, out_d=int(out_d), out_h=int(out_h),
                      out_w=int(out_w), scale=scale, interp_method=method,
                      align_corners=bool(align_corners), align_mode=int(align_mode))
    rule.__name__ = rule.__qualname__ = f"{method}_interp"
    return rule


for _method in ("nearest", "linear", "bilinear", "bicubic", "trilinear"):
    RULES.rule(f"{_method}_interp_v2", f"{_method}_interp",
               inputs=("X", "OutSize", "SizeTensor*", "Scale"))(_interp(_method))


@RULES.rule("prelu", inputs=("X", "Alpha"))
def prelu(t, x, alpha, *, mode="all", data_format="NCHW"):
    rank = t.rank(x)
    if mode == "channel":
        channel = 1 if data_format == "NCHW" else rank - 1
        alpha = t.call("reshape", alpha, shape=[-1])
        if channel != rank - 1:
            alpha = t.call("unsqueeze", alpha, axes=list(range(1, rank - channel)))
    elif mode == "element":
        alpha = t.call("unsqueeze", t.call("reshape", alpha, shape=dims_of(t, alpha)[1:]),
                       axes=[0]) if t.rank(alpha) == rank else alpha
    elif mode == "all":
        alpha = t.call("reshape", alpha, shape=[])
    else:
        raise Unsupported(f"mode={mode!r}")
    zero = t.constant(np.zeros((), t.var(x)[1]))
    return t.call("where", t.call("greater_than", x, zero), x, t.call("mul", x, alpha))


@RULES.rule("instance_norm", inputs=("X", "Scale", "Bias"),
            outputs=("Y", "SavedMean", "SavedVariance"))
def instance_norm(t, x, scale, bias, *, epsilon=1e-5):
    return _group_standardize(t, x, 0, scale, bias, epsilon), None, None


@RULES.rule("group_norm", inputs=("X", "Scale", "Bias"), outputs=("Y", "Mean", "Variance"))
def group_norm(t, x, scale, bias, *, epsilon=1e-5, groups=1, data_layout="NCHW"):
    if data_layout != "NCHW":
        raise Unsupported(f"data_layout={data_layout!r}")
    return _group_standardize(t, x, groups, scale, bias, epsilon), None, None


def _group_standardize(t, x, groups, scale, bias, epsilon):
    """(x - mean) / sqrt(var + eps) over each sample's groups of channels (groups=0:
    each channel alone), then the per-channel scale and bias."""
    dims = dims_of(t, x)
    c = dims[1]
    if c == -1 or -1 in dims[2:]:
        raise Unsupported("normalisation over unknown dims")
    groups = groups or c
    spatial = dims[2:]
    g = t.call("reshape", x, shape=[0, groups, c // groups * math.prod(spatial)])
    mean = t.call("reduce_mean", g, axis=[2], keep_dim=True)
    centered = t.call("sub", g, mean)
    var = t.call("reduce_mean", t.call("square", centered), axis=[2], keep_dim=True)
    y = t.call("mul", centered, t.call("rsqrt", t.call("scale", var, bias=float(epsilon))))
    y = t.call("reshape", y, shape=[0, c] + spatial)
    shape = [c] + [1] * len(spatial)
    if scale is not None:
        y = t.call("mul", y, t.call("reshape", scale, shape=shape))
    if bias is not None:
        y = t.call("add", y, t.call("reshape", bias, shape=shape))
    return y
