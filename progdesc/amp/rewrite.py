"""The AMP rewrite: explicit `cast` ops around the forward ops of a program.

Each forward op gets a precision, in program order:

- ops on the allow list run in the low dtype (bfloat16 or float16);
- ops on the deny list, and ops that write a persistable variable, run in float32;
- every other op follows its inputs: it runs in the low dtype when every
  input that votes is low precision, and in float32 otherwise.

Parameters, other persistables and constants do not vote: they take the
precision of the op that reads them, so the bias of `fc` is added in the low
dtype after a low-precision matmul (Paddle's rule for its gray list). Fed
data and activations vote with their dtype, so `sub(prediction, label)` in a
regression loss runs in float32 when the label is fed as float32 (PyTorch's
type promotion). Values computed from non-voters only (a constant, `2 *
weight`) do not vote either.

Only float32 and the chosen low dtype are rewritten: an op that reads
float64 or the other low dtype is left as it is, and so is `cast` (its
attribute decides). Inputs are cast where their dtype differs from the op's
precision, one `cast` per variable and dtype, placed before its first
reader and reused until the variable is written again. The op's outputs
take the dtype its shape rule infers from the cast inputs.
"""
from lowering import dtypes, registry
from lowering import progdesc_pb2 as pb
from lowering.desc import read_attrs, slot_map
from lowering.errors import ProgramError
from progdesc.amp.lists import AmpLists
from progdesc.framework import Program

LOW_DTYPES = ("bfloat16", "float16")
_SUFFIX = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
_KEEP = frozenset({"cast", "feed", "fetch"})   # ops whose own attributes decide the dtype


def low_dtype(dtype):
    """The dtype name of an AMP low precision; ProgramError unless bfloat16 or float16."""
    name = dtypes.name_of(dtype)
    if name not in LOW_DTYPES:
        raise ProgramError(f"mixed precision runs in bfloat16 or float16, got {name}")
    return name


def rewrite_program(program, dtype="bfloat16", lists=None):
    """Insert the casts that run `program`'s forward ops in mixed precision; returns it.

    `dtype` is 'bfloat16' or 'float16'; `lists` an AmpLists (default lists
    if None). Parameters stay float32: each low-precision reader gets a cast
    copy, whose gradient (the cast's gradient maker) is cast back to float32.
    Run it before append_backward / minimize: a program that already holds
    backward or optimizer ops raises ProgramError and is left unchanged, as
    is a program whose rewrite fails. Rewriting twice changes nothing more.
    """
    low = low_dtype(dtype)
    lists = lists or AmpLists()
    if len(program.blocks) > 1:
        raise ProgramError(f"mixed precision rewrites programs of one block; this one has "
                           f"{len(program.blocks)}")
    block = program.global_block()
    for i, op_desc in enumerate(block.desc.ops):
        if op_desc.role not in (pb.FORWARD, pb.LOSS):
            raise ProgramError("the program already has backward or optimizer ops: rewrite "
                               "it for mixed precision before append_backward and minimize",
                               op_type=op_desc.type, op_index=i, callsite=op_desc.callsite)
    scratch = Program.from_desc(program.desc).global_block()   # `program` stays as it is
    del scratch.desc.ops[:]                                      # until the rewrite succeeds
    _rewrite_ops(scratch, block.desc.ops, low, lists)
    _adopt(block, scratch)
    return program


def _rewrite_ops(block, ops, low, lists):
    """Append `ops` to the empty `block`, with casts before them."""
    neutral = {v.name for v in block.desc.vars if v.persistable}
    casts = {}   # variable -> {dtype: name of its cast copy}
    for op_desc in ops:
        opdef = registry.get(op_desc.type)
        inputs, outputs = slot_map(op_desc.inputs), slot_map(op_desc.outputs)
        values = _value_inputs(block, opdef, inputs)
        writes = [n for names in outputs.values() for n in names]
        target = _precision(block, opdef, values, writes, neutral, low, lists)
        if target is not None:
            for slot, i, name in values:
                if block.var(name).dtype != target:
                    inputs[slot][i] = _cast(block, name, target, casts, neutral, op_desc)
        block.append_op(op_desc.type, inputs, outputs, read_attrs(opdef, op_desc),
                        role=op_desc.role, callsite=op_desc.callsite)
        derived = all(n in neutral for names in inputs.values() for n in names)
        for name in writes:
            casts.pop(name, None)
            if derived or block.var(name).persistable:
                neutral.add(name)
            else:
                neutral.discard(name)


def _value_inputs(block, opdef, inputs):
    """(slot, position, name) of the float inputs whose values the op computes with.

    Inputs read only for their shape (`reshape_as`'s Target) or as labels are
    left out, unless the op needs them in the same dtype as its other inputs.
    """
    out = []
    for slot in opdef.inputs:
        if slot.name in inputs and (slot.differentiable or slot.name in opdef.same_dtype):
            out.extend((slot.name, i, n) for i, n in enumerate(inputs[slot.name])
                       if dtypes.kind_of(block.var(n).dtype) == "float")
    return out


def _precision(block, opdef, values, writes, neutral, low, lists):
    """The dtype an op runs in, or None to leave its inputs as they are."""
    kinds = {block.var(n).dtype for _, _, n in values}
    if not values or opdef.type in _KEEP or not kinds <= {"float32", low}:
        return None
    if opdef.type in lists.deny or any(block.var(n).persistable for n in writes):
        return "float32"
    if opdef.type in lists.allow:
        return low
    votes = {block.var(n).dtype for _, _, n in values if n not in neutral}
    return low if votes == {low} else "float32"


def _cast(block, name, dtype, casts, neutral, reader):
    """The name of `name` cast to `dtype`, appending the cast before `reader` if needed."""
    copies = casts.setdefault(name, {})
    if dtype not in copies:
        out = block.unused_name(f"{name}.cast_{_SUFFIX[dtype]}")
        block.append_op("cast", {"X": name}, {"Out": out}, {"dtype": dtype}, role=reader.role,
                        callsite=reader.callsite)
        block.var(out).desc.stop_gradient = block.var(name).stop_gradient
        if name in neutral:
            neutral.add(out)
        copies[dtype] = out
    return copies[dtype]


def _adopt(block, rewritten):
    """Make `block` hold the ops and variables of its `rewritten` copy.

    Existing VarDescs are updated in place, so the Variables users hold stay valid.
    """
    declared = {desc.name: desc for desc in block.desc.vars}
    for desc in rewritten.desc.vars:
        old = declared.get(desc.name)
        if old is None:
            block.desc.vars.add().CopyFrom(desc)
        elif old.dtype != desc.dtype or list(old.dims) != list(desc.dims):
            old.dtype = desc.dtype
            del old.dims[:]
            old.dims.extend(desc.dims)
    del block.desc.ops[:]
    block.desc.ops.extend(rewritten.desc.ops)
    block.sync()
