"""Training across processes (one per host, or per accelerator) on JAX's distributed runtime.

Every process runs the same program with the same seed. `initialize` joins them
through `jax.distributed` (process 0 serves the coordinator); afterwards
`jax.devices()` lists the devices of every process, and a Mesh over them spans
all processes. Without a GPU, cross-process collectives go through JAX's own
CPU implementation (gloo).

- Feeds: each process feeds only its own rows of the global batch;
  `global_batch` makes them one global array (`jax.make_array_from_process_local_data`).
- Fetches: `to_host` gives every process the whole value, gathering the parts
  other processes hold (`process_allgather`).
- Checkpoints: `save_checkpoint` gathers every persistable (a pipeline stage's state
  from the process that holds it) and process 0 writes one ordinary checkpoint file
  (`progdesc.io.load_checkpoint` reads it, on any device count). `save_checkpoint_shards` lets each process write the shards it
  holds, nothing gathered; `load_checkpoint_shards` assembles them, again for
  any device count.
"""
import contextlib
import errno
import math
import os
import re
import socket

import jax
import numpy as np
from jax.experimental import multihost_utils

from lowering.errors import DistributedError, FormatError
from progdesc import atomic, checkpointing, io, jax_compat
from progdesc.distributed import environments, peers
from progdesc.framework import default_main_program
from progdesc.scope import global_scope

_SHARD_FILE = "shard-{:05d}-of-{:05d}.safetensors"
_SHARD_FILE_RE = re.compile(r"shard-(\d{5})-of-(\d{5})\.safetensors")


def initialize(coordinator=None, num_processes=None, process_id=None, timeout=300,
               local_device_ids=None, heartbeat_timeout=100):
    """Join this process to a run of `num_processes` processes coordinated at `coordinator`.

    `coordinator` is "host:port"; process 0 serves the coordinator there and the
    others connect to it. Call this first, before anything touches a JAX device.
    Arguments left out are found in the environment (progdesc/distributed/environments.py):
    what `progdesc launch` sets, else what `jax.distributed.initialize()` detects (SLURM,
    Open MPI, Kubernetes...); DistributedError if none says.
    If the processes have not all joined within `timeout` seconds, raises
    DistributedError naming the coordinator (JAX alone would end the process).
    `local_device_ids` restricts this process to some of its accelerators; left out, the
    process sees every device of its host, except in a cluster environment found here
    (a SLURM step...), where JAX gives it the one of its local rank.

    A process lost later (killed, crashed, its host gone) is noticed within about
    `heartbeat_timeout` seconds: the survivors' next step (or fetch, checkpoint, batch)
    raises DistributedError naming the lost process, and they exit with status 1 without
    waiting for it at exit. A survivor that does not reach such a call ends the same way
    `heartbeat_timeout` seconds later, with the error printed. Losing process 0 (the
    coordinator's host) ends the others at once, with the error printed and status 1.
    """
    cluster = None       # JAX's own detection stays off unless a cluster gave the values
    if None in (coordinator, num_processes, process_id):
        coordinator, num_processes, process_id, source, cluster = environments.resolve(
            coordinator, num_processes, process_id, timeout)
        with _naming(source):
            _check_arguments(coordinator, num_processes, process_id, timeout, heartbeat_timeout)
    else:
        _check_arguments(coordinator, num_processes, process_id, timeout, heartbeat_timeout)
    state = jax_compat.distributed_state()      # JaxCompatError on a JAX without it
    if jax.distributed.is_initialized():
        raise DistributedError(f"this process already joined a run (coordinator "
                               f"{state.coordinator_address})")
    if jax_compat.backends_are_initialized():
        raise DistributedError("initialize must come before anything touches a JAX device "
                               "(jax.devices(), an Executor run, a computation)")
    if process_id == 0 and not _port_free(int(coordinator.rpartition(":")[2])):
        raise DistributedError(_CANNOT_SERVE.format(coordinator))
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    try:
        with _connect_raises(), _survivors_go_on():
            jax.distributed.initialize(coordinator, num_processes, process_id,
                                       local_device_ids=local_device_ids,
                                       cluster_detection_method=None if cluster else "deactivate",
                                       initialization_timeout=timeout,
                                       heartbeat_timeout_seconds=heartbeat_timeout)
    except RuntimeError:
        served = state.service is not None
        _forget_failed_join(state)
        if process_id == 0 and not served:
            raise DistributedError(_CANNOT_SERVE.format(coordinator)) from None
        raise DistributedError(
            f"process {process_id} of {num_processes} could not join the run coordinated at "
            f"{coordinator} within {timeout} s: is every process started, with the same "
            "coordinator address and num_processes?") from None
    peers.watch(state.client, num_processes, process_id, heartbeat_timeout)


@contextlib.contextmanager
def _naming(source):
    """DistributedErrors raised inside say where the arguments came from (`source`)."""
    try:
        yield
    except DistributedError as e:
        raise DistributedError(f"{e} (found in {source})") from None


@contextlib.contextmanager
def _survivors_go_on():
    """While JAX joins the run: a lost process does not make the coordinator end the others.

    Without it, the coordinator tells every process of a lost one, and jaxlib then
    ends them from its own thread (an abort: it cannot call the error callback that
    `_connect_raises` installs). `peers` notices the loss instead.
    """
    before = jax.config.jax_enable_recoverability
    jax.config.update("jax_enable_recoverability", True)
    try:
        yield
    finally:
        jax.config.update("jax_enable_recoverability", before)


_CANNOT_SERVE = ("process 0 could not serve the coordinator at {}: is the port free, and the "
                 "host an address of this machine?")


def _port_free(port):
    """Whether the coordinator's service can listen on `port` (on every address, as it does).

    Checked first because jaxlib may crash, not raise, when its service cannot bind.
    """
    for family, address in ((socket.AF_INET6, "::"), (socket.AF_INET, "")):
        try:
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind((address, port))
            return True
        except OSError as e:
            if family == socket.AF_INET6 and e.errno in (errno.EAFNOSUPPORT,
                                                        errno.EADDRNOTAVAIL):
                continue     # no IPv6 here: the service listens on IPv4
            return False
    return False


def _check_arguments(coordinator, num_processes, process_id, timeout, heartbeat_timeout):
    host, _, port = str(coordinator).rpartition(":")
    if not isinstance(coordinator, str) or not host or not port.isdigit():
        raise DistributedError(f"coordinator must be 'host:port', got {coordinator!r}")
    if not isinstance(num_processes, int) or num_processes < 1:
        raise DistributedError(f"num_processes must be a positive int, got {num_processes!r}")
    if not isinstance(process_id, int) or not 0 <= process_id < num_processes:
        raise DistributedError(f"process_id must be an int in [0, {num_processes}), "
                               f"got {process_id!r}")
    for name, value in (("timeout", timeout), ("heartbeat_timeout", heartbeat_timeout)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise DistributedError(f"{name} must be a positive number of seconds (int), "
                                   f"got {value!r}")


def _fail_connect(*_):
    raise RuntimeError("lost the distributed coordinator")


def _connect_raises():
    """While active, a distributed client that fails to connect raises instead of ending
    the process.

    jaxlib's client ends the process (a fatal log) on an error unless it was made
    with an error callback, and `jax.distributed.initialize` passes none. With one,
    the error reaches `connect`, which raises: our callback raises, and jaxlib 0.10
    cannot even call a Python callback with its error, which raises too. A peer lost
    after joining still ends the process, as in JAX (an exception on jaxlib's own
    thread). On a jaxlib without this seam, JAX's own behaviour stands
    (`jax_compat.distributed_clients_calling`).
    """
    return jax_compat.distributed_clients_calling(_fail_connect)


def _forget_failed_join(state):
    """Drop the client (never connected) and the service of a failed join (`state`, JAX's
    distributed state): the process goes on as a one-process run."""
    service, state.client, state.service = state.service, None, None
    state.process_id, state.num_processes, state.coordinator_address = 0, 1, None
    if service is not None:
        service.shutdown()


def global_batch(local_value, mesh, axis="data"):
    """The global batch split along `axis` of `mesh`, whose rows on this process's devices
    are `local_value` (this process's share, in process order).

    Every process calls it with its own rows (as many as its devices hold); the
    result is one array of all processes' rows, to feed like any other value.
    """
    sharding = jax.sharding.NamedSharding(_jax_mesh(mesh), jax.sharding.PartitionSpec(axis))
    # int64 labels stay int64, as the program declares them
    with jax.enable_x64(True), peers.raising():
        return jax.make_array_from_process_local_data(sharding, np.asarray(local_value))


def _jax_mesh(mesh):
    return mesh if isinstance(mesh, jax.sharding.Mesh) else mesh.jax_mesh


def to_host(value):
    """`value` as one NumPy array, the same on every process: the parts that other
    processes hold are gathered."""
    if isinstance(value, jax.Array) and not value.is_fully_addressable:
        if not value.addressable_shards:
            raise DistributedError(
                f"the value is held by process {_holder(value)} only (a pipeline stage's "
                "state): fetch it (exe.run brings fetched values to every process) or "
                "gather it with save_checkpoint, called in every process")
        with peers.raising():
            if value.is_fully_replicated:
                return np.asarray(value.addressable_data(0))
            with jax.enable_x64(True):   # 64-bit values stay 64-bit while they are gathered
                return multihost_utils.process_allgather(value, tiled=True)
    return np.asarray(value)


def _sync(what):
    """Wait until every process gets here (a no-op in a one-process run)."""
    if jax.process_count() > 1:
        with peers.raising():
            multihost_utils.sync_global_devices(what)


def save_checkpoint(path, program=None, scope=None, background=False):
    """Write one checkpoint of `program`'s persistables: gathered from every process,
    written by process 0. Every process must call it; all return once the file is written.

    The file is an ordinary checkpoint: `progdesc.io.load_checkpoint` reads it
    into a run on any number of devices and processes.

    With `background=True` the gather happens now, on every process, and process 0
    writes the file in a thread while training goes on; every process gets a
    `progdesc.checkpointing.PendingSave` whose `wait()` returns once the file is written
    (or raises process 0's error), as `progdesc.io.save_checkpoint(background=True)`.
    """
    program = program or default_main_program()
    scope = scope or global_scope()
    checkpointing.before_save(path)
    with scope.lock:    # values of one step: a run holds the lock from reading to writing
        held = {name: scope.get(name) for name in io.persistable_vars(program)
                if name in scope}
        gathered = _from_holders(held)   # pipeline stages' state, held by one process each
        gathered.update((name, value if isinstance(value, jax.Array)
                         and value.is_fully_addressable else to_host(value))
                        for name, value in held.items() if name not in gathered)
    writer = jax.process_index() == 0
    if not background:
        if writer:
            io.atomic_write(path, io.tensors_file(io.checkpoint_values(program, gathered)))
        _sync(f"progdesc checkpoint {os.fspath(path)}")
        return None
    values = io.checkpoint_values(program, gathered) if writer else None

    def write():
        if writer:
            io.atomic_write(path, io.tensors_file(values))

    return checkpointing.submit_across(path, write, [0], f"checkpoint '{os.fspath(path)}'")


def _holder(value):
    """The process whose devices hold all of `value`, an array this process holds none of."""
    return next(iter(value.sharding.device_set)).process_index


def _from_holders(values):
    """{name: NumPy array} of the `values` ({name: jax.Array}) that some process holds none
    of (a pipeline stage's state, held by its stage's process only), each broadcast from
    the process that holds it. Every process must call it, with the same names."""
    names = list(values)
    if jax.process_count() == 1 or not names:
        return {}
    absent = [n for n in names if isinstance(values[n], jax.Array)
              and not values[n].addressable_shards]
    holders = np.full(len(names), -1, np.int32)
    for n in absent:
        holders[names.index(n)] = _holder(values[n])
    with peers.raising():   # which process holds what, agreed by all
        holders = multihost_utils.process_allgather(holders).max(axis=0)
    me, out = jax.process_index(), {}
    for owner in sorted(set(holders.tolist()) - {-1}):
        mine = [n for n, h in zip(names, holders) if h == owner]
        sent = [np.asarray(values[n]) if owner == me else
                np.zeros(values[n].shape, values[n].dtype) for n in mine]
        with peers.raising(), jax.enable_x64(True):   # int64 state stays int64
            got = multihost_utils.broadcast_one_to_all(
                [v.astype(np.uint8) if v.dtype == np.bool_ else v for v in sent],
                is_source=owner == me)
        out.update((n, np.asarray(g).astype(v.dtype)) for n, g, v in zip(mine, got, sent))
    return out


def save_checkpoint_shards(dirname, program=None, scope=None, background=False):
    """Each process writes the shards of `program`'s persistables that it holds, nothing
    gathered: `dirname/shard-<process>-of-<count>.safetensors`. Every process must call it.

    A shard replicated on several devices is written once. `load_checkpoint_shards`
    assembles the files for a run on any number of devices. With `background=True` the
    shards are taken now and each process writes its file in a thread; every process's
    `PendingSave.wait()` returns once all the files are written (or raises the error of a
    process that failed), as `progdesc.io.save_checkpoint(background=True)`.
    """
    program = program or default_main_program()
    scope = scope or global_scope()
    checkpointing.before_save(dirname)
    pieces = {}
    with scope.lock:    # values of one step (they stay valid: see progdesc.scope)
        for name in io.persistable_vars(program):
            if name not in scope:
                continue
            value = scope.get(name)   # a jax.Array: a Scope holds nothing else
            for shard in value.addressable_shards:
                if shard.replica_id == 0:
                    box = _box(shard.index, value.shape)
                    pieces[_shard_key(name, box, value.shape)] = shard.data
    for piece in pieces.values():
        piece.copy_to_host_async()
    atomic.makedirs(dirname)
    index, count = jax.process_index(), jax.process_count()
    path = os.path.join(dirname, _SHARD_FILE.format(index, count))
    if not background:
        io.atomic_write(path, io.tensors_file(pieces))
        _sync(f"progdesc checkpoint shards {os.fspath(dirname)}")
        return None
    return checkpointing.submit_across(
        dirname, lambda: io.atomic_write(path, io.tensors_file(pieces)), list(range(count)),
        f"checkpoint shards '{os.fspath(dirname)}'")


def _box(index, shape):
    """[(start, stop)] per dim of a shard's index (a tuple of slices) in an array of `shape`."""
    return [s.indices(n)[:2] for s, n in zip(index, shape)]


def _shard_key(name, box, shape):
    where = ",".join(f"{a}:{b}" for a, b in box)
    return f"{name}|{where}|{','.join(map(str, shape))}"


def _parse_shard_key(key, where):
    try:
        name, box, shape = key.rsplit("|", 2)
        shape = tuple(int(n) for n in shape.split(",")) if shape else ()
        box = [tuple(int(n) for n in dim.split(":")) for dim in box.split(",")] if box else []
    except ValueError:
        raise FormatError(f"{where} holds '{key}', not a shard key (name|box|shape)") from None
    if len(box) != len(shape):
        raise FormatError(f"{where}: the shard's box and shape disagree", var=name)
    return name, tuple(slice(a, b) for a, b in box), shape


def read_checkpoint_shards(dirname):
    """{name: numpy array} assembled from the shard files in `dirname`; FormatError if a
    file is missing or corrupt, or the shards do not cover a value."""
    found = sorted(f for f in os.listdir(dirname) if _SHARD_FILE_RE.fullmatch(f))
    if not found:
        raise FormatError(f"'{os.fspath(dirname)}' holds no checkpoint shards ({_SHARD_FILE})")
    count = int(_SHARD_FILE_RE.fullmatch(found[0]).group(2))
    for i in range(count):
        if _SHARD_FILE.format(i, count) not in found:
            raise FormatError(f"'{os.fspath(dirname)}' lacks {_SHARD_FILE.format(i, count)} "
                              f"(the checkpoint was written by {count} processes)")
    pieces = {}   # name -> (shape, dtype, [(box, data)])
    for i in range(count):
        path = os.path.join(dirname, _SHARD_FILE.format(i, count))
        for key, data in io.read_checkpoint(path).items():
            name, box, shape = _parse_shard_key(key, f"'{path}'")
            whole, dtype, found = pieces.setdefault(name, (shape, data.dtype, []))
            extent = tuple(b.stop - b.start for b in box)
            if (whole, dtype) != (shape, data.dtype) or extent != data.shape or any(
                    b.start < 0 or b.stop > n for b, n in zip(box, shape)):
                raise FormatError(f"'{path}' holds a shard that does not fit the others",
                                  var=name)
            found.append((box, data))
    values = {}
    for name, (shape, dtype, found) in pieces.items():
        # the shards must hold at least the whole value's elements: this bounds what is
        # allocated by what the files hold
        if sum(data.size for _, data in found) < math.prod(shape):
            raise FormatError(f"the shards in '{os.fspath(dirname)}' do not cover the whole "
                              "value", var=name)
        value, covered = np.zeros(shape, dtype), np.zeros(shape, bool)
        for box, data in found:
            value[box], covered[box] = data, True
        if not covered.all():
            raise FormatError(f"the shards in '{os.fspath(dirname)}' do not cover the whole "
                              "value", var=name)
        values[name] = value
    return values


def load_checkpoint_shards(dirname, program=None, scope=None, allow_missing=False):
    """Load the shard files of `dirname` into `scope` for `program`, on any number of
    devices; all checked first (as `progdesc.io.load_checkpoint`). Returns the names loaded."""
    program = program or default_main_program()
    values = read_checkpoint_shards(dirname)
    io.check_values(program, values, allow_missing, where=f"checkpoint '{os.fspath(dirname)}'")
    return io.set_values(program, values, scope)
