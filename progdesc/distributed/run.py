"""How the Executor compiles a step for a mesh (`Executor(mesh=...)`).

Three modes, chosen by the program itself:

* **Data parallel** (and **tensor parallel**): a program with collectives
  (`minimize(..., data_parallel=True)`, a `batch_norm` with `sync_axis`, the layers of
  progdesc/distributed/tensor_parallel.py) runs under `shard_map` over every axis of the
  mesh. Each device runs the whole program on its share of the batch (split over the
  data axis) and on its slice of each persistable whose sharding annotation splits it
  over another axis (a tensor-parallel weight and its optimizer state, split over
  "model"); every other persistable is replicated. An annotation may not split a
  persistable over the data axis here. Every axis the program communicates over must be
  in the mesh. On a 2-D mesh `{"data": 2, "model": 2}` one program is so data parallel
  and tensor parallel at once.
* **Sharded** (FSDP / ZeRO-3, tensor parallel by annotations alone): any other program
  runs under `jax.jit` with `NamedSharding` in/out shardings taken from the variables'
  sharding annotations (replicated where there is none); XLA's SPMD partitioner
  inserts the collectives. Persistables come back laid out as they went in.

* **Pipeline**: a program made a pipeline (`progdesc.distributed.pipeline`: its ops
  marked with stages, `c_ppermute` transfers, a `pipeline_schedule` op) runs one stage
  per device of the mesh's pipe axis, each holding only its stage's parameters and
  optimizer state, over micro-batches in the schedule's order
  (progdesc/distributed/pipeline/driver.py, which also says how feeds and fetches go).

Feeds and fetches, in the first two modes: a variable whose first declared dim is -1
(the batch dim of a data variable) is *per-example*. Per-example feeds are split
along that dim over the data axis (its size must divide the fed batch, else
FeedError); other feeds are replicated. Per-example fetches come back as one
global array. In data-parallel mode every other fetch is computed per device and
combined: floating-point values are averaged over the devices (the loss, as the
mean over the global batch; a parameter, unchanged), integer and bool values are
summed (counts, e.g. of correct predictions). Over the other axes (tensor parallel) a
fetched value, the loss and each persistable not split over the axis must be the same on
every device: one that JAX's tracing finds varying over such an axis (a column-parallel
layer's slice reduced without a row-parallel layer) is a ProgramError naming it and the op
it began to differ at, raised while the step compiles (nothing has run); fetching the slice
a device holds of a split value (a column-parallel layer's output) is one too.
In sharded mode the program sees the global batch, so fetches need no combining.
Persistables that a data-parallel program leaves different on different devices
(`batch_norm` running statistics without `sync_axis`) are averaged over the devices
after each step. Random ops (dropout) draw different numbers on each device of the
data axis, from the device's index folded into the program's RNG state; the state
itself advances as on one device. The devices of another axis draw the same numbers.
"""
import re

import jax
import numpy as np
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec

from lowering.desc import FORWARD_OP, PIPELINE_STAGE
from lowering.gradients import GRAD_SUFFIX
from lowering import progdesc_pb2 as pb
from lowering.errors import FeedError, ProgramError
from lowering.lower import RNG_VAR, watching
from lowering.ops.collective import COLLECTIVE_OPS, varying_axes
from progdesc.distributed.data_parallel import collective_axes
from progdesc.distributed import peers
from progdesc.distributed.tensor_parallel import MODEL_AXIS, check_heads
from progdesc.distributed.sharding import (is_split, named_sharding, replicated,
                                            sharding_of)


def compile_on_mesh(mesh, program_desc, fn, feeds, fetch_names, reads, writes, steps,
                    donate):
    """(jitted step, `place`) for `fn(*feeds, *reads) -> (*fetched, *written)` on `mesh`.

    `feeds` are (name, fed shape) pairs; with `steps` each fed value has a leading axis of
    steps and so has each fetched one. `place(args)` puts the flat arguments where the
    step expects them (feeds split, persistables laid out), a no-op for those already there.
    """
    var = {v.name: v for v in program_desc.blocks[0].vars}
    lead = () if steps is None else (None,)

    def per_example(name):
        dims = var[name].dims
        return len(dims) > 0 and dims[0] == -1

    split = mesh.data_axis in mesh.axes
    feed_specs = []
    for name, shape in feeds:
        if split and per_example(name):
            batch = shape[len(lead)]
            if batch % mesh.data_size:
                raise FeedError(f"a fed batch of {batch} does not divide by the {mesh.data_size}"
                                f" devices of mesh axis '{mesh.data_axis}': feed a multiple of "
                                f"{mesh.data_size}", var=name)
            feed_specs.append(PartitionSpec(*lead, mesh.data_axis))
        else:
            feed_specs.append(PartitionSpec())
    feed_shardings = [NamedSharding(mesh.jax_mesh, s) for s in feed_specs]
    axes = collective_axes(program_desc)
    if axes:
        jitted, read_shardings = _data_parallel(mesh, axes, program_desc, fn, var, feed_specs, fetch_names,
                                                reads, writes, lead, per_example, donate)
    else:
        read_shardings = [named_sharding(mesh, var[n]) if n in var else replicated(mesh)
                          for n in reads]
        write_shardings = [named_sharding(mesh, var[n]) if n in var else replicated(mesh)
                           for n in writes]
        jitted = jax.jit(fn, in_shardings=(*feed_shardings, *read_shardings),
                         out_shardings=(*[None] * len(fetch_names), *write_shardings),
                         donate_argnums=donate)
    shardings = (*feed_shardings, *read_shardings)
    n_feeds = len(feed_shardings)

    def place(args, everything=True):
        """The flat arguments laid out as the step expects; only the feeds unless
        `everything` (persistables an earlier step wrote are already in place)."""
        n = len(args) if everything else n_feeds
        ahead = tuple(_from_host(a, s) for a, s in zip(args[:n], shardings[:n]))
        return (*jax.device_put(ahead, shardings[:n]), *args[n:])
    return jitted, place


def _from_host(value, sharding):
    """`value` laid out by `sharding`, through the host, when it is on this process's devices
    only and `sharding` spans other processes too (a value loaded from a checkpoint into a
    multi-process run: every process loaded the same one); JAX cannot move it there itself
    (no cross-host transfers on CPU). Else `value` unchanged."""
    if (not sharding.is_fully_addressable and isinstance(value, jax.Array)
            and value.is_fully_addressable):
        with jax.enable_x64(True):      # int64 state stays int64
            return jax.device_put(np.asarray(value), sharding)
    return value


def placing(call, place):
    """`call` (a compiled step) with its feeds placed first, and every argument placed when
    a persistable is laid out elsewhere.

    Feeds are always put on the mesh explicitly: handing NumPy arrays to a multi-device
    executable can deadlock JAX's CPU collectives. A persistable on other devices
    (written into the Scope by another Executor) makes the executable refuse the call
    before it runs (a ValueError, nothing donated); the call is then made again with
    everything placed.
    """
    def run(*args):
        with peers.raising():       # a lost process: DistributedError, not gloo's error
            try:
                return call(*place(args, everything=False))
            except ValueError:
                return call(*place(args))
    return run


def _data_parallel(mesh, axes, program_desc, fn, var, feed_specs, fetch_names, reads, writes,
                   lead, per_example, donate):
    axis = mesh.data_axis
    if axis in axes and axis not in mesh.axes:
        raise ProgramError(f"the program is data parallel (it all-reduces over a mesh axis) "
                           f"but the mesh {mesh.axes} has no data axis '{axis}'")
    unknown = sorted(axes - set(mesh.axes))
    split = sorted(set(unknown) & _split_axes(program_desc))
    if split:
        raise ProgramError(f"the program has layers split over mesh axis '{split[0]}' (tensor "
                           f"parallel), but the mesh {mesh.axes} has no axis '{split[0]}': "
                           f"give the mesh one, e.g. Mesh({{'{axis}': 2, '{split[0]}': 2}})")
    if unknown:
        raise ProgramError(f"the program communicates over mesh axis '{unknown[0]}', but runs "
                           f"data parallel over the mesh's data axis '{axis}' and the mesh "
                           f"{mesh.axes} has no axis '{unknown[0]}': build it for the mesh's "
                           f"axes, or give the Mesh data_axis='{unknown[0]}'")
    check_heads(program_desc, mesh)
    read_specs = [_split_spec(mesh, var, name) for name in reads]
    write_specs = [_split_spec(mesh, var, name) for name in writes]
    n_fetch, n_feeds = len(fetch_names), len(feed_specs)
    fetch_split = [per_example(n) for n in fetch_names]
    split_data = axis in mesh.axes
    rng_in = n_feeds + reads.index(RNG_VAR) if RNG_VAR in reads else None
    rng_out = n_fetch + writes.index(RNG_VAR) if RNG_VAR in writes else None
    others = [a for a in mesh.axes if a != axis]
    losses = _backward_targets(program_desc)
    writers = {n: op_desc for op_desc in program_desc.blocks[0].ops
               if op_desc.role != pb.BACKWARD for slot in op_desc.outputs for n in slot.arguments}

    def body(*args):
        args = list(args)
        if rng_in is not None and split_data:   # each device draws its own random numbers
            shared = args[rng_in]
            args[rng_in] = jax.random.fold_in(shared, lax.axis_index(axis))
        trail = _Trail()
        with watching(trail.watch):
            outs = list(fn(*args))
        if rng_out is not None and split_data:   # the state advances as on one device
            outs[rng_out] = jax.random.fold_in(shared, 0)
        for name in losses:
            _check_loss(name, others, trail, writers)
        for v, name in zip(outs[:n_fetch], fetch_names):
            _check_whole(v, others, (), name, var.get(name), trail, "fetched")
        for v, name, spec in zip(outs[n_fetch:], writes, write_specs):
            _check_whole(v, others, spec, name, var.get(name), trail, "persistable")
        fetched = [_fetched(v, axis, each)
                   for v, each in zip(outs[:n_fetch], fetch_split)]
        written = [_agree(v, axis, name) for v, name in zip(outs[n_fetch:], writes)]
        return (*fetched, *written)

    out_specs = (*[PartitionSpec(*lead, axis) if each and split_data else PartitionSpec()
                   for each in fetch_split],
                 *[PartitionSpec(*spec) for spec in write_specs])
    mapped = jax.shard_map(body, mesh=mesh.jax_mesh,
                           in_specs=(*feed_specs, *[PartitionSpec(*s) for s in read_specs]),
                           out_specs=out_specs)
    read_shardings = [NamedSharding(mesh.jax_mesh, PartitionSpec(*s)) for s in read_specs]
    in_shardings = (*[NamedSharding(mesh.jax_mesh, s) for s in feed_specs], *read_shardings)
    return jax.jit(mapped, in_shardings=in_shardings, donate_argnums=donate), read_shardings


def _split_axes(program_desc):
    """The mesh axes that the program's tensor-parallel ops split values over (every
    collective but `c_allreduce`, which a data-parallel program reduces with)."""
    axes = set()
    for op_desc in program_desc.blocks[0].ops:
        if op_desc.type in COLLECTIVE_OPS and op_desc.type != "c_allreduce":
            attr = op_desc.attrs.get("axis_name")
            axes.add(attr.s if attr is not None else MODEL_AXIS)
    return axes


def _split_spec(mesh, var, name):
    """The spec a persistable is laid out by under shard_map: its annotation, which may split
    it over the mesh's axes other than the data axis (a tensor-parallel weight's slices);
    replicated without one. ProgramError if it splits it over the data axis."""
    if name not in var or not is_split(var[name]):
        return ()
    spec = sharding_of(var[name])
    if mesh.data_axis in spec:
        raise ProgramError("a data-parallel program keeps every persistable replicated over "
                           f"the data axis '{mesh.data_axis}', but this one has a sharding "
                           "annotation that splits it there: drop data_parallel (the "
                           "annotations shard it) or the annotation", var=name)
    named_sharding(mesh, var[name])   # every axis in the mesh, every split dim divides
    return spec


def _raise_differs(what, name, axis, trail, origin_of=None):
    """The ProgramError of `_check_whole` and `_check_loss`: `name` (a `what`) differs between
    the devices of mesh axis `axis`; names the first op it differs from."""
    where, since = {}, ""
    step = trail.origin(origin_of or name, axis)
    if step is not None:
        where = dict(op_type=step.opdef.type, op_index=step.index, callsite=step.callsite)
        made = [n for names in step.outputs.values() for n in names]
        since = f" from the output '{made[0] if made else '?'}' of the op named here on"
    if what == "persistable":
        what = "persistable, replicated over the axis (no sharding annotation splits it there),"
    raise ProgramError(f"the {what} differs between the devices of mesh axis '{axis}': each "
                       f"computes it from its own slice of a layer split over '{axis}'{since}. "
                       "Join the slices first: a column-parallel fc ends in a row-parallel one "
                       "(mp_allreduce_sum), or c_concat gathers them", var=name, **where)


def _varies(x, axis):
    """Whether traced value `x` may differ between the devices of `axis` (inside shard_map)."""
    return axis in varying_axes(x)


class _Trail:
    """What the ops of block 0 did while a step was traced under shard_map: the op that
    wrote each variable and the mesh axes each value varies over, to tell where a value
    that should be whole on every device began to differ."""

    def __init__(self):
        self.producer = {}   # variable -> the step that wrote it
        self.varying = {}    # variable -> the mesh axes its value varies over

    def watch(self, step, inputs, env, block_idx):
        """The `lowering.lower.watching` callback."""
        if block_idx:
            return
        for name, value in inputs.items():
            self.varying.setdefault(name, _axes_of(value))
        for names in step.outputs.values():
            for name in names:
                if name in env:
                    self.producer[name] = step
                    self.varying[name] = _axes_of(env[name])

    def origin(self, name, axis):
        """The first op (in program order) among those that made `name` vary over `axis`:
        its ancestors through values that vary over `axis`. None if no op did (a read)."""
        first, seen, todo = None, set(), [name]
        while todo:
            step = self.producer.get(todo.pop())
            if step is None or step.index in seen:
                continue
            seen.add(step.index)
            if first is None or step.index < first.index:
                first = step
            todo.extend(n for names in step.inputs.values() for n in names
                        if axis in self.varying.get(n, ()))
        return first


def _backward_targets(program_desc):
    """The values block 0's backward starts from (the losses): the variables whose gradient
    seed a gradient op `fill_constant` writes (`append_backward` names it after them)."""
    names = {v.name for v in program_desc.blocks[0].vars}
    found = []
    for op_desc in program_desc.blocks[0].ops:
        if (op_desc.role != pb.BACKWARD or op_desc.type != "fill_constant"
                or FORWARD_OP in op_desc.attrs):
            continue
        for out in (n for slot in op_desc.outputs for n in slot.arguments):
            target = re.sub(r"_\d+$", "", out)
            target = target[:-len(GRAD_SUFFIX)] if target.endswith(GRAD_SUFFIX) else None
            if target in names:
                found.append(target)
    return found


def _check_loss(name, others, trail, writers):
    """ProgramError if the loss `name` differs between the devices of a mesh axis other than
    the data axis: each device would follow the gradient of its own loss. A loss that was
    not traced (nothing reads it) varies as the inputs of the op that computes it
    (`writers`: variable -> that op's desc), back to traced values."""
    for other in others:
        traced = _traced_ancestor(name, other, trail, writers, set())
        if traced is not None:
            _raise_differs("loss", name, other, trail, origin_of=traced)


def _traced_ancestor(name, axis, trail, writers, seen):
    """`name` if its traced value varies over `axis`; else, if it was not traced, one of the
    inputs of the op that wrote it that does (not through a collective over `axis`, after
    which it is whole); None if none does."""
    if name in seen:
        return None
    seen.add(name)
    if name in trail.varying:
        return name if axis in trail.varying[name] else None
    op_desc = writers.get(name)
    if op_desc is None:
        return None
    attr = op_desc.attrs.get("axis_name")
    if op_desc.type in COLLECTIVE_OPS and attr is not None and attr.s == axis:
        return None
    for n in (n for slot in op_desc.inputs for n in slot.arguments):
        found = _traced_ancestor(n, axis, trail, writers, seen)
        if found is not None:
            return found
    return None


def _axes_of(value):
    try:
        return varying_axes(value)
    except (TypeError, AttributeError):   # not an array (a sub-block's list, None)
        return frozenset()


def _check_whole(x, others, spec, name, var_desc, trail, what):
    """ProgramError if traced value `x`, a fetched value or a written persistable of `name`,
    differs between the devices of a mesh axis other than the data axis that its
    annotation `spec` does not split it over: each device would hold its own value where
    the program means one (a loss over a column-parallel layer's slice alone)."""
    for other in others:
        if other in spec or not _varies(x, other):
            continue
        if what == "fetched" and var_desc is not None and _is_slice(x, var_desc):
            raise ProgramError(f"the fetched value is split over mesh axis '{other}' (an "
                               "output of a column-parallel layer): fetch a value that "
                               "every device holds whole, e.g. after a row-parallel layer",
                               var=name)
        _raise_differs("fetched value" if what == "fetched" else "persistable", name,
                       other, trail)


def _fetched(x, axis, per_example):
    """A fetched per-device value made global (`_check_whole` has checked it is whole over
    the other axes). Over the data axis, a per-example value is gathered (by out_specs);
    any other is combined: floats averaged, integers and bools summed."""
    return x if per_example else _combine(x, axis)


def _is_slice(x, var_desc):
    """Whether a known dim of `var_desc` differs from the traced value's (a leading axis of
    steps, and the batch dim, -1, left aside)."""
    dims = list(var_desc.dims)
    if x.ndim < len(dims) or not dims:
        return False
    shape = x.shape[x.ndim - len(dims):]
    return any(d >= 0 and d != n for d, n in zip(dims, shape))


def _combine(x, axis):
    """A fetched per-device value made global: floats averaged, integers and bools summed."""
    if not _varies(x, axis):
        return x
    if np.issubdtype(x.dtype, np.floating):
        return lax.pmean(x, axis)
    return lax.psum(x.astype(np.int32) if x.dtype == np.bool_ else x, axis)


def _agree(x, axis, name):
    """A written persistable, averaged over the data axis if its devices disagree on it."""
    if not _varies(x, axis):
        return x
    if not np.issubdtype(x.dtype, np.floating):
        raise ProgramError(f"the data-parallel program leaves this {x.dtype} persistable "
                           "different on different devices", var=name)
    return lax.pmean(x, axis)


def compile_pipeline(mesh, program_desc, lowered, feed_names, reads, writes, steps, precision):
    """The step of a pipeline program on `mesh` (a `PipelineStep`, called with the flat
    `(*feeds, *reads)` and returning `(*fetched, *writes)`), or None if the program is not a
    pipeline."""
    from progdesc.distributed.pipeline.plan import schedule_op
    if schedule_op(program_desc) is None:
        if any(PIPELINE_STAGE in op_desc.attrs for op_desc in program_desc.blocks[0].ops):
            raise ProgramError("the program marks pipeline stages but is not a pipeline: "
                               "apply progdesc.distributed.pipeline(program, micro_batches) "
                               "before minimize")
        return None
    from progdesc.distributed.pipeline.driver import PipelineStep
    return PipelineStep(mesh, program_desc, lowered.kept_ops, feed_names, lowered.fetch_names,
                        reads, writes, steps, precision)
