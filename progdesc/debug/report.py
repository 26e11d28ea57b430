"""What a NumericsError says: summaries of an op's values and the words around them."""
from collections import namedtuple
from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np

from lowering import dtypes
from lowering.desc import FORWARD_OP
from lowering.errors import NumericsError


OpRef = namedtuple("OpRef", "block index type callsite")
"""Where an op is: its block, its index there, its type and the line that created it."""


@dataclass(frozen=True)
class ValueSummary:
    """One array, summarised: its variable, dtype and shape, its NaN, +Inf and -Inf counts, and
    the least and greatest of its finite values (NaN when it has none)."""
    var: str
    dtype: str
    shape: tuple
    nan: int
    posinf: int
    neginf: int
    min: float
    max: float

    @property
    def finite(self):
        """Whether every value is finite."""
        return not (self.nan or self.posinf or self.neginf)

    def __str__(self):
        size = int(np.prod(self.shape))
        counts = [f"{n} {what}" for n, what in ((self.nan, "NaN"), (self.posinf, "+Inf"),
                                                (self.neginf, "-Inf")) if n]
        text = f"'{self.var}' {self.dtype}{list(self.shape)}: "
        text += f"{', '.join(counts)} of {size} values" if counts else f"all {size} finite"
        if size - self.nan - self.posinf - self.neginf:
            text += f", {'finite values ' if counts else ''}from {self.min:.6g} to {self.max:.6g}"
        return text


def checked(value):
    """Whether `value` is an array whose values can be NaN or Inf (a floating dtype)."""
    return hasattr(value, "dtype") and jnp.issubdtype(value.dtype, jnp.floating)


def stats(value):
    """(NaN count, +Inf count, -Inf count, finite min, finite max) of a float array, as arrays:
    computed where the array is, concrete or traced."""
    finite = jnp.isfinite(value)
    return (jnp.sum(jnp.isnan(value)), jnp.sum(jnp.isposinf(value)),
            jnp.sum(jnp.isneginf(value)),
            jnp.min(jnp.where(finite, value, jnp.inf), initial=jnp.inf),
            jnp.max(jnp.where(finite, value, -jnp.inf), initial=-jnp.inf))


def summary(var, dtype, shape, computed):
    """The ValueSummary of variable `var` from its `stats`."""
    nan, posinf, neginf, lo, hi = (np.asarray(s).item() for s in computed)
    n_finite = int(np.prod(shape)) - nan - posinf - neginf
    return ValueSummary(var, dtypes.name_of(dtype), tuple(shape), int(nan), int(posinf),
                        int(neginf), float(lo) if n_finite else float("nan"),
                        float(hi) if n_finite else float("nan"))


def labelled(slots, env, what):
    """[(label, name, value)] of the float values in `env` bound to `slots` ({slot: [names]}):
    labels as 'output Out', or 'input X[1]' in a slot of several."""
    out = []
    for slot, names in slots.items():
        for k, name in enumerate(names):
            value = env.get(name)
            if checked(value):
                out.append((f"{what} {slot}[{k}]" if len(names) > 1 else f"{what} {slot}",
                            name, value))
    return out


def forward_op_of(program_desc, op):
    """The OpRef of the forward op the gradient op `op` (an OpRef) belongs to, or None when it
    is not a gradient op or its forward op is no longer where it was."""
    op_desc = program_desc.blocks[op.block].ops[op.index]
    link = op_desc.attrs[FORWARD_OP].ints.values if FORWARD_OP in op_desc.attrs else ()
    if len(link) != 2:
        return None
    block, index = link
    ops = program_desc.blocks[block].ops if 0 <= block < len(program_desc.blocks) else ()
    if not 0 <= index < len(ops) or ops[index].callsite != op_desc.callsite:
        return None
    return OpRef(block, index, ops[index].type, ops[index].callsite)


def _named(op):
    where = f" in block {op.block}" if op.block else ""
    at = f" (created at {op.callsite})" if op.callsite else ""
    return f"op #{op.index} '{op.type}'{where}{at}"


def numerics_error(op, values, forward_op=None, outer_op=None, origins=None):
    """The NumericsError of `op` (an OpRef), whose outputs went bad; `values` are
    {label: ValueSummary} of its outputs and inputs, `forward_op` and `outer_op` OpRefs or
    None, `origins` {input variable: where a value that was already bad came from}."""
    outputs = {k: v for k, v in values.items() if k.startswith("output")}
    inputs = {k: v for k, v in values.items() if k.startswith("input")}
    bad_label = next(k for k, v in outputs.items() if not v.finite)
    head = ("this op produced the run's first NaN or Inf" if outer_op is None else
            f"inside {_named(outer_op)}, this op produced a NaN or Inf")
    if forward_op is not None:
        head += f"; it computes a gradient of {_named(forward_op)}"
    parts = [head, "outputs: " + "; ".join(f"{k[7:]} {v}" for k, v in outputs.items())]
    if inputs:
        parts.append("inputs: " + "; ".join(f"{k[6:]} {v}" for k, v in inputs.items()))
    for label, v in inputs.items():
        if not v.finite:
            parts.append(f"{label} '{v.var}' was already bad when the op was reached "
                         f"({(origins or {}).get(v.var, 'it came from an enclosing block')})")
    return NumericsError(". ".join(parts), values=values, forward_op=forward_op,
                         outer_op=outer_op, op_type=op.type, op_index=op.index,
                         block_idx=op.block, callsite=op.callsite,
                         var=outputs[bad_label].var, slot=bad_label.split(" ", 1)[1])
