"""Samples of lowering/ops/conv_transpose.py. The reference scatters: every input pixel adds
its value times its filter slice into a full-size output at stride `strides`, which is then
cropped by the paddings (PaddlePaddle's definition of the transposed convolution); the
gradient reference reads the same scatter backwards."""
import itertools

import numpy as np

from op_table import Invalid, Sample, rand, spec


def _setup(Input, Filter, strides, paddings, output_padding, output_size, dilations,
           padding_algorithm, data_format):
    """(NCHW float64 input, crops (top, left), dilations, output (H, W), full buffer (H, W))."""
    x = Input.astype(np.float64)
    if data_format == "NHWC":
        x = x.transpose(0, 3, 1, 2)
    spatial, kernel = x.shape[2:], Filter.shape[2:]
    if padding_algorithm == "VALID":
        pads = [(0, 0), (0, 0)]
    elif padding_algorithm == "SAME":   # as a forward convolution of x would pad
        dilations, pads = (1, 1), []
        for n, k, s in zip(spatial, kernel, strides):
            total = max((int(np.ceil(n / s)) - 1) * s + k - n, 0)
            pads.append((total // 2, total - total // 2))
    elif len(paddings) == 2:
        pads = [(paddings[0],) * 2, (paddings[1],) * 2]
    else:
        pads = [tuple(paddings[:2]), tuple(paddings[2:])]
    full = [(n - 1) * s + d * (k - 1) + 1
            for n, k, s, d in zip(spatial, kernel, strides, dilations)]
    out = [f - lo - hi for f, (lo, hi) in zip(full, pads)]
    if output_size:
        out = list(output_size)
    elif output_padding:
        out = [o + p for o, p in zip(out, output_padding)]
    buffer = [max(f, lo + o) for f, (lo, _), o in zip(full, pads, out)]
    return x, (pads[0][0], pads[1][0]), tuple(dilations), out, buffer


def _taps(x, Filter, groups, strides, dilations):
    """Every (input channel, output channel, filter slice index, buffer slices it reaches)."""
    C, Og, kh, kw = Filter.shape
    H, W = x.shape[2:]
    for ci, co, a, b in itertools.product(range(C), range(Og), range(kh), range(kw)):
        o = (ci // (C // groups)) * Og + co
        rows = slice(a * dilations[0], a * dilations[0] + (H - 1) * strides[0] + 1, strides[0])
        cols = slice(b * dilations[1], b * dilations[1] + (W - 1) * strides[1] + 1, strides[1])
        yield ci, co, (a, b), o, rows, cols


def conv2d_transpose_ref(Input, Filter, strides=(1, 1), paddings=(0, 0), output_padding=(),
                         output_size=(), dilations=(1, 1), groups=1,
                         padding_algorithm="EXPLICIT", data_format="NCHW"):
    x, (top, left), dil, (Ho, Wo), buffer = _setup(
        Input, Filter, strides, paddings, output_padding, output_size, dilations,
        padding_algorithm, data_format)
    full = np.zeros((x.shape[0], Filter.shape[1] * groups, *buffer))
    for ci, co, tap, o, rows, cols in _taps(x, Filter, groups, strides, dil):
        full[:, o, rows, cols] += x[:, ci] * Filter[(ci, co) + tap]
    out = full[:, :, top:top + Ho, left:left + Wo]
    if data_format == "NHWC":
        out = out.transpose(0, 2, 3, 1)
    return out.astype(Input.dtype)


def conv2d_transpose_grad_ref(Input, Filter, OutputGrad, strides=(1, 1), paddings=(0, 0),
                              output_padding=(), output_size=(), dilations=(1, 1), groups=1,
                              padding_algorithm="EXPLICIT", data_format="NCHW"):
    x, (top, left), dil, (Ho, Wo), buffer = _setup(
        Input, Filter, strides, paddings, output_padding, output_size, dilations,
        padding_algorithm, data_format)
    dy = OutputGrad.astype(np.float64)
    if data_format == "NHWC":
        dy = dy.transpose(0, 3, 1, 2)
    dfull = np.zeros(dy.shape[:2] + tuple(buffer))
    dfull[:, :, top:top + Ho, left:left + Wo] = dy
    dx, dw = np.zeros_like(x), np.zeros(Filter.shape)
    for ci, co, tap, o, rows, cols in _taps(x, Filter, groups, strides, dil):
        dx[:, ci] += dfull[:, o, rows, cols] * Filter[(ci, co) + tap]
        dw[(ci, co) + tap] += np.sum(dfull[:, o, rows, cols] * x[:, ci])
    if data_format == "NHWC":
        dx = dx.transpose(0, 2, 3, 1)
    return dx.astype(Input.dtype), dw.astype(Filter.dtype)


def _conv_t(name, x, w, **attrs):
    """A conv2d_transpose sample and a conv2d_transpose_grad sample, same geometry.

    Neither takes the unknown-batch check: it would make Filter's dim 0, the input channels,
    the batch dim too (test_conv_transpose.py checks an unknown batch on its own)."""
    dy = rand(*conv2d_transpose_ref(x, w, **attrs).shape, dtype=x.dtype, seed=5)
    return [Sample("conv2d_transpose", {"Input": x, "Filter": w}, conv2d_transpose_ref, attrs,
                   name=name, atol=1e-5, symbolic=False),
            Sample("conv2d_transpose_grad", {"Input": x, "Filter": w, "OutputGrad": dy},
                   conv2d_transpose_grad_ref, attrs, name=name, atol=1e-5, symbolic=False)]


SAMPLES = [
    *_conv_t("default", rand(1, 2, 3, 3), rand(2, 3, 2, 2, seed=1)),
    *_conv_t("stride_pad", rand(2, 2, 3, 4), rand(2, 2, 3, 3, seed=1), strides=[2, 2],
             paddings=[1, 1]),
    *_conv_t("pad4_dilation_output_padding", rand(1, 2, 3, 3), rand(2, 1, 2, 3, seed=1),
             strides=[2, 3], paddings=[1, 0, 0, 2], dilations=[2, 1], output_padding=[1, 2]),
    # above the inferred 7 x 3: the first extra row and column hold what the bottom and
    # right paddings crop, the second extra column is zero
    *_conv_t("output_size", rand(1, 1, 3, 2), rand(1, 2, 3, 2, seed=1), strides=[3, 3],
             paddings=[1, 1], output_size=[8, 5]),
    *_conv_t("same_ignores_dilations", rand(1, 2, 5, 4), rand(2, 1, 3, 2, seed=1),
             strides=[2, 3], dilations=[2, 2], padding_algorithm="SAME"),
    *_conv_t("valid_ignores_paddings", rand(1, 1, 3, 3), rand(1, 2, 2, 2, seed=1),
             strides=[2, 2], paddings=[1, 1], padding_algorithm="VALID"),
    *_conv_t("groups", rand(1, 4, 3, 3), rand(4, 2, 2, 2, seed=1), groups=2,
             strides=[2, 2], paddings=[1, 1]),
    *_conv_t("depthwise", rand(2, 3, 3, 3), rand(3, 1, 3, 3, seed=1),
             groups=3, strides=[2, 2], paddings=[1, 1]),
    *_conv_t("nhwc", rand(2, 3, 4, 2), rand(2, 3, 3, 2, seed=1), strides=[2, 1],
             paddings=[1, 0], output_padding=[1, 0], data_format="NHWC"),
    *_conv_t("float64", rand(1, 2, 3, 3, dtype="float64"),
             rand(2, 2, 2, 2, dtype="float64", seed=1), strides=[2, 2], paddings=[0, 1]),
]

INVALID = [
    Invalid("conv2d_transpose", {"Input": spec(2, 3, 8, 8), "Filter": spec(4, 2, 3, 3)},
            name="channels", expect=("Filter", "must be 3", "got 4")),
    Invalid("conv2d_transpose", {"Input": spec(2, 8, 8, 3), "Filter": spec(4, 2, 3, 3)},
            attrs={"data_format": "NHWC"}, name="channels_nhwc",
            expect=("Filter", "must be 3", "NHWC", "got 4")),
    Invalid("conv2d_transpose", {"Input": spec(2, 64), "Filter": spec(2, 2, 3, 3)},
            name="flat_input", expect=("Input", "rank 4", "float32[2, 64]")),
    Invalid("conv2d_transpose", {"Input": spec(1, 3, 4, 4), "Filter": spec(3, 2, 3, 3)},
            attrs={"groups": 2}, name="groups", expect=("Input", "groups=2", "3 channels")),
    Invalid("conv2d_transpose", {"Input": spec(1, 2, 4, 4), "Filter": spec(2, 2, 3, 3)},
            attrs={"strides": [2, 2], "output_size": [12, 9]}, name="output_size",
            expect=("output_size=[12, 9]", "from 9 to 10", "float32[1, 2, 4, 4]")),
    Invalid("conv2d_transpose", {"Input": spec(1, 2, 4, 4), "Filter": spec(2, 2, 3, 3)},
            attrs={"strides": [2, 2], "output_padding": [2, 0]}, name="output_padding",
            expect=("output_padding=[2, 0]", "max(stride, dilation) = 2")),
    Invalid("conv2d_transpose", {"Input": spec(1, 2, 1, 1), "Filter": spec(2, 2, 1, 1)},
            attrs={"paddings": [1, 0]}, name="cropped_away",
            expect=("paddings [1, 1]", "float32[1, 2, 1, 1]")),
]
