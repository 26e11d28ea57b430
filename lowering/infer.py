"""Shape and dtype inference, derived from each op's lowering rule.

Unknown dims (-1) become one symbolic dimension, so `jax.eval_shape` can
trace the rule; result dims that stay symbolic are reported as -1 again.
Results are cached by op type, attributes and input shapes/dtypes.
"""
import functools

import jax
import numpy as np
from jax import export

from lowering import dtypes, sizes
from lowering.errors import ProgdescError, ShapeError

RNG_KEY_AVAL = jax.ShapeDtypeStruct((2,), np.uint32)


@functools.cache
def _batch_dim():
    return export.symbolic_shape("batch")[0]


def aval(dims, dtype):
    """A `ShapeDtypeStruct` for a variable; -1 dims become the symbolic batch dim."""
    shape = tuple(_batch_dim() if d < 0 else int(d) for d in dims)
    return jax.ShapeDtypeStruct(shape, dtypes.to_numpy(dtype))


def _dims(shape):
    return tuple(d if isinstance(d, int) else -1 for d in shape)


def _frozen(value):
    return tuple(_frozen(v) for v in value) if isinstance(value, (list, tuple)) else value


_CACHE = {}


def infer(opdef, inputs, attrs, program_desc=None, block_idx=0):
    """Output (dims, dtype name) lists per output slot.

    `inputs` maps each bound input slot to a list of (dims, dtype name).
    Returns {output slot: [(dims, dtype name), ...]}. An op with sub-blocks
    (cond, scan) with an explicit shape rule reads them: the rule is called as
    `rule(inputs, attrs, program_desc, block_idx)`, `block_idx` being the
    block the op is in, and not cached (the sub-blocks are not in the key).
    """
    if opdef.has_blocks and opdef.infer is not None:
        try:
            result = opdef.infer(inputs, attrs, program_desc, block_idx)
            sizes.check_results(result)
            return result
        except ProgdescError as e:
            raise type(e)(e.detail, op_type=opdef.type, var=e.var, slot=e.slot) from None
    try:
        key = (opdef.type, id(opdef), tuple(attrs.items()),
               tuple([(k, tuple(v)) for k, v in inputs.items()]))
        result = _CACHE.get(key)
    except TypeError:   # list-valued attributes or dims: compare them as tuples
        key = (opdef.type, id(opdef), _frozen(tuple(attrs.items())),
               _frozen(tuple(inputs.items())))
        try:
            result = _CACHE.get(key)
        except TypeError:   # an unhashable attribute value: infer without the cache
            return _infer(opdef, inputs, attrs)
    if result is None:
        if len(_CACHE) > 65536:
            _CACHE.clear()
        result = _infer(opdef, inputs, attrs)
        sizes.check_results(result)
        _CACHE[key] = result
    return result


def _infer(opdef, inputs, attrs):
    if opdef.infer is not None:
        return opdef.infer(inputs, attrs)
    args = {}
    for slot in opdef.inputs:
        given = inputs.get(slot.name)
        if given is None:
            args[slot.name] = [] if slot.many else None
        elif slot.many:
            args[slot.name] = [aval(d, t) for d, t in given]
        else:
            args[slot.name] = aval(*given[0])
    if opdef.random:
        args["key"] = RNG_KEY_AVAL

    def rule(**kw):
        return opdef.lower(**kw, **attrs)

    try:
        with jax.enable_x64(True):
            result = jax.eval_shape(rule, **args)
    except ProgdescError as e:   # the rule's own check, in the op's terms
        raise type(e)(e.detail, op_type=opdef.type, var=e.var, slot=e.slot) from None
    except Exception as e:  # noqa: BLE001  (any failure of the rule is the user's shapes)
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ShapeError(f"{_described(opdef, inputs, attrs)} rejected: {msg}",
                         op_type=opdef.type) from None
    return split_outputs(opdef, result, lambda a: (_dims(a.shape), dtypes.name_of(a.dtype)))


def _described(opdef, inputs, attrs):
    """'X float32[4, 5], Y float32[4, 3]': an op's inputs by slot (its attributes if none)."""
    parts = []
    for slot in opdef.inputs:
        for i, (dims, dtype) in enumerate(inputs.get(slot.name) or ()):
            parts.append(f"{slot.name}[{i}]" if slot.many else slot.name)
            parts[-1] += f" {dtype}{list(dims)}"
    if not parts:
        return "attributes " + ", ".join(f"{k}={v!r}" for k, v in attrs.items())
    return ", ".join(parts)


def split_outputs(opdef, result, convert=lambda a: a):
    """Map a lowering rule's return value to {output slot: [values]}."""
    if len(opdef.outputs) == 1:
        result = (result,)
    if not isinstance(result, (tuple, list)) or len(result) != len(opdef.outputs):
        raise ShapeError(f"lowering rule returned {type(result).__name__}, expected "
                         f"{len(opdef.outputs)} outputs", op_type=opdef.type)
    out = {}
    for slot, value in zip(opdef.outputs, result):
        if value is None:
            continue
        values = list(value) if slot.many else [value]
        out[slot.name] = [convert(v) for v in values]
    return out
