"""Shape and layout ops: reshape, transpose, concat / split / stack, slice, squeeze,
unsqueeze, tile, expand, gather, one_hot, take_along_axis, and the `lax` primitives
broadcast_in_dim, dynamic_slice, dynamic_update_slice, pad, rev, gather (`gather_general`,
differentiated by `gather_general_grad`, the `jax.vjp` of its rule), scatter-add
(`scatter_add_general`, whose gradient is a gather) and scatter, scatter-mul, -min and -max
(`scatter_general`: mul's gradient composed of ops; the others' through `scatter_general_grad`
and `scatter_general_jvp`, the `jax.vjp` and `jax.jvp` of its rule, so that colliding
updates share the gradient as in JAX).

Gradients move the incoming gradient back into the input's layout. Where the
input's shape is only known at run time (a symbolic batch dim), they read it
from the input itself: `reshape_as`, `concat_grad`, and the scatter ops
`slice_grad`, `gather_grad` and `take_along_axis_grad` that write into zeros
shaped like the forward input.
"""
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from lowering import checks, dtypes
from lowering.constraints import Dims, at_least, non_negative, one_of, positive
from lowering.errors import BackwardError, ShapeError
from lowering.ops.collective import local_vjp
from lowering.registry import REQUIRED, Attr, In, Out, op

_AXIS = Attr("axis", "int", 0)
_LIKE = In("X", differentiable=False, doc="only its shape (and dtype) is used")


@op("reshape", inputs=[In("X")], outputs=[Out("Out")],
    attrs={"shape": Attr("shape", "ints", REQUIRED, where=Dims(least=-1), lone_int=True)})
def reshape(X, *, shape):
    """Reshape `X`; a 0 in `shape` copies the input dim at that position, one -1 is inferred."""
    target = tuple(X.shape[i] if d == 0 and i < X.ndim else d for i, d in enumerate(shape))
    _check_reshape(X, shape, target)
    return jnp.reshape(X, target)


def _check_reshape(X, shape, target):
    """`shape` has one -1 at most, no 0 beyond X's rank, and as many elements as X."""
    size = math.prod(d for d in target if d != -1)
    wrong = None
    if shape.count(-1) > 1 or any(d < -1 for d in shape):
        wrong = "it may hold one -1 (inferred) and sizes >= 0"
    elif any(d == 0 for d in shape[X.ndim:]):
        wrong = f"a 0 copies X's dim at its position, and X has only {X.ndim} dims"
    elif all(isinstance(d, int) for d in X.shape + (size,)):
        total = math.prod(X.shape)
        if -1 not in shape and size != total:
            wrong = f"{size} elements, X has {total}"
        elif -1 in shape and (size == 0 or total % size):
            wrong = f"X's {total} elements do not divide into rows of {size}"
    if wrong:
        raise ShapeError(f"cannot reshape X {checks.typed(X)} to shape {list(shape)}: {wrong}",
                         slot="X")


@reshape.gradient
def _(g):
    g.call("reshape_as", g.out_grad("Out"), g.input("X"), out=g.in_grad("X"))


@op("reshape_as", inputs=[In("X"), In("Target", differentiable=False)], outputs=[Out("Out")])
def reshape_as(X, Target):
    """Reshape `X` to the (run-time) shape of `Target`."""
    return jnp.reshape(X, Target.shape)


@reshape_as.gradient
def _(g):
    g.call("reshape_as", g.out_grad("Out"), g.input("X"), out=g.in_grad("X"))


@op("transpose", inputs=[In("X")], outputs=[Out("Out")],
    attrs={"perm": Attr("perm", "ints", REQUIRED)})
def transpose(X, *, perm):
    """Permute the axes of `X`: output axis i is input axis perm[i]."""
    return jnp.transpose(X, perm)


@transpose.gradient
def _(g):
    perm = [p % len(g.attr("perm")) for p in g.attr("perm")]
    g.call("transpose", g.out_grad("Out"), perm=[int(i) for i in np.argsort(perm)],
           out=g.in_grad("X"))


@op("concat", inputs=[In("X", many=True)], outputs=[Out("Out")], attrs={"axis": _AXIS})
def concat(X, *, axis):
    """Concatenate the arrays of `X` along `axis`."""
    _check_same_shapes(X, axis, f"concat along axis {axis}")
    return jnp.concatenate(X, axis=axis)


@concat.gradient
def _(g):
    outs = [t or g.tmp("concat.grad") for t in g.in_grad_list("X")]
    g.op("concat_grad", {"X": g.input_list("X"), "DOut": g.out_grad("Out")}, {"Out": outs},
         axis=g.attr("axis"))


@op("concat_grad",
    inputs=[In("X", many=True, differentiable=False, doc="concat's inputs; only their shapes "
                                                         "are used"), In("DOut")],
    outputs=[Out("Out", many=True)], attrs={"axis": _AXIS})
def concat_grad(X, DOut, *, axis):
    """Cut `DOut`, the gradient of concat's output, along `axis` into parts the sizes of the
    arrays of `X` (read at run time, so any number of them may be unknown when building)."""
    axis = axis % DOut.ndim
    parts, start = [], 0
    for x in X:
        parts.append(lax.slice_in_dim(DOut, start, start + x.shape[axis], axis=axis))
        start = start + x.shape[axis]
    return parts


@concat_grad.shape_rule
def _(inputs, attrs):   # the parts are shaped like X; tracing could not tell apart two -1 sizes
    (dout, dtype), = inputs["DOut"]
    xs = [dims for dims, _ in inputs["X"]]
    if any(len(dims) != len(dout) for dims in xs) or not dout:
        raise ShapeError(f"X={[list(d) for d in xs]} and DOut={list(dout)} must be of one "
                         "rank, at least 1", op_type="concat_grad")
    axis = attrs["axis"] % len(dout)
    sizes = [dims[axis] for dims in xs]
    if -1 not in sizes and dout[axis] != -1 and sum(sizes) != dout[axis]:
        raise ShapeError(f"the sizes of X along axis {axis} ({sizes}) do not add up to "
                         f"DOut's {dout[axis]}", op_type="concat_grad")
    return {"Out": [(tuple(dims), dtype) for dims in xs]}


@concat_grad.gradient
def _(g):   # linear in DOut: the parts' gradients, put back together
    grads = [g.out_grad("Out", i) for i in range(len(g.output_list("Out")))]
    g.call("concat", grads, axis=g.attr("axis"), out=g.in_grad("DOut"))


def _check_same_shapes(X, axis, what):
    """The arrays of list slot X have X[0]'s shape, except on `axis` (None: on every dim)."""
    if axis is not None:
        checks.axis("X[0]", X[0], axis)
        axis %= X[0].ndim
    for i, x in enumerate(X[1:], 1):
        expected = [x.shape[k] if k == axis and x.ndim == X[0].ndim else d
                    for k, d in enumerate(X[0].shape)]
        checks.shape(f"X[{i}]", x, expected, f"{what} needs the shape of X[0] "
                     f"{checks.typed(X[0])}" + ("" if axis is None else f" except on axis {axis}"))


def _split_bounds(sizes):
    """Static (start, stop) of each part; parts after the inferred one count from the end."""
    j = sizes.index(-1) if -1 in sizes else len(sizes)
    bounds, start = [], 0
    for s in sizes[:j]:
        bounds.append((start, start + s))
        start += s
    if j < len(sizes):
        stop = -sum(sizes[j + 1:])
        bounds.append((start, stop or None))
        for s in sizes[j + 1:]:
            bounds.append((stop, stop + s or None))
            stop += s
    return bounds


@op("split", inputs=[In("X")], outputs=[Out("Out", many=True)],
    attrs={"num": Attr("num", "int", 0, where=non_negative),
           "sections": Attr("sections", "ints", (), where=at_least(-1)), "axis": _AXIS})
def split(X, *, num, sections, axis):
    """Split `X` along `axis` into `num` equal parts, or into parts of sizes `sections`
    (at most one -1, inferred)."""
    if (num > 0) == bool(sections):
        raise ValueError("split: give exactly one of num > 0 or sections")
    if num:
        return jnp.split(X, num, axis=axis)
    sections, dim = list(sections), X.shape[axis]
    if sections.count(-1) > 1 or any(s < -1 for s in sections):
        raise ValueError(f"split: sections {sections} may hold one -1 and sizes >= 0")
    rest = sum(s for s in sections if s != -1)
    if isinstance(dim, int) and (rest > dim if -1 in sections else rest != dim):
        raise ValueError(f"split: sections {sections} do not fit dim {dim}")
    index = [slice(None)] * X.ndim
    parts = []
    for start, stop in _split_bounds(sections):
        index[axis] = slice(start, stop)
        parts.append(X[tuple(index)])
    return parts


@split.gradient
def _(g):
    grads = [g.out_grad("Out", i) for i in range(len(g.output_list("Out")))]
    g.call("concat", grads, axis=g.attr("axis"), out=g.in_grad("X"))


@op("stack", inputs=[In("X", many=True)], outputs=[Out("Out")], attrs={"axis": _AXIS})
def stack(X, *, axis):
    """Stack the same-shaped arrays of `X` along a new axis `axis`."""
    _check_same_shapes(X, None, "stack")
    checks.axis("X[0]", X[0], axis, extra=1)
    return jnp.stack(X, axis=axis)


@stack.gradient
def _(g):
    dout = g.out_grad("Out")
    axis = g.attr("axis") % (len(g.var(g.input_list("X")[0])[0]) + 1)
    for i, target in enumerate(g.in_grad_list("X")):
        if target:
            part = g.call("slice", dout, axes=[axis], starts=[i], ends=[i + 1])
            g.call("squeeze", part, axes=[axis], out=target)


TO_THE_END = 2 ** 31 - 1   # a slice's end past any dim: the dim's end


def _slices(ndim, axes, starts, ends, strides):
    if not len(axes) == len(starts) == len(ends) or strides and len(strides) != len(axes):
        raise ValueError("slice: axes, starts, ends (and strides) must have equal lengths")
    index = [slice(None)] * ndim
    for k, axis in enumerate(axes):
        stride = strides[k] if strides else 1
        end = None if ends[k] >= TO_THE_END and stride > 0 else ends[k]   # a symbolic dim's too
        index[axis] = slice(starts[k], end, stride)
    return tuple(index)


_SLICE_ATTRS = {"axes": Attr("axes", "ints", REQUIRED, lone_int=True),
                "starts": Attr("starts", "ints", REQUIRED, lone_int=True),
                "ends": Attr("ends", "ints", REQUIRED, lone_int=True), "strides": Attr("strides", "ints", ())}


@op("slice", inputs=[In("X")], outputs=[Out("Out")], attrs=_SLICE_ATTRS)
def slice_(X, *, axes, starts, ends, strides):
    """X[starts:ends:strides] along each of `axes`, indices clamped as in NumPy."""
    for a in axes:
        checks.axis("X", X, a, "axes")
    return X[_slices(X.ndim, axes, starts, ends, strides)]


@slice_.gradient
def _(g):
    g.call("slice_grad", g.input("X"), g.out_grad("Out"), out=g.in_grad("X"),
           **{k: g.attr(k) for k in _SLICE_ATTRS})


@op("slice_grad", inputs=[_LIKE, In("OutGrad")], outputs=[Out("Out")], attrs=_SLICE_ATTRS)
def slice_grad(X, OutGrad, *, axes, starts, ends, strides):
    """Zeros shaped like `X` with `OutGrad` written into the slice that `slice` reads."""
    return jnp.zeros_like(X, dtype=OutGrad.dtype).at[
        _slices(X.ndim, axes, starts, ends, strides)].add(OutGrad)


@slice_grad.shape_rule
def _(inputs, attrs):   # shaped like X; tracing could not tell apart X's -1 and OutGrad's
    (x, _), = inputs["X"]
    (out_grad, dtype), = inputs["OutGrad"]
    if len(x) != len(out_grad):
        raise ShapeError(f"X={list(x)} and OutGrad={list(out_grad)} must be of one rank",
                         op_type="slice_grad")
    return {"Out": [(tuple(x), dtype)]}


@slice_grad.gradient
def _(g):
    g.call("slice", g.out_grad("Out"), out=g.in_grad("OutGrad"),
           **{k: g.attr(k) for k in _SLICE_ATTRS})


@op("squeeze", inputs=[In("X")], outputs=[Out("Out")], attrs={"axes": Attr("axes", "ints", (), lone_int=True)})
def squeeze(X, *, axes):
    """Drop the size-1 dims `axes` (all statically size-1 dims when empty)."""
    if not axes:
        axes = tuple(i for i, d in enumerate(X.shape) if isinstance(d, int) and d == 1)
    return jnp.squeeze(X, axis=tuple(axes))


@op("unsqueeze", inputs=[In("X")], outputs=[Out("Out")],
    attrs={"axes": Attr("axes", "ints", REQUIRED, lone_int=True)})
def unsqueeze(X, *, axes):
    """Insert size-1 dims so that they sit at `axes` of the output."""
    return jnp.expand_dims(X, tuple(axes))


@squeeze.gradient
@unsqueeze.gradient
def _(g):
    g.call("reshape_as", g.out_grad("Out"), g.input("X"), out=g.in_grad("X"))


_REPS = {"reps": Attr("reps", "ints", REQUIRED, "how many copies along each dim of X",
                      where=non_negative)}


@op("tile", inputs=[In("X")], outputs=[Out("Out")], attrs=_REPS)
def tile(X, *, reps):
    """`reps[i]` copies of X one after another along each dim i (`numpy.tile` with one
    entry of `reps` per dim)."""
    checks.rank("X", X, len(reps), "one dim per entry of reps")
    return jnp.tile(X, tuple(reps))


@tile.gradient
def _(g):
    g.call("tile_grad", g.input("X"), g.out_grad("Out"), reps=g.attr("reps"),
           out=g.in_grad("X"))


@op("tile_grad", inputs=[_LIKE, In("OutGrad")], outputs=[Out("Out")], attrs=_REPS)
def tile_grad(X, OutGrad, *, reps):
    """The sum of the copies of X's shape that tile made of OutGrad."""
    checks.rank("X", X, len(reps), "one dim per entry of reps")
    split = [n for pair in zip(reps, X.shape) for n in pair]
    return OutGrad.reshape(split).sum(axis=tuple(range(0, len(split), 2)))


@tile_grad.gradient
def _(g):
    g.call("tile", g.out_grad("Out"), reps=g.attr("reps"), out=g.in_grad("OutGrad"))


@op("expand", inputs=[In("X")], outputs=[Out("Out")],
    attrs={"shape": Attr("shape", "ints", REQUIRED, where=Dims(least=-1))})
def expand(X, *, shape):
    """Broadcast `X` to `shape` (NumPy rules); -1 keeps the input dim it lines up with."""
    lead = len(shape) - X.ndim
    if any(d == -1 for d in shape[:max(lead, 0)]):
        raise ValueError(f"expand: -1 in shape {list(shape)} has no input dim to keep")
    return jnp.broadcast_to(X, tuple(X.shape[i - lead] if d == -1 else d
                                     for i, d in enumerate(shape)))


@expand.gradient
def _(g):
    g.call("reduce_as", g.out_grad("Out"), g.input("X"), out=g.in_grad("X"))


@op("gather", inputs=[In("X"), In("Index", "int")], outputs=[Out("Out")], attrs={"axis": _AXIS})
def gather(X, Index, *, axis):
    """Rows `Index` (1-D, negative counts from the end) of `X` along `axis`."""
    return jnp.take(X, Index, axis=axis)


@gather.gradient
def _(g):
    g.call("gather_grad", g.input("X"), g.input("Index"), g.out_grad("Out"),
           axis=g.attr("axis"), out=g.in_grad("X"))


@op("gather_grad", inputs=[_LIKE, In("Index", "int"), In("OutGrad")], outputs=[Out("Out")],
    attrs={"axis": _AXIS})
def gather_grad(X, Index, OutGrad, *, axis):
    """Zeros shaped like `X` with the rows of `OutGrad` added at `Index` along `axis`."""
    where = (slice(None),) * (axis % X.ndim) + (Index,)
    return jnp.zeros_like(X, dtype=OutGrad.dtype).at[where].add(OutGrad)


@gather_grad.gradient
def _(g):
    g.call("gather", g.out_grad("Out"), g.input("Index"), axis=g.attr("axis"),
           out=g.in_grad("OutGrad"))


@op("take_along_axis", inputs=[In("X"), In("Indices", "int")], outputs=[Out("Out")],
    attrs={"axis": _AXIS})
def take_along_axis(X, Indices, *, axis):
    """X picked at `Indices` along `axis` (as numpy.take_along_axis)."""
    return jnp.take_along_axis(X, Indices, axis=axis)


@take_along_axis.gradient
def _(g):
    g.call("take_along_axis_grad", g.input("X"), g.input("Indices"), g.out_grad("Out"),
           axis=g.attr("axis"), out=g.in_grad("X"))


@op("take_along_axis_grad", inputs=[_LIKE, In("Indices", "int"), In("OutGrad")],
    outputs=[Out("Out")], attrs={"axis": _AXIS})
def take_along_axis_grad(X, Indices, OutGrad, *, axis):
    """Zeros shaped like `X` with `OutGrad` added at `Indices` along `axis`."""
    where = [lax.broadcasted_iota(Indices.dtype, Indices.shape, d) for d in range(Indices.ndim)]
    where[axis % X.ndim] = Indices
    return jnp.zeros_like(X, dtype=OutGrad.dtype).at[tuple(where)].add(OutGrad)


@take_along_axis_grad.gradient
def _(g):
    g.call("take_along_axis", g.out_grad("Out"), g.input("Indices"), axis=g.attr("axis"),
           out=g.in_grad("OutGrad"))


@op("one_hot", inputs=[In("X", "int")], outputs=[Out("Out")],
    attrs={"depth": Attr("depth", "int", REQUIRED, where=positive), "dtype": Attr("dtype", "dtype", "float32")},
    differentiable=False)
def one_hot(X, *, depth, dtype):
    """One-hot encoding of `X` along a new last axis of size `depth` (out-of-range: all 0)."""
    return (X[..., None] == jnp.arange(depth, dtype=X.dtype)).astype(dtypes.to_numpy(dtype))


@op("broadcast_in_dim",
    inputs=[In("X"), In("Like", optional=True, differentiable=False,
                        doc="only its shape is used: the size of a -1 no dim of X is mapped to")],
    outputs=[Out("Out")],
    attrs={"shape": Attr("shape", "ints", REQUIRED, "dims of the result; -1 takes the size "
                                                    "of the X dim mapped there, else Like's",
                         where=Dims(least=-1)),
           "broadcast_dimensions": Attr("broadcast_dimensions", "ints", REQUIRED,
                                        "the result dim each dim of X becomes"),
           "like_axis": Attr("like_axis", "int", 0, "the dim of Like a -1 takes")})
def broadcast_in_dim(X, Like=None, *, shape, broadcast_dimensions, like_axis):
    """`lax.broadcast_in_dim`: X's dim i becomes dim broadcast_dimensions[i] of the result
    (its size there, or 1); the other dims of `shape` are new. A size known only at run
    time (a batch dim) is a -1, taken from X or from `Like`."""
    if len(broadcast_dimensions) != X.ndim:
        raise ShapeError(f"broadcast_dimensions {list(broadcast_dimensions)} must name one "
                         f"result dim for each of the {X.ndim} dims of X {checks.typed(X)}",
                         slot="X")
    source = dict(zip(broadcast_dimensions, X.shape))
    if any(d == -1 and i not in source for i, d in enumerate(shape)):
        if Like is None:
            raise ShapeError(f"shape {list(shape)}: a -1 needs a dim of X mapped to it, or "
                             "Like", slot="X")
        checks.axis("Like", Like, like_axis, "like_axis")
    target = tuple(d if d != -1 else source[i] if i in source else Like.shape[like_axis]
                   for i, d in enumerate(shape))
    for i, (n, d) in enumerate(zip(X.shape, broadcast_dimensions)):
        if not 0 <= d < len(target):
            raise ShapeError(f"broadcast_dimensions {list(broadcast_dimensions)} name a dim "
                             f"outside the result's {len(target)}", slot="X")
        checks.dim("X", X, i, n if n == 1 else target[d],
                   f"it becomes dim {d} of the result, of size {target[d]}, or 1")
    return lax.broadcast_in_dim(X, target, tuple(broadcast_dimensions))


@broadcast_in_dim.gradient
def _(g):
    x, dout = g.input("X"), g.out_grad("Out")
    dims, out_dims = g.var(x)[0], g.var(g.output("Out"))[0]
    mapped = g.attr("broadcast_dimensions")
    summed = [i for i in range(len(out_dims)) if i not in mapped]
    summed += [d for n, d in zip(dims, mapped) if n == 1 and out_dims[d] != 1]
    if summed:
        dout = g.call("reduce_sum", dout, axis=sorted(summed), keep_dim=True)
    g.call("reshape_as", dout, x, out=g.in_grad("X"))


_STARTS = In("StartIndices", "int", many=True, differentiable=False,
             doc="one int scalar per dim of X: where the window starts (clamped to fit)")


@op("dynamic_slice", inputs=[In("X"), _STARTS], outputs=[Out("Out")],
    attrs={"sizes": Attr("sizes", "ints", REQUIRED, "the window's size in each dim; -1 "
                        "takes that dim whole (a batch dim)", where=Dims(least=-1))})
def dynamic_slice(X, StartIndices, *, sizes):
    """The window of X of `sizes` at run-time `StartIndices` (`lax.dynamic_slice`)."""
    sizes = [n if k == -1 else k for k, n in zip(sizes, X.shape)]
    _check_starts(X, StartIndices, sizes)
    return lax.dynamic_slice(X, _clamp_low(StartIndices), tuple(sizes))


def _clamp_low(StartIndices):
    """Negative starts as 0 (`lax.dynamic_slice` would count them from the end; the
    primitive, like XLA, clamps the window into X)."""
    return [jnp.maximum(s, 0) for s in StartIndices]


def _check_starts(X, StartIndices, sizes):
    """One scalar start per dim of X; a window no larger than X."""
    if len(StartIndices) != X.ndim or any(s.ndim for s in StartIndices):
        raise ShapeError(f"StartIndices must hold {X.ndim} int scalars, one per dim of X "
                         f"{checks.typed(X)}, got {[checks.typed(s) for s in StartIndices]}",
                         slot="StartIndices")
    checks.rank("X", X, len(sizes), f"one per window size {list(sizes)}")
    for i, (n, k) in enumerate(zip(X.shape, sizes)):
        if isinstance(n, int) and not 0 <= k <= n:
            raise ShapeError(f"window size {k} does not fit dim {i} of X {checks.typed(X)}",
                             slot="X")


@dynamic_slice.gradient
def _(g):
    zeros = g.call("fill_zeros_like", g.input("X"))
    g.call("dynamic_update_slice", zeros, g.out_grad("Out"), g.input_list("StartIndices"),
           out=g.in_grad("X"))


@op("dynamic_update_slice", inputs=[In("X"), In("Update"), _STARTS], outputs=[Out("Out")],
    same_dtype=("X", "Update"))
def dynamic_update_slice(X, Update, StartIndices):
    """X with the window at run-time `StartIndices` replaced by `Update`
    (`lax.dynamic_update_slice`)."""
    _check_starts(X, StartIndices, Update.shape)
    return lax.dynamic_update_slice(X, Update, _clamp_low(StartIndices))


@dynamic_update_slice.gradient
def _(g):
    dout, update, starts = g.out_grad("Out"), g.input("Update"), g.input_list("StartIndices")
    if g.wants("X"):
        g.call("dynamic_update_slice", dout, g.call("fill_zeros_like", update), starts,
               out=g.in_grad("X"))
    if g.wants("Update"):   # an unknown dim of Update (-1) is one it has whole, as X
        g.call("dynamic_slice", dout, starts, sizes=list(g.var(update)[0]),
               out=g.in_grad("Update"))


_GATHER_ATTRS = {
    "offset_dims": Attr("offset_dims", "ints", ()),
    "collapsed_slice_dims": Attr("collapsed_slice_dims", "ints", ()),
    "start_index_map": Attr("start_index_map", "ints", ()),
    "operand_batching_dims": Attr("operand_batching_dims", "ints", ()),
    "start_indices_batching_dims": Attr("start_indices_batching_dims", "ints", ()),
    "slice_sizes": Attr("slice_sizes", "ints", REQUIRED, "one per dim of X; -1 takes that dim "
                                                         "whole (a batch dim)"),
    "mode": Attr("mode", "string", "fill", "out-of-bounds slices: clip (moved inside X), fill "
                                           "(filled with fill_value) or promise_in_bounds"),
    "fill_value": Attr("fill_value", "float", float("nan"),
                       "for mode fill; NaN: JAX's default for X's dtype"),
}


def _gather_args(slice_sizes, mode, fill_value, **dimension_numbers):
    return dict(dimension_numbers=lax.GatherDimensionNumbers(
                    **{k: tuple(v) for k, v in dimension_numbers.items()}),
                slice_sizes=tuple(slice_sizes), mode=mode,
                fill_value=None if math.isnan(fill_value) else fill_value)


@op("gather_general", inputs=[In("X"), In("Indices", "int")], outputs=[Out("Out")],
    attrs=_GATHER_ATTRS)
def gather_general(X, Indices, **attrs):
    """Slices of X at the start positions in `Indices`, as `lax.gather` takes them (the
    dimension numbers are its `GatherDimensionNumbers`): what `jnp.take` and indexing
    with arrays make."""
    checks.rank("X", X, len(attrs["slice_sizes"]), "one dim per slice size")
    sizes = [n if s == -1 else s for s, n in zip(attrs["slice_sizes"], X.shape)]
    return lax.gather(X, Indices, **_gather_args(**dict(attrs, slice_sizes=sizes)))


@gather_general.gradient
def _(g):
    g.call("gather_general_grad", g.input("X"), g.input("Indices"), g.out_grad("Out"),
           out=g.in_grad("X"), **g.attrs)


@op("gather_general_grad", inputs=[_LIKE, In("Indices", "int"), In("OutGrad")],
    outputs=[Out("Out")], attrs=_GATHER_ATTRS)
def gather_general_grad(X, Indices, OutGrad, **attrs):
    """Zeros shaped like `X` with `OutGrad`'s slices added where gather_general read them
    (slices it filled or dropped add nothing)."""
    return local_vjp(lambda x: gather_general.lower(x, Indices, **attrs),
                     (jnp.zeros(X.shape, OutGrad.dtype),), OutGrad)[0]


@gather_general_grad.gradient
def _(g):   # linear in OutGrad: a gather, whose dropped slices took no part (zeros)
    g.call("gather_general", g.out_grad("Out"), g.input("Indices"), out=g.in_grad("OutGrad"),
           **dict(g.attrs, fill_value=0.0))


@op("pad", inputs=[In("X"), In("PaddingValue", doc="a scalar of X's dtype")],
    outputs=[Out("Out")], same_dtype=("X", "PaddingValue"),
    attrs={"padding_config": Attr("padding_config", "ints", REQUIRED,
                                  "(low, high, interior) for each dim of X, flattened; "
                                  "a negative low or high cuts")})
def pad(X, PaddingValue, *, padding_config):
    """X padded with `PaddingValue` before, after and between its elements (`lax.pad`)."""
    config = _pad_config(X, padding_config)
    checks.rank("PaddingValue", PaddingValue, 0, "a scalar")
    return lax.pad(X, PaddingValue, config)


def _pad_config(X, padding_config):
    config = [tuple(padding_config[i:i + 3]) for i in range(0, len(padding_config), 3)]
    if len(padding_config) != 3 * X.ndim or any(c[2] < 0 for c in config):
        raise ShapeError(f"padding_config {list(padding_config)} must hold (low, high, "
                         f"interior >= 0) for each dim of X {checks.typed(X)}", slot="X")
    return config


@pad.gradient
def _(g):   # as JAX's transpose: cut the padding off, take every (interior + 1)-th element
    x, dout = g.input("X"), g.out_grad("Out")
    config = g.attr("padding_config")
    lo, hi, interior = config[0::3], config[1::3], config[2::3]
    if g.wants("X"):
        zero = g.call("fill_constant", shape=[], dtype=g.var(x)[1])
        cut = g.call("pad", dout, zero,
                     padding_config=[v for a, b in zip(lo, hi) for v in (-a, -b, 0)])
        dims = g.var(x)[0]   # the cut is X's shape but for interior padding: skip that
        axes = [a for a, k in enumerate(interior) if k]
        g.call("slice", cut, axes=axes, starts=[0] * len(axes),
               ends=[(dims[a] - 1) * (interior[a] + 1) + 1 if dims[a] >= 0 else TO_THE_END
                     for a in axes],
               strides=[interior[a] + 1 for a in axes], out=g.in_grad("X"))
    if g.wants("PaddingValue"):   # the elements of Out that are padding: a mask of them
        one = g.call("scale", g.call("fill_zeros_like", g.input("PaddingValue")), bias=1.0)
        mask = g.call("pad", g.call("fill_zeros_like", x), one, padding_config=list(config))
        g.call("reduce_sum", g.call("mul", dout, mask), out=g.in_grad("PaddingValue"))


@op("rev", inputs=[In("X")], outputs=[Out("Out")],
    attrs={"dimensions": Attr("dimensions", "ints", REQUIRED, "the dims reversed")})
def rev(X, *, dimensions):
    """X with the order of its elements reversed along `dimensions`."""
    for d in dimensions:
        checks.axis("X", X, d, "dimensions")
    return lax.rev(X, tuple(d % X.ndim for d in dimensions))


@rev.gradient
def _(g):
    g.call("rev", g.out_grad("Out"), dimensions=g.attr("dimensions"), out=g.in_grad("X"))


_SCATTER_ATTRS = {
    "update_window_dims": Attr("update_window_dims", "ints", ()),
    "inserted_window_dims": Attr("inserted_window_dims", "ints", ()),
    "scatter_dims_to_operand_dims": Attr("scatter_dims_to_operand_dims", "ints", ()),
    "operand_batching_dims": Attr("operand_batching_dims", "ints", ()),
    "scatter_indices_batching_dims": Attr("scatter_indices_batching_dims", "ints", ()),
    "mode": Attr("mode", "string", "fill", "out-of-bounds updates: clip (moved inside X), "
                                           "fill (dropped) or promise_in_bounds"),
}


@op("scatter_add_general", inputs=[In("X"), In("Indices", "int"), In("Updates")],
    outputs=[Out("Out")], attrs=_SCATTER_ATTRS, same_dtype=("X", "Updates"))
def scatter_add_general(X, Indices, Updates, *, mode, **dimension_numbers):
    """X with `Updates` added at the positions in `Indices`, as `lax.scatter_add` takes them
    (the dimension numbers are its `ScatterDimensionNumbers`): what `x.at[i].add(v)` and the
    gradient of a gather make."""
    numbers = lax.ScatterDimensionNumbers(**{k: tuple(v) for k, v in dimension_numbers.items()})
    return lax.scatter_add(X, Indices, Updates, numbers, mode=mode)


def _gather_updates(g, source, out=None):
    """Emit the gather that reads, from `source` (shaped like the scatter's X), the entries
    each update of the scatter op went to (0 for dropped ones); returns its name."""
    a = g.attrs
    dims = len(g.var(g.input("X"))[0])
    update_dims = g.var(g.input("Updates"))[0]
    skipped = set(a["inserted_window_dims"]) | set(a["operand_batching_dims"])
    window = iter(a["update_window_dims"])
    sizes = [1 if i in skipped else update_dims[next(window)] for i in range(dims)]
    return g.call("gather_general", source, g.input("Indices"),
                  offset_dims=a["update_window_dims"],
                  collapsed_slice_dims=a["inserted_window_dims"],
                  start_index_map=a["scatter_dims_to_operand_dims"],
                  operand_batching_dims=a["operand_batching_dims"],
                  start_indices_batching_dims=a["scatter_indices_batching_dims"],
                  slice_sizes=sizes, mode=a["mode"], fill_value=0.0, out=out)


@scatter_add_general.gradient
def _(g):   # as JAX's transpose: X's gradient passes; Updates' is a gather of it
    dout = g.out_grad("Out")
    g.pass_through("X", dout)
    if g.wants("Updates"):
        _gather_updates(g, dout, out=g.in_grad("Updates"))


_SCATTERS = {"set": lax.scatter, "mul": lax.scatter_mul, "min": lax.scatter_min,
             "max": lax.scatter_max}
_SCATTER_GENERAL_ATTRS = dict(
    _SCATTER_ATTRS,
    computation=Attr("computation", "string", REQUIRED, "set (x.at[i].set(v)), mul, min or max",
                     where=one_of(*_SCATTERS)),
    indices_are_sorted=Attr("indices_are_sorted", "bool", False, "a promise that lets XLA "
                                                                 "scatter faster"),
    unique_indices=Attr("unique_indices", "bool", False, "a promise that no two updates meet"))


def _scatter(X, Indices, Updates, *, computation, mode, indices_are_sorted, unique_indices,
             **dimension_numbers):
    numbers = lax.ScatterDimensionNumbers(**{k: tuple(v) for k, v in dimension_numbers.items()})
    return _SCATTERS[computation](X, Indices, Updates, numbers, mode=mode,
                                  indices_are_sorted=indices_are_sorted,
                                  unique_indices=unique_indices)


@op("scatter_general", inputs=[In("X"), In("Indices", "int"), In("Updates")],
    outputs=[Out("Out")], attrs=_SCATTER_GENERAL_ATTRS, same_dtype=("X", "Updates"))
def scatter_general(X, Indices, Updates, **attrs):
    """X with `Updates` written (set), multiplied in (mul) or combined by min or max at the
    positions in `Indices`, as `lax.scatter` and its kin take them: what `x.at[i].set(v)`,
    `.mul`, `.min` and `.max` make. Of updates that meet at one place, set keeps one."""
    return _scatter(X, Indices, Updates, **attrs)


@scatter_general.gradient
def _(g):
    x, indices, updates, dout = (g.input("X"), g.input("Indices"), g.input("Updates"),
                                 g.out_grad("Out"))
    if g.attr("computation") != "mul":
        for slot in ("X", "Updates"):
            if g.wants(slot):
                g.call("scatter_general_grad", x, indices, updates, dout, wrt=slot,
                       out=g.in_grad(slot), **g.attrs)
        return
    # mul: out = x * p, p = the product of the updates at each place (1 elsewhere)
    if g.wants("X"):
        ones = g.call("scale", g.call("fill_zeros_like", x), bias=1.0)
        g.call("mul", dout, g.call("scatter_general", ones, indices, updates, **g.attrs),
               out=g.in_grad("X"))
    if g.wants("Updates"):
        if not g.attr("unique_indices"):
            raise BackwardError("the gradient of scatter_general (mul) with respect to "
                                "Updates needs unique_indices (as in JAX)",
                                op_type="scatter_general")
        _gather_updates(g, g.call("mul", dout, x), out=g.in_grad("Updates"))


_WRT = Attr("wrt", "string", REQUIRED, "X or Updates: the input differentiated",
            where=one_of("X", "Updates"))
_SCATTER_DERIVATIVE_ATTRS = dict(
    _SCATTER_GENERAL_ATTRS, wrt=_WRT,
    computation=Attr("computation", "string", REQUIRED, "set, min or max",
                     where=one_of("set", "min", "max")))


def _scatter_wrt(X, Indices, Updates, wrt, attrs):
    """scatter_general as a function of its input `wrt` alone, and that input."""
    if wrt == "X":
        return (lambda x: _scatter(x, Indices, Updates, **attrs)), X
    return (lambda u: _scatter(X, Indices, u, **attrs)), Updates


@op("scatter_general_grad",
    inputs=[In("X", "float"), In("Indices", "int"), In("Updates", "float"),
            In("OutGrad", "float")],
    outputs=[Out("Out")], attrs=_SCATTER_DERIVATIVE_ATTRS, same_dtype=("X", "Updates", "OutGrad"))
def scatter_general_grad(X, Indices, Updates, OutGrad, *, wrt, **attrs):
    """Gradient of scatter_general's input `wrt` (set, min or max) from the gradient of its
    Out (linear in OutGrad)."""
    fn, primal = _scatter_wrt(X, Indices, Updates, wrt, attrs)
    return local_vjp(fn, (primal,), OutGrad)[0]


@op("scatter_general_jvp",
    inputs=[In("X", "float"), In("Indices", "int"), In("Updates", "float"),
            In("Tangent", "float", doc="shaped like the input wrt")],
    outputs=[Out("Out")], attrs=_SCATTER_DERIVATIVE_ATTRS, same_dtype=("X", "Updates", "Tangent"))
def scatter_general_jvp(X, Indices, Updates, Tangent, *, wrt, **attrs):
    """Derivative of scatter_general (set, min or max) along Tangent in its input `wrt`:
    the transpose of scatter_general_grad."""
    fn, primal = _scatter_wrt(X, Indices, Updates, wrt, attrs)
    return jax.jvp(fn, (primal,), (Tangent,))[1]


def _scatter_derivative_gradient(transpose, linear_slot):
    def gradient(g):   # linear in its last input; piecewise constant in X and Updates
        x, indices, updates = g.input("X"), g.input("Indices"), g.input("Updates")
        if g.wants(linear_slot):
            g.call(transpose, x, indices, updates, g.out_grad("Out"),
                   out=g.in_grad(linear_slot), **g.attrs)
        for slot in ("X", "Updates"):
            if g.in_grad(slot):
                g.call("fill_zeros_like", g.input(slot), out=g.in_grad(slot))
    return gradient


scatter_general_grad.gradient(_scatter_derivative_gradient("scatter_general_jvp", "OutGrad"))
scatter_general_jvp.gradient(_scatter_derivative_gradient("scatter_general_grad", "Tangent"))
