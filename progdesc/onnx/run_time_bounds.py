"""Slices whose start is known only at run time but whose length is known at import: a
loop body reading x[i:i + 1] at its iteration number i. ONNX computes such bounds with
Add / Sub of known ints and reshapes of one-element tensors (`Unsqueeze(i)`,
`Unsqueeze(Add(i, 1))`); when the start and the end come from the same run-time value,
their difference is the window's static length and our `dynamic_slice` takes it.

A window that would reach past the dim (where ONNX would clamp the end and give fewer
elements: a shape only run time knows) is moved back inside the dim, as XLA's dynamic
slice does; a negative start counts from the end, as in ONNX.
"""
import numpy as np

from progdesc.onnx.shape_args import axis_of
from progdesc.translate import Unsupported

_SAME_VALUE = ("Unsqueeze", "Squeeze", "Reshape", "Identity", "Flatten")


def _known_int(t, name):
    value = t.value_of(name)
    if value is None or np.size(value) != 1 or np.asarray(value).dtype.kind not in "iu":
        return None
    return int(np.asarray(value).reshape(-1)[0])


def offset_form(t, name, depth=0):
    """(base, k) with our one-element int variable `name` holding base + k: `base` one of
    ours known only at run time, `k` an int known at import, found through the Add / Sub
    of known ints and the reshapes that made `name`; (name, 0) where nothing more is
    known."""
    made = t.computed_by(name)
    if made is None or depth > 32:
        return name, 0
    op_type, ins, _ = made
    if op_type in _SAME_VALUE and ins and ins[0] is not None:
        return offset_form(t, ins[0], depth + 1)
    if op_type in ("Add", "Sub") and len(ins) == 2:
        right = _known_int(t, ins[1])
        if right is not None:
            base, k = offset_form(t, ins[0], depth + 1)
            return base, k + right if op_type == "Add" else k - right
        left = _known_int(t, ins[0])
        if left is not None and op_type == "Add":
            base, k = offset_form(t, ins[1], depth + 1)
            return base, k + left
    return name, 0


def slice_window(t, x, starts, ends, axes, steps):
    """Our `dynamic_slice` for an ONNX Slice of one axis, step 1, whose start is known
    only at run time and whose end is that start plus a length known at import; None
    where the Slice is not of that form (its row reads the bounds as usual)."""
    if t.sizes_of(starts) is not None or t.sizes_of(ends) is not None:
        return None
    if np.prod(t.var(starts)[0]) != 1 or np.prod(t.var(ends)[0]) != 1:
        return None
    (start_base, start_k), (end_base, end_k) = offset_form(t, starts), offset_form(t, ends)
    if start_base != end_base:
        return None
    dims = t.var(x)[0]
    axis = 0 if axes is None else _one_int(t, axes, "axes")
    axis = axis_of(axis, len(dims))
    if steps is not None and _one_int(t, steps, "steps") != 1:
        raise Unsupported("a step other than 1 between bounds known only at run time")
    length = end_k - start_k
    if dims[axis] < 0:
        raise Unsupported("a run-time start on a dim known only at run time")
    if not 0 <= length <= dims[axis]:
        raise Unsupported(f"a window of {length} (end - start) on a dim of {dims[axis]}")
    index_type = t.var(starts)[1]
    start = t.call("reshape", starts, shape=[])
    zero = t.constant(np.zeros((), dtype=np.dtype(index_type)))
    wrapped = t.call("add", start, t.constant(np.asarray(dims[axis], np.dtype(index_type))))
    start = t.call("where", t.call("less_than", start, zero), wrapped, start)
    starts_list = [start if a == axis else zero for a in range(len(dims))]
    return t.call("dynamic_slice", x, starts_list,
                  sizes=[length if a == axis else -1 for a in range(len(dims))])


def _one_int(t, name, what):
    value = _known_int(t, name)
    if value is None:
        raise Unsupported(f"its {what} is computed at run time, or not one int")
    return value
