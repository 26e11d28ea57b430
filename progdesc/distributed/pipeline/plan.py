"""What each pipeline stage runs: a pipeline program split into per-stage segments.

A stage runs three segments: its forward ops (once per micro-batch), its backward ops
(once per micro-batch, in reverse stage order) and its update ops (optimizer and learning
rate ops, once per step, on the gradients summed over the micro-batches). Forward ops
carry their stage; a gradient op takes the stage of the forward op its gradient maker
came from (else of the variables it differentiates); an update op the stage of the
parameters and gradients it reads, or every stage when it reads none (a learning-rate
schedule, which each stage then runs on its own copy). `c_ppermute` ops are not run by a
stage: they are the transfers between stages.
"""
from dataclasses import dataclass, field

from lowering import progdesc_pb2 as pb
from lowering.desc import FORWARD_OP, PIPELINE_STAGE
from lowering.errors import ProgramError
from lowering.gradients import GRAD_SUFFIX
from lowering.lower import FEED_VAR, steps_of

_FORWARD_ROLES = (pb.FORWARD, pb.LOSS)


@dataclass
class Transfer:
    """A `c_ppermute`: the value `source` of stage `src` becomes `target` of stage `dst`."""
    src: int
    dst: int
    source: str
    target: str


@dataclass
class Segment:
    """Steps of one stage run together: the names they read from outside and hand back."""
    steps: list = field(default_factory=list)
    reads: tuple = ()
    writes: tuple = ()


@dataclass
class Plan:
    """A pipeline program, split: see the module docstring."""
    n_stages: int
    micro_batches: int
    schedule: str
    axis_name: str
    forward: list          # Segment per stage
    backward: list
    update: list
    sends: list            # forward Transfers
    returns: list          # backward Transfers (gradients)
    state: list            # persistable names each stage holds
    stage_of_var: dict     # non-persistable name -> the stage that computes it
    grads: list            # per stage: names its backward sums over micro-batches for update


def schedule_op(program_desc):
    """The `pipeline_schedule` op of a program, or None if it is not a pipeline."""
    for op_desc in program_desc.blocks[0].ops:
        if op_desc.type == "pipeline_schedule":
            return op_desc
    return None


def _names(slots):
    return [n for s in slots.values() for n in s]


def _base(name):
    return name.split(GRAD_SUFFIX, 1)[0]


def plan(program_desc, kept, fetch_names, persistable):
    """The `Plan` of a pipeline program with feed and fetch ops (`program_desc`); `kept`
    are the indices of the ops the run needs, `persistable` the persistable names."""
    marker = schedule_op(program_desc)
    attrs = {k: getattr(marker.attrs[k], marker.attrs[k].WhichOneof("value"))
             for k in ("stages", "micro_batches", "schedule", "axis_name")}
    n_stages = attrs["stages"]
    ops = program_desc.blocks[0].ops
    n_feeds = sum(o.type == "feed" for o in ops)
    steps = {s.desc_index: s for s in steps_of(program_desc)}
    forward, backward, update = ([Segment() for _ in range(n_stages)] for _ in range(3))
    sends, returns = [], []
    var_stage, op_stage = {}, {}
    for j in kept:
        op_desc, step = ops[j], steps[j]
        where = dict(op_type=op_desc.type, op_index=step.index, callsite=op_desc.callsite)
        if op_desc.type in ("feed", "fetch", "pipeline_schedule"):
            continue
        ins, outs = _names(step.inputs), _names(step.outputs)
        if op_desc.role in _FORWARD_ROLES:
            if PIPELINE_STAGE not in op_desc.attrs:
                raise ProgramError("the forward op has no pipeline stage: append forward ops "
                                   "before the pipeline pass", **where)
            stage = op_desc.attrs[PIPELINE_STAGE].i
        elif op_desc.role == pb.BACKWARD:
            link = op_desc.attrs.get(FORWARD_OP)
            if link is not None and link.ints.values[0] == 0 and \
                    link.ints.values[1] + n_feeds in op_stage:
                stage = op_stage[link.ints.values[1] + n_feeds]
            else:
                found = {var_stage[_base(n)] for n in ins + outs if _base(n) in var_stage}
                if len(found) != 1:
                    raise ProgramError("cannot tell which pipeline stage runs this gradient op"
                                       f" (it touches stages {sorted(found)})", **where)
                stage = found.pop()
        else:
            found = {var_stage[n] for n in ins + outs if n in var_stage}
            if len(found) > 1:
                raise ProgramError(f"the op reads values of pipeline stages {sorted(found)}; "
                                   "each stage updates its own parameters, so an update op "
                                   "reading every stage's gradients (clipping by global norm, "
                                   "AMP's check for infs) is not pipelined", **where)
            for s in (found or range(n_stages)):
                update[s].steps.append(step)
            continue
        op_stage[j] = stage
        if op_desc.type == "c_ppermute":
            shift = step.attrs["shift"]
            src, dst = (stage - shift, stage) if op_desc.role in _FORWARD_ROLES else \
                (stage, stage + shift)
            if not (0 <= src < n_stages and 0 <= dst < n_stages):
                raise ProgramError(f"the transfer goes from stage {src} to stage {dst}, outside "
                                   f"the pipeline's {n_stages} stages", **where)
            t = Transfer(src, dst, step.inputs["X"][0], step.outputs["Out"][0])
            (sends if op_desc.role in _FORWARD_ROLES else returns).append(t)
            var_stage.setdefault(t.target, dst)
            continue
        for n in outs:
            var_stage.setdefault(n, stage)
        for n in ins:
            if n in persistable:
                var_stage.setdefault(n, stage)
        (forward if op_desc.role in _FORWARD_ROLES else backward)[stage].steps.append(step)

    fetched = set(fetch_names)
    read_later = {}   # name -> segments (id) that read it
    segments = forward + backward + update
    for seg in segments:
        seg.reads = _free_reads(seg.steps)
        for n in seg.reads:
            read_later.setdefault(n, set()).add(id(seg))
    for t in sends + returns:
        read_later.setdefault(t.source, set()).add("transfer")
    for seg in segments:
        written = dict.fromkeys(n for s in seg.steps for n in _names(s.outputs))
        seg.writes = tuple(n for n in written if n in persistable or n in fetched
                           or read_later.get(n, set()) - {id(seg)})
    state = [sorted({n for seg in (forward[s], backward[s], update[s])
                     for n in (*seg.reads, *seg.writes) if n in persistable})
             for s in range(n_stages)]
    grads = [tuple(n for n in update[s].reads if n in backward[s].writes and
                   n not in persistable) for s in range(n_stages)]
    stage_of_var = {n: s for n, s in var_stage.items() if n not in persistable}
    return Plan(n_stages, attrs["micro_batches"], attrs["schedule"], attrs["axis_name"],
                forward, backward, update, sends, returns, state, stage_of_var, grads)


def _free_reads(steps):
    """Names `steps` read before any of them writes them."""
    written, reads = set(), {}
    for step in steps:
        for n in _names(step.inputs):
            if n not in written and n != FEED_VAR:
                reads[n] = None
        written.update(_names(step.outputs))
    return tuple(reads)
