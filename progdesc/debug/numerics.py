"""The checking run: a program op by op, uncompiled, stopped at the first NaN or Inf.

`Executor(check_numerics=True).run(...)` comes here. The program gets the same
feed and fetch ops, the same pruning, scope reads, random keys and precision
as a compiled run: the block's function from `lowering.lower.lower_block` is
called on concrete arrays instead of being compiled, so its ops run one by one,
and this module watches each (`lowering.lower.watching`). When nothing goes bad
it fetches what the compiled run fetches and writes the same values into the
Scope. After each op, its float outputs are checked; the first op with a NaN or
Inf among them is the culprit (a value already bad when an op reaches it would
have stopped the run at the op that made it; only feeds and the Scope's values
are taken as they come, and the error says so when one of them was bad). The
error names the op, its index and block, the line that created it, the forward
op of a gradient op, and summarises its inputs and outputs. An op with
sub-blocks (cond, switch, scan, while) is run once more with every op of its
sub-blocks watched, to name the inner op that went bad first. Nothing is
written to the Scope unless the whole run succeeds.
"""
import jax
import jax.numpy as jnp
import numpy as np

from lowering.errors import FeedError, FetchError, NumericsError, ProgramError
from lowering.lower import RNG_VAR, lower_block, run_step, watching
from progdesc.debug.report import (OpRef, forward_op_of, labelled, numerics_error, stats,
                                   summary)
from progdesc.feeding import (convert_feeds, disagreeing_feeds, in_run, names_of, on_device,
                              read_state, with_feed_fetch)
from progdesc.framework import Program
from progdesc.scope import ABSENT


def run_checked(executor, program, feed, fetch_list, scope, return_numpy, steps):
    """What `executor.run(program, feed, fetch_list, scope, return_numpy, steps)` returns,
    computed op by op; raises NumericsError at the first op producing a NaN or Inf."""
    if not isinstance(program, Program):
        raise TypeError(f"Executor.run expects a Program, got {type(program).__name__}")
    fetch_names = names_of(fetch_list)
    try:
        names, values, _ = convert_feeds(program, feed, steps)
        desc = with_feed_fetch(program, tuple(names), fetch_names)
        lowered = lower_block(desc, 0, executor.precision or program.precision)
    except (FeedError, FetchError) as e:
        raise in_run(e) from None
    feed_shapes = tuple((n, v.shape if steps is None else v.shape[1:])
                        for n, v in zip(names, values))
    with scope.lock:   # runs on one scope tree take turns
        found, _ = scope.holders(lowered.reads, ())   # checked as the compiled run checks them
        state = dict(zip(lowered.reads, read_state(program, lowered.reads,
                                                   [h or ABSENT for h in found])))
        check = _Check(program, desc, state)
        with jax.enable_x64(True), on_device(executor.device), watching(check):
            try:
                if steps is None:
                    fetched, written = lowered.fn(values, state, {})
                else:
                    per_step = []
                    for k in range(steps):
                        fetched, written = lowered.fn([v[k] for v in values], state, {})
                        state.update(written)
                        per_step.append(fetched)
                    fetched = [jnp.stack(column) for column in zip(*per_step)]
            except ProgramError as e:   # fed sizes that disagree, as a compiled run says
                mismatch = disagreeing_feeds(program, feed_shapes, e)
                if mismatch is None:
                    raise
                raise in_run(mismatch) from None
        if written:
            scope.write_many(written)
    return [np.asarray(v) for v in fetched] if return_numpy else list(fetched)


class _Check:
    """The watch of one checking run: after each op of block 0, NumericsError if one of its
    float outputs holds a NaN or Inf. `state` holds the values read from the Scope."""

    def __init__(self, program, desc, state):
        self.program, self.desc, self.state = program, desc, state

    def __call__(self, step, inputs, env, block_idx):
        # an op of a sub-block is traced inside its op: looked into once that op went bad
        if block_idx != 0 or step.opdef.type == "fetch":
            return
        outputs = labelled(step.outputs, env, "output")
        if not all(bool(jnp.isfinite(v).all()) for _, _, v in outputs):
            raise self._error(step, inputs, outputs, env.get(RNG_VAR))

    def _error(self, step, inputs, outputs, rng):
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
        origins = dict.fromkeys((n for n in inputs if n in self.state),
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

    def watch(inner, inner_inputs, env, block_idx):
        outputs = labelled(inner.outputs, env, "output")
        if not outputs:
            return
        watched = outputs + labelled(inner.inputs, inner_inputs, "input")
        op = OpRef(block_idx, inner.index, inner.opdef.type, inner.callsite)
        labels = [(label, name, v.dtype, v.shape) for label, name, v in watched]
        jax.debug.callback(lambda computed: record(op, len(outputs), labels, computed),
                           [stats(v) for _, _, v in watched], ordered=True)

    with watching(watch):
        run_step(step, dict(inputs), rng, desc, 0, [])
        jax.effects_barrier()
    return found[0] if found else None
