"""How the Executor compiles a step for a mesh (`Executor(mesh=...)`).

Three modes, chosen by the program itself:

* **Data parallel**: a program with collectives (`minimize(..., data_parallel=True)`,
  a `batch_norm` with `sync_axis`) runs under `shard_map` over the mesh's data
  axis. Each device runs the whole program on its share of the batch; parameters,
  optimizer state and every other persistable are replicated.
* **Sharded** (FSDP / ZeRO-3, tensor parallel): any other program runs under
  `jax.jit` with `NamedSharding` in/out shardings taken from the variables'
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
summed (counts, e.g. of correct predictions). In sharded mode the program sees the
global batch, so fetches need no combining. Persistables that a data-parallel
program leaves different on different devices (`batch_norm` running statistics
without `sync_axis`) are averaged over the devices after each step. Random ops
(dropout) draw different numbers on each device, from the device's index folded
into the program's RNG state; the state itself advances as on one device.
"""
import jax
import numpy as np
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec

from lowering.desc import PIPELINE_STAGE
from lowering.errors import FeedError, ProgramError
from lowering.lower import RNG_VAR
from lowering.ops.collective import varying_axes
from progdesc.distributed.data_parallel import collective_axes
from progdesc.distributed import peers
from progdesc.distributed.sharding import is_split, named_sharding, replicated


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
        jitted, read_shardings = _data_parallel(mesh, axes, fn, var, feed_specs, fetch_names,
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
        return (*jax.device_put(tuple(args[:n]), shardings[:n]), *args[n:])
    return jitted, place


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


def _data_parallel(mesh, axes, fn, var, feed_specs, fetch_names, reads, writes, lead,
                   per_example, donate):
    axis = mesh.data_axis
    if axis not in mesh.axes:
        raise ProgramError(f"the program is data parallel (it all-reduces over a mesh axis) "
                           f"but the mesh {mesh.axes} has no data axis '{axis}'")
    if axes != {axis}:
        other = sorted(axes - {axis})[0]
        raise ProgramError(f"the program communicates over mesh axis '{other}', but runs data "
                           f"parallel over the mesh's data axis '{axis}' only: build it for "
                           f"that axis, or give the Mesh data_axis='{other}'")
    for name in (*reads, *writes):
        if name in var and is_split(var[name]):
            raise ProgramError("a data-parallel program keeps every persistable replicated, "
                               "but this one has a sharding annotation that splits it: drop "
                               "data_parallel (the annotations shard it) or the annotation",
                               var=name)
    n_fetch, n_feeds = len(fetch_names), len(feed_specs)
    fetch_split = [per_example(n) for n in fetch_names]
    rng_in = n_feeds + reads.index(RNG_VAR) if RNG_VAR in reads else None
    rng_out = n_fetch + writes.index(RNG_VAR) if RNG_VAR in writes else None

    def body(*args):
        args = list(args)
        if rng_in is not None:   # each device draws its own random numbers (dropout masks)
            shared = args[rng_in]
            args[rng_in] = jax.random.fold_in(shared, lax.axis_index(axis))
        outs = list(fn(*args))
        if rng_out is not None:   # the state advances as lower_block advances it, on all alike
            outs[rng_out] = jax.random.fold_in(shared, 0)
        fetched = [v if each else _combine(v, axis) for v, each in
                   zip(outs[:n_fetch], fetch_split)]
        written = [_agree(v, axis, name) for v, name in zip(outs[n_fetch:], writes)]
        return (*fetched, *written)

    rep = PartitionSpec()
    out_specs = (*[PartitionSpec(*lead, axis) if each else rep for each in fetch_split],
                 *[rep] * len(writes))
    mapped = jax.shard_map(body, mesh=mesh.jax_mesh,
                           in_specs=(*feed_specs, *[rep] * len(reads)), out_specs=out_specs)
    read_shardings = [replicated(mesh)] * len(reads)
    in_shardings = (*[NamedSharding(mesh.jax_mesh, s) for s in feed_specs], *read_shardings)
    return jax.jit(mapped, in_shardings=in_shardings, donate_argnums=donate), read_shardings


def _varies(x, axis):
    """Whether traced value `x` may differ between the devices of `axis` (inside shard_map)."""
    return axis in varying_axes(x)


def _combine(x, axis):
    """A fetched per-device value made global: floats averaged, integers and bools summed."""
    if not _varies(x, axis):
        return x
    if np.issubdtype(x.dtype, np.floating):
        return lax.pmean(x, axis)
    return lax.psum(x.astype(np.int32) if x.dtype == np.bool_ else x, axis)


def _agree(x, axis, name):
    """A written persistable, averaged over the devices if they disagree on it."""
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
