"""How the Executor compiles a step for a mesh (`Executor(mesh=...)`).

Two modes, chosen by the program itself:

* **Data parallel**: a program with collectives (`minimize(..., data_parallel=True)`,
  a `batch_norm` with `sync_axis`) runs under `shard_map` over the mesh's data
  axis. Each device runs the whole program on its share of the batch; parameters,
  optimizer state and every other persistable are replicated.
* **Sharded** (FSDP / ZeRO-3, tensor parallel): any other program runs under
  `jax.jit` with `NamedSharding` in/out shardings taken from the variables'
  sharding annotations (replicated where there is none); XLA's SPMD partitioner
  inserts the collectives. Persistables come back laid out as they went in.

Feeds and fetches, in both modes: a variable whose first declared dim is -1
(the batch dim of a data variable) is *per-example*. Per-example feeds are split
along that dim over the data axis (its size must divide the fed batch, else
FeedError); other feeds are replicated. Per-example fetches come back as one
global array. In data-parallel mode every other fetch is computed per device and
combined: floating-point values are averaged over the devices (the loss, as the
mean over the global batch; a parameter, unchanged), integer and bool values are
summed (counts, e.g. of correct predictions). In sharded mode the program sees the
global batch, so fetches need no combining. Persistables that a data-parallel
program leaves different on different devices (`batch_norm` running statistics
without `sync_axis`) are averaged over the devices after each step.
"""
import jax
import numpy as np
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec

from lowering.errors import FeedError, ProgramError
from lowering.ops.collective import varying_axes
from progdesc.distributed.data_parallel import uses_collectives
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
    if uses_collectives(program_desc):
        jitted, read_shardings = _data_parallel(mesh, fn, var, feed_specs, fetch_names, reads,
                                                writes, lead, per_example, donate)
    else:
        read_shardings = [named_sharding(mesh, var[n]) if n in var else replicated(mesh)
                          for n in reads]
        write_shardings = [named_sharding(mesh, var[n]) if n in var else replicated(mesh)
                           for n in writes]
        jitted = jax.jit(fn, in_shardings=(*feed_shardings, *read_shardings),
                         out_shardings=(*[None] * len(fetch_names), *write_shardings),
                         donate_argnums=donate)
    shardings = (*feed_shardings, *read_shardings)
    return jitted, lambda args: jax.device_put(tuple(args), shardings)


def _data_parallel(mesh, fn, var, feed_specs, fetch_names, reads, writes, lead, per_example,
                   donate):
    axis = mesh.data_axis
    if axis not in mesh.axes:
        raise ProgramError(f"the program is data parallel (it all-reduces over a mesh axis) "
                           f"but the mesh {mesh.axes} has no data axis '{axis}'")
    for name in (*reads, *writes):
        if name in var and is_split(var[name]):
            raise ProgramError("a data-parallel program keeps every persistable replicated, "
                               "but this one has a sharding annotation that splits it: drop "
                               "data_parallel (the annotations shard it) or the annotation",
                               var=name)
    n_fetch = len(fetch_names)
    fetch_split = [per_example(n) for n in fetch_names]

    def body(*args):
        outs = fn(*args)
        fetched = [v if each else _combine(v, axis) for v, each in
                   zip(outs[:n_fetch], fetch_split)]
        written = [_agree(v, axis, name) for v, name in zip(outs[n_fetch:], writes)]
        return (*fetched, *written)

    rep = PartitionSpec()
    out_specs = (*[PartitionSpec(*lead, axis) if each else rep for each in fetch_split],
                 *[rep] * len(writes))
    mapped = jax.shard_map(body, mesh=mesh.jax_mesh,
                           in_specs=(*feed_specs, *[rep] * len(reads)), out_specs=out_specs)
    return jax.jit(mapped, donate_argnums=donate), [replicated(mesh)] * len(reads)


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
