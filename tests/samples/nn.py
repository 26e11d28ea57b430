"""Samples of lowering/ops/nn.py: explicit-loop NumPy references for conv and pooling."""
import itertools

import numpy as np

from lowering.errors import ProgramError
from op_table import Invalid, Sample, positive, rand, spec


# --- convolution ---

def _pads4(paddings):
    return tuple(paddings) if len(paddings) == 4 else (paddings[0],) * 2 + (paddings[1],) * 2


def _conv_setup(Input, Filter, strides, paddings, dilations, padding_algorithm):
    """(padded float64 input, (top, left), dilations, output size) as PaddlePaddle resolves them."""
    H, W = Input.shape[2:]
    kh, kw = Filter.shape[2:]
    if padding_algorithm == "VALID":
        pads = (0, 0, 0, 0)
    elif padding_algorithm == "SAME":
        dilations, pads = (1, 1), []
        for n, k, s in ((H, kh, strides[0]), (W, kw, strides[1])):
            out = int(np.ceil(n / s))
            total = max((out - 1) * s + k - n, 0)
            pads += [total // 2, total - total // 2]
    else:
        pads = _pads4(paddings)
    top, bottom, left, right = pads
    xp = np.pad(Input.astype(np.float64), ((0, 0), (0, 0), (top, bottom), (left, right)))
    Ho = (H + top + bottom - dilations[0] * (kh - 1) - 1) // strides[0] + 1
    Wo = (W + left + right - dilations[1] * (kw - 1) - 1) // strides[1] + 1
    return xp, (top, left), tuple(dilations), (Ho, Wo)


def _conv_taps(Input, Filter, strides, dilations, groups, out_hw):
    """Every (output channel, input channel, kernel pos, output pos, padded input pos)."""
    O, Cg, kh, kw = Filter.shape
    per_group = O // groups
    for o, c, a, b, i, j in itertools.product(range(O), range(Cg), range(kh), range(kw),
                                              range(out_hw[0]), range(out_hw[1])):
        yield (o, c, a, b, i, j, (o // per_group) * Cg + c,
               i * strides[0] + a * dilations[0], j * strides[1] + b * dilations[1])


def conv2d_ref(Input, Filter, strides=(1, 1), paddings=(0, 0), dilations=(1, 1), groups=1,
               padding_algorithm="EXPLICIT"):
    xp, _, dil, out_hw = _conv_setup(Input, Filter, strides, paddings, dilations,
                                     padding_algorithm)
    out = np.zeros((Input.shape[0], Filter.shape[0]) + out_hw)
    for o, c, a, b, i, j, ci, h, w in _conv_taps(Input, Filter, strides, dil, groups, out_hw):
        out[:, o, i, j] += xp[:, ci, h, w] * Filter[o, c, a, b]
    return out.astype(Input.dtype)


def conv2d_grad_ref(Input, Filter, OutputGrad, strides=(1, 1), paddings=(0, 0),
                    dilations=(1, 1), groups=1, padding_algorithm="EXPLICIT"):
    xp, (top, left), dil, out_hw = _conv_setup(Input, Filter, strides, paddings, dilations,
                                               padding_algorithm)
    dxp, dw = np.zeros_like(xp), np.zeros(Filter.shape)
    for o, c, a, b, i, j, ci, h, w in _conv_taps(Input, Filter, strides, dil, groups, out_hw):
        dxp[:, ci, h, w] += OutputGrad[:, o, i, j] * Filter[o, c, a, b]
        dw[o, c, a, b] += np.sum(OutputGrad[:, o, i, j] * xp[:, ci, h, w])
    H, W = Input.shape[2:]
    return (dxp[:, :, top:top + H, left:left + W].astype(Input.dtype),
            dw.astype(Filter.dtype))


def _conv(name, x, w, symbolic=True, **attrs):
    """A conv2d sample and a conv2d_grad sample with the same geometry."""
    dy = rand(*conv2d_ref(x, w, **attrs).shape, dtype=x.dtype, seed=5)
    return [Sample("conv2d", {"Input": x, "Filter": w}, conv2d_ref, attrs, name=name,
                   atol=1e-5, symbolic=symbolic),
            # the unknown-batch check would make Filter's O the batch dim too, and dy's O clash
            Sample("conv2d_grad", {"Input": x, "Filter": w, "OutputGrad": dy}, conv2d_grad_ref,
                   attrs, name=f"{name}_static_filter_O", atol=1e-5, symbolic=False)]


CONV = [
    *_conv("default", rand(1, 2, 5, 5), rand(3, 2, 3, 3, seed=1)),
    *_conv("stride_pad", rand(2, 2, 5, 5), rand(3, 2, 3, 3, seed=1),
           strides=[2, 2], paddings=[1, 1]),
    *_conv("pad4_dilation", rand(1, 2, 5, 6), rand(2, 2, 2, 3, seed=1),
           paddings=[1, 0, 2, 1], dilations=[2, 1]),
    # a symbolic O (see above) can not be proven divisible by groups
    *_conv("groups_static_filter_O", rand(1, 4, 4, 4), rand(4, 2, 2, 2, seed=1), groups=2,
           paddings=[1, 1], symbolic=False),
    *_conv("same_stride", rand(1, 2, 5, 6), rand(2, 2, 3, 2, seed=1), strides=[2, 3],
           dilations=[2, 2], padding_algorithm="SAME"),
    *_conv("valid_ignores_paddings", rand(1, 2, 5, 5), rand(2, 2, 3, 3, seed=1),
           paddings=[2, 2], padding_algorithm="VALID"),
    *_conv("float64", rand(1, 2, 4, 4, dtype="float64"), rand(2, 2, 3, 3, dtype="float64", seed=1),
           paddings=[1, 1]),
]


# --- pooling ---

def _windows(X, ksize, strides=(1, 1), paddings=(0, 0), global_pooling=False, ceil_mode=False,
             **_):
    """Every (output pos, in-image window slices, kh * kw) of pool2d as PaddlePaddle sizes it."""
    H, W = X.shape[2:]
    if global_pooling:
        ksize, strides, paddings = (H, W), (1, 1), (0, 0)
    top, bottom, left, right = _pads4(paddings)
    sizes = []
    for n, k, s, lo, hi in ((H, ksize[0], strides[0], top, bottom),
                            (W, ksize[1], strides[1], left, right)):
        sizes.append((n + lo + hi - k + (s - 1 if ceil_mode else 0)) // s + 1)
    for i, j in itertools.product(range(sizes[0]), range(sizes[1])):
        h0, w0 = i * strides[0] - top, j * strides[1] - left
        yield ((i, j), sizes, (slice(max(h0, 0), min(h0 + ksize[0], H)),
                               slice(max(w0, 0), min(w0 + ksize[1], W))), ksize[0] * ksize[1])


def _argmax_in(win):
    """[N, C, h, w] window -> (n, c, row, col) index arrays of each channel's maximum."""
    n, c = np.indices(win.shape[:2])
    flat = win.reshape(win.shape[:2] + (-1,)).argmax(-1)
    return n, c, flat // win.shape[3], flat % win.shape[3]


def pool2d_ref(X, pooling_type="max", exclusive=True, **attrs):
    out = None
    for (i, j), sizes, (hs, ws), area in _windows(X, **attrs):
        out = np.zeros(X.shape[:2] + tuple(sizes)) if out is None else out
        win = X[:, :, hs, ws].astype(np.float64)
        if pooling_type == "max":
            out[:, :, i, j] = win.max(axis=(2, 3))
        else:
            out[:, :, i, j] = win.sum(axis=(2, 3)) / (win[0, 0].size if exclusive else area)
    return out.astype(X.dtype)


def pool2d_grad_ref(X, OutGrad, pooling_type="max", exclusive=True, **attrs):
    dx = np.zeros(X.shape)
    for (i, j), _, (hs, ws), area in _windows(X, **attrs):
        dout = OutGrad[:, :, i, j]
        if pooling_type == "max":
            n, c, r, s = _argmax_in(X[:, :, hs, ws])
            np.add.at(dx, (n, c, r + hs.start, s + ws.start), dout)
        else:
            size = (hs.stop - hs.start) * (ws.stop - ws.start) if exclusive else area
            dx[:, :, hs, ws] += (dout / size)[:, :, None, None]
    return dx.astype(X.dtype)


def pool2d_jvp_ref(X, Tangent, pooling_type="max", exclusive=True, **attrs):
    if pooling_type == "avg":
        return pool2d_ref(Tangent, pooling_type, exclusive, **attrs)
    out = None
    for (i, j), sizes, (hs, ws), _ in _windows(X, **attrs):
        out = np.zeros(X.shape[:2] + tuple(sizes)) if out is None else out
        n, c, r, s = _argmax_in(X[:, :, hs, ws])
        out[:, :, i, j] = Tangent[:, :, hs, ws][n, c, r, s]
    return out.astype(X.dtype)


def _pool(name, x, **attrs):
    """pool2d, pool2d_grad and pool2d_jvp samples with the same geometry."""
    out_shape = pool2d_ref(x, **attrs).shape
    return [Sample("pool2d", {"X": x}, pool2d_ref, attrs, name=name),
            Sample("pool2d_grad", {"X": x, "OutGrad": rand(*out_shape, dtype=x.dtype, seed=6)},
                   pool2d_grad_ref, attrs, name=name),
            Sample("pool2d_jvp", {"X": x, "Tangent": rand(*x.shape, dtype=x.dtype, seed=7)},
                   pool2d_jvp_ref, attrs, name=name)]


POOL = [
    *_pool("max", rand(1, 2, 4, 4), ksize=[2, 2], strides=[2, 2]),
    *_pool("max_overlap_pad4", rand(1, 2, 5, 5), ksize=[3, 2], paddings=[1, 0, 0, 1]),
    *_pool("max_ceil", rand(1, 2, 5, 5), ksize=[2, 2], strides=[2, 2], ceil_mode=True),
    *_pool("max_global", rand(2, 2, 3, 4), ksize=[1, 1], global_pooling=True),
    *_pool("avg_exclusive_pad", rand(1, 2, 5, 5), pooling_type="avg", ksize=[3, 3],
           strides=[2, 2], paddings=[1, 1]),
    *_pool("avg_inclusive_pad", rand(1, 2, 5, 5), pooling_type="avg", ksize=[3, 3],
           strides=[2, 2], paddings=[1, 1], exclusive=False),
    *_pool("avg_ceil", rand(1, 1, 5, 5), pooling_type="avg", ksize=[2, 2], strides=[2, 2],
           ceil_mode=True),
    *_pool("avg_global_float64", rand(2, 2, 3, 3, dtype="float64"), pooling_type="avg",
           ksize=[2, 2], global_pooling=True),
]


# --- normalization ---

def _bn_axes(X, data_layout):
    channel = X.ndim - 1 if data_layout == "NHWC" else 1
    shape = [1] * X.ndim
    shape[channel] = -1
    return tuple(a for a in range(X.ndim) if a != channel), shape


def batch_norm_ref(X, Scale, Bias, Mean, Variance, momentum=0.9, epsilon=1e-5, is_test=False,
                   data_layout="NCHW", sync_axis=""):
    axes, shape = _bn_axes(X, data_layout)
    x = X.astype(np.float64)
    if is_test:
        mean, var = Mean, Variance
    else:
        mean = x.mean(axis=axes)
        var = ((x - mean.reshape(shape)) ** 2).mean(axis=axes)
    y = ((x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + epsilon) * Scale.reshape(shape)
         + Bias.reshape(shape))
    if not is_test:
        stats = (momentum * Mean + (1 - momentum) * mean,
                 momentum * Variance + (1 - momentum) * var, mean, var)
    else:
        stats = (Mean, Variance, Mean, Variance)
    return tuple(a.astype(X.dtype) for a in (y,) + stats)


def _bn(name, x, channels, **attrs):
    inputs = {"X": x, "Scale": positive(channels, dtype=x.dtype, seed=1),
              "Bias": rand(channels, dtype=x.dtype, seed=2),
              "Mean": rand(channels, dtype=x.dtype, seed=3),
              "Variance": positive(channels, dtype=x.dtype, seed=4)}
    return Sample("batch_norm", inputs, batch_norm_ref, attrs, name=name, atol=1e-5)


def layer_norm_ref(X, Scale=None, Bias=None, begin_norm_axis=1, epsilon=1e-5):
    x = X.reshape(int(np.prod(X.shape[:begin_norm_axis])), -1).astype(np.float64)
    mean = x.mean(axis=1)
    var = x.var(axis=1)
    y = (x - mean[:, None]) / np.sqrt(var[:, None] + epsilon)
    y = y * (1 if Scale is None else Scale) + (0 if Bias is None else Bias)
    return tuple(a.astype(X.dtype) for a in (y.reshape(X.shape), mean, var))


NORM = [
    _bn("train_nchw", rand(2, 3, 2, 2), 3),
    _bn("train_2d", rand(4, 3), 3, momentum=0.8, epsilon=1e-3),
    _bn("train_nhwc", rand(2, 2, 2, 3), 3, data_layout="NHWC"),
    # one device: the statistics synchronised over an unmapped axis are the local ones
    _bn("train_sync_one_device", rand(2, 3, 2, 2), 3, sync_axis="data"),
    _bn("test_nchw", rand(2, 3, 2, 2), 3, is_test=True),
    _bn("test_nhwc_float64", rand(2, 2, 3, dtype="float64"), 3, is_test=True,
        data_layout="NHWC"),
    Sample("layer_norm", {"X": rand(2, 3, 4), "Scale": positive(12, seed=1),
                          "Bias": rand(12, seed=2)}, layer_norm_ref, name="axis1", atol=1e-5),
    Sample("layer_norm", {"X": rand(2, 3, 4), "Scale": positive(4, seed=1),
                          "Bias": rand(4, seed=2)}, layer_norm_ref, {"begin_norm_axis": 2},
           name="axis2", atol=1e-5),
    Sample("layer_norm", {"X": rand(3, 5)}, layer_norm_ref, {"epsilon": 1e-3},
           name="no_scale_bias", atol=1e-5),
    Sample("layer_norm", {"X": rand(4, 3, dtype="float64"), "Scale": positive(3, dtype="float64")},
           layer_norm_ref, name="scale_only_float64"),
]


# --- mode_select: the Train input, or Eval when is_test ---

def _mode_select(Train, Eval, is_test=False):
    return Eval if is_test else Train


MODE_SELECT = [
    Sample("mode_select", {"Train": rand(3, 4), "Eval": rand(3, 4, seed=1)}, _mode_select,
           name="train", grad_slots=("Train",)),   # the value not taken gets no gradient
    Sample("mode_select", {"Train": rand(3, 4), "Eval": rand(3, 4, seed=1)}, _mode_select,
           {"is_test": True}, name="test", grad_slots=("Eval",)),
]


# --- dropout ---

def _dropout_check(p, upscale=True):
    """check= for training-mode dropout: kept values scaled, zeros about p of them, the mask."""
    def check(outputs, inputs):
        (out,), (mask,) = outputs["Out"], outputs["Mask"]
        x = inputs["X"]
        assert out.dtype == x.dtype and out.shape == x.shape and mask.dtype == np.uint8
        assert set(np.unique(mask)) <= {0, 1}
        kept = mask == 1
        factor = 1 / (1 - p) if upscale and p < 1 else 1.0
        np.testing.assert_allclose(out[kept], x[kept] * factor, rtol=1e-6)
        assert np.all(out[~kept] == 0)
        if x.size >= 1000:
            assert abs((~kept).mean() - p) < 0.03, (~kept).mean()
    return check


DROPOUT = [
    Sample("dropout", {"X": positive(64, 64)}, check=_dropout_check(0.5),
           name="upscale_stats_no_grad_large", grad=False),
    Sample("dropout", {"X": positive(64, 64)}, attrs={
        "dropout_prob": 0.2, "dropout_implementation": "downgrade_in_infer"},
        check=_dropout_check(0.2, upscale=False), name="downgrade_stats_no_grad_large",
        grad=False),
    Sample("dropout", {"X": positive(3, 4)}, check=_dropout_check(0.4),
           attrs={"dropout_prob": 0.4}, name="upscale_small"),
    Sample("dropout", {"X": positive(3, 4)}, check=_dropout_check(0.4, upscale=False),
           attrs={"dropout_prob": 0.4, "dropout_implementation": "downgrade_in_infer"},
           name="downgrade_small"),
    Sample("dropout", {"X": positive(2, 3)}, check=_dropout_check(1.0), attrs={"dropout_prob": 1.0},
           name="drop_all"),
    Sample("dropout", {"X": rand(3, 4)}, lambda X, **_: (X, np.ones(X.shape, np.uint8)),
           {"is_test": True}, name="test_upscale"),
    Sample("dropout", {"X": rand(3, 4, dtype="float64")},
           lambda X, dropout_prob, **_: (X * (1 - dropout_prob), np.ones(X.shape, np.uint8)),
           {"is_test": True, "dropout_prob": 0.3, "dropout_implementation": "downgrade_in_infer"},
           name="test_downgrade_float64"),
]


# --- embedding lookup ---
# lookup_table_grad: the unknown-batch check would make OutGrad's leading dim symbolic but
# not that of the lower-rank Ids, which must match it.

def _pad_row(vocab, padding_idx):
    return None if padding_idx == -1 else (vocab + padding_idx if padding_idx < 0 else padding_idx)


def lookup_table_ref(W, Ids, padding_idx=-1):
    out = np.stack([W[i] for i in Ids.reshape(-1)]).reshape(Ids.shape + W.shape[1:])
    pad = _pad_row(W.shape[0], padding_idx)
    if pad is not None:
        out[Ids == pad] = 0
    return out


def lookup_table_grad_ref(W, Ids, OutGrad, padding_idx=-1):
    dw = np.zeros(W.shape, OutGrad.dtype)
    pad = _pad_row(W.shape[0], padding_idx)
    for i, row in zip(Ids.reshape(-1), OutGrad.reshape(-1, W.shape[1])):
        if i != pad:
            dw[i] += row
    return dw


_IDS = np.array([[0, 2, 5], [2, 3, 0]], np.int64)

LOOKUP = [
    Sample("lookup_table", {"W": rand(6, 4), "Ids": _IDS}, lookup_table_ref, name="repeated_ids"),
    Sample("lookup_table", {"W": rand(6, 3), "Ids": np.array([4, 1, 4], np.int32)},
           lookup_table_ref, {"padding_idx": 4}, name="padding_int32_ids"),
    Sample("lookup_table", {"W": rand(6, 3, dtype="float64"), "Ids": _IDS}, lookup_table_ref,
           {"padding_idx": -4}, name="negative_padding_float64"),
    Sample("lookup_table_grad", {"W": rand(6, 4), "Ids": _IDS, "OutGrad": rand(2, 3, 4, seed=1)},
           lookup_table_grad_ref, name="repeated_ids_static_ids", symbolic=False),
    Sample("lookup_table_grad", {"W": rand(6, 3), "Ids": np.array([4, 1, 4], np.int32),
                                 "OutGrad": rand(3, 3, seed=1)},
           lookup_table_grad_ref, {"padding_idx": 4}, name="padding_static_ids",
           symbolic=False),
]


# --- attention ---

def _heads(a):   # [B, T, N, H] <-> [B, N, T, H]
    return np.asarray(a, np.float64).transpose(0, 2, 1, 3)


def _attention_weights(Q, K, Bias, Mask, is_causal, scale):
    """(q, k as [B, N, T or S, H] float64, the logit scale, kept [B, N, T, S], the weights)."""
    q, k = _heads(Q), _heads(K)
    s = scale or 1 / np.sqrt(Q.shape[-1])
    logits = s * np.einsum("bnth,bnsh->bnts", q, k) + (0 if Bias is None else Bias)
    keep = np.ones(logits.shape, bool) & (True if Mask is None else Mask)
    if is_causal:
        keep &= np.tril(np.ones(logits.shape[-2:], bool))
    # softmax over the kept logits of each row; uniform weights in a row that keeps none
    logits = np.where(keep, logits, -np.inf)
    top = logits.max(-1, keepdims=True)
    weights = np.exp(logits - np.where(np.isfinite(top), top, 0))
    total = weights.sum(-1, keepdims=True)
    weights = np.where(total > 0, weights / np.where(total > 0, total, 1), 1 / logits.shape[-1])
    return q, k, s, keep, weights


def attention_ref(Q, K, V, Bias=None, Mask=None, is_causal=False, scale=0.0):
    """softmax(scale * Q K^T + Bias) V per head, over [B, T, N, H] arrays, in float64."""
    p = _attention_weights(Q, K, Bias, Mask, is_causal, scale)[-1]
    return _heads(np.einsum("bnts,bnsh->bnth", p, _heads(V))).astype(Q.dtype)


def attention_grad_ref(Q, K, V, OutGrad, Bias=None, Mask=None, is_causal=False, scale=0.0):
    """Hand-derived gradients of attention_ref: dV = P^T dO, dP = dO V^T,
    dLogits = P * (dP - rowsum(dP * P)), dQ = scale dLogits K, dK = scale dLogits^T Q."""
    q, k, s, keep, p = _attention_weights(Q, K, Bias, Mask, is_causal, scale)
    v, do = _heads(V), _heads(OutGrad)
    dv = np.einsum("bnts,bnth->bnsh", p, do)
    dp = np.einsum("bnth,bnsh->bnts", do, v)
    # a row that keeps no key has uniform weights, whatever its logits
    dlogits = p * (dp - (dp * p).sum(-1, keepdims=True)) * keep.any(-1, keepdims=True)
    dq = s * np.einsum("bnts,bnsh->bnth", dlogits, k)
    dk = s * np.einsum("bnts,bnth->bnsh", dlogits, q)
    back = [_heads(a).astype(Q.dtype) for a in (dq, dk, dv)]
    dbias = None
    if Bias is not None:   # summed over the axes Bias was broadcast along
        axes = tuple(i for i, n in enumerate(Bias.shape) if n == 1 and dlogits.shape[i] != 1)
        dbias = dlogits.sum(axes, keepdims=True).astype(Bias.dtype)
    return (*back, dbias)


def _attention(name, b, t, s, n, h, bias=None, mask=None, dtype="float32", **attrs):
    """A scaled_dot_product_attention sample and its _grad sample on the same inputs."""
    inputs = {"Q": rand(b, t, n, h, dtype=dtype), "K": rand(b, s, n, h, dtype=dtype, seed=1),
              "V": rand(b, s, n, h, dtype=dtype, seed=2)}
    if bias is not None:
        inputs["Bias"] = rand(*bias, dtype=dtype, seed=3)
    if mask is not None:
        inputs["Mask"] = mask
    out_grad = rand(b, t, n, h, dtype=dtype, seed=4)
    return [Sample("scaled_dot_product_attention", inputs, attention_ref, attrs, name=name,
                   atol=1e-5),
            Sample("scaled_dot_product_attention_grad", {**inputs, "OutGrad": out_grad},
                   attention_grad_ref, attrs, name=f"{name}_first_order_only", atol=1e-5,
                   grad=False)]


_KEY_PADDING = np.array([[True, True, True, False, False], [True, True, True, True, True]])
_NO_KEY_FOR_QUERY_1 = np.array([True, False, True])[None, None, :, None] & np.ones(5, bool)
ATTENTION = [
    *_attention("self", 2, 4, 4, 2, 3),
    *_attention("cross_scale", 2, 3, 5, 2, 4, scale=0.3),
    *_attention("causal", 1, 4, 4, 2, 3, is_causal=True),
    *_attention("key_padding_mask", 2, 3, 5, 1, 4, mask=_KEY_PADDING[:, None, None, :]),
    *_attention("causal_bias_per_head", 2, 4, 4, 2, 3, bias=(1, 2, 4, 4), is_causal=True),
    *_attention("query_with_every_key_masked", 1, 3, 5, 2, 2, mask=_NO_KEY_FOR_QUERY_1),
    *_attention("bias_and_mask_float64", 2, 3, 5, 2, 2, bias=(2, 1, 3, 5), dtype="float64",
                mask=_KEY_PADDING[:, None, None, :]),
]

SAMPLES = CONV + POOL + NORM + MODE_SELECT + DROPOUT + LOOKUP + ATTENTION

_BN_STATS = {"Bias": spec(3), "Mean": spec(3), "Variance": spec(3)}

_KV = {"K": spec(2, 6, 2, 4), "V": spec(2, 6, 2, 4)}
INVALID = [
    Invalid("mode_select", {"Train": spec(3, 4), "Eval": spec(4, 3)}, name="shapes_differ",
            expect=["Eval must have shape [3, 4]", "got float32[4, 3]"]),
    Invalid("conv2d", {"Input": spec(-1, 64), "Filter": spec(8, 1, 3, 3)}, name="flat_input",
            expect=["Input must have rank 4 (N, C, H, W), got float32[-1, 64]"]),
    Invalid("conv2d", {"Input": spec(2, 3, 8, 8), "Filter": spec(4, 2, 3, 3)}, name="channels",
            expect=["dim 1 of Filter float32[4, 2, 3, 3] must be 3",
                    "Input float32[2, 3, 8, 8]'s 3 channels / groups=1", "got 2"]),
    Invalid("conv2d", {"Input": spec(2, 4, 8, 8), "Filter": spec(3, 2, 3, 3)}, attrs={"groups": 2},
            name="groups", expect=["Filter float32[3, 2, 3, 3]'s filters must split into groups=2"]),
    Invalid("conv2d", {"Input": spec(2, 3, 2, 2), "Filter": spec(4, 3, 3, 3)}, name="window",
            expect=["the 3x3 window is larger than Input float32[2, 3, 2, 2]'s H of 2"]),
    Invalid("conv2d", {"Input": spec(2, 3, 8, 8, dtype="int32"), "Filter": spec(4, 3, 3, 3)},
            name="int_input", error=ProgramError,
            expect=["input slot 'Input' expects a float dtype, got int32"]),
    Invalid("pool2d", {"X": spec(2, 3, 8)}, attrs={"ksize": [2, 2]}, name="rank",
            expect=["X must have rank 4 (N, C, H, W), got float32[2, 3, 8]"]),
    Invalid("pool2d", {"X": spec(-1, 3, 2, 2)}, attrs={"ksize": [3, 3]}, name="window",
            expect=["the 3x3 window is larger than X float32[-1, 3, 2, 2]'s H of 2"]),
    Invalid("batch_norm", {"X": spec(-1, 3, 4, 4), "Scale": spec(4), **_BN_STATS},
            name="scale_size",
            expect=["Scale must have shape [3] (one per channel of X float32[-1, 3, 4, 4]",
                    "got float32[4]"]),
    Invalid("batch_norm", {"X": spec(2, 4, 3), "Scale": spec(3), **_BN_STATS},
            name="layout", expect=["Scale must have shape [4] (one per channel of X "
                                   "float32[2, 4, 3], NCHW), got float32[3]"]),
    Invalid("layer_norm", {"X": spec(-1, 3, 4), "Scale": spec(4)}, name="scale_size",
            expect=["Scale must have shape [12] (one per element of X float32[-1, 3, 4]'s dims "
                    "from begin_norm_axis=1 on), got float32[4]"]),
    Invalid("layer_norm", {"X": spec(2, 3, 4)}, attrs={"begin_norm_axis": 3}, name="axis",
            expect=["attribute begin_norm_axis=3 is out of range for X float32[2, 3, 4]"]),
    Invalid("scaled_dot_product_attention", {"Q": spec(2, 5, 8), **_KV}, name="q_rank",
            expect=["Q must have rank 4 (B, T, N, H), got float32[2, 5, 8]"]),
    Invalid("scaled_dot_product_attention", {"Q": spec(2, 5, 2, 4), "K": spec(2, 6, 8),
                                             "V": spec(2, 6, 2, 4)}, name="k_rank",
            expect=["K must have rank 4 (B, S, N, H), got float32[2, 6, 8]"]),
    Invalid("scaled_dot_product_attention", {"Q": spec(2, 5, 2, 3), **_KV}, name="head_size",
            expect=["dim 3 of K float32[2, 6, 2, 4] must be 3 (the head size of Q), got 4"]),
    Invalid("scaled_dot_product_attention", {"Q": spec(-1, 5, 2, 4), "K": spec(-1, 6, 2, 4),
                                             "V": spec(-1, 7, 2, 4)}, name="kv_length",
            expect=["V must have shape [-1, 6, 2, 4] (the shape of K: one value per key), "
                    "got float32[-1, 7, 2, 4]"]),
    Invalid("scaled_dot_product_attention", {"Q": spec(2, 5, 2, 4), **_KV,
                                             "Mask": spec(2, 1, 5, 6)}, name="float_mask",
            error=ProgramError, expect=["input slot 'Mask' expects a bool dtype, got float32"]),
    Invalid("scaled_dot_product_attention", {"Q": spec(2, 5, 2, 4), **_KV,
                                             "Mask": spec(2, 1, 5, 5, dtype="bool")},
            name="mask_keys",
            expect=["Mask must broadcast to [2, 2, 5, 6] (B, N, T, S: batch, heads, queries, "
                    "keys), got bool[2, 1, 5, 5]"]),
    Invalid("scaled_dot_product_attention", {"Q": spec(-1, 5, 2, 4), "K": spec(-1, 6, 2, 4),
                                             "V": spec(-1, 6, 2, 4), "Bias": spec(1, 2, 2, 5, 6)},
            name="bias_rank",
            expect=["Bias must broadcast to [-1, 2, 5, 6]", "got float32[1, 2, 2, 5, 6]"]),
    Invalid("lookup_table", {"W": spec(10), "Ids": spec(4, dtype="int64")}, name="flat_table",
            expect=["W must have rank 2 (vocabulary size, embedding size), got float32[10]"]),
    Invalid("lookup_table", {"W": spec(10, 3), "Ids": spec(4)}, name="float_ids",
            error=ProgramError, expect=["input slot 'Ids' expects a int dtype, got float32"]),
]
