"""Export rows: matmul, convolution, pooling, normalizations, dropout, attention, embeddings."""
import math

import numpy as np

from progdesc.onnx.export_table import EXPORT
from progdesc.translate import Unsupported


def _swap_last_two(e, x, rank):
    perm = list(range(rank))
    perm[-2:] = perm[-1], perm[-2]
    return e.node("Transpose", [x], perm=perm)


@EXPORT.rule("matmul")
def matmul(e, X, Y, *, transpose_x, transpose_y, alpha, in_types):
    (x_dims, dtype), (y_dims, _) = in_types
    if transpose_x and len(x_dims) >= 2:
        X = _swap_last_two(e, X, len(x_dims))
    if transpose_y and len(y_dims) >= 2:
        Y = _swap_last_two(e, Y, len(y_dims))
    out = e.node("MatMul", [X, Y])
    return out if alpha == 1.0 else e.node("Mul", [out, e.scalar(alpha, dtype)])


def _known(dims):
    """`dims` as an attribute, or None (left out) where one is unknown."""
    return None if -1 in dims else list(dims)


def _pads(paddings):
    """ONNX pads (begins then ends) of (pad_h, pad_w) or (top, bottom, left, right)."""
    p = list(paddings)
    if len(p) == 2:
        return [p[0], p[1], p[0], p[1]]
    if len(p) == 4:
        return [p[0], p[2], p[1], p[3]]
    raise Unsupported(f"paddings {p} (2 or 4 values)")


@EXPORT.rule("conv2d")
def conv2d(e, Input, Filter, *, strides, paddings, dilations, groups, padding_algorithm,
           in_types):
    common = dict(strides=list(strides), group=int(groups),
                  kernel_shape=_known(in_types[1][0][2:]))
    if padding_algorithm == "SAME":   # dilations are ignored, as our op does
        return e.node("Conv", [Input, Filter], auto_pad="SAME_UPPER", dilations=[1, 1], **common)
    pads = [0, 0, 0, 0] if padding_algorithm == "VALID" else _pads(paddings)
    return e.node("Conv", [Input, Filter], pads=pads, dilations=list(dilations), **common)


@EXPORT.rule("pool2d")
def pool2d(e, X, *, pooling_type, ksize, strides, paddings, global_pooling, exclusive,
           ceil_mode):
    if global_pooling:
        return e.node("GlobalMaxPool" if pooling_type == "max" else "GlobalAveragePool", [X])
    common = dict(kernel_shape=list(ksize), strides=list(strides), pads=_pads(paddings),
                  ceil_mode=int(bool(ceil_mode)))
    if pooling_type == "max":
        return e.node("MaxPool", [X], **common)
    if ceil_mode and not exclusive:
        raise Unsupported("average pooling with ceil_mode that counts the padding")
    return e.node("AveragePool", [X], count_include_pad=int(not exclusive), **common)


@EXPORT.rule("batch_norm")
def batch_norm(e, X, Scale, Bias, Mean, Variance, *, epsilon, is_test, data_layout, in_types):
    if not is_test:
        raise Unsupported("batch_norm in training mode (export a program cloned for test)")
    rank = len(in_types[0][0])
    if data_layout == "NHWC" and rank > 2:
        to_first = [0, rank - 1] + list(range(1, rank - 1))
        X = e.node("Transpose", [X], perm=to_first)
    y = e.node("BatchNormalization", [X, Scale, Bias, Mean, Variance], epsilon=float(epsilon))
    if data_layout == "NHWC" and rank > 2:
        y = e.node("Transpose", [y], perm=[0] + list(range(2, rank)) + [1])
    return (y, None, None, None, None)


@EXPORT.rule("layer_norm")
def layer_norm(e, X, Scale=None, Bias=None, *, begin_norm_axis, epsilon, in_types):
    dims, dtype = in_types[0]
    axis = begin_norm_axis % len(dims)
    trailing = list(dims[axis:])
    if -1 in trailing:
        raise Unsupported("layer_norm over dims of unknown size")

    def shaped(v):   # our [width] scale or bias -> the normalized dims
        return v if len(trailing) == 1 else e.node("Reshape", [v, e.ints(trailing)])

    if e.opset >= 17:
        scale = shaped(Scale) if Scale is not None else e.const(np.ones(trailing), dtype)
        y = e.node("LayerNormalization", [X, scale, shaped(Bias) if Bias is not None else None],
                   axis=axis, epsilon=float(epsilon))
        return (y, None, None)
    axes = list(range(axis, len(dims)))
    centered = e.node("Sub", [X, e.reduce("ReduceMean", X, axes, True)])
    var = e.reduce("ReduceMean", e.node("Mul", [centered, centered]), axes, True)
    std = e.node("Sqrt", [e.node("Add", [var, e.scalar(epsilon, dtype)])])
    y = e.node("Div", [centered, std])
    if Scale is not None:
        y = e.node("Mul", [y, shaped(Scale)])
    if Bias is not None:
        y = e.node("Add", [y, shaped(Bias)])
    return (y, None, None)


@EXPORT.rule("dropout")
def dropout(e, X, *, dropout_prob, is_test, dropout_implementation, in_types):
    if not is_test:
        raise Unsupported("dropout in training mode (export a program cloned for test)")
    if dropout_implementation == "downgrade_in_infer":
        return (e.node("Mul", [X, e.scalar(1.0 - dropout_prob, in_types[0][1])]), None)
    return (e.node("Identity", [X]), None)


@EXPORT.rule("mode_select")
def mode_select(e, Train, Eval, *, is_test):
    return e.node("Identity", [Eval if is_test else Train])


@EXPORT.rule("lookup_table")
def lookup_table(e, W, Ids, *, padding_idx, in_types):
    rows = e.node("Gather", [W, Ids], axis=0)
    if padding_idx == -1:
        return rows
    (vocab, _), dtype = in_types[0]
    pad = padding_idx % vocab if padding_idx < 0 else padding_idx
    is_pad = e.unsqueeze(e.node("Equal", [Ids, e.scalar(pad, in_types[1][1])]), [-1])
    return e.node("Where", [is_pad, e.scalar(0, dtype), rows])


@EXPORT.rule("one_hot")
def one_hot(e, X, *, depth, dtype):
    values = e.const(np.asarray([0, 1]), dtype)
    return e.node("OneHot", [X, e.ints([depth]), values], axis=-1)


@EXPORT.rule("scaled_dot_product_attention")
def scaled_dot_product_attention(e, Q, K, V, Bias=None, Mask=None, *, is_causal, scale,
                                 in_types):
    """softmax(scale Q K^T + Bias, masked) V, heads [B, T, N, H] -> [B, N, T, H] and back."""
    q_dims, dtype = in_types[0]
    if not scale:
        if q_dims[-1] == -1:
            raise Unsupported("attention with the default scale and an unknown head size")
        scale = 1.0 / math.sqrt(q_dims[-1])
    q = e.node("Transpose", [Q], perm=[0, 2, 1, 3])
    k_t = e.node("Transpose", [K], perm=[0, 2, 3, 1])
    v = e.node("Transpose", [V], perm=[0, 2, 1, 3])
    logits = e.node("Mul", [e.node("MatMul", [q, k_t]), e.scalar(scale, dtype)])
    if Bias is not None:
        logits = e.node("Add", [logits, Bias])
    keep = Mask
    if is_causal:   # query t sees keys s <= t
        t = e.node("Range", [e.const(np.int64(0)), e.squeeze(e.dim(Q, 1), [0]),
                             e.const(np.int64(1))])
        s = e.node("Range", [e.const(np.int64(0)), e.squeeze(e.dim(K, 1), [0]),
                             e.const(np.int64(1))])
        causal = e.node("LessOrEqual", [s, e.unsqueeze(t, [1])])
        keep = causal if keep is None else e.node("And", [keep, causal])
    if keep is not None:
        lowest = e.scalar(np.finfo(np.dtype(dtype)).min, dtype)
        logits = e.node("Where", [keep, logits, lowest])
    weights = e.node("Softmax", [logits], axis=-1)
    return e.node("Transpose", [e.node("MatMul", [weights, v])], perm=[0, 2, 1, 3])


def _transposed_conv_rule(n):
    def rule(e, Input, Filter, *, strides, paddings, output_padding, output_size, dilations,
             groups, padding_algorithm, data_format, in_types):
        (x_dims, _), (w_dims, _) = in_types
        last = data_format == "NHWC"
        spatial = list(x_dims[1:-1] if last else x_dims[2:])
        kernel = list(w_dims[2:])
        if padding_algorithm == "VALID":
            pairs = [(0, 0)] * n
        elif padding_algorithm == "SAME":   # as a stride-`strides` convolution pads
            if -1 in spatial:
                raise Unsupported("padding_algorithm SAME with spatial dims of unknown size")
            totals = [max((-(-m // s) - 1) * s + k - m, 0)
                      for m, k, s in zip(spatial, kernel, strides)]
            pairs, dilations = [(t // 2, t - t // 2) for t in totals], [1] * n
        elif len(paddings) == n:
            pairs = [(p, p) for p in paddings]
        else:
            pairs = list(zip(paddings[::2], paddings[1::2]))
        extras = list(output_padding) or [0] * n
        if output_size:
            if -1 in spatial:
                raise Unsupported("output_size with spatial dims of unknown size")
            extras = [want - ((m - 1) * s - lo - hi + d * (k - 1) + 1)
                      for want, m, s, (lo, hi), d, k in zip(output_size, spatial, strides,
                                                             pairs, dilations, kernel)]
        x = e.node("Transpose", [Input], perm=[0, n + 1] + list(range(1, n + 1))) \
            if last else Input
        y = e.node("ConvTranspose", [x, Filter], strides=list(strides),
                   pads=[lo for lo, _ in pairs] + [hi for _, hi in pairs],
                   dilations=list(dilations), group=int(groups), output_padding=extras,
                   kernel_shape=_known(kernel))
        return e.node("Transpose", [y], perm=[0] + list(range(2, n + 2)) + [1]) if last else y
    rule.__name__ = rule.__qualname__ = f"conv{n}d_transpose"
    return rule


EXPORT.rule("conv2d_transpose")(_transposed_conv_rule(2))
EXPORT.rule("conv3d_transpose")(_transposed_conv_rule(3))


@EXPORT.rule("softmax_with_cross_entropy")
def softmax_with_cross_entropy(e, Logits, Label, *, soft_label, ignore_index, axis, in_types):
    """Softmax, and the loss -sum(label * log_softmax) (soft) or -log_softmax at the label
    (hard; 0 where the label is `ignore_index`), keeping `axis` as a dim of size 1."""
    (dims, dtype), (_, label_dtype) = in_types
    log_p = e.node("LogSoftmax", [Logits], axis=axis)
    softmax = e.node("Softmax", [Logits], axis=axis)
    if soft_label:
        loss = e.node("Neg", [e.reduce("ReduceSum", e.node("Mul", [Label, log_p]), [axis],
                                       True)])
        return (softmax, loss)
    index = Label if label_dtype == "int64" else e.cast(Label, "int64")
    ignored = e.node("Equal", [index, e.const(np.int64(ignore_index))])
    safe = e.node("Where", [ignored, e.const(np.int64(0)), index])
    picked = e.node("Neg", [e.node("GatherElements", [log_p, safe], axis=axis)])
    return (softmax, e.node("Where", [ignored, e.scalar(0, dtype), picked]))


def _argsort(values):
    return sorted(range(len(values)), key=values.__getitem__)


@EXPORT.rule("conv_general_dilated")
def conv_general_dilated(e, Input, Filter, *, window_strides, padding, lhs_dilation,
                         rhs_dilation, lhs_spec, rhs_spec, out_spec, feature_group_count,
                         batch_group_count, in_types):
    """Conv over the layouts the specs give: Input and Filter moved to NC... / OI...,
    the result moved to `out_spec`'s order."""
    n = len(lhs_spec) - 2
    if any(d != 1 for d in lhs_dilation) or batch_group_count != 1:
        raise Unsupported("input dilation or batch_group_count (no ONNX Conv form)")
    if any(p < 0 for p in padding):
        raise Unsupported(f"negative padding {list(padding)}")
    pads = list(padding[::2]) + list(padding[1::2]) if padding else [0] * (2 * n)
    w_dims = in_types[1][0]
    x = Input if list(lhs_spec) == sorted(lhs_spec) else \
        e.node("Transpose", [Input], perm=list(lhs_spec))
    w = Filter if list(rhs_spec) == sorted(rhs_spec) else \
        e.node("Transpose", [Filter], perm=list(rhs_spec))
    y = e.node("Conv", [x, w], strides=list(window_strides) or [1] * n, pads=pads,
               dilations=list(rhs_dilation) or [1] * n, group=int(feature_group_count),
               kernel_shape=_known([w_dims[a] for a in rhs_spec[2:]]))
    back = _argsort(out_spec)
    return y if back == sorted(back) else e.node("Transpose", [y], perm=back)


@EXPORT.rule("reduce_window")
def reduce_window(e, X, *, computation, window_dimensions, window_strides, padding,
                  base_dilation, window_dilation, in_types):
    """MaxPool (min: of -X; sum: AveragePool counting the padding, times the window size)
    over the dims the window spans, two dims it leaves alone as N and C."""
    dims, dtype = in_types[0]
    rank = len(dims)
    strides = list(window_strides) or [1] * rank
    pairs = list(zip(padding[::2], padding[1::2])) or [(0, 0)] * rank
    dilation = list(window_dilation) or [1] * rank
    if any(d != 1 for d in base_dilation):
        raise Unsupported("base dilation (no ONNX pooling form)")
    if any(lo < 0 or hi < 0 for lo, hi in pairs):
        raise Unsupported("negative padding")
    trivial = [a for a in range(rank) if (window_dimensions[a], strides[a], pairs[a],
                                          dilation[a]) == (1, 1, (0, 0), 1)]
    if len(trivial) < 2 or len(trivial) == rank:
        raise Unsupported("a window that leaves fewer than two dims alone (N, C) or none")
    perm = trivial[:2] + [a for a in range(rank) if a not in trivial[:2]]
    spatial = perm[2:]
    x = X if perm == sorted(perm) else e.node("Transpose", [X], perm=perm)
    if computation == "min":
        x = e.node("Neg", [x])
    common = dict(kernel_shape=[window_dimensions[a] for a in spatial],
                  strides=[strides[a] for a in spatial],
                  pads=[pairs[a][0] for a in spatial] + [pairs[a][1] for a in spatial])
    dilations = [dilation[a] for a in spatial]
    if computation == "sum":
        if any(d != 1 for d in dilations) and e.opset < 19:
            raise Unsupported("a dilated sum window needs opset 19 (AveragePool dilations)")
        y = e.node("AveragePool", [x], count_include_pad=1,
                   dilations=dilations if e.opset >= 19 else None, **common)
        size = math.prod(common["kernel_shape"])
        y = e.node("Mul", [y, e.scalar(size, dtype)])
    else:
        y = e.node("MaxPool", [x], dilations=dilations, **common)
        if computation == "min":
            y = e.node("Neg", [y])
    return y if perm == sorted(perm) else e.node("Transpose", [y], perm=_argsort(perm))
