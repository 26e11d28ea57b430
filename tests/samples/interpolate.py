"""Samples of lowering/ops/interpolate.py. The reference follows PaddlePaddle's interpolation
formulas point by point: each output element is a list of (input position, weight) taps
(products of per-axis taps), which the forward reference gathers and the gradient
reference scatters. Positions and weights are float32 as PaddlePaddle computes them, or
float64 for float64 linear and bicubic."""
import itertools
import math

import numpy as np

from op_table import Invalid, Sample, rand, spec

F32 = np.float32


def _cubic(t, one):
    """Keys' cubic convolution weights (A = -0.75) of the neighbours at -1, 0, 1, 2 from
    fraction t, in the precision of `one`."""
    a = -0.75 * one

    def w(d):   # the kernel at distance d >= 0
        if d <= 1:
            return ((a + 2) * d - (a + 3)) * d * d + 1
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return [w(t + one), w(t), w(one - t), w(2 * one - t)]


def _axis_taps(n, m, scale, method, align_corners, align_mode, dtype):
    """For each of the `m` output indices: [(input index, weight), ...] along one axis."""
    if m == 1 and (align_corners or method not in ("linear", "trilinear")):
        ratio = F32(0)
    elif align_corners:
        ratio = F32(n - 1) / F32(m - 1)
    elif scale is not None:
        ratio = F32(1.0 / float(F32(scale)))
    else:
        ratio = F32(n) / F32(m)
    wide = np.float64 if method in ("linear", "bicubic") and dtype == np.float64 else F32
    one = wide(1)
    taps = []
    for k in range(m):
        pos = wide(ratio * F32(k))                  # a float32 product
        half = float(ratio) * (k + 0.5) - 0.5       # in double
        if method == "nearest":
            i = int(float(pos) + 0.5) if align_corners else int(pos)
            taps.append([(min(i, n - 1), one)])
        elif method == "bicubic":
            src = pos if align_corners else wide(half)
            base = math.floor(F32(src))
            taps.append([(min(max(base + i - 1, 0), n - 1), w)
                         for i, w in enumerate(_cubic(src - wide(base), one))])
        else:
            if align_mode == 0 and not align_corners:   # half-pixel centres
                low = max(int(half), 0)
                frac = max(wide(half), wide(0)) - wide(low)
            else:
                low = max(int(pos), 0)
                frac = pos - wide(low)
            taps.append([(low, one - frac), (min(low + 1, n - 1), frac)])
    return taps


def _point_taps(X, data_layout="NCHW", out_d=-1, out_h=-1, out_w=-1, scale=(),
                interp_method="bilinear", align_corners=True, align_mode=1):
    """(channels-first float64 input, output spatial size, {output position: [(input
    position, weight), ...]})."""
    x = X.astype(np.float64)
    if data_layout == "NHWC":
        x = np.moveaxis(x, -1, 1)
    spatial = x.shape[2:]
    scales = tuple(scale) or (None,) * len(spatial)
    wanted = (out_d, out_h, out_w)[3 - len(spatial):]
    sizes = [int(F32(n) * F32(s)) if s is not None else o
             for n, s, o in zip(spatial, scales, wanted)]
    if tuple(sizes) == spatial:
        return x, sizes, {p: [(p, 1.0)] for p in np.ndindex(*spatial)}
    per_axis = [_axis_taps(n, m, s, interp_method, align_corners, align_mode, X.dtype)
                for n, m, s in zip(spatial, sizes, scales)]
    taps = {}
    for p in np.ndindex(*sizes):
        taps[p] = [(tuple(i for i, _ in combo), math.prod(float(w) for _, w in combo))
                   for combo in itertools.product(*(axis[k] for axis, k in zip(per_axis, p)))]
    return x, sizes, taps


def _layout(a, data_layout):
    return np.moveaxis(a, 1, -1) if data_layout == "NHWC" else a


def interpolate_ref(X, **attrs):
    x, sizes, taps = _point_taps(X, **attrs)
    out = np.zeros(x.shape[:2] + tuple(sizes))
    for p, point in taps.items():
        for i, weight in point:
            out[(Ellipsis,) + p] += x[(Ellipsis,) + i] * weight
    return _layout(out, attrs.get("data_layout", "NCHW")).astype(X.dtype)


def interpolate_grad_ref(X, OutGrad, **attrs):
    x, _, taps = _point_taps(X, **attrs)
    layout = attrs.get("data_layout", "NCHW")
    dy = OutGrad.astype(np.float64)
    dy = np.moveaxis(dy, -1, 1) if layout == "NHWC" else dy
    dx = np.zeros_like(x)
    for p, point in taps.items():
        for i, weight in point:
            dx[(Ellipsis,) + i] += dy[(Ellipsis,) + p] * weight
    return _layout(dx, layout).astype(X.dtype)


def _interp(name, x, zero_x_grad=False, **attrs):
    """An interpolate sample and an interpolate_grad sample, same geometry. The gradient
    checks of interpolate_grad take its X (whose gradient is zero: it only gives the
    shape) where `zero_x_grad`, else only its OutGrad, to keep finite differences short."""
    dy = rand(*interpolate_ref(x, **attrs).shape, dtype=x.dtype, seed=5)
    return [Sample("interpolate", {"X": x}, interpolate_ref, attrs, name=name),
            Sample("interpolate_grad", {"X": x, "OutGrad": dy}, interpolate_grad_ref, attrs,
                   name=name, grad_slots=None if zero_x_grad else ("OutGrad",))]


_HALF_PIXEL = dict(interp_method="bilinear", align_corners=False, align_mode=0)
SAMPLES = [
    # PaddlePaddle's F.interpolate(mode="nearest"): floor(k * in / out)
    *_interp("nearest_up", rand(2, 2, 3, 4), interp_method="nearest", align_corners=False,
             out_h=7, out_w=6),
    *_interp("nearest_scale_down", rand(1, 2, 7, 5), interp_method="nearest",
             align_corners=False, scale=[0.6, 0.5]),
    # old fluid resize_nearest: align_corners rounds k * (in - 1) / (out - 1) half up
    *_interp("nearest_align_corners", rand(1, 1, 4, 5), interp_method="nearest",
             out_h=7, out_w=3),
    *_interp("bilinear_half_pixel", rand(2, 2, 3, 4), out_h=7, out_w=5, zero_x_grad=True,
             **_HALF_PIXEL),
    *_interp("bilinear_half_pixel_down", rand(1, 1, 7, 6), out_h=3, out_w=4, **_HALF_PIXEL),
    # the ratio is 1 / scale, not in / out: int(5 * 1.7) = 8 rows of step 1 / 1.7
    *_interp("bilinear_scale_asymmetric", rand(1, 2, 5, 3), interp_method="bilinear",
             align_corners=False, align_mode=1, scale=[1.7, 2.0]),
    *_interp("bilinear_align_corners", rand(1, 2, 4, 6), out_h=6, out_w=4),
    *_interp("bilinear_to_one_row", rand(1, 1, 4, 3), out_h=1, out_w=5, **_HALF_PIXEL),
    *_interp("bilinear_nhwc", rand(1, 3, 4, 2), out_h=5, out_w=7, data_layout="NHWC",
             **_HALF_PIXEL),
    *_interp("same_size_is_identity", rand(1, 2, 3, 3), out_h=3, out_w=3, **_HALF_PIXEL),
    *_interp("float64", rand(1, 2, 3, 4, dtype="float64"), out_h=5, out_w=6, **_HALF_PIXEL),
    *_interp("linear", rand(2, 3, 5), interp_method="linear", out_w=8, align_corners=False,
             align_mode=0),
    # PaddlePaddle's linear keeps the ratio of a 1-long output: the middle of 7
    *_interp("linear_to_one", rand(1, 2, 7), interp_method="linear", out_w=1,
             align_corners=False, align_mode=0),
    *_interp("linear_nwc_float64_scale", rand(1, 4, 2, dtype="float64"),
             interp_method="linear", scale=[1.7], data_layout="NHWC", align_corners=False,
             align_mode=1),
    *_interp("trilinear", rand(1, 1, 2, 3, 4), interp_method="trilinear", out_d=3, out_h=2,
             out_w=5, align_corners=False, align_mode=0),
    *_interp("trilinear_align_corners_ndhwc", rand(1, 2, 2, 2, 2), interp_method="trilinear",
             out_d=2, out_h=3, out_w=3, data_layout="NHWC"),
    *_interp("nearest_3d", rand(1, 1, 2, 3, 4), interp_method="nearest", scale=[2.0, 1.0, 0.5],
             align_corners=False),
    *_interp("bicubic", rand(1, 1, 4, 5), interp_method="bicubic", out_h=7, out_w=3,
             align_corners=False, zero_x_grad=True),
    *_interp("bicubic_align_corners_float64", rand(1, 1, 3, 4, dtype="float64"),
             interp_method="bicubic", out_h=5, out_w=6),
]

INVALID = [
    Invalid("interpolate", {"X": spec(2, 3, 8)}, attrs={"out_h": 4, "out_w": 4},
            name="rank", expect=("X", "rank 4", "float32[2, 3, 8]")),
    Invalid("interpolate", {"X": spec(2, 3, 8, 8)}, name="no_size",
            expect=("X", "float32[2, 3, 8, 8]", "[-1, -1]", "at least 1")),
    Invalid("interpolate", {"X": spec(2, 3, 4, 8)}, attrs={"scale": [0.2, 1.0]},
            name="scaled_to_nothing", expect=("X", "[0, 8]", "scale=[0.2, 1.0]")),
    Invalid("interpolate", {"X": spec(2, 3, 8, 8)}, attrs={"scale": [2.0]},
            name="one_scale", expect=("X", "scale=[2.0]", "one value per spatial dim")),
    Invalid("interpolate", {"X": spec(2, 3, 8, 8, 8)}, attrs={"out_d": 4, "out_h": 4,
                                                              "out_w": 4},
            name="bilinear_of_3d",
            expect=("X", "rank 4", "'bilinear'", "float32[2, 3, 8, 8, 8]")),
]
