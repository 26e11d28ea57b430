"""Sub-blocks: what an op with sub-blocks (cond, switch, scan) refers to, reads and writes.

An op refers to its sub-blocks through `block`/`blocks` attributes. A sub-block
reads variables of enclosing blocks only through the op's inputs (its captures,
listed by the builder), so the op's inputs say everything it depends on, and
writes only variables declared in itself: what it hands back to the enclosing
block is named by the op's attributes and bound to the op's outputs.
"""
from lowering import registry
from lowering.desc import read_attrs, slot_map
from lowering.errors import ProgramError

BLOCK_ATTR_TYPES = ("block", "blocks")


def block_attrs(opdef):
    """The names of an op definition's block-valued attributes."""
    return [a.name for a in opdef.attrs if a.type in BLOCK_ATTR_TYPES]


def sub_block_indices(op_desc):
    """The indices of the sub-blocks an `OpDesc` refers to, in attribute order."""
    out = []
    for name in sorted(op_desc.attrs):
        attribute = op_desc.attrs[name]
        which = attribute.WhichOneof("value")
        if which == "block_idx":
            out.append(attribute.block_idx)
        elif which == "blocks_idx":
            out.extend(attribute.blocks_idx.values)
    return out


def declared(block_desc):
    """The names declared in a `BlockDesc`."""
    return {v.name for v in block_desc.vars}


def free_reads(program_desc, block_idx, results=()):
    """Names a sub-block (and the ops of its own sub-blocks, through their inputs) reads
    from enclosing blocks, in first-read order; `results` are read at the end."""
    block = program_desc.blocks[block_idx]
    local, written, free = declared(block), set(), {}
    for op_desc in block.ops:
        for s in op_desc.inputs:
            for n in s.arguments:
                if n not in written and n not in local:
                    free[n] = None
        for s in op_desc.outputs:
            written.update(s.arguments)
    for n in results:
        if n not in written and n not in local:
            free[n] = None
    return list(free)


def check_sub_block(program_desc, block_idx, parent_idx, op_type):
    """Check that block `block_idx` is a child of `parent_idx` whose ops write only
    variables declared in it; raises ProgramError naming the offending inner op."""
    if not 0 < block_idx < len(program_desc.blocks):
        raise ProgramError(f"sub-block {block_idx} does not exist (the program has "
                           f"{len(program_desc.blocks)} blocks)")
    block = program_desc.blocks[block_idx]
    if block.parent_idx != parent_idx:
        raise ProgramError(f"sub-block {block_idx} has parent {block.parent_idx}, but the "
                           f"'{op_type}' op referring to it is in block {parent_idx}")
    local = declared(block)
    for i, op_desc in enumerate(block.ops):
        for s in op_desc.outputs:
            for n in s.arguments:
                if n not in local:
                    where = f" (created at {op_desc.callsite})" if op_desc.callsite else ""
                    raise ProgramError(
                        f"op #{i} '{op_desc.type}' of sub-block {block_idx}{where} writes "
                        f"'{n}', a variable of an enclosing block; a sub-block hands values "
                        f"out only as the outputs of its '{op_type}' op", var=n)


def var_type(program_desc, block_idx, name):
    """(dims, dtype enum) of `name` as block `block_idx` sees it, or None."""
    while block_idx >= 0:
        block = program_desc.blocks[block_idx]
        for v in block.vars:
            if v.name == name:
                return tuple(v.dims), v.dtype
        block_idx = block.parent_idx if block_idx != 0 else -1
    return None


def op_attrs(op_desc):
    """The decoded attributes of an `OpDesc` of a registered type."""
    return read_attrs(registry.get(op_desc.type), op_desc)


def op_inputs(op_desc):
    """{slot: [names]} of an `OpDesc`'s inputs."""
    return slot_map(op_desc.inputs)
