"""Helpers of the shape rows: inputs read at import, symbolic sizes mapped onto our ops.

A target shape (Reshape's, Expand's, ConstantOfShape's) is a list of ints and symbolic
`Size`s; `computed_dims` turns its Sizes into the `shape` / `dims` / `Like` arguments of
`reshape_dims` and `broadcast_dims`, each symbol read at run time from a variable that
holds it (`OnnxTranslator.source_of`).
"""
import numpy as np

from lowering.errors import ProgramError
from progdesc.onnx import symbolic
from progdesc.onnx.model import as_numpy_dtype
from progdesc.translate import Unsupported

INT32_MAX = 2 ** 31 - 1


def axis_of(axis, rank, what="axis"):
    """`axis` (negative counts from the end) as an index into `rank` dims."""
    axis = int(axis)
    if not -rank <= axis < rank:
        raise Unsupported(f"{what} {axis} is out of range for rank {rank}")
    return axis % rank


def ints_of(t, name, what):
    """The ints our variable `name` holds, known at import; Unsupported naming `what`
    where they are computed at run time."""
    value = t.value_of(name)
    if value is None:
        sizes = t.sizes_of(name)
        if sizes is not None and not any(isinstance(s, symbolic.Size) for s in sizes):
            return [int(s) for s in sizes]
        raise Unsupported(f"its {what} is computed at run time (progdesc needs it at import)")
    return [int(v) for v in np.asarray(value).reshape(-1)]


def sizes_or_refuse(t, name, what):
    """The sizes (ints and symbolic Sizes) our int vector `name` holds; Unsupported naming
    `what` where some element depends on run-time values."""
    sizes = t.sizes_of(name)
    if sizes is None:
        raise Unsupported(f"its {what} is computed at run time (import folds constants "
                          "and polynomials in the inputs' dims, e.g. batch*seq, not this)")
    return sizes


def dim_sizes(t, x):
    """The dims of our variable `x` as sizes (ints and Sizes)."""
    return [t.size_of_dim(x, i) for i in range(len(t.var(x)[0]))]


def computed_dims(t, target):
    """(shape, dims, likes) of `target` (ints and Sizes) for reshape_dims / broadcast_dims:
    each Size's constant term in `shape`, its other terms in `dims`, read from `likes`."""
    shape, dims, likes = [], [], []
    for pos, size in enumerate(target):
        if not isinstance(size, symbolic.Size):
            shape.append(int(size))
            continue
        shape.append(size.terms.get((), 0))
        for mono, coef in size.terms.items():
            if not mono:
                continue
            dims += [pos, coef, len(mono)]
            for name in mono:
                source = t.source_of(name)
                if source is None:
                    raise Unsupported(f"no variable holds the symbolic dim '{name}' at run time")
                var, axis = source
                if var not in likes:
                    likes.append(var)
                dims += [likes.index(var), axis]
    return shape, dims, likes


def inferred_dim(sizes, target):
    """The size a -1 of `target` stands for, reshaping dims `sizes`; None if unknown."""
    try:
        rest = symbolic.product(d for d in target if not (isinstance(d, int) and d == -1))
        return symbolic.product(sizes) // rest
    except (symbolic.Undecided, ZeroDivisionError, TypeError):
        return None


def reshape_to(t, x, target, allowzero=False):
    """Reshape our `x` to `target` (ints, Sizes, one -1; a 0 copies x's dim unless
    `allowzero`), with our `reshape` where its 0 and -1 can say it, else `reshape_dims`."""
    sizes = dim_sizes(t, x)
    target = list(target)
    if not allowzero:
        for i, d in enumerate(target):
            if isinstance(d, int) and d == 0:
                if i >= len(sizes):
                    raise Unsupported(f"a 0 at dim {i} of the target copies a dim x lacks")
                target[i] = sizes[i]
    if sum(1 for d in target if isinstance(d, int) and d == -1) > 1:
        raise Unsupported(f"the target {target} holds more than one -1")
    out_dims = [inferred_dim(sizes, target) if isinstance(d, int) and d == -1 else d
                for d in target]
    ours = []   # our reshape's shape: 0 copies x's dim, one -1 inferred
    for i, d in enumerate(target):
        if isinstance(d, symbolic.Size):
            ours.append(0 if i < len(sizes) and sizes[i] == d else d)
        elif d == 0 and not (i < len(sizes) and sizes[i] == 0):
            ours.append(None)   # a literal 0: only reshape_dims says it
        else:
            ours.append(d)
    left = [i for i, d in enumerate(ours) if d is None or isinstance(d, symbolic.Size)]
    if len(left) == 1 and -1 not in ours and isinstance(ours[left[0]], symbolic.Size):
        ours[left[0]] = -1
        left = []
    out = None
    if not left:
        try:
            out = t.call("reshape", x, shape=ours)
        except ProgramError:
            # its shape rule sees every unknown dim as one symbol: [-1, 7, 8] ([4*batch,
            # 7, 8]) to [-1, 4, 7, 8] does not divide there; reshape_dims does not check
            out = None
    if out is None:
        known = [d if d is not None and not (isinstance(d, int) and d == -1) else t_d
                 for d, t_d in zip(out_dims, target)]
        shape, dims, likes = computed_dims(t, known if all(
            _sourced(t, d) for d in known) else target)
        out = t.call("reshape_dims", x, likes or None, shape=shape, dims=dims)
    t.set_dims(out, out_dims)
    return out


def _sourced(t, size):
    """Whether a variable holds every symbol of `size` at run time."""
    return not isinstance(size, symbolic.Size) or all(
        t.source_of(n) is not None for n in size.symbols)


def zero_of(t, x):
    """A scalar constant 0 of our variable x's dtype."""
    return t.constant(np.zeros((), as_numpy_dtype(t.var(x)[1])))


def wrapped_indices(t, indices, sizes):
    """Our int `indices` with negative entries counted from the end of `sizes` (an int, or
    a list along the last axis of `indices`): a constant where they are known."""
    value = t.value_of(indices)
    dtype = as_numpy_dtype(t.var(indices)[1])
    bound = np.asarray(sizes, dtype=dtype)
    if value is not None:
        return t.constant(np.where(value < 0, value + bound, value).astype(dtype))
    zero = t.constant(np.zeros((), dtype))
    negative = t.call("less_than", indices, zero)
    return t.call("where", negative, t.call("add", indices, t.constant(bound)), indices)
