"""Reshape, broadcast and slice to shapes computed from other arrays' dims at run time.

An imported model's shapes may be products and sums of dims known only at run time
(`[batch, seq, 12, 64]` from `[batch*seq, 768]`): `reshape_dims` and `broadcast_dims`
take them (and `slice_dims` its bounds) from the shapes of their `Like` inputs (only
their shapes are read, so the values computing them are never needed), which keeps the
dims symbolic through `jax.export`.

The target's dims are `shape`, with the dims that `dims` lists computed as
`shape[pos] + sum(coef * Like[i].shape[axis] * ...)`. `dims` is flat: for each term,
`pos, coef, n` then `n` pairs `(i, axis)` of the Like dims it multiplies.
"""
import jax.numpy as jnp
from jax import lax

from lowering import checks
from lowering.errors import ShapeError
from lowering.ops.collective import local_vjp
from lowering.registry import REQUIRED, Attr, In, Out, op

_LIKES = In("Like", many=True, optional=True, differentiable=False,
            doc="arrays whose dims the target's dims are computed from (only their shapes "
                "are read)")
_DIMS = Attr("dims", "ints", (), "the computed dims: for each term, pos, coef, n and n "
                                 "pairs (Like index, axis) whose sizes it multiplies")


def target_dims(shape, dims, Like):
    """The target of `shape` and `dims` (see the module's text) and the set of its
    positions that `dims` computes."""
    target, computed, i = list(shape), set(), 0
    Like = Like or []
    while i < len(dims):
        if i + 3 > len(dims):
            raise ShapeError(f"attribute dims={list(dims)} ends inside a term", slot="Like")
        pos, coef, n = dims[i:i + 3]
        pairs = dims[i + 3:i + 3 + 2 * n]
        if not 0 <= pos < len(target) or n < 0 or len(pairs) != 2 * n:
            raise ShapeError(f"attribute dims={list(dims)}: the term at {i} names no dim of "
                             f"the target {list(shape)} or ends early", slot="Like")
        value = coef
        for k in range(n):
            index, axis = pairs[2 * k:2 * k + 2]
            if not 0 <= index < len(Like):
                raise ShapeError(f"attribute dims={list(dims)} reads Like[{index}] of "
                                 f"{len(Like)}", slot="Like")
            checks.axis(f"Like[{index}]", Like[index], axis, "dims")
            value = value * Like[index].shape[axis]
        target[pos] = target[pos] + value
        computed.add(pos)
        i += 3 + 2 * n
    return target, computed


@op("reshape_dims", inputs=[In("X"), _LIKES], outputs=[Out("Out")],
    attrs={"shape": Attr("shape", "ints", REQUIRED, "the target; one -1 (not computed) is "
                                                    "inferred"),
           "dims": _DIMS})
def reshape_dims(X, Like=None, *, shape, dims):
    """Reshape `X` to `shape`, its dims listed in `dims` computed from Like's dims."""
    target, computed = target_dims(shape, dims, Like)
    free = [d for i, d in enumerate(target) if i not in computed]
    if free.count(-1) > 1 or any(d < -1 for d in free):
        raise ShapeError(f"cannot reshape X {checks.typed(X)} to {list(shape)}: it may hold "
                         "one -1 (inferred) and sizes >= 0 beside the computed dims", slot="X")
    return jnp.reshape(X, tuple(target))


class _Dims:
    """The dims of an input as a shape rule sees them (-1: unknown), for `target_dims`."""

    def __init__(self, dims):
        self.shape = tuple(dims)
        self.ndim = len(self.shape)


def _inferred(inputs, attrs):
    """(X's dims, its dtype, the target with -1 where a Like dim it reads is unknown, the
    computed positions)."""
    (x, dtype), = inputs["X"]
    likes = [d for d, _ in inputs.get("Like", [])]
    two, computed = target_dims(attrs["shape"], attrs["dims"],
                                [_Dims([2 if d < 0 else d for d in like]) for like in likes])
    three, _ = target_dims(attrs["shape"], attrs["dims"],
                           [_Dims([3 if d < 0 else d for d in like]) for like in likes])
    target = [a if a == b else -1 for a, b in zip(two, three)]
    return list(x), dtype, target, computed


@reshape_dims.shape_rule
def _(inputs, attrs):
    x, dtype, target, computed = _inferred(inputs, attrs)
    free = [i for i in range(len(target)) if i not in computed and target[i] == -1]
    if free and all(d >= 0 for d in x) and all(
            d >= 0 for i, d in enumerate(target) if i != free[0]):
        rest = 1
        for i, d in enumerate(target):
            if i != free[0]:
                rest *= d
        total = 1
        for d in x:
            total *= d
        target[free[0]] = total // rest if rest else -1
    return {"Out": [(tuple(target), dtype)]}


@reshape_dims.gradient
def _(g):
    g.call("reshape_as", g.out_grad("Out"), g.input("X"), out=g.in_grad("X"))


@op("broadcast_dims", inputs=[In("X"), _LIKES], outputs=[Out("Out")],
    attrs={"shape": Attr("shape", "ints", REQUIRED, "the target; -1 (not computed) keeps "
                                                    "the dim of X it lines up with"),
           "dims": _DIMS})
def broadcast_dims(X, Like=None, *, shape, dims):
    """Broadcast `X` to `shape` (NumPy rules, X's dims lined up with the last ones), its
    dims listed in `dims` computed from Like's dims."""
    target, computed = target_dims(shape, dims, Like)
    lead = len(target) - X.ndim
    if lead < 0:
        raise ShapeError(f"cannot broadcast X {checks.typed(X)} to the {len(target)} dims of "
                         f"{list(shape)}", slot="X")
    for i, d in enumerate(target):
        if i not in computed and d == -1:
            if i < lead:
                raise ShapeError(f"-1 at dim {i} of {list(shape)} has no dim of X "
                                 f"{checks.typed(X)} to keep", slot="X")
            target[i] = X.shape[i - lead]
    return jnp.broadcast_to(X, tuple(target))


@broadcast_dims.shape_rule
def _(inputs, attrs):
    x, dtype, target, computed = _inferred(inputs, attrs)
    lead = len(target) - len(x)
    for i, d in enumerate(target):
        if i not in computed and d == -1:
            if i < lead:
                raise ShapeError(f"-1 at dim {i} of {list(attrs['shape'])} has no dim of X "
                                 f"{checks.dims(x)} to keep", slot="X")
            target[i] = x[i - lead]
    return {"Out": [(tuple(target), dtype)]}


@broadcast_dims.gradient
def _(g):
    g.call("reduce_as", g.out_grad("Out"), g.input("X"), out=g.in_grad("X"))


_SLICE_ATTRS = {
    "axes": Attr("axes", "ints", REQUIRED),
    "starts": Attr("starts", "ints", REQUIRED, "negative counts from the end"),
    "ends": Attr("ends", "ints", REQUIRED, "negative counts from the end; clamped to the dim"),
    "strides": Attr("strides", "ints", ()),
    "dims": Attr("dims", "ints", (), "computed starts and ends: terms as for reshape_dims, "
                                     "positions in starts + ends"),
}


def dim_min_max():
    """(min, max) of two dims, ints or symbolic (progdesc.jax_compat reaches JAX's)."""
    from progdesc.jax_compat import dim_min_max as reach   # JAX internals: one place
    return reach()


def _clamped(value, n, step):
    """An ONNX start or end (an int or a symbolic dim) clamped into a dim of `n`."""
    low, high = dim_min_max()
    if isinstance(value, int) and value < 0:
        value = value + n
    if step > 0:
        return low(high(value, 0), n)
    return low(high(value, -1), n - 1)


def _slice_window(X, Like, axes, starts, ends, strides, dims):
    """(starts, limits, strides) per dim of X for `lax.slice`, or Python slices (a
    negative stride)."""
    bounds, _ = target_dims(list(starts) + list(ends), dims, Like)
    n = len(axes)
    if len(starts) != n or len(ends) != n or (strides and len(strides) != n):
        raise ShapeError("slice_dims: axes, starts, ends (and strides) must have equal "
                         "lengths", slot="X")
    index = [slice(None)] * X.ndim
    for k, axis in enumerate(axes):
        checks.axis("X", X, axis, "axes")
        step = strides[k] if strides else 1
        if step == 0:
            raise ShapeError("slice_dims: a stride of 0", slot="X")
        size = X.shape[axis]
        start, end = _clamped(bounds[k], size, step), _clamped(bounds[n + k], size, step)
        if step < 0 and isinstance(end, int) and end < 0:
            end = None
        index[axis % X.ndim] = slice(start, end, step)
    return tuple(index)


@op("slice_dims", inputs=[In("X"), _LIKES], outputs=[Out("Out")], attrs=_SLICE_ATTRS)
def slice_dims(X, Like=None, *, axes, starts, ends, strides, dims):
    """X[starts:ends:strides] along `axes` (ONNX's Slice: bounds clamped into each dim),
    the bounds listed in `dims` computed from Like's dims."""
    index = _slice_window(X, Like, axes, starts, ends, strides, dims)
    if all(s.step is None or s.step > 0 for s in index):
        low, high = dim_min_max()
        start = [0 if s.start is None else s.start for s in index]
        limit = [n if s.stop is None else high(s.stop, s.start or 0)
                 for s, n in zip(index, X.shape)]
        return lax.slice(X, start, limit, [s.step or 1 for s in index])
    return X[index]


@slice_dims.gradient
def _(g):
    g.call("slice_dims_grad", g.input("X"), g.input_list("Like") or None, g.out_grad("Out"),
           out=g.in_grad("X"), **{k: g.attr(k) for k in _SLICE_ATTRS})


@op("slice_dims_grad", inputs=[In("X", differentiable=False, doc="only its shape is used"),
                               _LIKES, In("OutGrad")],
    outputs=[Out("Out")], attrs=_SLICE_ATTRS)
def slice_dims_grad(X, Like=None, OutGrad=None, **attrs):
    """Zeros shaped like `X` with `OutGrad` written where slice_dims read it."""
    return local_vjp(lambda x: slice_dims.lower(x, Like, **attrs),
                     (jnp.zeros(X.shape, OutGrad.dtype),), OutGrad)[0]


@slice_dims_grad.shape_rule
def _(inputs, attrs):
    (x, _), = inputs["X"]
    (_, dtype), = inputs["OutGrad"]
    return {"Out": [(tuple(x), dtype)]}


@slice_dims_grad.gradient
def _(g):
    g.call("slice_dims", g.out_grad("Out"), g.input_list("Like") or None,
           out=g.in_grad("OutGrad"), **{k: g.attr(k) for k in _SLICE_ATTRS})
