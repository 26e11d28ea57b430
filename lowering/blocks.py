"""Sub-blocks: what an op with sub-blocks (cond, switch, scan, while) refers to, reads and writes.

An op refers to its sub-blocks through `block`/`blocks` attributes. A sub-block
reads variables of enclosing blocks only through the op's inputs (its captures,
listed by the builder), so the op's inputs say everything it depends on, and
writes only variables declared in itself: what it hands back to the enclosing
block is named by the op's attributes and bound to the op's outputs.
"""
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


def check_block_references(program_desc):
    """Check that every sub-block reference of every op is a block of the program, a child
    of the op's block (so no block contains itself), that no sub-block belongs to two ops
    and that sub-blocks write only their own variables. Returns a message naming the
    first offending op, or None."""
    n_blocks, owner = len(program_desc.blocks), {}
    for block in program_desc.blocks:
        for i, op_desc in enumerate(block.ops):
            where = f"op #{i} '{op_desc.type}' of block {block.idx}"
            for ref in sub_block_indices(op_desc):
                if not 0 <= ref < n_blocks:
                    return f"{where} refers to block {ref}, but the program has {n_blocks} blocks"
                if ref == block.idx or program_desc.blocks[ref].parent_idx != block.idx:
                    chain, b = set(), block.idx
                    while b > 0 and b not in chain:
                        chain.add(b)
                        b = program_desc.blocks[b].parent_idx
                    kind = ("itself or a block enclosing it (a cycle)" if ref in chain | {0}
                            else f"block {ref}, whose parent is block "
                                 f"{program_desc.blocks[ref].parent_idx}")
                    return f"{where} refers to {kind}; a sub-block is a child of its op's block"
                if ref in owner:
                    return (f"{where} refers to block {ref}, which {owner[ref]} runs already; "
                            "a sub-block belongs to one op")
                owner[ref] = where
                try:
                    check_sub_block(program_desc, ref, block.idx, op_desc.type)
                except ProgramError as e:
                    return f"{where}: {e.detail}"
    return None


def drop_unused_blocks(program_desc):
    """Remove the sub-blocks no op of the program refers to (those of ops a pass dropped),
    renumbering the others; returns whether any block was removed."""
    used, stack = {0}, [0]
    while stack:
        for op_desc in program_desc.blocks[stack.pop()].ops:
            for ref in sub_block_indices(op_desc):
                if ref not in used:
                    used.add(ref)
                    stack.append(ref)
    if len(used) == len(program_desc.blocks):
        return False
    new_index = {old: new for new, old in enumerate(sorted(used))}
    kept = [program_desc.blocks[i] for i in sorted(used)]
    for block in kept:
        block.idx = new_index[block.idx]
        if block.parent_idx >= 0:
            block.parent_idx = new_index[block.parent_idx]
        for op_desc in block.ops:
            for attribute in op_desc.attrs.values():
                which = attribute.WhichOneof("value")
                if which == "block_idx":
                    attribute.block_idx = new_index[attribute.block_idx]
                elif which == "blocks_idx":
                    attribute.blocks_idx.values[:] = [new_index[i]
                                                      for i in attribute.blocks_idx.values]
    copies = [type(b)() for b in kept]
    for copy, block in zip(copies, kept):
        copy.CopyFrom(block)
    del program_desc.blocks[:]
    program_desc.blocks.extend(copies)
    return True
