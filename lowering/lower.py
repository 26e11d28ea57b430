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

The program's precision policy (`ProgramDesc.precision`) is applied to the
whole traced block as `jax.default_matmul_precision`, so it reaches every
float32 dot and convolution: those of gradient ops and of ops lowered through
`jax.vjp` or library calls (attention), and those of custom ops, which would
each need their own `precision=` argument otherwise.
"""
import contextlib
from dataclasses import dataclass

import jax

from lowering import progdesc_pb2 as pb
from lowering import registry
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


def _precision_scope(precision):
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


def _plan(program_desc, block_idx):
    block = program_desc.blocks[block_idx]
    var_index = _var_index(program_desc, block_idx)
    persistable, stop = set(), set()
    for n, v in var_index.items():
        if v.persistable:
            persistable.add(n)
        elif v.stop_gradient:
            stop.add(n)
    steps, n_feeds, opdefs = [], 0, {}
    for desc_index, op_desc in enumerate(block.ops):
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
                           attrs, op_desc.callsite))

    needed, kept = set(), []
    for step in reversed(steps):
        outs = [n for names in step.outputs.values() for n in names]
        if step.opdef.type == "fetch" or any(n in needed or n in persistable for n in outs):
            kept.append(step)
            if step.opdef.type != "fetch":
                needed.difference_update(outs)
            needed.update(n for names in step.inputs.values() for n in names)
    kept.reverse()
    return kept, var_index, persistable


_NOTHING = frozenset()


def draws_random(opdef, attrs):
    """Whether an op draws random numbers: random ops draw nothing in test mode (`is_test`)."""
    return opdef.random and not attrs.get("is_test", False)


def lower_block(program_desc, block_idx=0, precision=None):
    """Lower block `block_idx` of a `ProgramDesc` (with feed/fetch ops) to a `LoweredBlock`.

    `precision` (a name in PRECISIONS) overrides the program's precision policy.
    """
    precision = check_precision(precision or precision_of(program_desc))
    with gc_paused():
        steps, var_index, persistable = _plan(program_desc, block_idx)
    fetch_names = {}
    defined, reads, writes = set(), {}, {}   # dicts: ordered sets
    uses_rng = False
    for step in steps:
        if step.opdef.type == "fetch":
            fetch_names[step.attrs["col"]] = step.inputs["X"][0]
        for name in (n for names in step.inputs.values() for n in names):
            if name in defined or name == FEED_VAR:
                continue
            if name in persistable:
                reads[name] = None
                defined.add(name)
            else:
                var = var_index.get(name)
                fed = var is not None and var.need_check_feed
                raise (FeedError if fed else ProgramError)(
                    "is needed but not fed" if fed else
                    "is read before any op writes it and is neither fed nor persistable",
                    op_type=step.opdef.type, op_index=step.index, block_idx=block_idx,
                    var=name, callsite=step.callsite)
        for name in (n for names in step.outputs.values() for n in names):
            defined.add(name)
            if name in persistable:
                writes[name] = None
        uses_rng |= draws_random(step.opdef, step.attrs)
    if uses_rng:
        reads[RNG_VAR] = writes[RNG_VAR] = None
    if sorted(fetch_names) != list(range(len(fetch_names))):
        raise FetchError(f"fetch columns {sorted(fetch_names)} are not 0..{len(fetch_names) - 1}")

    n_fetch = len(fetch_names)
    write_names = tuple(writes)

    def fn(feeds, mutable, readonly):
        env = {**readonly, **mutable, FEED_VAR: list(feeds)}
        fetches = [None] * n_fetch
        rng = env.get(RNG_VAR)
        with _precision_scope(precision):
            for step in steps:
                _run_step(step, env, rng, fetches, block_idx)
        if uses_rng:
            env[RNG_VAR] = jax.random.fold_in(rng, 0)
        return tuple(fetches), {name: env[name] for name in write_names}

    return LoweredBlock(fn, tuple(fetch_names[i] for i in range(n_fetch)), tuple(reads),
                        write_names, tuple(s.desc_index for s in steps))


def _run_step(step, env, rng, fetches, block_idx):
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
    try:
        result = opdef.lower(**args, **step.attrs)
        produced = split_outputs(opdef, result)
    except ProgdescError as e:
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
