"""Inference programs: keep only the ops a set of fetch targets needs (seed 001).

The result carries no gradient or optimizer ops, runs dropout and
batch_norm in test mode, and declares only the variables its ops use; the
sub-blocks of the ops it keeps (which read the global block only through
their op's inputs) are kept whole, the others dropped.
"""
from lowering.blocks import drop_unused_blocks
from lowering.errors import FetchError, did_you_mean
from progdesc.callsites import user_call
from progdesc.framework import Program, Variable


def _name(v):
    return v.name if isinstance(v, Variable) else v


def prune(program, feed_names, fetch_targets):
    """A test-mode copy of `program` computing `fetch_targets` from the `feed_names` variables.

    Ops between the feeds and the targets are kept; anything that only
    produces a fed variable is dropped, and so is everything else not on
    the way to a target.
    """
    feeds = {_name(v) for v in feed_names}
    targets = [_name(v) for v in fetch_targets]
    pruned = program.clone(for_test=True)
    block = pruned.global_block()
    for t in targets:
        if block.find_var(t) is None:
            raise FetchError("is a fetch target but not a variable of the program"
                             + did_you_mean(t, block.vars), var=t, during=user_call() or None)
    needed = set(targets)
    keep = []
    for idx in range(len(block.desc.ops) - 1, -1, -1):
        op_desc = block.desc.ops[idx]
        outs = {n for s in op_desc.outputs for n in s.arguments}
        if outs & needed and not outs <= feeds:
            keep.append(idx)
            needed -= outs
            needed |= {n for s in op_desc.inputs for n in s.arguments} - feeds
    for idx in range(len(block.desc.ops) - 1, -1, -1):
        if idx not in keep:
            del block.desc.ops[idx]
    used = feeds | set(targets) | {n for op_desc in block.desc.ops
                                   for slots in (op_desc.inputs, op_desc.outputs)
                                   for s in slots for n in s.arguments}
    for idx in range(len(block.desc.vars) - 1, -1, -1):
        var = block.desc.vars[idx]
        if var.name not in used:
            del block.desc.vars[idx]
        elif var.name in feeds:
            var.need_check_feed = True
    block.sync()
    drop_unused_blocks(pruned.desc)
    return Program.from_desc(pruned.desc)
