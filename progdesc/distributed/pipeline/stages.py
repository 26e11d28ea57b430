"""Marking pipeline stages in a program, and the pass that makes it a pipeline.

    with dist.pipeline_stage(0):
        h = layers.fc(x, 64, act="relu")
    with dist.pipeline_stage(1):
        loss = ops.mean(ops.square(layers.fc(h, 1) - y))
    dist.pipeline(main, micro_batches=4)          # before minimize
    Adam(1e-3).minimize(loss)

`pipeline_stage(i)` records attribute `@pipeline_stage` = i on every forward op appended
within. `pipeline(program, ...)` gives each unmarked forward op the latest stage of the
ops it reads from, puts a `c_ppermute` op wherever a stage reads a value another stage
computed (the transfer: its gradient maker sends the gradient back), and puts a
`pipeline_schedule` op first, holding the number of stages, micro-batches and the
schedule. All of it is in the description: print shows it, save keeps it.
"""
import contextlib

from lowering import progdesc_pb2 as pb
from lowering.desc import PIPELINE_STAGE
from lowering.errors import ProgramError
from progdesc.framework import ProgramListener, add_listener, default_startup_program

SCHEDULES = ("gpipe", "1f1b")
_FORWARD_ROLES = (pb.FORWARD, pb.LOSS)


class _Marker(ProgramListener):
    """Records the innermost open `pipeline_stage` on each forward op of a root block, but
    the startup program's (initializers: every stage's device runs it whole)."""

    def __init__(self):
        self.stages = []

    def op_appended(self, block, index, opdef, inputs, outputs, attrs):
        if self.stages and block.idx == 0 and block.program is not default_startup_program():
            desc = block.desc.ops[index]
            if desc.role in _FORWARD_ROLES and PIPELINE_STAGE not in desc.attrs:
                desc.attrs[PIPELINE_STAGE].i = self.stages[-1]


_marker = None


@contextlib.contextmanager
def pipeline_stage(stage):
    """Within, every forward op appended to a program belongs to pipeline stage `stage`
    (an int >= 0; stage 0 takes the fed inputs first)."""
    global _marker
    if isinstance(stage, bool) or not isinstance(stage, int) or stage < 0:
        raise ValueError(f"a pipeline stage is an int >= 0, got {stage!r}")
    if _marker is None:
        _marker = _Marker()
        add_listener(_marker)
    _marker.stages.append(stage)
    try:
        yield
    finally:
        _marker.stages.pop()


def stage_of(op_desc):
    """The stage an op is marked with, or None."""
    attr = op_desc.attrs.get(PIPELINE_STAGE)
    return None if attr is None else attr.i


def _names(slots):
    return [n for slot in slots for n in slot.arguments]


def pipeline(program, micro_batches, schedule="gpipe", axis_name="pipe"):
    """Make `program` (forward ops only: call it before `minimize`) a pipeline over the
    `axis_name` axis of a mesh, in place; returns the number of stages.

    Each fed batch is split into `micro_batches` micro-batches, run through the stages in
    the order `schedule` gives ("gpipe": every forward, then every backward; "1f1b": one
    forward, one backward once the pipeline is full). ProgramError, the program left as
    it was, if an op reads a value of a later stage, a parameter is read by two stages,
    a stage between 0 and the last has no op, or the program already has gradients or a
    pipeline."""
    if isinstance(micro_batches, bool) or not isinstance(micro_batches, int) or \
            micro_batches < 1:
        raise ValueError(f"micro_batches is an int >= 1, got {micro_batches!r}")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule is one of {', '.join(SCHEDULES)}, got {schedule!r}")
    block = program.global_block()
    ops = block.desc.ops
    for i, op_desc in enumerate(ops):
        if op_desc.type == "pipeline_schedule":
            raise ProgramError("the program is a pipeline already", op_type=op_desc.type,
                               op_index=i)
        if op_desc.role not in _FORWARD_ROLES:
            raise ProgramError("the program has gradient or optimizer ops: make it a "
                               "pipeline before minimize", op_type=op_desc.type, op_index=i)
    persistable = {v.name for v in block.desc.vars if v.persistable}
    stages, made_at, param_stage = [], {}, {}
    for i, op_desc in enumerate(ops):
        reads = _names(op_desc.inputs)
        latest = max((made_at[n] for n in reads if n in made_at), default=0)
        stage = stage_of(op_desc)
        if stage is None:
            stage = latest
        elif stage < latest:
            late = next(n for n in reads if made_at.get(n, -1) == latest)
            raise ProgramError(f"an op of pipeline stage {stage} reads a value of stage "
                               f"{latest}: stages run in order", op_type=op_desc.type,
                               op_index=i, var=late, callsite=op_desc.callsite)
        for n in reads:
            if n in persistable and n not in made_at:
                if param_stage.setdefault(n, stage) != stage:
                    raise ProgramError(f"the parameter is read by pipeline stages "
                                       f"{param_stage[n]} and {stage}: each stage holds its "
                                       "own parameters", op_type=op_desc.type, op_index=i,
                                       var=n, callsite=op_desc.callsite)
        for n in _names(op_desc.outputs):
            made_at.setdefault(n, stage)
        stages.append(stage)
    n_stages = max(stages, default=0) + 1
    empty = sorted(set(range(n_stages)) - set(stages))
    if empty:
        raise ProgramError(f"pipeline stage {empty[0]} has no op (stages are numbered 0 to "
                           f"{n_stages - 1})")
    snapshot = pb.BlockDesc()
    snapshot.CopyFrom(block.desc)
    try:
        _insert_transfers(block, stages, made_at, axis_name)
        block.insert_op(0, "pipeline_schedule", outputs={"Out": ["pipeline@micro_batches"]},
                        attrs={"stages": n_stages, "micro_batches": micro_batches,
                               "schedule": schedule, "axis_name": axis_name}, callsite="")
    except BaseException:
        block.desc.CopyFrom(snapshot)
        block.sync()
        program.mark_changed()
        raise
    return n_stages


def _insert_transfers(block, stages, made_at, axis_name):
    """Mark every forward op with its stage, and put a `c_ppermute` before the first op of a
    stage that reads a value made by an earlier stage; that stage's ops read its output."""
    received = {}   # (name, stage) -> the name the stage reads it under
    i = 0
    for stage in stages:
        reads = _names(block.desc.ops[i].inputs)
        for n in dict.fromkeys(reads):
            if made_at.get(n, stage) < stage and (n, stage) not in received:
                received[n, stage] = f"{n}@STAGE{stage}"
                block.insert_op(i, "c_ppermute", {"X": n}, {"Out": [received[n, stage]]},
                                {"axis_name": axis_name, "shift": stage - made_at[n]},
                                callsite=block.desc.ops[i].callsite)
                block.desc.ops[i].attrs[PIPELINE_STAGE].i = stage
                i += 1
        op_desc = block.desc.ops[i]
        for slot in op_desc.inputs:
            slot.arguments[:] = [received.get((n, stage), n) for n in slot.arguments]
        op_desc.attrs[PIPELINE_STAGE].i = stage
        i += 1
    block.program.mark_changed()
