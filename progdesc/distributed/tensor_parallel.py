"""Tensor parallel layers (Megatron's layout): what `tensor_parallel=` on a layer does.

A layer built with `tensor_parallel=` keeps a slice of its weights on each device of the
mesh axis "model" (a sharding annotation on the parameter, which its optimizer state
copies), and the collectives that join the slices are ops of the program:

* `fc(..., tensor_parallel="column")`: W [in, out] split by columns, b by the same; the
  input enters through `c_identity` (identity; its gradient sums the devices' partial
  gradients), the output is split over "model" (each device its out / n features).
* `fc(..., tensor_parallel="row")`: W split by rows; the input is the split output of a
  column layer, the partial products are summed by `mp_allreduce_sum`, then b
  (replicated) is added: the output is whole on every device.
* `multi_head_attention(..., tensor_parallel=True)`: the query, key and value
  projections column-parallel (the heads split over "model"), the output projection
  row-parallel. `transformer_encoder_layer(..., tensor_parallel=True)` also pairs its
  feed-forward fcs (column, then row).
* `embedding(..., tensor_parallel="vocab")`: the table split by rows (`c_embedding`
  looks up the ids a device holds, `mp_allreduce_sum` joins them);
  `tensor_parallel="hidden"`: split by columns, `c_concat` gathers the slices.

With `minimize(loss, data_parallel=True)` the same program is also data parallel, and
`Executor(mesh=Mesh({"data": 2, "model": 2}))` runs it under `shard_map` over both axes
(progdesc/distributed/run.py); the mesh must have a "model" axis (its size divides the
split dims: for attention, the number of heads, which `check_heads` checks). The loss, a
fetched value and each replicated persistable must come out whole over "model"; run.py
raises a ProgramError where one varies over it (a column layer's slice never joined). Without a mesh every one of these
collectives is the identity (the lookup, for `c_embedding`): the program is the plain
model. Parameters live in the Scope whole (global arrays laid out by their annotation),
so checkpoints hold them whole and load on any layout. Dropout inside a split layer
draws the same numbers on the devices of "model" (per slice), unlike one device.
"""
import dataclasses

from lowering.desc import SPLIT_HEADS
from lowering import registry
from lowering.errors import ProgramError
from progdesc import ops
from progdesc.callsites import user_callsite
from progdesc.param import ParamAttr

MODEL_AXIS = "model"
"""The mesh axis tensor-parallel layers split their weights over."""

FC_MODES = ("column", "row")
EMBEDDING_MODES = ("vocab", "hidden")


def check_mode(layer, value, modes):
    """`value` if it is None or one of `modes`; ProgramError naming the layer otherwise."""
    if value is not None and value not in modes:
        raise ProgramError(f"{layer}'s tensor_parallel must be one of "
                           f"{', '.join(repr(m) for m in modes)} or None, got {value!r}",
                           callsite=user_callsite())
    return value


def check_flag(layer, value):
    """`value` if it is a bool; ProgramError naming the layer otherwise (a layer that splits
    several weights takes True or False, not a direction)."""
    if not isinstance(value, bool):
        raise ProgramError(f"{layer}'s tensor_parallel is True or False, got {value!r}",
                           callsite=user_callsite())
    return value


def check_column_act(act):
    """`act` if a column-parallel fc may apply it to its slice of the features: ProgramError if
    it works along an axis (softmax normalizes over every feature, which no device holds)."""
    if act is not None and registry.is_registered(act) and registry.get(act).attr("axis"):
        raise ProgramError(f"a column-parallel fc holds a slice of its output features on each "
                           f"device, but act={act!r} works across the features of its axis: "
                           "apply it after the row-parallel fc (or c_concat) that joins them",
                           callsite=user_callsite())
    return act


def split_attr(attr, spec, layer):
    """ParamAttr `attr` (anything ParamAttr.of takes) with the sharding `spec`; False (no
    parameter) stays False. ProgramError if `attr` already names another sharding."""
    if attr is False:
        return attr
    attr = ParamAttr.of(attr)
    if attr.sharding is not None and tuple(attr.sharding) != tuple(spec):
        raise ProgramError(f"{layer}: tensor_parallel lays the parameter out as {spec}, but "
                           f"its ParamAttr asks for sharding {tuple(attr.sharding)}: drop one",
                           callsite=user_callsite())
    return dataclasses.replace(attr, sharding=tuple(spec))


def column_spec():
    """The sharding of a column-parallel [in, out] weight."""
    return (None, MODEL_AXIS)


def row_spec():
    """The sharding of a row-parallel [in, out] weight."""
    return (MODEL_AXIS, None)


def mark_heads(out, num_heads):
    """Record `num_heads` on the op that wrote `out` (the reshape of a split projection into
    heads), for the Executor to check against the size of the "model" axis."""
    block = out.block
    for op_desc in reversed(block.desc.ops):
        if out.name in (n for slot in op_desc.outputs for n in slot.arguments):
            op_desc.attrs[SPLIT_HEADS].i = num_heads
            block.program.mark_changed()
            return


def check_heads(program_desc, mesh):
    """ProgramError, naming the attention's reshape op, if a tensor-parallel attention layer
    of the program has a number of heads that does not divide by the size of `mesh`'s
    "model" axis (each device holds whole heads)."""
    size = mesh.axes.get(MODEL_AXIS)
    if not size:
        return
    ops = program_desc.blocks[0].ops
    fed = sum(op_desc.type == "feed" for op_desc in ops)   # the Executor's, put first
    for i, op_desc in enumerate(ops[fed:]):
        attr = op_desc.attrs.get(SPLIT_HEADS)
        if attr is not None and attr.i % size:
            raise ProgramError(f"a tensor-parallel multi_head_attention splits its "
                               f"num_heads={attr.i} heads over mesh axis '{MODEL_AXIS}' of "
                               f"size {size}, which does not divide them: each device holds "
                               f"whole heads. Give it a multiple of {size} heads, or a "
                               f"'{MODEL_AXIS}' axis whose size divides {attr.i}",
                               op_type=op_desc.type, op_index=i, callsite=op_desc.callsite)


def enter(x):
    """`x` (whole on every device) entering a layer split over "model": `c_identity`."""
    return ops.c_identity(x, axis_name=MODEL_AXIS)


def join_partial(x):
    """Partial results of a split layer summed over "model": `mp_allreduce_sum`."""
    return ops.mp_allreduce_sum(x, axis_name=MODEL_AXIS)


def gather(x):
    """Slices of the last dim over "model" concatenated: `c_concat`."""
    return ops.c_concat(x, axis_name=MODEL_AXIS)


def vocab_lookup(w, ids):
    """Rows of a table split by rows over "model" at `ids`, whole on every device."""
    return join_partial(ops.c_embedding(w, ids, axis_name=MODEL_AXIS))
