"""The lowering pass: one block of a program becomes one pure JAX function.

    fn(feeds, mutable, readonly) -> (fetches, written)

`feeds` is the tuple of values read by the block's `feed` ops (by column),
`mutable` and `readonly` are the persistable values the block reads (split by
whether the block also writes them, so the caller can donate the former),
`fetches` is the tuple written by its `fetch` ops and `written` holds the new
value of every persistable the block writes, the RNG state included.

Ops whose results reach neither a fetch nor a persistable variable are
dropped before tracing. Random ops draw `fold_in(rng_state, op_index + 1)`;
the state advances to `fold_in(rng_state, 0)` after each run.

An op with sub-blocks (cond, switch, scan, while) gets each of them as a `SubBlock`:
the same pass over the sub-block's ops, which its lowering rule calls inside
`lax.cond` / `lax.switch` / `lax.scan` / `lax.while_loop`. A sub-block sees the values of its
op's inputs and its own bindings, and is pruned to the results it hands back.

The program's precision policy (`ProgramDesc.precision`) is applied to the
whole traced block as `jax.default_matmul_precision`, so it reaches every
float32 dot and convolution: those of gradient ops and of ops lowered through
`jax.vjp` or library calls (attention), and those of custom ops, which would
each need their own `precision=` argument otherwise.
"""
import contextlib
import contextvars
from dataclasses import dataclass

import jax

from lowering import registry, sizes
from lowering import progdesc_pb2 as pb
from lowering.blocks import block_attrs
from lowering.desc import read_attrs, slot_map
from lowering.errors import FeedError, FetchError, ProgdescError, ProgramError
from lowering.gc_pause import gc_paused
from lowering.infer import split_outputs

RNG_VAR = "@RNG_STATE@"
FEED_VAR = "feed"
FETCH_VAR = "fetch"
PRECISIONS = ("default", "highest")
"""Precision policies: "default" leaves float32 dots and convolutions to JAX's
`jax_default_matmul_precision` (unset: the backend's fast default, TF32 on NVIDIA
GPUs, one bfloat16 pass on TPU); "highest" runs them in true float32 everywhere."""


def check_precision(precision):
    """`precision` if it is one of PRECISIONS, else ValueError."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(map(repr, PRECISIONS))}, "
                         f"got {precision!r}")
    return precision


def precision_of(program_desc):
    """The precision policy of a `ProgramDesc`, as a name in PRECISIONS."""
    return PRECISIONS[program_desc.precision]


def precision_value(precision):
    """The `ProgramDesc.Precision` enum value of a policy name."""
    return pb.ProgramDesc.Precision.Value(check_precision(precision).upper())


def precision_scope(precision):
    """A context applying matmul `precision` ('default': nothing) as the compiled block does."""
    if precision == "default":
        return contextlib.nullcontext()
    return jax.default_matmul_precision(precision)


@dataclass
class _Step:
    stopped: set       # outputs marked stop_gradient: lax.stop_gradient keeps JAX autodiff honest
    index: int         # position among the user's ops (feed ops inserted by the Executor skipped)
    desc_index: int    # position in the lowered desc
    opdef: object
    inputs: dict
    outputs: dict
    attrs: dict
    callsite: str
    block_attrs: tuple = ()   # names of the attributes holding sub-block indices


@dataclass
class LoweredBlock:
    """A block as a function, with the names it reads and writes."""
    fn: object
    fetch_names: tuple     # variable fetched by each fetch column
    reads: tuple           # persistables the block needs from the scope
    writes: tuple          # persistables the block produces
    kept_ops: tuple        # indices of the ops that were lowered


def _var_index(program_desc, block_idx):
    """{name: VarDesc} visible from block `block_idx` (inner blocks shadow outer ones)."""
    chain = []
    while block_idx >= 0:
        chain.append(program_desc.blocks[block_idx])
        block_idx = chain[-1].parent_idx if block_idx != 0 else -1
    return {v.name: v for block in reversed(chain) for v in block.vars}


def steps_of(program_desc, block_idx=0, start=0, var_index=None):
    """The ops of block `block_idx` from desc index `start` on, as `_Step`s (attributes read,
    nothing pruned): what `lower_block` traces and `run_step` runs."""
    block = program_desc.blocks[block_idx]
    var_index = var_index or _var_index(program_desc, block_idx)
    stop = {n for n, v in var_index.items() if v.stop_gradient and not v.persistable}
    n_feeds = sum(op.type == "feed" for op in block.ops[:start])
    steps, opdefs = [], {}
    for desc_index in range(start, len(block.ops)):
        op_desc = block.ops[desc_index]
        op_type = op_desc.type
        n_feeds += op_type == "feed"
        i = desc_index - n_feeds if op_type != "feed" else desc_index
        opdef = opdefs.get(op_type)
        if opdef is None:
            opdef = opdefs[op_type] = registry.get(op_type)
        try:
            attrs = read_attrs(opdef, op_desc) if opdef.attrs else {}
        except ProgdescError as e:
            raise type(e)(e.detail, op_type=op_type, op_index=i, block_idx=block_idx,
                          callsite=op_desc.callsite) from None
        outputs = slot_map(op_desc.outputs)
        stopped = stop.intersection(*outputs.values()) if stop else _NOTHING
        steps.append(_Step(stopped, i, desc_index, opdef, slot_map(op_desc.inputs), outputs,
                           attrs, op_desc.callsite,
                           tuple(block_attrs(opdef)) if opdef.has_blocks else ()))
    return steps


def _plan(program_desc, block_idx, results=None, fetches_only=False):
    """(kept steps, var index, persistable names) of block `block_idx`.

    Block 0 keeps the ops that reach a fetch or a persistable variable (only a
    fetch with `fetches_only`); a sub-block (`results` given) keeps the ops that
    reach `results`, the names it hands back to its op.
    """
    var_index = _var_index(program_desc, block_idx)
    persistable = {n for n, v in var_index.items() if v.persistable}
    steps = steps_of(program_desc, block_idx, var_index=var_index)
    roots = _NOTHING if results is None else set(results)
    write_roots = _NOTHING if results is not None or fetches_only else persistable
    needed, kept = set(roots), []
    for step in reversed(steps):
        outs = [n for names in step.outputs.values() for n in names]
        if (results is None and step.opdef.type == "fetch") or any(
                n in needed or n in write_roots for n in outs):
            kept.append(step)
            if step.opdef.type != "fetch":
                needed.difference_update(outs)
            needed.update(n for names in step.inputs.values() for n in names)
    kept.reverse()
    return kept, var_index, persistable


_NOTHING = frozenset()
_SUB_BLOCK_KEYS = 2**31 - 1   # a sub-block's key folds in this minus its op's index


def draws_random(opdef, attrs):
    """Whether an op draws random numbers: random ops draw nothing in test mode (`is_test`)."""
    return opdef.random and not attrs.get("is_test", False)


def _sub_blocks(step):
    """The sub-block indices an op refers to."""
    out = []
    for name in step.block_attrs:
        value = step.attrs[name]
        out.extend(value if isinstance(value, tuple) else (value,))
    return out


def _draws_random_in(program_desc, steps):
    """Whether any of `steps`, or an op of their sub-blocks, draws random numbers."""
    for step in steps:
        if draws_random(step.opdef, step.attrs) or any(
                _draws_random_in(program_desc, _all_steps(program_desc, idx))
                for idx in _sub_blocks(step)):
            return True
    return False


def _all_steps(program_desc, block_idx):
    """Every op of a block as a step, none pruned."""
    block = program_desc.blocks[block_idx]
    return _plan(program_desc, block_idx, [n for o in block.ops for s in o.outputs
                                           for n in s.arguments])[0]


def _check_reads(steps, available, persistable, var_index, block_idx):
    """Raise if a step reads a name that is neither in `available` nor written by an earlier
    step (a persistable is read from the scope in block 0); returns the persistables read."""
    defined, reads = set(available), {}
    for step in steps:
        for name in (n for names in step.inputs.values() for n in names):
            if name in defined or name == FEED_VAR:
                continue
            if name in persistable and block_idx == 0:
                reads[name] = None
                defined.add(name)
                continue
            var = var_index.get(name)
            fed = var is not None and var.need_check_feed and block_idx == 0
            raise (FeedError if fed else ProgramError)(
                "is needed but not fed" if fed else
                "is read before any op writes it and is neither fed nor persistable"
                if block_idx == 0 else
                "is read by a sub-block before any of its ops writes it, and is not an input "
                "of the op the sub-block belongs to",
                op_type=step.opdef.type, op_index=step.index, block_idx=block_idx,
                var=name, callsite=step.callsite)
        defined.update(n for names in step.outputs.values() for n in names)
    return reads


def lower_block(program_desc, block_idx=0, precision=None, fetches_only=False):
    """Lower block `block_idx` of a `ProgramDesc` (with feed/fetch ops) to a `LoweredBlock`.

    `precision` (a name in PRECISIONS) overrides the program's precision policy.
    With `fetches_only`, ops that write persistables but reach no fetch are left
    out too (op indices, and so random keys, stay those of the whole block).
    Ops with sub-blocks lower them with the same pass (`SubBlock`), traced inside
    the op's `lax.cond` / `lax.switch` / `lax.scan` / `lax.while_loop`.
    """
    precision = check_precision(precision or precision_of(program_desc))
    with gc_paused():
        steps, var_index, persistable = _plan(program_desc, block_idx,
                                              fetches_only=fetches_only)
    fetch_names = {}
    for step in steps:
        if step.opdef.type == "fetch":
            fetch_names[step.attrs["col"]] = step.inputs["X"][0]
    reads = _check_reads(steps, (), persistable, var_index, block_idx)
    writes = {n: None for step in steps for names in step.outputs.values() for n in names
              if n in persistable}
    uses_rng = _draws_random_in(program_desc, steps)
    if uses_rng:
        reads[RNG_VAR] = writes[RNG_VAR] = None
    if sorted(fetch_names) != list(range(len(fetch_names))):
        raise FetchError(f"fetch columns {sorted(fetch_names)} are not 0..{len(fetch_names) - 1}")

    n_fetch = len(fetch_names)
    write_names = tuple(writes)
    plans = {}   # (block index, results, bound names) -> checked steps of a sub-block

    def fn(feeds, mutable, readonly):
        env = {**readonly, **mutable, FEED_VAR: list(feeds)}
        fetches = [None] * n_fetch
        rng = env.get(RNG_VAR)
        with precision_scope(precision):
            _run_steps(steps, env, rng, fetches, block_idx, program_desc, plans)
        if uses_rng:
            env[RNG_VAR] = jax.random.fold_in(rng, 0)
        return tuple(fetches), {name: env[name] for name in write_names}

    return LoweredBlock(fn, tuple(fetch_names[i] for i in range(n_fetch)), tuple(reads),
                        write_names, tuple(s.desc_index for s in steps))


class SubBlock:
    """A sub-block as the lowering rule of its op sees it: a function of its bindings.

    `block(bindings, results)` runs the sub-block's ops (those `results` need)
    over the op's inputs and `bindings` ({name: value}, e.g. a scan step's
    carry and slices) and returns the values of `results`, a list of names.
    `step` (a traced integer, in a loop) is folded into the random key, so each
    iteration of a loop draws different random numbers.
    """

    def __init__(self, idx, visible, rng, program_desc, plans):
        self.idx = idx
        self._visible = visible
        self._rng = rng
        self._program_desc = program_desc
        self._plans = plans

    def __call__(self, bindings, results, step=None):
        """The values of `results` after running the sub-block over `bindings`."""
        results = tuple(results)
        key = (self.idx, results, frozenset(bindings))
        steps = self._plans.get(key)
        if steps is None:
            steps, var_index, _ = _plan(self._program_desc, self.idx, results)
            available = set(self._visible) | set(bindings)
            _check_reads(steps, available, (), var_index, self.idx)
            missing = [n for n in results if n not in available
                       and not any(n in names for s in steps for names in s.outputs.values())]
            if missing:
                raise ProgramError(f"sub-block {self.idx} hands back '{missing[0]}', which none "
                                   "of its ops writes and its op does not read", var=missing[0])
            self._plans[key] = steps
        env = {**self._visible, **bindings}
        rng = self._rng
        if rng is not None and step is not None:
            rng = jax.random.fold_in(rng, step)
        _run_steps(steps, env, rng, None, self.idx, self._program_desc, self._plans)
        return [env[n] for n in results]


_WATCH = contextvars.ContextVar("progdesc_watch", default=None)


@contextlib.contextmanager
def watching(watch):
    """Within, `watch(step, inputs, env, block_idx)` is called after each op a lowered block
    runs, of the block itself and of its sub-blocks: `inputs` holds the values the op read
    ({name: value}), `env` its outputs too. Called outside `jax.jit`, a block's function
    runs its ops on concrete arrays (those of block 0 concrete in the watch, those of
    sub-blocks tracers inside lax.cond / scan / while_loop): the checking run
    (progdesc.debug) watches a block that way. A watch may raise to stop the run."""
    token = _WATCH.set(watch)
    try:
        yield
    finally:
        _WATCH.reset(token)


def _run_steps(steps, env, rng, fetches, block_idx, program_desc, plans):
    """Trace the ops of one block (block 0 or a sub-block) over `env`, in order."""
    watch = _WATCH.get()
    if watch is None:
        for step in steps:
            _run_step(step, env, rng, fetches, block_idx, program_desc, plans)
        return
    for step in steps:
        inputs = {n: env[n] for names in step.inputs.values() for n in names if n in env}
        _run_step(step, env, rng, fetches, block_idx, program_desc, plans)
        watch(step, inputs, env, block_idx)


def run_step(step, env, rng, program_desc, block_idx=0, fetches=None):
    """Run one op (a step from `steps_of`) over `env` ({name: value}), writing its outputs
    into `env`, as the compiled block would: the same lowering rule, random ops drawing
    `fold_in(rng, op index + 1)` from the block's RNG state `rng`, sub-blocks through
    `SubBlock`. Values may be concrete arrays (eager mode, the checking executor) or
    tracers. A fetch op writes into `fetches[col]`; feed ops are the caller's to handle."""
    _run_step(step, env, rng, fetches, block_idx, program_desc, {})


def _run_step(step, env, rng, fetches, block_idx, program_desc, plans):
    opdef = step.opdef
    if opdef.type == "fetch":
        fetches[step.attrs["col"]] = env[step.inputs["X"][0]]
        return
    args = {}
    for slot in opdef.inputs:
        names = step.inputs.get(slot.name)
        if slot.many:
            args[slot.name] = [env[n] for n in names or []]
        else:
            args[slot.name] = env[names[0]] if names else None
    if opdef.random:
        args["key"] = jax.random.fold_in(rng, step.index + 1) if rng is not None else None
    attrs = step.attrs
    if step.block_attrs:
        attrs = dict(attrs)
        visible = {n: env[n] for names in step.inputs.values() for n in names}
        sub_rng = None if rng is None else jax.random.fold_in(rng, _SUB_BLOCK_KEYS - step.index)
        for name in step.block_attrs:
            value = attrs[name]
            make = lambda idx: SubBlock(idx, visible, sub_rng, program_desc, plans)  # noqa: E731
            attrs[name] = [make(i) for i in value] if isinstance(value, tuple) else make(value)
    try:
        result = opdef.lower(**args, **attrs)
        produced = split_outputs(opdef, result)
        sizes.check_results(produced)   # before XLA sees it: sizes fed for -1 dims too
    except ProgdescError as e:
        if e.op_type is not None and e.op_index is not None:   # an op of a sub-block
            raise
        raise type(e)(e.detail, op_type=opdef.type, op_index=step.index, block_idx=block_idx,
                      callsite=step.callsite) from None
    except Exception as e:  # noqa: BLE001  (a rule that fails on these inputs)
        raise ProgramError(f"lowering failed: {type(e).__name__}: {e}", op_type=opdef.type,
                           op_index=step.index, block_idx=block_idx,
                           callsite=step.callsite) from e
    for slot_name, names in step.outputs.items():
        values = produced.get(slot_name, [])
        for name, value in zip(names, values):
            env[name] = jax.lax.stop_gradient(value) if name in step.stopped else value
