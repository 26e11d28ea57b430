"""Samples of lowering/ops/conv_transpose.py (2-D and 3-D). The reference scatters: every
input pixel adds its value times its filter slice into a full-size output at stride
`strides`, which is then cropped by the paddings (PaddlePaddle's definition of the
transposed convolution); the gradient reference reads the same scatter backwards."""
import itertools

import numpy as np

from op_table import Invalid, Sample, rand, spec


def _setup(Input, Filter, strides, paddings, output_padding, output_size, dilations,
           padding_algorithm, data_format):
    """(channels-first float64 input, low crops, dilations, output size, full buffer size),
    one entry per spatial dim."""
    x = Input.astype(np.float64)
    if data_format == "NHWC":
        x = np.moveaxis(x, -1, 1)
    spatial, kernel = x.shape[2:], Filter.shape[2:]
    n = len(spatial)
    if padding_algorithm == "VALID":
        pads = [(0, 0)] * n
    elif padding_algorithm == "SAME":   # as a forward convolution of x would pad
        dilations, pads = (1,) * n, []
        for size, k, s in zip(spatial, kernel, strides):
            total = max((int(np.ceil(size / s)) - 1) * s + k - size, 0)
            pads.append((total // 2, total - total // 2))
    elif len(paddings) == n:
        pads = [(p, p) for p in paddings]
    else:
        pads = list(zip(paddings[::2], paddings[1::2]))
    full = [(size - 1) * s + d * (k - 1) + 1
            for size, k, s, d in zip(spatial, kernel, strides, dilations)]
    out = [f - lo - hi for f, (lo, hi) in zip(full, pads)]
    if output_size:
        out = list(output_size)
    elif output_padding:
        out = [o + p for o, p in zip(out, output_padding)]
    buffer = [max(f, lo + o) for f, (lo, _), o in zip(full, pads, out)]
    return x, [lo for lo, _ in pads], tuple(dilations), out, buffer


def _taps(x, Filter, groups, strides, dilations):
    """Every (input channel, output channel, filter position, buffer slices it reaches)."""
    C, Og = Filter.shape[:2]
    for ci, co in itertools.product(range(C), range(Og)):
        o = (ci // (C // groups)) * Og + co
        for tap in np.ndindex(*Filter.shape[2:]):
            reach = tuple(slice(t * d, t * d + (size - 1) * s + 1, s)
                          for t, d, s, size in zip(tap, dilations, strides, x.shape[2:]))
            yield ci, co, tap, o, reach


def _window(lows, sizes):
    return tuple(slice(lo, lo + size) for lo, size in zip(lows, sizes))


def conv2d_transpose_ref(Input, Filter, strides=(1, 1), paddings=(0, 0), output_padding=(),
                         output_size=(), dilations=(1, 1), groups=1,
                         padding_algorithm="EXPLICIT", data_format="NCHW"):
    x, lows, dil, out_size, buffer = _setup(
        Input, Filter, strides, paddings, output_padding, output_size, dilations,
        padding_algorithm, data_format)
    full = np.zeros((x.shape[0], Filter.shape[1] * groups, *buffer))
    for ci, co, tap, o, reach in _taps(x, Filter, groups, strides, dil):
        full[(slice(None), o) + reach] += x[:, ci] * Filter[(ci, co) + tap]
    out = full[(Ellipsis,) + _window(lows, out_size)]
    if data_format == "NHWC":
        out = np.moveaxis(out, 1, -1)
    return out.astype(Input.dtype)


def conv2d_transpose_grad_ref(Input, Filter, OutputGrad, strides=(1, 1), paddings=(0, 0),
                              output_padding=(), output_size=(), dilations=(1, 1), groups=1,
                              padding_algorithm="EXPLICIT", data_format="NCHW"):
    x, lows, dil, out_size, buffer = _setup(
        Input, Filter, strides, paddings, output_padding, output_size, dilations,
        padding_algorithm, data_format)
    dy = OutputGrad.astype(np.float64)
    if data_format == "NHWC":
        dy = np.moveaxis(dy, -1, 1)
    dfull = np.zeros(dy.shape[:2] + tuple(buffer))
    dfull[(Ellipsis,) + _window(lows, out_size)] = dy
    dx, dw = np.zeros_like(x), np.zeros(Filter.shape)
    for ci, co, tap, o, reach in _taps(x, Filter, groups, strides, dil):
        dx[:, ci] += dfull[(slice(None), o) + reach] * Filter[(ci, co) + tap]
        dw[(ci, co) + tap] += np.sum(dfull[(slice(None), o) + reach] * x[:, ci])
    if data_format == "NHWC":
        dx = np.moveaxis(dx, 1, -1)
    return dx.astype(Input.dtype), dw.astype(Filter.dtype)


def _conv_t(name, x, w, op="conv2d_transpose", **attrs):
    """A transposed convolution sample and a sample of its gradient op, same geometry
    (the references serve both ranks; 3-D samples give strides, paddings and dilations).

    Neither takes the unknown-batch check: it would make Filter's dim 0, the input channels,
    the batch dim too (test_conv_transpose.py checks an unknown batch on its own)."""
    dy = rand(*conv2d_transpose_ref(x, w, **attrs).shape, dtype=x.dtype, seed=5)
    return [Sample(op, {"Input": x, "Filter": w}, conv2d_transpose_ref, attrs,
                   name=name, atol=1e-5, symbolic=False),
            Sample(f"{op}_grad", {"Input": x, "Filter": w, "OutputGrad": dy},
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
    *_conv_t("default", rand(1, 2, 2, 2, 3), rand(2, 2, 2, 1, 2, seed=1), op="conv3d_transpose",
             strides=[1, 1, 1], paddings=[0, 0, 0], dilations=[1, 1, 1]),
    *_conv_t("stride_pad6_output_size", rand(1, 1, 2, 3, 2), rand(1, 2, 2, 2, 3, seed=1),
             op="conv3d_transpose", strides=[2, 1, 2], paddings=[1, 0, 0, 1, 1, 1],
             dilations=[1, 2, 1], output_size=[3, 4, 4]),
    *_conv_t("groups_ndhwc", rand(1, 2, 2, 2, 4), rand(4, 1, 2, 2, 1, seed=1),
             op="conv3d_transpose", strides=[2, 2, 1], paddings=[0, 0, 0], dilations=[1, 1, 1],
             groups=2, data_format="NHWC", output_padding=[1, 0, 0]),
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
