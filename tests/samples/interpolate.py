"""Samples of lowering/ops/interpolate.py. The reference follows PaddlePaddle's interpolation
formulas pixel by pixel: each output pixel is a list of (input pixel, weight) taps, which
the forward reference gathers and the gradient reference scatters. Positions and weights
are float32, as PaddlePaddle computes them."""
import itertools

import numpy as np

from op_table import Invalid, Sample, rand, spec

F32 = np.float32


def _out_size(n, size, scale):
    return int(F32(n) * F32(scale)) if scale is not None else size


def _axis_taps(n, m, scale, method, align_corners, align_mode):
    """For each of the `m` output indices: [(input index, weight), ...] along one axis."""
    if m == 1:
        ratio = F32(0)
    elif align_corners:
        ratio = F32(n - 1) / F32(m - 1)
    elif scale is not None:
        ratio = F32(1.0 / float(F32(scale)))
    else:
        ratio = F32(n) / F32(m)
    taps = []
    for k in range(m):
        pos = ratio * F32(k)                        # float32 product
        if method == "nearest":
            i = int(float(pos) + 0.5) if align_corners else int(pos)
            taps.append([(min(i, n - 1), F32(1))])
            continue
        if align_mode == 0 and not align_corners:   # half-pixel centres
            src = float(ratio) * (k + 0.5) - 0.5
            low = max(int(src), 0)
            frac = F32(max(F32(src), F32(0))) - F32(low)
        else:
            low = max(int(pos), 0)
            frac = pos - F32(low)
        taps.append([(low, F32(1) - frac), (min(low + 1, n - 1), frac)])
    return taps


def _pixel_taps(X, data_layout="NCHW", out_h=-1, out_w=-1, scale=(), interp_method="bilinear",
                align_corners=True, align_mode=1):
    """(NCHW float64 input, output (H, W), {(k, l): [((i, j), weight), ...]})."""
    x = X.astype(np.float64)
    if data_layout == "NHWC":
        x = x.transpose(0, 3, 1, 2)
    H, W = x.shape[2:]
    sh, sw = scale if scale else (None, None)
    Ho, Wo = _out_size(H, out_h, sh), _out_size(W, out_w, sw)
    if (Ho, Wo) == (H, W):
        return x, (H, W), {(k, l): [((k, l), 1.0)] for k, l in np.ndindex(H, W)}
    rows = _axis_taps(H, Ho, sh, interp_method, align_corners, align_mode)
    cols = _axis_taps(W, Wo, sw, interp_method, align_corners, align_mode)
    return x, (Ho, Wo), {(k, l): [((i, j), float(a) * float(b))
                                  for (i, a), (j, b) in itertools.product(rows[k], cols[l])]
                         for k, l in np.ndindex(Ho, Wo)}


def _layout(a, data_layout):
    return a.transpose(0, 2, 3, 1) if data_layout == "NHWC" else a


def interpolate_ref(X, **attrs):
    x, (Ho, Wo), taps = _pixel_taps(X, **attrs)
    out = np.zeros(x.shape[:2] + (Ho, Wo))
    for (k, l), pixel in taps.items():
        for (i, j), weight in pixel:
            out[:, :, k, l] += x[:, :, i, j] * weight
    return _layout(out, attrs.get("data_layout", "NCHW")).astype(X.dtype)


def interpolate_grad_ref(X, OutGrad, **attrs):
    x, _, taps = _pixel_taps(X, **attrs)
    layout = attrs.get("data_layout", "NCHW")
    dy = OutGrad.astype(np.float64)
    dy = dy.transpose(0, 3, 1, 2) if layout == "NHWC" else dy
    dx = np.zeros_like(x)
    for (k, l), pixel in taps.items():
        for (i, j), weight in pixel:
            dx[:, :, i, j] += dy[:, :, k, l] * weight
    return _layout(dx, layout).astype(X.dtype)


def _interp(name, x, **attrs):
    """An interpolate sample and an interpolate_grad sample, same geometry."""
    dy = rand(*interpolate_ref(x, **attrs).shape, dtype=x.dtype, seed=5)
    return [Sample("interpolate", {"X": x}, interpolate_ref, attrs, name=name),
            Sample("interpolate_grad", {"X": x, "OutGrad": dy}, interpolate_grad_ref, attrs,
                   name=name)]


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
    *_interp("bilinear_half_pixel", rand(2, 2, 3, 4), out_h=7, out_w=5, **_HALF_PIXEL),
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
]

INVALID = [
    Invalid("interpolate", {"X": spec(2, 3, 8)}, attrs={"out_h": 4, "out_w": 4},
            name="rank", expect=("X", "rank 4", "float32[2, 3, 8]")),
    Invalid("interpolate", {"X": spec(2, 3, 8, 8)}, name="no_size",
            expect=("X", "float32[2, 3, 8, 8]", "[-1, -1]", "at least 1")),
    Invalid("interpolate", {"X": spec(2, 3, 4, 8)}, attrs={"scale": [0.2, 1.0]},
            name="scaled_to_nothing", expect=("X", "[0, 8]", "scale=[0.2, 1.0]")),
    Invalid("interpolate", {"X": spec(2, 3, 8, 8)}, attrs={"scale": [2.0]},
            name="one_scale", expect=("X", "scale=[2.0]", "(scale_h, scale_w)")),
]
