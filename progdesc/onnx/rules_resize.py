"""Resize: nearest, linear and cubic resampling, every coordinate transformation mode.

The sizes, scales (and roi) must be known at import, and so must the input's dims along
the resized axes: then the source positions of every output index are fixed, and the
resampling along one axis is a gather (nearest) or a sum of gathers of the neighbours
times constant weights (linear, cubic, antialiased): linear in X, so it differentiates.
Axes are resampled one after the other, as ONNX's reference does.
"""
import math

import numpy as np

from progdesc.onnx.table import RULES
from progdesc.translate import Unsupported

_MODES = ("nearest", "linear", "cubic")
_TRANSFORMS = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
               "asymmetric", "tf_crop_and_resize")
_NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def source_positions(transform, n_out, n_in, scale, roi):
    """The input position (float64) each of the `n_out` output indices samples, and which
    fall outside the input (tf_crop_and_resize; else None)."""
    x = np.arange(n_out, dtype=np.float64)
    width = scale * n_in   # as a float, as ONNX's reference uses it
    outside = None
    if transform == "align_corners":
        pos = np.zeros(n_out) if width == 1 else x * (n_in - 1) / (width - 1)
    elif transform == "asymmetric":
        pos = x / scale
    elif transform == "tf_crop_and_resize":
        lo, hi = roi
        if width == 1:
            pos = np.full(n_out, (hi - lo) * (n_in - 1) / 2)
        else:
            pos = x * (hi - lo) * (n_in - 1) / (width - 1)
        pos = pos + lo * (n_in - 1)
        outside = (pos < 0) | (pos > n_in - 1)
    elif transform == "pytorch_half_pixel":
        pos = np.full(n_out, -0.5) if width == 1 else (x + 0.5) / scale - 0.5
    elif transform == "half_pixel":
        pos = (x + 0.5) / scale - 0.5
    else:   # half_pixel_symmetric
        offset = n_in / 2 * (1 - n_out / width)
        pos = offset + (x + 0.5) / scale - 0.5
    return pos, outside


def nearest_indices(pos, n_in, nearest_mode):
    """The input index nearest to each position, ties and rounding by `nearest_mode`."""
    if nearest_mode == "round_prefer_floor":
        idx = np.ceil(pos - 0.5)
    elif nearest_mode == "round_prefer_ceil":
        idx = np.floor(pos + 0.5)
    elif nearest_mode == "floor":
        idx = np.floor(pos)
    else:
        idx = np.ceil(pos)
    return np.clip(idx, 0, n_in - 1).astype(np.int64)


def _cubic(d, a):
    """Keys' cubic convolution kernel with coefficient `a` at distances `d`."""
    d = np.abs(d)
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


def interpolation_taps(pos, n_in, mode, scale, *, cubic_a=-0.75, antialias=False,
                       exclude_outside=False):
    """(indices, weights), both [len(pos), taps]: output i is sum_j weights[i, j] *
    input[indices[i, j]] (neighbours beyond the input read its edge). An antialiased
    kernel is stretched by 1 / scale when downsampling."""
    stretch = min(scale, 1.0) if antialias else 1.0
    support = 1 if mode == "linear" else 2
    start = int(math.floor(-support / stretch) + 1)
    taps = 2 - 2 * start
    whole = np.floor(pos)
    integral = pos == whole
    # ONNX's reference takes an integral position as ratio 1 from the index below it
    base = np.where(integral, whole - 1, whole).astype(np.int64)
    ratio = np.where(integral, 1.0, pos - whole)
    offsets = np.arange(start, start + taps)
    dist = (offsets[None, :] - ratio[:, None]) * stretch
    if mode == "linear":
        coeffs = np.clip(1 - np.abs(dist), 0, 1)
    else:
        coeffs = _cubic(dist, cubic_a)
    if antialias:
        coeffs = coeffs / coeffs.sum(axis=1, keepdims=True)
    idx = base[:, None] + offsets[None, :]
    if exclude_outside:
        coeffs = np.where((idx < 0) | (idx >= n_in), 0.0, coeffs)
        total = coeffs.sum(axis=1, keepdims=True)
        coeffs = coeffs / np.where(total == 0, 1.0, total)
    return np.clip(idx, 0, n_in - 1), coeffs


def _floats(t, name, what):
    if name is None:
        return None
    value = t.value_of(name)
    if value is None:
        raise Unsupported(f"its {what} are computed at run time")
    value = np.asarray(value, np.float64).reshape(-1)
    return value if value.size else None


def _plan(t, x, roi, scales, sizes, axes, keep_aspect_ratio_policy, crop):
    """[(axis, input size, scale, output size, roi pair)] for the axes resized: those whose
    scale is not 1 or whose size changes. An axis of unknown size may be left as it is
    (scale 1, or its own symbolic size in `sizes`), not resized. The roi only matters when
    `crop` (tf_crop_and_resize)."""
    dims = t.dims(x)
    rank = len(dims)
    axes = list(range(rank)) if axes is None else [int(a) % rank for a in axes]
    scale_values = _floats(t, scales, "scales")
    size_values = None
    if sizes is not None and scale_values is None:
        size_values = t.sizes_of(sizes)
        if size_values is None:
            raise Unsupported("its sizes are computed at run time")
        size_values = size_values or None
    if scale_values is None and size_values is None:
        raise Unsupported("neither scales nor sizes")
    given = scale_values if scale_values is not None else size_values
    if len(given) != len(axes):
        raise Unsupported(f"{len(given)} scales or sizes for {len(axes)} axes")
    roi_values = _floats(t, roi, "roi") if crop else None
    rois = [(0.0, 1.0)] * len(axes)
    if roi_values is not None:
        n = len(roi_values) // 2
        if n == rank:
            rois = [(roi_values[a], roi_values[a + n]) for a in axes]
        elif n == len(axes):
            rois = [(roi_values[i], roi_values[i + n]) for i in range(n)]
        else:
            raise Unsupported(f"roi of {len(roi_values)} values for a {rank}-D input")
    if size_values is not None:
        kept = [s == dims[a] for a, s in zip(axes, size_values)]   # symbolic dims too
        changed = [(a, s) for (a, s), k in zip(zip(axes, size_values), kept) if not k]
        if any(not isinstance(dims[a], int) or not isinstance(s, int) for a, s in changed):
            raise Unsupported(f"sizes {list(size_values)} for an input of dims {list(dims)}, "
                              "not all known at import")
        factors = [1.0 if k else s / dims[a] for a, s, k in zip(axes, size_values, kept)]
        if keep_aspect_ratio_policy in ("not_larger", "not_smaller"):
            if any(not isinstance(dims[a], int) for a in axes):
                raise Unsupported(f"keep_aspect_ratio_policy={keep_aspect_ratio_policy!r} "
                                  f"over dims unknown at import ({list(dims)})")
            pick = min if keep_aspect_ratio_policy == "not_larger" else max
            factor = pick(factors)
            factors = [factor] * len(axes)
            size_values = [int(factor * dims[a] + 0.5) for a in axes]
        elif keep_aspect_ratio_policy != "stretch":
            raise Unsupported(f"keep_aspect_ratio_policy={keep_aspect_ratio_policy!r}")
        outs = [dims[a] if k else int(s) for a, s, k in zip(axes, size_values, kept)]
    else:
        factors = [float(s) for s in scale_values]
        if any(f <= 0 for f in factors):
            raise Unsupported(f"scales {factors}")
        outs = []
        for a, f in zip(axes, factors):
            if isinstance(dims[a], int):
                outs.append(int(f * dims[a]))
            elif f == 1.0:
                outs.append(dims[a])
            else:
                raise Unsupported(f"resizing axis {a}, of a size unknown at import")
    plan = []
    for a, f, n_out, pair in zip(axes, factors, outs, rois):
        if math.isclose(f, 1.0) and n_out == dims[a] and (not crop or pair == (0.0, 1.0)):
            continue
        if not isinstance(dims[a], int):
            raise Unsupported(f"resizing axis {a}, of a size unknown at import")
        plan.append((a, dims[a], f, n_out, pair))
    return plan


def _weighted_gathers(t, x, axis, along, dtype, indices, weights):
    """sum over taps j of x gathered at indices[:, j] along `axis`, times weights[:, j]."""
    total = None
    for j in range(indices.shape[1]):
        if not weights[:, j].any():
            continue
        term = t.call("gather", x, t.constant(indices[:, j].astype(np.int32)), axis=axis)
        term = t.call("mul", term, t.constant(weights[:, j].astype(dtype).reshape(along)))
        total = term if total is None else t.call("add", total, term)
    return total


@RULES.rule("Resize", since=13)
def resize(t, x, roi=None, scales=None, sizes=None, *, antialias=0, axes=None,
           coordinate_transformation_mode="half_pixel", cubic_coeff_a=-0.75, exclude_outside=0,
           extrapolation_value=0.0, keep_aspect_ratio_policy="stretch", mode="nearest",
           nearest_mode="round_prefer_floor"):
    if mode not in _MODES:
        raise Unsupported(f"mode={mode!r}")
    if coordinate_transformation_mode not in _TRANSFORMS:
        raise Unsupported(f"coordinate_transformation_mode={coordinate_transformation_mode!r}")
    if nearest_mode not in _NEAREST:
        raise Unsupported(f"nearest_mode={nearest_mode!r}")
    dtype = t.var(x)[1]
    if mode != "nearest" and not dtype.startswith(("float", "bfloat")):
        raise Unsupported(f"{mode} resizing of {dtype} values")
    crop = coordinate_transformation_mode == "tf_crop_and_resize"
    rank = len(t.var(x)[0])
    for axis, n_in, factor, n_out, roi_pair in _plan(t, x, roi, scales, sizes, axes,
                                                     keep_aspect_ratio_policy, crop):
        pos, outside = source_positions(coordinate_transformation_mode, n_out, n_in, factor,
                                         roi_pair)
        along = [-1] + [1] * (rank - 1 - axis)   # a vector along `axis`, broadcast
        if mode == "nearest":
            index = nearest_indices(pos, n_in, nearest_mode)
            x = t.call("gather", x, t.constant(index.astype(np.int32)), axis=axis)
        else:
            x = _weighted_gathers(t, x, axis, along, dtype, *interpolation_taps(
                pos, n_in, mode, factor, cubic_a=float(cubic_coeff_a),
                antialias=bool(antialias), exclude_outside=bool(exclude_outside)))
        if outside is not None and outside.any():
            keep = (~outside).astype(dtype).reshape(along)
            fill = np.where(outside, float(extrapolation_value), 0.0).astype(dtype)
            x = t.call("add", t.call("mul", x, t.constant(keep)),
                       t.constant(fill.reshape(along)))
    return x
