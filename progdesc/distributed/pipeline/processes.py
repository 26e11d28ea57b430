"""Pipelines whose stages live in different processes (driver.py's `Links`).

Every process walks the same tick table and runs only the stages whose devices it owns;
for the others it follows along with shapes only (`jax.eval_shape`), so that it knows
what it is about to receive. A transfer between two stages of one process is a copy
(`jax.device_put`); between stages of different processes it is a computation both take
part in: a jitted `lax.ppermute` over the two stage devices, the sender handing in the
value, the receiver zeros of its shape. As every process calls these transfers in the
same order (the tick table's), none waits for a transfer the other has not reached.
Fetched values are broadcast from the process whose stage computed them
(`multihost_utils.broadcast_one_to_all`), so every process gets them whole. A stage's
state stays on its process: the others hold, in its place, an array with no data of
theirs (`placeholder`), which `progdesc.distributed.save_checkpoint` gathers from the
owner.
"""
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from lowering.errors import DistributedError
from progdesc.distributed import peers


def abstract(value):
    """The shape and dtype of `value` (an array, or a ShapeDtypeStruct) as JAX holds it."""
    if isinstance(value, jax.ShapeDtypeStruct):
        return value
    return jax.ShapeDtypeStruct(np.shape(value), jax.dtypes.canonicalize_dtype(value.dtype))


def is_abstract(value):
    """Whether `value` stands for a value another process holds."""
    return isinstance(value, jax.ShapeDtypeStruct)


def placeholder(value, device):
    """An array of `value`'s shape and dtype on `device` (another process's): it holds no
    data here; its owner holds the data."""
    a = abstract(value)
    sharding = NamedSharding(Mesh(np.array([device]), ("stage",)), PartitionSpec())
    return jax.make_array_from_single_device_arrays(a.shape, sharding, [], dtype=a.dtype)


def local_value(value, name):
    """`value` as an array of this process: a replicated global array's local copy.
    DistributedError if this process holds none of it."""
    if isinstance(value, jax.Array) and not value.is_fully_addressable:
        if not value.addressable_shards or not value.is_fully_replicated:
            raise DistributedError(
                "a pipeline stage of this process reads a value that this process does not "
                "hold whole (another process's stage holds it, or it is split): load the "
                "checkpoint in every process, or run the startup program", var=name)
        return value.addressable_data(0)
    return value


class Links:
    """Where the stages of a pipeline on `devices` (one per stage) run, and how values
    move between them; see the module docstring."""

    def __init__(self, devices):
        self.devices = devices
        me = jax.process_index()
        self.local = [d.process_index == me for d in devices]
        self.spans = not all(self.local)
        self._pairs = {}

    def put(self, value, s, name=None):
        """`value` (fed, or state) on stage `s`'s device, or its shape where `s` is not ours."""
        if self.local[s]:
            return jax.device_put(local_value(value, name), self.devices[s])
        return abstract(value)

    def move(self, value, src, dst):
        """The value `value` of stage `src` handed to stage `dst`."""
        if self.local[src] and self.local[dst]:
            return jax.device_put(value, self.devices[dst])
        if not self.local[src] and not self.local[dst]:
            return value
        return self._send(value, src, dst)

    def _send(self, value, src, dst):
        a = abstract(value)
        fn, sharding = self._pair(src, dst)
        if self.local[src]:
            # wait for the value itself first: then the transfer, once started, waits only
            # for the other process to reach the same one
            piece = jnp.expand_dims(jax.block_until_ready(value), 0)
        else:
            piece = jax.device_put(np.zeros((1, *a.shape), a.dtype), self.devices[dst])
        both = jax.make_array_from_single_device_arrays((2, *a.shape), sharding, [piece])
        with peers.raising():
            out = fn(both)
        return out.addressable_data(0).reshape(a.shape) if self.local[dst] else a

    def _pair(self, src, dst):
        if (src, dst) not in self._pairs:
            mesh = Mesh(np.array([self.devices[src], self.devices[dst]]), ("pair",))
            spec = PartitionSpec("pair")
            fn = jax.jit(jax.shard_map(lambda x: lax.ppermute(x, "pair", [(0, 1)]),
                                       mesh=mesh, in_specs=spec, out_specs=spec))
            self._pairs[src, dst] = fn, NamedSharding(mesh, spec)
        return self._pairs[src, dst]

    def broadcast(self, values):
        """[(value, stage)] made whole in every process: each value computed by `stage`
        comes from that stage's process (a local array in every process)."""
        out = [None] * len(values)
        owners = sorted({self.devices[s].process_index for _, s in values})
        for owner in owners:
            mine = [i for i, (_, s) in enumerate(values)
                    if self.devices[s].process_index == owner]
            tree = [_sendable(values[i][0]) for i in mine]
            with peers.raising():
                got = multihost_utils.broadcast_one_to_all(
                    tree, is_source=owner == jax.process_index())
            for i, v in zip(mine, got):
                out[i] = jnp.asarray(v, abstract(values[i][0]).dtype)
        return out


def _sendable(value):
    """What broadcast_one_to_all sends for `value`: its data, or zeros of its shape where
    another process has it (bools as uint8: they are summed)."""
    a = abstract(value)
    data = np.zeros(a.shape, a.dtype) if is_abstract(value) else np.asarray(value)
    return data.astype(np.uint8) if data.dtype == np.bool_ else data
