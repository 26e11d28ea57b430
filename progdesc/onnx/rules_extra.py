"""Less common ops of the default domain, each mapped onto ops we have: GridSample,
AffineGrid, RoiAlign (sampling, via `grid_sample`), DeformConv, Col2Im and MaxUnpool
(scatters with indices known at import or fed), CenterCropPad, ReverseSequence,
CumProd, BitCast, SwiGLU.

Sizes that shape the result (AffineGrid's size, Col2Im's image and block shapes,
CenterCropPad's shape, MaxUnpool's output_shape) must be known at import (a constant,
or a graph input the backend binds); RoiAlign needs a fixed sampling_ratio. Refused:
GridSample's cubic mode and 5-D inputs (our grid_sample is 2-D, bilinear or nearest),
BitCast from or to a 64-bit type (computed as 32 bits here).
"""
import itertools

import numpy as np

from progdesc.onnx import model as onnx_model
from progdesc.onnx.rules_quantize import onnx_dtype
from progdesc.onnx.shape_args import axis_of, ints_of
from progdesc.onnx.table import RULES
from progdesc.translate import Unsupported


def _known_dims(t, name, what):
    dims = t.dims(name)
    if not all(isinstance(d, int) for d in dims):
        raise Unsupported(f"{what} has dims {dims}, not all known at import")
    return dims


def _np_dtype(t, name):
    return onnx_model.as_numpy_dtype(t.var(name)[1])


# --- elementwise and scans ---
@RULES.rule("SwiGLU", since=28)
def swiglu(t, a, b, *, alpha=1.0):
    gate = (t.call("silu", a) if alpha == 1.0 else
            t.call("mul", a, t.call("sigmoid", t.call("scale", a, scale=float(alpha)))))
    return t.call("mul", gate, b)


@RULES.rule("CumProd", since=26)
def cumprod(t, x, axis, *, exclusive=0, reverse=0):
    axes = ints_of(t, axis, "axis")
    if len(axes) != 1:
        raise Unsupported(f"axis {axes}: one axis")
    rank = len(t.var(x)[0])
    axis = axis_of(axes[0], rank)
    if exclusive:   # x shifted by one along the axis (a one in, the last element out)
        config = [0] * (3 * rank)
        config[3 * axis:3 * axis + 2] = (-1, 1) if reverse else (1, -1)
        one = t.constant(np.ones((), _np_dtype(t, x)))
        x = t.call("pad", x, one, padding_config=config)
    return t.call("cumprod", x, axis=axis, reverse=bool(reverse))


_WIDE = ("int64", "uint64", "float64")


@RULES.rule("BitCast", since=26)
def bitcast(t, x, *, to):
    source, target = t.var(x)[1], onnx_dtype(to, "to")
    if source in _WIDE or target in _WIDE:
        raise Unsupported(f"BitCast {source} -> {target}: 64-bit types compute as 32 bits "
                          "here, their bits are not held")
    if target == "bool":
        raise Unsupported(f"BitCast {source} -> bool: a byte other than 0 or 1 is no bool")
    if source == "bool":   # a bool's byte is 0 or 1
        if target not in ("uint8", "int8"):
            raise Unsupported(f"BitCast bool -> {target}: of another width")
        return t.call("cast", x, dtype=target)
    if source == target:
        return t.call("assign", x)
    return t.call("bitcast", x, dtype=target)


@RULES.rule("ReverseSequence")
def reverse_sequence(t, x, lens, *, batch_axis=1, time_axis=0):
    dims = _known_dims(t, x, "the input")
    rank = len(dims)
    batch_axis, time_axis = axis_of(batch_axis, rank), axis_of(time_axis, rank)
    if {batch_axis, time_axis} != {0, 1}:
        raise Unsupported(f"batch_axis {batch_axis}, time_axis {time_axis}: 0 and 1")
    dtype = t.var(lens)[1]
    time = t.call("iota", shape=dims, dtype=dtype, dimension=time_axis)
    lens = t.call("reshape", lens,
                  shape=[dims[batch_axis] if a == batch_axis else 1 for a in range(rank)])
    one = t.constant(np.ones((), onnx_model.as_numpy_dtype(dtype)))
    reversed_time = t.call("sub", t.call("sub", lens, one), time)
    index = t.call("where", t.call("less_than", time, lens), reversed_time, time)
    return t.call("take_along_axis", x, index, axis=time_axis)


# --- crops and scatters ---
@RULES.rule("CenterCropPad", since=18)
def center_crop_pad(t, x, shape, *, axes=None):
    dims = _known_dims(t, x, "the input")
    rank = len(dims)
    axes = list(range(rank)) if axes is None else [axis_of(a, rank) for a in axes]
    sizes = ints_of(t, shape, "shape")
    if len(sizes) != len(axes):
        raise Unsupported(f"shape {sizes} for axes {axes}")
    starts, ends, config, cropped = [], [], [0] * (3 * rank), []
    for axis, size in zip(axes, sizes):
        have = dims[axis]
        if size < have:
            start = (have - size) // 2
            cropped.append(axis)
            starts.append(start)
            ends.append(start + size)
        elif size > have:
            before = (size - have) // 2
            config[3 * axis:3 * axis + 2] = (before, size - have - before)
    if cropped:
        x = t.call("slice", x, axes=cropped, starts=starts, ends=ends)
    if any(config):
        zero = t.constant(np.zeros((), _np_dtype(t, x)))
        x = t.call("pad", x, zero, padding_config=config)
    return x if cropped or any(config) else t.call("assign", x)


def _scatter_into(t, dims, dtype, flat_index, updates, window_rank):
    """zeros of `dims` (the scattered dim last) with `updates` ([window..., M]) added at
    `flat_index` ([M, 1]) of the last dim."""
    zeros = t.call("fill_constant", shape=list(dims), dtype=dtype, value=0.0)
    return t.call("scatter_add_general", zeros, flat_index, updates,
                  update_window_dims=list(range(window_rank)),
                  inserted_window_dims=[window_rank], scatter_dims_to_operand_dims=[window_rank])


@RULES.rule("Col2Im", since=18)
def col2im(t, x, image_shape, block_shape, *, dilations=None, pads=None, strides=None):
    n, ck, length = _known_dims(t, x, "the input")
    image = ints_of(t, image_shape, "image_shape")
    block = ints_of(t, block_shape, "block_shape")
    rank = len(image)
    dilations = list(dilations or [1] * rank)
    strides = list(strides or [1] * rank)
    pads = list(pads or [0] * (2 * rank))
    kernel = int(np.prod(block))
    if len(block) != rank or ck % kernel:
        raise Unsupported(f"block_shape {block} for image_shape {image} and {ck} columns")
    padded = [i + pads[d] + pads[d + rank] for d, i in enumerate(image)]
    blocks = [(p - (dilations[d] * (block[d] - 1) + 1)) // strides[d] + 1
              for d, p in enumerate(padded)]
    if int(np.prod(blocks)) != length:
        raise Unsupported(f"{length} blocks, where image_shape {image} and block_shape "
                          f"{block} give {blocks}")
    index = np.zeros((kernel, length), np.int64)   # flat padded index of each tap, block
    for k, tap in enumerate(itertools.product(*map(range, block))):
        for b, where in enumerate(itertools.product(*map(range, blocks))):
            point = [where[d] * strides[d] + tap[d] * dilations[d] for d in range(rank)]
            index[k, b] = np.ravel_multi_index(point, padded)
    channels = ck // kernel
    updates = t.call("reshape", x, shape=[n, channels, kernel * length])
    out = _scatter_into(t, [n, channels, int(np.prod(padded))], t.var(x)[1],
                        t.constant(index.reshape(-1, 1).astype(np.int32)), updates, 2)
    out = t.call("reshape", out, shape=[n, channels] + padded)
    if any(pads):
        out = t.call("slice", out, axes=list(range(2, 2 + rank)), starts=pads[:rank],
                     ends=[pads[d] + image[d] for d in range(rank)])
    return out


@RULES.rule("MaxUnpool", since=11)
def max_unpool(t, x, indices, output_shape=None, *, kernel_shape, pads=None, strides=None):
    dims = _known_dims(t, x, "the input")
    rank = len(dims) - 2
    pads = list(pads or [0] * (2 * rank))
    strides = list(strides or [1] * rank)
    # the indices address the inferred shape; output_shape, larger, pads its end with zeros
    inferred = dims[:2] + [(dims[2 + d] - 1) * strides[d] - pads[d] - pads[d + rank]
                           + kernel_shape[d] for d in range(rank)]
    out_dims = inferred if output_shape is None else ints_of(t, output_shape, "output_shape")
    if (len(out_dims) != len(dims) or out_dims[:2] != dims[:2]
            or any(o < i for o, i in zip(out_dims, inferred))):
        raise Unsupported(f"output_shape {out_dims} for an unpooled shape of {inferred}")
    count = int(np.prod(dims))
    flat_index = t.call("reshape", indices, shape=[count, 1])
    updates = t.call("reshape", x, shape=[count])
    zeros = t.call("fill_constant", shape=[int(np.prod(inferred))], dtype=t.var(x)[1],
                   value=0.0)
    out = t.call("scatter_general", zeros, flat_index, updates, computation="set",
                 mode="fill", update_window_dims=[], inserted_window_dims=[0],
                 scatter_dims_to_operand_dims=[0])
    out = t.call("reshape", out, shape=inferred)
    if out_dims != inferred:
        config = [v for o, i in zip(out_dims, inferred) for v in (0, o - i, 0)]
        out = t.call("pad", out, t.constant(np.zeros((), _np_dtype(t, x))),
                     padding_config=config)
    return out


# --- sampling ---
_GRID_MODES = {"bilinear": "bilinear", "linear": "bilinear", "nearest": "nearest"}


def _grid_sample(t, x, grid, mode, padding_mode, align_corners):
    if len(t.var(x)[0]) != 4:
        raise Unsupported(f"a {len(t.var(x)[0])}-D input: grid_sample samples 4-D "
                          "[N, C, H, W] inputs only")
    if mode not in _GRID_MODES:
        raise Unsupported(f"mode '{mode}': grid_sample has bilinear and nearest")
    if padding_mode not in ("zeros", "border", "reflection"):
        raise Unsupported(f"padding_mode '{padding_mode}'")
    return t.call("grid_sample", x, grid, mode=_GRID_MODES[mode], padding_mode=padding_mode,
                  align_corners=bool(align_corners))


@RULES.rule("GridSample", since=16)
def grid_sample_16(t, x, grid, *, align_corners=0, mode="bilinear", padding_mode="zeros"):
    return _grid_sample(t, x, grid, mode, padding_mode, align_corners)


@RULES.rule("GridSample", since=20)
def grid_sample(t, x, grid, *, align_corners=0, mode="linear", padding_mode="zeros"):
    return _grid_sample(t, x, grid, mode, padding_mode, align_corners)


def _positions(n, align_corners):
    """The n points in [-1, 1] that AffineGrid places along one axis."""
    if align_corners:
        return np.linspace(-1.0, 1.0, n)
    return (2.0 * np.arange(n) + 1.0) / n - 1.0


@RULES.rule("AffineGrid", since=20)
def affine_grid(t, theta, size, *, align_corners=0):
    sizes = ints_of(t, size, "size")
    spatial = sizes[2:]
    if len(spatial) not in (2, 3):
        raise Unsupported(f"size {sizes}: a 2-D or 3-D grid")
    # the points (x, y[, z], 1) of the grid, x fastest; spatial sizes are (D,) H, W
    axes = [_positions(s, align_corners) for s in reversed(spatial)]
    mesh = np.meshgrid(*reversed(axes), indexing="ij")[::-1]
    base = np.stack([m.reshape(-1) for m in mesh] + [np.ones(mesh[0].size)])
    dtype = _np_dtype(t, theta)
    # theta [N, k, k + 1] @ base [k + 1, P] -> [N, k, P] -> [N, P, k]
    points = t.call("matmul", theta, t.constant(base.astype(dtype)))
    points = t.call("transpose", points, perm=[0, 2, 1])
    return t.call("reshape", points, shape=[sizes[0]] + spatial + [len(spatial)])


@RULES.rule("DeformConv", since=19)
def deform_conv(t, x, w, offset, b=None, mask=None, *, dilations=None, group=1,
                kernel_shape=None, offset_group=1, pads=None, strides=None):
    if len(t.var(x)[0]) != 4:
        raise Unsupported(f"a {len(t.var(x)[0])}-D input: deformable_conv is 2-D")
    pads = list(pads or [0, 0, 0, 0])
    if pads[:2] != pads[2:]:
        raise Unsupported(f"pads {pads}: the same before and after")
    if kernel_shape is not None and list(kernel_shape) != list(t.var(w)[0][2:]):
        raise Unsupported(f"kernel_shape {list(kernel_shape)} is not W's {t.var(w)[0][2:]}")
    out = t.call("deformable_conv", x, offset, w, mask, strides=list(strides or [1, 1]),
                 paddings=pads[:2], dilations=list(dilations or [1, 1]), groups=int(group),
                 deformable_groups=int(offset_group))
    if b is not None:
        out = t.call("add", out, t.call("reshape", b, shape=[1, -1, 1, 1]))
    return out


def _roi_align(t, x, rois, batch_indices, *, half_pixel, mode, output_height,
               output_width, sampling_ratio, spatial_scale):
    """RoiAlign as reads of grid_sample at the sampling points of each bin. A point is
    clamped to the image (a point beyond one pixel outside reads 0); avg averages the
    points' bilinear values (grid_sample, align_corners, border), max takes the largest
    of the 4 weighted corner reads of every point (4 nearest reads), as ONNX defines it."""
    if mode not in ("avg", "max"):
        raise Unsupported(f"mode '{mode}'")
    if sampling_ratio <= 0:
        raise Unsupported("sampling_ratio 0: the number of points depends on each roi's size")
    _, _, height, width = _known_dims(t, x, "the input")
    rois_count = _known_dims(t, rois, "rois")[0]
    oh, ow, ratio = int(output_height), int(output_width), int(sampling_ratio)
    dtype = _np_dtype(t, rois)

    def const(value):
        return t.constant(np.asarray(value, dtype))

    def coordinate(col):
        picked = t.call("slice", rois, axes=[1], starts=[col], ends=[col + 1])  # [R, 1]
        scaled = t.call("scale", picked, scale=float(spatial_scale))
        return t.call("sub", scaled, const(0.5)) if half_pixel else scaled

    def along(start, end, count, size, axis):
        """The points along one axis: (normalized place, weight) pairs, [R, P] each
        reshaped to broadcast along `axis` of [R, P, Q]: one pair for avg, the low and
        high pixels with their weights for max; the weights 0 for points outside."""
        extent = t.call("sub", end, start)
        if not half_pixel:
            extent = t.call("maximum", extent, const(1.0))
        step = t.call("scale", extent, scale=1.0 / count)                # bin size [R, 1]
        where = (np.arange(count)[:, None] + (np.arange(ratio) + 0.5) / ratio).reshape(-1)
        place = t.call("add", start, t.call("mul", step, const(where[None])))  # [R, P]
        inside = t.call("cast", t.call("logical_and",
                                       t.call("greater_equal", place, const(-1.0)),
                                       t.call("less_equal", place, const(float(size)))),
                        dtype=t.var(rois)[1])
        shape = [rois_count, 1, 1]
        shape[axis] = count * ratio

        def normalized(pixel):   # grid_sample with align_corners reads (g + 1) / 2 * (size - 1)
            g = (t.call("scale", pixel, scale=2.0 / (size - 1), bias=-1.0) if size > 1
                 else t.call("scale", pixel, scale=0.0))
            return t.call("reshape", g, shape=shape)

        if mode == "avg":
            return [(normalized(place), t.call("reshape", inside, shape=shape))]
        clamped = t.call("clip", place, min=0.0, max=float(size - 1))
        low = t.call("floor", clamped)
        high = t.call("clip", t.call("scale", low, bias=1.0), min=0.0, max=float(size - 1))
        frac = t.call("mul", t.call("sub", clamped, low), inside)
        return [(normalized(low), t.call("reshape", t.call("sub", inside, frac), shape=shape)),
                (normalized(high), t.call("reshape", frac, shape=shape))]

    ys = along(coordinate(1), coordinate(3), oh, height, 1)
    xs = along(coordinate(0), coordinate(2), ow, width, 2)
    zeros = const(np.zeros((1, oh * ratio, ow * ratio)))
    images = t.call("gather", x, batch_indices, axis=0)           # [R, C, H, W]
    reads = []
    for (gy, wy), (gx, wx) in itertools.product(ys, xs):
        grid = t.call("concat", [t.call("unsqueeze", t.call("add", g, zeros), axes=[3])
                                 for g in (gx, gy)], axis=3)      # [R, P, Q, 2]
        read = t.call("grid_sample", images, grid,
                      mode="bilinear" if mode == "avg" else "nearest",
                      padding_mode="border", align_corners=True)
        reads.append(t.call("mul", read, t.call("unsqueeze", t.call("mul", wy, wx), axes=[1])))
    out = reads[0]
    for read in reads[1:]:
        out = t.call("maximum", out, read)
    out = t.call("reshape", out, shape=[rois_count, -1, oh, ratio, ow, ratio])
    return t.call("reduce_mean" if mode == "avg" else "reduce_max", out, axis=[3, 5])


@RULES.rule("RoiAlign", since=10)
def roi_align_10(t, x, rois, batch_indices, *, mode="avg", output_height=1, output_width=1,
                 sampling_ratio=0, spatial_scale=1.0):
    return _roi_align(t, x, rois, batch_indices, half_pixel=False, mode=mode,
                      output_height=output_height, output_width=output_width,
                      sampling_ratio=sampling_ratio, spatial_scale=spatial_scale)


@RULES.rule("RoiAlign", since=16)
def roi_align(t, x, rois, batch_indices, *, coordinate_transformation_mode="half_pixel",
              mode="avg", output_height=1, output_width=1, sampling_ratio=0,
              spatial_scale=1.0):
    if coordinate_transformation_mode not in ("half_pixel", "output_half_pixel"):
        raise Unsupported(f"coordinate_transformation_mode '{coordinate_transformation_mode}'")
    return _roi_align(t, x, rois, batch_indices,
                      half_pixel=coordinate_transformation_mode == "half_pixel", mode=mode,
                      output_height=output_height, output_width=output_width,
                      sampling_ratio=sampling_ratio, spatial_scale=spatial_scale)
