"""Rows of the Paddle table: shapes, slices, lists, constants and casts (see
`progdesc.paddle.rules` for how rows are written)."""
import math

import numpy as np

from progdesc.paddle.rule_args import (axis_of, dtype_name, numpy_dtype, parse_number,
                                       ints_of, list_ints, sizes_in, with_unknown, dims_of,
                                       reshape_to, unsqueezed, INT32_MAX)
from progdesc.paddle.table import RULES
from progdesc.translate import Unsupported


# --- shapes ---
@RULES.rule("reshape2", inputs=("X", "Shape", "ShapeTensor*"), outputs=("Out", "XShape"))
def reshape2(t, x, shape_input, shape_list, *, shape=()):
    if shape_input is not None:
        shape = with_unknown(sizes_in(t, [shape_input], "Shape"), "Shape")[0]
    elif shape_list:
        shape = with_unknown(sizes_in(t, shape_list, "ShapeTensor"), "ShapeTensor")[0]
    return t.call("reshape", x, shape=[int(d) for d in shape]), None


@RULES.rule("reshape", inputs=("X", "Shape", "ShapeTensor*"))
def reshape(t, x, shape_input, shape_list, *, shape=()):
    return reshape2(t, x, shape_input, shape_list, shape=shape)[0]


@RULES.rule("transpose2", outputs=("Out", "XShape"))
def transpose2(t, x, *, axis=()):
    return t.call("transpose", x, perm=[axis_of(a, t.rank(x)) for a in axis]), None


@RULES.rule("transpose")
def transpose(t, x, *, axis=()):
    return transpose2(t, x, axis=axis)[0]


@RULES.rule("flatten_contiguous_range", outputs=("Out", "XShape"))
def flatten_contiguous_range(t, x, *, start_axis=1, stop_axis=1):
    dims = dims_of(t, x)
    if not dims:
        return t.call("reshape", x, shape=[1]), None
    start, stop = axis_of(start_axis, len(dims)), axis_of(stop_axis, len(dims))
    middle = dims[start:stop + 1]
    size = -1 if -1 in middle else math.prod(middle)
    return reshape_to(t, x, dims[:start] + [size] + dims[stop + 1:]), None


@RULES.rule("flatten2", outputs=("Out", "XShape"))
def flatten2(t, x, *, axis=1):
    dims = dims_of(t, x)
    outer, inner = dims[:axis], dims[axis:]
    return reshape_to(t, x, [-1 if -1 in outer else math.prod(outer),
                           -1 if -1 in inner else math.prod(inner)]), None


@RULES.rule("squeeze2", outputs=("Out", "XShape"))
def squeeze2(t, x, *, axes=()):
    dims = dims_of(t, x)
    if axes:
        keep = sorted({axis_of(a, len(dims)) for a in axes if dims[axis_of(a, len(dims))] == 1})
    else:
        keep = [i for i, d in enumerate(dims) if d == 1]
    return (t.call("squeeze", x, axes=keep) if keep else t.call("assign", x)), None


@RULES.rule("squeeze")
def squeeze(t, x, *, axes=()):
    return squeeze2(t, x, axes=axes)[0]


@RULES.rule("unsqueeze2", inputs=("X", "AxesTensor", "AxesTensorList*"),
            outputs=("Out", "XShape"))
def unsqueeze2(t, x, axes_tensor, axes_list, *, axes=()):
    if axes_tensor is not None:
        axes = ints_of(t, axes_tensor, "AxesTensor")
    elif axes_list:
        axes = list_ints(t, axes_list, "AxesTensorList")
    return t.call("unsqueeze", x, axes=unsqueezed(t.rank(x), list(axes))), None


@RULES.rule("unsqueeze", inputs=("X", "AxesTensor", "AxesTensorList*"))
def unsqueeze(t, x, axes_tensor, axes_list, *, axes=()):
    return unsqueeze2(t, x, axes_tensor, axes_list, axes=axes)[0]


@RULES.rule("concat", inputs=("X*", "AxisTensor"))
def concat(t, xs, axis_tensor, *, axis=0):
    if axis_tensor is not None:
        axis = ints_of(t, axis_tensor, "AxisTensor")[0]
    return t.call("concat", xs, axis=axis_of(axis, t.rank(xs[0])))


@RULES.rule("split", inputs=("X", "AxisTensor", "SectionsTensorList*"), outputs=("Out*",))
def split(t, x, axis_tensor, sections_list, *, num=0, sections=(), axis=0):
    if axis_tensor is not None:
        axis = ints_of(t, axis_tensor, "AxisTensor")[0]
    if sections_list:
        sections = list_ints(t, sections_list, "SectionsTensorList")
    axis = axis_of(axis, t.rank(x))
    if num:
        return list(t.call("split", x, num=int(num), axis=axis))
    return list(t.call("split", x, sections=[int(s) for s in sections], axis=axis))


@RULES.rule("stack", inputs=("X*",), outputs=("Y",))
def stack(t, xs, *, axis=0):
    return t.call("stack", xs, axis=axis_of(axis, t.rank(xs[0]) + 1))


@RULES.rule("unstack", outputs=("Y*",))
def unstack(t, x, *, axis=0, num=0):
    axis = axis_of(axis, t.rank(x))
    n = dims_of(t, x)[axis]
    if n == -1:
        raise Unsupported("unstack along an unknown dim")
    return [t.call("squeeze", p, axes=[axis]) for p in t.call("split", x, num=n, axis=axis)]


def _slice(t, x, axes, starts, ends, strides, decrease_axis):
    dims = dims_of(t, x)
    axes = [axis_of(a, len(dims)) for a in axes]
    clamp = lambda v: max(min(int(v), INT32_MAX), -INT32_MAX)  # noqa: E731
    out = t.call("slice", x, axes=axes, starts=[clamp(s) for s in starts],
                 ends=[clamp(e) for e in ends],
                 strides=[int(s) for s in strides] if strides else [])
    if decrease_axis:
        out = t.call("squeeze", out, axes=[axis_of(a, len(dims)) for a in decrease_axis])
    sizes = t.sizes_of(x)
    if sizes is not None and len(dims) == 1 and axes == [0]:
        t.set_sizes(out, sizes[slice(clamp(starts[0]), clamp(ends[0]),
                                     int(strides[0]) if strides else None)])
    return out


@RULES.rule("slice", inputs=("Input", "StartsTensor", "EndsTensor", "StartsTensorList*",
                             "EndsTensorList*"))
def slice_(t, x, starts_t, ends_t, starts_l, ends_l, *, axes=(), starts=(), ends=(),
           decrease_axis=()):
    if starts_t is not None:
        starts = ints_of(t, starts_t, "StartsTensor")
    elif starts_l:
        starts = list_ints(t, starts_l, "StartsTensorList")
    if ends_t is not None:
        ends = ints_of(t, ends_t, "EndsTensor")
    elif ends_l:
        ends = list_ints(t, ends_l, "EndsTensorList")
    return _slice(t, x, axes, starts, ends, (), decrease_axis)


@RULES.rule("strided_slice", inputs=("Input", "StartsTensor", "EndsTensor", "StridesTensor",
                                     "StartsTensorList*", "EndsTensorList*",
                                     "StridesTensorList*"))
def strided_slice(t, x, starts_t, ends_t, strides_t, starts_l, ends_l, strides_l, *, axes=(),
                  starts=(), ends=(), strides=(), decrease_axis=()):
    for name, lst, what in ((starts_t, starts_l, "starts"), (ends_t, ends_l, "ends"),
                            (strides_t, strides_l, "strides")):
        if name is not None or lst:
            value = ints_of(t, name, what) if name is not None else list_ints(t, lst, what)
            starts, ends, strides = ((value, ends, strides) if what == "starts" else
                                     (starts, value, strides) if what == "ends" else
                                     (starts, ends, value))
    return _slice(t, x, axes, starts, ends, strides, decrease_axis)


@RULES.rule("gather", inputs=("X", "Index", "Axis"))
def gather(t, x, index, axis_tensor, *, axis=0):
    if axis_tensor is not None:
        axis = ints_of(t, axis_tensor, "Axis")[0]
    if t.rank(index) == 2 and dims_of(t, index)[1] == 1:
        index = t.call("squeeze", index, axes=[1])
    return t.call("gather", x, index, axis=axis_of(axis, t.rank(x)))


@RULES.rule("expand_v2", inputs=("X", "Shape", "expand_shapes_tensor*"))
def expand_v2(t, x, shape_t, shape_l, *, shape=()):
    if shape_t is not None:
        shape = ints_of(t, shape_t, "Shape")
    elif shape_l:
        shape = list_ints(t, shape_l, "expand_shapes_tensor")
    return t.call("expand", x, shape=[int(d) for d in shape])


@RULES.rule("expand_as_v2", inputs=("X", "Y"))
def expand_as_v2(t, x, y, *, target_shape=()):
    if y is not None:
        return t.call("expand_as", x, y)
    return t.call("expand", x, shape=[int(d) for d in target_shape])


@RULES.rule("tile", inputs=("X", "RepeatTimes", "repeat_times_tensor*"))
def tile(t, x, reps_t, reps_l, *, repeat_times=()):
    if reps_t is not None:
        repeat_times = ints_of(t, reps_t, "RepeatTimes")
    elif reps_l:
        repeat_times = list_ints(t, reps_l, "repeat_times_tensor")
    reps = [int(r) for r in repeat_times]
    rank = t.rank(x)
    if len(reps) > rank:   # Paddle lines x up with the trailing entries
        x = t.call("unsqueeze", x, axes=list(range(len(reps) - rank)))
    reps = [1] * (t.rank(x) - len(reps)) + reps
    return t.call("tile", x, reps=reps)


# --- creation ---
@RULES.rule("fill_constant", inputs=("ShapeTensor", "ShapeTensorList*", "ValueTensor"))
def fill_constant(t, shape_t, shape_l, value_t, *, shape=(), dtype=5, value=0.0, str_value=""):
    sizes = [int(d) for d in shape]
    if shape_t is not None:
        sizes = sizes_in(t, [shape_t], "ShapeTensor")
    elif shape_l:
        sizes = sizes_in(t, shape_l, "ShapeTensorList")
    dtype = dtype_name(dtype)
    if value_t is not None:
        known = t.value_of(value_t)
        if known is None:
            raise Unsupported("ValueTensor is computed at run time")
        value = np.asarray(known).reshape(-1)[0]
    elif str_value:
        value = parse_number(str_value)
    dims, unknown = with_unknown(sizes, "the shape")
    if unknown is None:
        if any(d < 0 for d in dims):
            raise Unsupported(f"shape {dims} has an unknown dim")
        return t.constant(np.full(dims, value, dtype=numpy_dtype(dtype)))
    like, axis = unknown
    return t.call("broadcast_in_dim", t.constant(np.asarray(value, numpy_dtype(dtype))), like,
                  shape=dims, broadcast_dimensions=[], like_axis=axis)


@RULES.rule("assign_value", inputs=())
def assign_value(t, *, shape=(), dtype=5, fp32_values=(), int32_values=(), int64_values=(),
                 bool_values=(), fp64_values=(), values=()):
    dtype = dtype_name(dtype)
    data = next((v for v in (values, fp32_values, int32_values, int64_values, bool_values,
                             fp64_values) if len(v)), [])
    count = math.prod(shape)
    if len(data) != count:
        raise Unsupported(f"{len(data)} values for shape {list(shape)}")
    return t.constant(np.asarray(data).astype(numpy_dtype(dtype)).reshape([int(d) for d in shape]))


@RULES.rule("assign")
def assign(t, x):
    return t.call("assign", x)


@RULES.rule("fill_any_like")
def fill_any_like(t, x, *, value=0.0, dtype=-1):
    dtype = t.var(x)[1] if dtype == -1 else dtype_name(dtype)
    return t.call("expand_as", t.constant(np.asarray(value, numpy_dtype(dtype))), x)


@RULES.rule("fill_zeros_like")
def fill_zeros_like(t, x):
    return t.call("fill_zeros_like", x)


@RULES.rule("cast")
def cast(t, x, *, out_dtype=5, in_dtype=5):
    dtype = dtype_name(out_dtype)
    known = t.value_of(x)
    if known is not None:
        return t.constant(known.astype(numpy_dtype(dtype)))
    out = t.call("assign", x) if t.var(x)[1] == dtype else t.call("cast", x, dtype=dtype)
    sizes = t.sizes_of(x)
    if sizes is not None and dtype.startswith(("int", "uint")):
        t.set_sizes(out, sizes)
    return out


@RULES.rule("shape", inputs=("Input",))
def shape(t, x, *, out_types=()):
    dims = dims_of(t, x)
    dtype = out_types[0].dtype if out_types and out_types[0] is not None and \
        out_types[0].dtype else "int32"
    if -1 not in dims:
        return t.constant(np.asarray(dims, numpy_dtype(dtype)))
    parts = [t.call("unsqueeze", t.call("dim_size", x, axis=i, dtype=dtype), axes=[0])
             if d == -1 else t.constant(np.asarray([d], numpy_dtype(dtype)))
             for i, d in enumerate(dims)]
    out = t.call("concat", parts, axis=0)
    t.set_sizes(out, [d if d != -1 else (x, i) for i, d in enumerate(dims)])
    return out


@RULES.rule("range", "arange", inputs=("Start", "End", "Step"))
def range_(t, start, end, step, *, out_types=()):
    values = [t.value_of(v) for v in (start, end, step)]
    dtype = numpy_dtype(out_types[0].dtype) if out_types and out_types[0] is not None and \
        out_types[0].dtype else None
    if all(v is not None for v in values):
        s, e, d = (np.asarray(v).reshape(-1)[0] for v in values)
        return t.constant(np.arange(s, e, d).astype(dtype or values[0].dtype))
    ends = t.sizes_of(end)
    if values[0] is None or values[2] is None or ends is None or len(ends) != 1:
        raise Unsupported("start, end or step is computed at run time")
    s, d = (np.asarray(values[i]).reshape(-1)[0] for i in (0, 2))
    if s != 0 or d != 1:
        raise Unsupported("a range up to a size known only at run time from a start other "
                          "than 0 or a step other than 1")
    like, axis = ends[0]
    ones = t.call("broadcast_in_dim", t.constant(np.ones((), np.int32)), like, shape=[-1],
                  broadcast_dimensions=[], like_axis=axis)
    counted = t.call("scale", t.call("cumsum", ones, axis=0), bias=-1.0)
    dtype = np.dtype(dtype or values[0].dtype)
    return t.call("cast", counted, dtype=str(dtype)) if dtype != np.int32 else counted


@RULES.rule("flip")
def flip(t, x, *, axis=()):
    return t.call("rev", x, dimensions=[axis_of(a, t.rank(x)) for a in axis])


@RULES.rule("index_select", inputs=("X", "Index"))
def index_select(t, x, index, *, dim=0):
    return t.call("gather", x, index, axis=axis_of(dim, t.rank(x)))


def _padded(t, x, pairs, mode, value):
    """x padded by (low, high) `pairs`, one per dim: constant (`pad`) or Paddle's
    reflect, replicate or circular modes (`border_pad`)."""
    if mode == "constant":
        config = [v for lo, hi in pairs for v in (lo, hi, 0)]
        return t.call("pad", x, t.constant(np.asarray(value, t.var(x)[1])),
                      padding_config=config)
    if mode == "edge":
        mode = "replicate"
    if mode not in ("reflect", "replicate", "circular"):
        raise Unsupported(f"mode={mode!r}")
    return t.call("border_pad", x, paddings=[v for pair in pairs for v in pair], mode=mode)


@RULES.rule("pad3d", inputs=("X", "Paddings"))
def pad3d(t, x, paddings_t, *, paddings=(0, 0, 0, 0, 0, 0), mode="constant", value=0.0,
          data_format="NCDHW"):
    if paddings_t is not None:
        paddings = ints_of(t, paddings_t, "Paddings")
    left, right, top, bottom, front, back = [int(p) for p in paddings]
    spatial = [(front, back), (top, bottom), (left, right)]
    if data_format == "NCDHW":
        pairs = [(0, 0), (0, 0)] + spatial
    elif data_format == "NDHWC":
        pairs = [(0, 0)] + spatial + [(0, 0)]
    else:
        raise Unsupported(f"data_format={data_format!r}")
    return _padded(t, x, pairs, mode, value)


@RULES.rule("pad2d", inputs=("X", "Paddings"))
def pad2d(t, x, paddings_t, *, paddings=(0, 0, 0, 0), mode="constant", pad_value=0.0,
          data_format="NCHW"):
    if paddings_t is not None:
        paddings = ints_of(t, paddings_t, "Paddings")
    top, bottom, left, right = [int(p) for p in paddings]
    spatial = [(top, bottom), (left, right)]
    if data_format == "NCHW":
        pairs = [(0, 0), (0, 0)] + spatial
    elif data_format == "NHWC":
        pairs = [(0, 0)] + spatial + [(0, 0)]
    else:
        raise Unsupported(f"data_format={data_format!r}")
    return _padded(t, x, pairs, mode, pad_value)


@RULES.rule("pad", inputs=("X",))
def pad(t, x, *, paddings=(), pad_value=0.0):
    config = [v for i in range(0, len(paddings), 2)
              for v in (int(paddings[i]), int(paddings[i + 1]), 0)]
    return t.call("pad", x, t.constant(np.asarray(pad_value, t.var(x)[1])),
                  padding_config=config)
