"""Shape ops: Constant, Shape, Size, Reshape, Flatten, Squeeze, Unsqueeze, Transpose,
Concat, Split, Slice, Expand, Tile, Range, ConstantOfShape, EyeLike, DepthToSpace,
SpaceToDepth.

Their shape-like inputs (Reshape's shape, Slice's starts, Expand's shape...) are read at
import: values known then (constants, int initializers, computations of them, which the
translator folds: `progdesc.onnx.folding`), or symbolic sizes that `Shape` made of dims
known only at run time, which `reshape_dims`, `broadcast_dims` and `slice_dims` read from
the variables holding them (`progdesc.onnx.shape_args`). What depends on run-time values
is refused.
"""
import numpy as np

from progdesc.onnx import run_time_bounds, symbolic
from progdesc.onnx.model import as_numpy_dtype, dtype_name
from progdesc.onnx.shape_args import (INT32_MAX, axis_of, computed_dims, dim_sizes, ints_of,
                                      reshape_to, sizes_or_refuse)
from progdesc.onnx.table import RULES
from progdesc.translate import Unsupported


@RULES.rule("Constant")
def constant(t, *, value=None, value_float=None, value_floats=None, value_int=None,
             value_ints=None, sparse_value=None, value_string=None, value_strings=None):
    if value is not None:
        if np.asarray(value).dtype.kind in "OSU":
            raise Unsupported("a string constant")
        return t.constant(value)
    for v, dtype in ((value_float, np.float32), (value_floats, np.float32),
                     (value_int, np.int64), (value_ints, np.int64)):
        if v is not None:
            return t.constant(np.asarray(v, dtype=dtype))
    raise Unsupported("a sparse or string constant")


# --- shapes as values ---
@RULES.rule("Shape")
def shape(t, x, *, start=0, end=None):
    sizes = dim_sizes(t, x)
    rank = len(sizes)
    lo = min(max(start + rank if start < 0 else start, 0), rank)
    hi = rank if end is None else min(max(end + rank if end < 0 else end, 0), rank)
    value = np.empty(max(hi - lo, 0), dtype=object)
    value[:] = sizes[lo:max(hi, lo)]
    return t.materialize(value if symbolic.is_symbolic(value) else value.astype(np.int64))


@RULES.rule("Size")
def size(t, x):
    value = np.empty((), dtype=object)
    value[()] = symbolic.product(dim_sizes(t, x))
    return t.materialize(value if symbolic.is_symbolic(value) else value.astype(np.int64))


# --- reshaping ---
@RULES.rule("Reshape")
def reshape(t, x, target, *, allowzero=0):
    sizes = sizes_or_refuse(t, target, "target shape")
    return reshape_to(t, x, sizes, allowzero=bool(allowzero))


@RULES.rule("Flatten")
def flatten(t, x, *, axis=1):
    sizes = dim_sizes(t, x)
    axis = int(axis) + len(sizes) if axis < 0 else int(axis)
    if not 0 <= axis <= len(sizes):
        raise Unsupported(f"axis {axis} is out of range for rank {len(sizes)}")
    return reshape_to(t, x, [symbolic.product(sizes[:axis]), symbolic.product(sizes[axis:])],
                      allowzero=True)


def _axes(t, axes_input, axes_attr, what="axes"):
    if axes_input is not None:
        return ints_of(t, axes_input, what)
    return None if axes_attr is None else list(axes_attr)


@RULES.rule("Squeeze")
def squeeze(t, x, axes_input=None, *, axes=None):
    dims = t.dims(x)
    axes = _axes(t, axes_input, axes)
    if axes is None:
        if any(d is None or isinstance(d, (str, symbolic.Size)) for d in dims):
            raise Unsupported("Squeeze without axes of a value whose dims are not all known "
                              f"({dims})")
        axes = [i for i, d in enumerate(dims) if d == 1]
    axes = sorted({axis_of(a, len(dims)) for a in axes})
    for a in axes:
        if isinstance(dims[a], int) and dims[a] != 1:
            raise Unsupported(f"dim {a} of the input is {dims[a]}, not 1")
    if not axes:
        return t.call("assign", x)
    out = t.call("squeeze", x, axes=axes)
    t.set_dims(out, [d for i, d in enumerate(dims) if i not in axes])
    return out


@RULES.rule("Unsqueeze")
def unsqueeze(t, x, axes_input=None, *, axes=None):
    dims = t.dims(x)
    axes = _axes(t, axes_input, axes)
    if axes is None:
        raise Unsupported("Unsqueeze without axes")
    rank = len(dims) + len(axes)
    axes = sorted(axis_of(a, rank) for a in axes)
    if len(set(axes)) != len(axes):
        raise Unsupported(f"repeated axes {axes}")
    out = t.call("unsqueeze", x, axes=axes)
    rest = iter(dims)
    t.set_dims(out, [1 if i in axes else next(rest) for i in range(rank)])
    return out


@RULES.rule("Transpose")
def transpose(t, x, *, perm=None):
    dims = t.dims(x)
    perm = list(range(len(dims)))[::-1] if perm is None else [axis_of(p, len(dims), "perm")
                                                                for p in perm]
    out = t.call("transpose", x, perm=perm)
    t.set_dims(out, [dims[p] for p in perm])
    return out


@RULES.rule("Concat")
def concat(t, *xs, axis):
    xs = [x for x in xs if x is not None]
    dims = t.dims(xs[0])
    axis = axis_of(axis, len(dims))
    return t.call("concat", xs, axis=axis)


@RULES.rule("Split")
def split(t, x, split_input=None, *, axis=0, split=None, num_outputs=None):
    dims = t.dims(x)
    axis = axis_of(axis, len(dims))
    count = len(t.node_proto.output)
    sections = ints_of(t, split_input, "split") if split_input is not None else split
    n = dims[axis]
    if sections is None:
        parts = num_outputs or count
        if not isinstance(n, int):
            if parts != count:
                raise Unsupported("Split of a dim known only at run time into unequal parts")
            return list(t.call("split", x, num=count, axis=axis))
        chunk = -(-n // parts)
        sections = [chunk] * (n // chunk) + ([n % chunk] if n % chunk else [])
    sections = [int(s) for s in sections]
    if len(sections) != count:
        raise Unsupported(f"{len(sections)} parts for {count} outputs")
    if not isinstance(n, int) and sections.count(-1) == 0:
        sections[-1] = -1
    return list(t.call("split", x, sections=sections, axis=axis))


# --- slicing ---
def _slice_bound(value, dim):
    """An ONNX start or end (an int or a Size) as an int our `slice` takes (it clamps ints
    at run time as ONNX does), against the sliced dim `dim` (an int or a Size); None
    where only run time can clamp it."""
    if not isinstance(value, symbolic.Size):
        return _clip(value)
    past = value - dim   # from the end: negative, or past it
    if not isinstance(past, symbolic.Size):
        return INT32_MAX if past >= 0 else past
    try:
        return INT32_MAX if symbolic.compare(value, dim) >= 0 else None
    except symbolic.Undecided:
        return None


def _clip(value):
    return max(min(int(value), INT32_MAX), -INT32_MAX)


@RULES.rule("Slice")
def slice_(t, x, starts, ends, axes=None, steps=None):
    window = run_time_bounds.slice_window(t, x, starts, ends, axes, steps)
    if window is not None:   # a run-time start, a length known at import
        return window
    sizes = dim_sizes(t, x)
    rank = len(sizes)
    starts = sizes_or_refuse(t, starts, "starts")
    ends = sizes_or_refuse(t, ends, "ends")
    axes = ints_of(t, axes, "axes") if axes is not None else list(range(len(starts)))
    steps = ints_of(t, steps, "steps") if steps is not None else [1] * len(starts)
    axes = [axis_of(a, rank) for a in axes]
    if not len(starts) == len(ends) == len(axes) == len(steps) or len(set(axes)) != len(axes):
        raise Unsupported("starts, ends, axes and steps of different lengths, or axes "
                          "repeated")
    if 0 in steps:
        raise Unsupported("a step of 0")
    if not axes:
        return t.call("assign", x)
    ours_starts = [_slice_bound(s, sizes[a]) for s, a in zip(starts, axes)]
    ours_ends = [_slice_bound(e, sizes[a]) for e, a in zip(ends, axes)]
    dims = list(t.dims(x))
    if None in ours_starts or None in ours_ends:   # clamped at run time
        if any(k < 0 for k, s, e in zip(steps, starts, ends)
               if isinstance(s, symbolic.Size) or isinstance(e, symbolic.Size)):
            raise Unsupported("a negative step between bounds known only at run time")
        bounds = [b if isinstance(b, symbolic.Size) else _clip(b) for b in starts + ends]
        shape, spec, likes = computed_dims(t, bounds)
        out = t.call("slice_dims", x, likes or None, axes=axes, starts=shape[:len(axes)],
                     ends=shape[len(axes):], strides=steps, dims=spec)
        for a in axes:
            dims[a] = None
        t.set_dims(out, dims)
        return out
    out = t.call("slice", x, axes=axes, starts=ours_starts, ends=ours_ends, strides=steps)
    for a, s, e, k in zip(axes, ours_starts, ours_ends, steps):
        if not (isinstance(sizes[a], symbolic.Size) and (s, e, k) == (0, INT32_MAX, 1)):
            dims[a] = None   # the whole dim keeps its size; else unknown here
    t.set_dims(out, dims)
    return out


# --- broadcasting and creating ---
def _expanded(t, x, target):
    """x broadcast to `target` (ints and Sizes; ONNX's Expand: a 1 keeps x's dim)."""
    sizes = dim_sizes(t, x)
    rank = max(len(sizes), len(target))
    target = [1] * (rank - len(target)) + list(target)
    lead = rank - len(sizes)
    ours, out_dims, computed = [], [], []
    for i, d in enumerate(target):
        own = sizes[i - lead] if i >= lead else None
        if isinstance(d, int) and d == 1 and own is not None:
            ours.append(-1)
            out_dims.append(own)
        elif isinstance(d, symbolic.Size) and own is not None and own == d:
            ours.append(-1)
            out_dims.append(own)
        else:
            ours.append(d)
            out_dims.append(d)
            if isinstance(d, symbolic.Size):
                computed.append(i)
    if not computed:
        out = t.call("expand", x, shape=[int(d) for d in ours])
    else:
        shape, dims, likes = computed_dims(t, ours)
        out = t.call("broadcast_dims", x, likes, shape=shape, dims=dims)
    t.set_dims(out, out_dims)
    return out


@RULES.rule("Expand")
def expand(t, x, target):
    return _expanded(t, x, sizes_or_refuse(t, target, "target shape"))


@RULES.rule("Tile")
def tile(t, x, repeats):
    reps = sizes_or_refuse(t, repeats, "repeats")
    sizes = dim_sizes(t, x)
    if len(reps) != len(sizes):
        raise Unsupported(f"{len(reps)} repeats for a rank-{len(sizes)} input")
    if not any(isinstance(r, symbolic.Size) for r in reps):
        return t.call("tile", x, reps=[int(r) for r in reps])
    # repeats known only at run time: x[None, :, None, :] broadcast to [r0, s0, r1, s1]
    spread = t.call("unsqueeze", x, axes=list(range(0, 2 * len(sizes), 2)))
    t.set_dims(spread, [d for s in sizes for d in (1, s)])
    copies = _expanded(t, spread, [d for r, s in zip(reps, sizes) for d in (r, s)])
    return reshape_to(t, copies, [r * s for r, s in zip(reps, sizes)], allowzero=True)


@RULES.rule("ConstantOfShape")
def constant_of_shape(t, target, *, value=None):
    value = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)
    sizes = sizes_or_refuse(t, target, "shape")
    if not any(isinstance(s, symbolic.Size) for s in sizes):
        return t.constant(np.full([int(s) for s in sizes], value[0], dtype=value.dtype))
    shape, dims, likes = computed_dims(t, sizes)
    out = t.call("broadcast_dims", t.constant(value.reshape(())), likes, shape=shape,
                 dims=dims)
    t.set_dims(out, sizes)
    return out


@RULES.rule("Range")
def range_(t, start, limit, delta):
    values = []
    for v in (start, limit, delta):
        value = t.value_of(v)
        value = t.sizes_of(v) if value is None else list(np.asarray(value).reshape(-1))
        if not value:
            raise Unsupported("its start, limit or delta is computed at run time (its "
                              "length must be known at import)")
        values.append(value[0])
    dtype = as_numpy_dtype(t.var(start)[1])
    first, last, step = values
    if not any(isinstance(v, symbolic.Size) for v in (first, last, step)):
        count = max(int(np.ceil((float(last) - float(first)) / float(step))), 0)
        return t.constant((first + np.arange(count) * step).astype(dtype))
    if isinstance(first, symbolic.Size) or isinstance(step, symbolic.Size) or step <= 0:
        raise Unsupported("a Range whose start or delta is symbolic, or that counts down to "
                          "a symbolic limit")
    try:
        count = (last - int(first) + int(step) - 1) // int(step)
    except symbolic.Undecided:
        raise Unsupported(f"the length of Range({first}, {last}, {step}) is not a "
                          "polynomial in the symbolic dims") from None
    shape, dims, likes = computed_dims(t, [count])
    ones = t.call("broadcast_dims", t.constant(np.ones((), dtype)), likes, shape=shape,
                  dims=dims)
    counted = t.call("cumsum", ones, axis=0)   # 1, 2, ..., count
    out = t.call("scale", counted, scale=float(step), bias=float(int(first) - int(step)))
    t.set_dims(out, [count])
    return out


@RULES.rule("EyeLike")
def eye_like(t, x, *, dtype=None, k=0):
    dims = t.dims(x)
    if len(dims) != 2 or not all(isinstance(d, int) for d in dims):
        raise Unsupported(f"EyeLike of a value of dims {dims} (2 known dims needed)")
    np_dtype = (as_numpy_dtype(dtype_name(dtype)) if dtype is not None
                else as_numpy_dtype(t.var(x)[1]))
    return t.constant(np.eye(dims[0], dims[1], k, dtype=np_dtype))


# --- blocks of pixels ---
@RULES.rule("DepthToSpace")
def depth_to_space(t, x, *, blocksize, mode="DCR"):
    n, c, h, w = dim_sizes(t, x)
    b = int(blocksize)
    if not isinstance(c, int) or c % (b * b):
        raise Unsupported(f"{c} channels do not divide into blocks of {b}x{b}")
    if mode == "DCR":
        parts, perm = [n, b, b, c // (b * b), h, w], [0, 3, 4, 1, 5, 2]
    elif mode == "CRD":
        parts, perm = [n, c // (b * b), b, b, h, w], [0, 1, 4, 2, 5, 3]
    else:
        raise Unsupported(f"mode '{mode}'")
    y = t.call("transpose", reshape_to(t, x, parts, allowzero=True), perm=perm)
    return reshape_to(t, y, [n, c // (b * b), h * b, w * b], allowzero=True)


@RULES.rule("SpaceToDepth")
def space_to_depth(t, x, *, blocksize, mode="DCR"):
    n, c, h, w = dim_sizes(t, x)
    b = int(blocksize)
    if not (isinstance(h, int) and isinstance(w, int)) or h % b or w % b:
        raise Unsupported(f"dims {h}x{w} do not divide into blocks of {b}")
    y = reshape_to(t, x, [n, c, h // b, b, w // b, b], allowzero=True)
    perm = [0, 3, 5, 1, 2, 4] if mode == "DCR" else [0, 1, 3, 5, 2, 4]
    if mode not in ("DCR", "CRD"):
        raise Unsupported(f"mode '{mode}'")
    y = t.call("transpose", y, perm=perm)
    return reshape_to(t, y, [n, c * b * b, h // b, w // b], allowzero=True)
