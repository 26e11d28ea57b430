"""Running a pipeline program: one device per stage, one compiled function per segment.

Each stage's forward, backward and update segments (plan.py) are compiled with
`jax.jit` for the stage's device, which holds the stage's parameters and optimizer
state and nothing else. A step splits each per-example feed into micro-batches, then
runs the segments in the order of the schedule's tick table (schedule.py); a
`c_ppermute` is a copy of the value onto the next (or, for a gradient, the previous)
stage's device. JAX dispatches asynchronously, so a stage starts on its next
micro-batch while the next stage works on the previous one. The backward sums each
parameter gradient over the micro-batches; the update segment applies the mean, once
per step: the gradient of the mean loss over the whole batch, as on one device when the
loss is a mean over examples. Fetched values computed per micro-batch are combined as
the data-parallel mode combines devices' (progdesc/distributed/run.py): per-example
ones concatenated, floats averaged, integers summed.

Stages may live in different processes (a mesh over several processes' devices): each
process then runs only its own stages, follows the others' with shapes only, and moves
values between processes through computations both take part in (processes.py).
"""

import jax
import jax.numpy as jnp
import numpy as np

from lowering.errors import FeedError, ProgramError
from lowering.lower import RNG_VAR, precision_scope, run_step
from progdesc.distributed.pipeline.plan import plan as make_plan
from progdesc.distributed.pipeline.processes import Links, is_abstract, placeholder
from progdesc.distributed.pipeline.schedule import ticks


def stage_devices(mesh, n_stages, axis_name):
    """The device of each stage: the mesh's devices along `axis_name`, its only axis of
    size > 1; ProgramError if the mesh does not fit the pipeline."""
    if mesh.axes.get(axis_name) != n_stages:
        raise ProgramError(f"the program is a pipeline of {n_stages} stages over mesh axis "
                           f"'{axis_name}', but the mesh is {mesh.axes}: give it "
                           f"Mesh({{'{axis_name}': {n_stages}}})")
    others = [a for a, size in mesh.axes.items() if a != axis_name and size > 1]
    if others:
        raise ProgramError(f"a pipeline runs on a mesh with the one axis '{axis_name}'; this "
                           f"one also splits axis '{others[0]}'")
    return list(mesh.jax_mesh.devices.reshape(-1))


class PipelineStep:
    """The flat step the Executor calls, `(*feeds, *reads) -> (*fetched, *writes)`,
    for a pipeline program on `mesh`; see the module docstring."""

    def __init__(self, mesh, program_desc, kept, feed_names, fetch_names, reads, writes,
                 steps, precision):
        var = {v.name: v for v in program_desc.blocks[0].vars}
        if RNG_VAR in reads:
            raise ProgramError("the pipeline program draws random numbers (dropout, random "
                               "ops), which a pipeline does not run yet")
        persistable = {n for n, v in var.items() if v.persistable}
        self.plan = p = make_plan(program_desc, kept, fetch_names, persistable)
        self.devices = stage_devices(mesh, p.n_stages, p.axis_name)
        self.links = Links(self.devices)
        self._shapes = {}   # (segment kind, stage, input shapes) -> output shapes
        self.table = ticks(p.schedule, p.n_stages, p.micro_batches)
        self.feed_names, self.fetch_names = tuple(feed_names), tuple(fetch_names)
        self.reads, self.writes, self.steps = tuple(reads), tuple(writes), steps
        self.per_example = {n for n, v in var.items() if len(v.dims) and v.dims[0] == -1}
        self.persistable = persistable
        m = p.micro_batches
        self._forward = [jax.jit(_run(seg, program_desc, precision)) for seg in p.forward]
        self._backward = [jax.jit(_run_summing(seg, grads, program_desc, precision))
                          for seg, grads in zip(p.backward, p.grads)]
        self._update = [jax.jit(_run_mean(seg, grads, m, program_desc, precision))
                        for seg, grads in zip(p.update, p.grads)]
        self._fed_at = [set() for _ in range(p.n_stages)]
        for s in range(p.n_stages):
            for seg in (p.forward[s], p.backward[s]):
                self._fed_at[s].update(n for n in seg.reads if n in set(self.feed_names))
        self._acc_shapes = {}
        self.final = {}   # name -> stage whose update (or state) gives the value after a step
        for s in reversed(range(p.n_stages)):
            for n in (*p.state[s], *p.update[s].writes):
                self.final[n] = s
        for n in fetch_names:
            if n not in self.final and n not in p.stage_of_var and n not in feed_names:
                raise ProgramError("the fetched variable is computed by no pipeline stage",
                                   var=n)

    def __call__(self, *args):
        n = len(self.feed_names)
        feeds, state = args[:n], dict(zip(self.reads, args[n:]))
        if self.steps is None:
            return self._step(dict(zip(self.feed_names, feeds)), state)
        outs = []
        for k in range(self.steps):
            out = self._step({f: v[k] for f, v in zip(self.feed_names, feeds)}, state)
            state.update(zip(self.writes, out[len(self.fetch_names):]))
            outs.append(out)
        home = self.devices[0] if self.links.local[0] else jax.local_devices()[0]
        fetched = [jnp.stack([jax.device_put(o[i], home) for o in outs])
                   for i in range(len(self.fetch_names))]
        return (*fetched, *outs[-1][len(self.fetch_names):])

    def _micro_feeds(self, feeds):
        m = self.plan.micro_batches
        out = [dict() for _ in range(m)]
        for name, value in feeds.items():
            if isinstance(value, jax.Array) and not value.is_fully_addressable:
                raise FeedError("a pipeline takes the whole batch in every process (each uses "
                                "what its stages read), not a global array of every "
                                "process's rows (dist.global_batch)", var=name)
            if name in self.per_example:
                if value.shape[0] % m:
                    raise FeedError(f"a fed batch of {value.shape[0]} does not split into the "
                                    f"pipeline's {m} micro-batches: feed a multiple of {m}",
                                    var=name)
                size = value.shape[0] // m
                for i in range(m):
                    out[i][name] = value[i * size:(i + 1) * size]
            else:
                for i in range(m):
                    out[i][name] = value
        return out

    def _step(self, feeds, state):
        p, links = self.plan, self.links
        micro = self._micro_feeds(feeds)
        held = [{n: links.put(state[n], s, n) for n in p.state[s] if n in state}
                for s in range(p.n_stages)]
        env = [[None] * p.micro_batches for _ in range(p.n_stages)]
        acc = [None] * p.n_stages
        per_micro, made_by = {}, {}   # fetched name -> [value per micro-batch], its stage

        def values(s, i):
            if env[s][i] is None:
                env[s][i] = {n: links.put(micro[i][n], s) for n in self._fed_at[s]}
            return env[s][i]

        def keep(s, out):
            for n in self.fetch_names:
                if n in out and n not in self.final:
                    per_micro.setdefault(n, []).append(out[n])
                    made_by[n] = s
            held[s].update((n, v) for n, v in out.items() if n in self.persistable)

        for tick in self.table:
            for s, kind, i in tick:
                here = values(s, i)
                if kind == "F":
                    seg, fn = p.forward[s], self._forward[s]
                    out = self._call(fn, s, "F",
                                     {n: here[n] if n in here else held[s][n] for n in seg.reads})
                    here.update(out)
                    keep(s, out)
                    for t in p.sends:
                        if t.src == s:
                            values(t.dst, i)[t.target] = links.move(out[t.source], s, t.dst)
                else:
                    seg = p.backward[s]
                    inputs = {n: here[n] if n in here else held[s][n] for n in seg.reads}
                    if acc[s] is None:   # zeros, so that one compiled function serves all
                        acc[s] = self._zeros(s, inputs)
                    out, acc[s] = self._call(self._backward[s], s, "B", inputs, acc[s])
                    keep(s, out)
                    for t in p.returns:
                        if t.src == s:
                            values(t.dst, i)[t.target] = links.move(out[t.source], s, t.dst)
                    env[s][i] = ()   # its activations are no longer needed
        finals = {}
        for s in range(p.n_stages):
            seg = p.update[s]
            if seg.steps:
                out = self._call(self._update[s], s, "U", {n: held[s][n] for n in seg.reads
                                                           if n not in p.grads[s]}, acc[s])
                held[s].update(out)
            for n, v in held[s].items():   # the first stage's, where this process runs one
                if n not in finals or is_abstract(finals[n][0]) and not is_abstract(v):
                    finals[n] = v, s
        fetched, made = [], []
        for n in self.fetch_names:
            if n in self.final:   # the same stage's in every process
                fetched.append(held[self.final[n]][n])
                made.append(self.final[n])
            elif n in per_micro:
                fetched.append(self._combine(n, per_micro[n]))
                made.append(made_by[n])
            else:
                fetched.append(jnp.asarray(feeds[n]))
                made.append(None)
        if links.spans:   # every process gets every fetched value whole
            sent = [i for i, s in enumerate(made) if s is not None]
            got = links.broadcast([(fetched[i], made[i]) for i in sent])
            for i, v in zip(sent, got):
                fetched[i] = v
        writes = [finals[n] for n in self.writes]
        return (*fetched, *(placeholder(v, self.devices[s]) if is_abstract(v) else v
                            for v, s in writes))

    def _call(self, fn, s, kind, *args):
        """`fn(*args)`, stage `s`'s segment of `kind`; where another process runs the
        stage, the shapes of what it returns (memoized per input shapes)."""
        if self.links.local[s]:
            return fn(*args)
        key = (kind, s, str(jax.tree.map(lambda a: (a.shape, a.dtype), args)))
        if key not in self._shapes:
            self._shapes[key] = jax.eval_shape(fn, *args)
        return self._shapes[key]

    def _zeros(self, s, inputs):
        """Zero sums of stage `s`'s gradients, on its device (their shapes where another
        process runs the stage)."""
        if s not in self._acc_shapes:
            self._acc_shapes[s] = jax.eval_shape(self._backward[s], inputs, None)[1] or {}
        if not self.links.local[s]:
            return dict(self._acc_shapes[s])
        return {g: jax.device_put(np.zeros(a.shape, a.dtype), self.devices[s])
                for g, a in self._acc_shapes[s].items()}

    def _combine(self, name, parts):
        if is_abstract(parts[0]):
            return jax.eval_shape(lambda *xs: self._combine(name, list(xs)), *parts)
        if name in self.per_example:
            return jnp.concatenate(parts)
        stacked = jnp.stack(parts)
        if np.issubdtype(stacked.dtype, np.floating):
            return stacked.mean(0).astype(stacked.dtype)
        return stacked.astype(np.int32).sum(0) if stacked.dtype == np.bool_ else stacked.sum(0)


def _run(segment, program_desc, precision):
    def run(inputs):
        env = dict(inputs)
        with precision_scope(precision):
            for step in segment.steps:
                run_step(step, env, None, program_desc)
        return {n: env[n] for n in segment.writes}
    return run


def _run_summing(segment, grads, program_desc, precision):
    forward = _run(segment, program_desc, precision)

    def run(inputs, acc):
        out = forward(inputs)
        mine = {g: out[g] for g in grads}
        acc = mine if acc is None else {g: acc[g] + mine[g] for g in grads}
        return out, acc
    return run


def _run_mean(segment, grads, micro_batches, program_desc, precision):
    update = _run(segment, program_desc, precision)

    def run(inputs, acc):
        mean = {g: (acc[g] / micro_batches).astype(acc[g].dtype) for g in grads}
        return update({**inputs, **mean})
    return run
