"""The checking run: a program op by op, uncompiled, stopped at the first NaN or Inf.

`Executor(check_numerics=True).run(...)` comes here. The program gets the same
feed and fetch ops, the same pruning, scope reads, random keys and precision
as a compiled run (the ops are lowering.lower's steps, run by its `run_step`
on concrete arrays), so when nothing goes bad it fetches what the compiled run
fetches and writes the same values into the Scope. After each op, its float
outputs are checked; the first op with a NaN or Inf among them is the culprit
(a value already bad when an op reaches it would have stopped the run at the
op that made it; only feeds and the Scope's values are taken as they come,
and the error says so when one of them was bad). The error names the op, its
index and block, the line that created it, the forward op of a gradient op,
and summarises its inputs and outputs. An op with sub-blocks (cond, switch,
scan, while) is run once more with every op of its sub-blocks watched, to name
the inner op that went bad first. Nothing is written to the Scope unless the
whole run succeeds.
"""
import contextlib
import types

import jax
import jax.numpy as jnp
import numpy as np

from lowering.errors import FeedError, NumericsError, ProgramError
from lowering.lower import FEED_VAR, RNG_VAR, lower_block, run_step, steps_of, watching
from progdesc.debug.report import (OpRef, forward_op_of, labelled, numerics_error, stats,
                                   summary)
from progdesc.executor import (_default_device, _disagreeing_feeds, _fetch_names, _in_run,
                               with_feed_fetch)
from progdesc.framework import Program

_UNSET = types.SimpleNamespace(_value=None)   # a scope holder for a name the scope lacks


def run_checked(executor, program, feed, fetch_list, scope, return_numpy, steps):
    """What `executor.run(program, feed, fetch_list, scope, return_numpy, steps)` returns,
    computed op by op; raises NumericsError at the first op producing a NaN or Inf."""
    if not isinstance(program, Program):
        raise TypeError(f"Executor.run expects a Program, got {type(program).__name__}")
    fetch_names = _fetch_names(fetch_list)
    precision = executor.precision or program.precision
    try:
        names, values, _ = executor._convert_feeds(program, feed, steps)
        desc = with_feed_fetch(program, tuple(names), fetch_names)
        lowered = lower_block(desc, 0, precision)
    except FeedError as e:
        raise _in_run(e) from None
    with scope.lock:   # runs on one scope tree take turns
        # what the compiled run checks, on what it reads (an entry's names and scope holders)
        holders = tuple(scope.find_var(n) or _UNSET for n in lowered.reads)
        checked = executor._check_state(program, lowered.reads, holders, 0)
        state = dict(zip(lowered.reads, checked))
        return _run(executor, program, desc, lowered, names, values, steps, precision, scope,
                    state, return_numpy)


def _run(executor, program, desc, lowered, names, values, steps, precision, scope, state,
         return_numpy):
    """What `run_checked` returns, computed op by op from `state` (the scope's values)."""
    kept = set(lowered.kept_ops)
    run = _Run(program, desc, [s for s in steps_of(desc) if s.desc_index in kept], lowered,
               tuple((n, v.shape if steps is None else v.shape[1:])
                     for n, v in zip(names, values)))
    precision_scope = (jax.default_matmul_precision("highest") if precision == "highest"
                       else contextlib.nullcontext())
    with jax.enable_x64(True), _default_device(executor.device), precision_scope:
        if steps is None:
            fetched, written = run.once(state, values)
        else:
            per_step = []
            for k in range(steps):
                fetched, written = run.once(state, [v[k] for v in values])
                state.update(written)
                per_step.append(fetched)
            fetched = [jnp.stack(column) for column in zip(*per_step)]
    if written:
        scope.write_many(written)
    return [np.asarray(v) for v in fetched] if return_numpy else list(fetched)


class _Run:
    """The kept steps of one program with feed and fetch ops, and how to run them once."""

    def __init__(self, program, desc, steps, lowered, feed_shapes):
        self.program, self.desc, self.steps = program, desc, steps
        self.lowered, self.feed_shapes = lowered, feed_shapes

    def once(self, state, feeds):
        """(fetched values, {written persistable: value}) of one run over `state` and `feeds`."""
        env = {**state, FEED_VAR: list(feeds)}
        rng = env.get(RNG_VAR)
        fetches = [None] * len(self.lowered.fetch_names)
        for step in self.steps:
            inputs = {n: env[n] for names in step.inputs.values() for n in names}
            try:
                run_step(step, env, rng, self.desc, 0, fetches)
            except ProgramError as e:   # fed sizes that disagree, as a compiled run says
                mismatch = _disagreeing_feeds(self.program, self.feed_shapes, e)
                if mismatch is None:
                    raise
                raise _in_run(mismatch) from None
            if step.opdef.type != "fetch":
                outputs = labelled(step.outputs, env, "output")
                if not all(bool(jnp.isfinite(v).all()) for _, _, v in outputs):
                    raise self._error(step, inputs, outputs, state, rng)
        if RNG_VAR in self.lowered.writes:
            env[RNG_VAR] = jax.random.fold_in(rng, 0)
        return fetches, {n: env[n] for n in self.lowered.writes}

    def _error(self, step, inputs, outputs, state, rng):
        """The NumericsError of block 0's op `step`, which produced `outputs` from `inputs`."""
        if step.opdef.type == "feed":
            (_, name, value), = outputs
            return NumericsError(f"the value fed holds a NaN or Inf: "
                                 f"{summary(name, value.dtype, value.shape, stats(value))}",
                                 var=name)
        op = OpRef(0, step.index, step.opdef.type, step.callsite)
        if step.block_attrs:
            inner = _inner_culprit(step, inputs, rng, self.desc)
            if inner is not None:
                inner_op, values = inner
                return numerics_error(inner_op, values, forward_op_of(self.desc, inner_op),
                                      outer_op=op)
        values = {label: summary(name, v.dtype, v.shape, stats(v))
                  for label, name, v in outputs + labelled(step.inputs, inputs, "input")}
        origins = dict.fromkeys((n for n in inputs if n in state),
                                "the Scope held it before this run")
        return numerics_error(op, values, forward_op_of(self.program.desc, op), origins=origins)


def _inner_culprit(step, inputs, rng, desc):
    """(OpRef, {label: ValueSummary}) of the first op inside the sub-blocks of `step` to produce
    a NaN or Inf when `step` runs again over `inputs`, or None if none does."""
    found = []

    def record(op, n_outputs, labels, computed):
        if not found and any(s[0] or s[1] or s[2] for s in computed[:n_outputs]):
            found.append((op, {label: summary(name, dtype, shape, s) for
                               (label, name, dtype, shape), s in zip(labels, computed)}))

    def watch(inner, env, block_idx):
        outputs = labelled(inner.outputs, env, "output")
        if not outputs:
            return
        watched = outputs + labelled(inner.inputs, env, "input")
        op = OpRef(block_idx, inner.index, inner.opdef.type, inner.callsite)
        labels = [(label, name, v.dtype, v.shape) for label, name, v in watched]
        jax.debug.callback(lambda computed: record(op, len(outputs), labels, computed),
                           [stats(v) for _, _, v in watched], ordered=True)

    with watching(watch):
        run_step(step, dict(inputs), rng, desc, 0, [])
        jax.effects_barrier()
    return found[0] if found else None
