"""progdesc.distributed across processes: joining, feeding, fetching, checkpoints.

The multi-process cases start real processes on 127.0.0.1 (a free port each
time), with PYTHONPATH at this repository and a timeout, and kill what is left
of them when a case fails.
"""
import os
import socket
import subprocess
import sys
import tempfile
import textwrap

import jax
import numpy as np
import pytest

import progdesc as pd
from lowering.errors import DistributedError, FormatError
from progdesc import distributed as dist
from progdesc import io
from progdesc.distributed.launch import free_port

from multihost_worker import GLOBAL_BATCH, global_batches, mlp_program

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROCESS_TIMEOUT = 180


def start(command, *args, devices=1):
    """A Python process running `command` (["-c", source] or [path]) with `args`, on
    `devices` forced CPU devices; its output goes to a temporary file."""
    env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    log = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen([sys.executable, *command, *map(str, args)], env=env, cwd=ROOT,
                            stdout=log, stderr=subprocess.STDOUT, text=True)
    proc.log = log
    return proc


def finish(procs):
    """Every process's (return code, output); kills them all if one outlives the timeout."""
    try:
        codes = [p.wait(timeout=PROCESS_TIMEOUT) for p in procs]
        outs = []
        for p in procs:
            p.log.seek(0)
            outs.append(p.log.read())
        return list(zip(codes, outs))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            p.log.close()


@pytest.mark.parametrize("args, message", [
    (("localhost", 2, 0), "coordinator must be 'host:port'"),
    (("127.0.0.1:x", 2, 0), "coordinator must be 'host:port'"),
    (("127.0.0.1:1234", 0, 0), "num_processes must be a positive int"),
    (("127.0.0.1:1234", 2, 2), r"process_id must be an int in \[0, 2\)"),
    (("127.0.0.1:1234", 2, -1), r"process_id must be an int in \[0, 2\)"),
])
def test_initialize_checks_its_arguments(args, message):
    with pytest.raises(DistributedError, match=message):
        dist.initialize(*args)


def test_initialize_checks_its_timeouts():
    with pytest.raises(DistributedError, match="timeout must be a positive"):
        dist.initialize("127.0.0.1:1234", 2, 0, timeout=0)
    for bad in (0, 2.5, True):
        with pytest.raises(DistributedError, match="heartbeat_timeout must be a positive"):
            dist.initialize("127.0.0.1:1234", 2, 0, heartbeat_timeout=bad)


def test_initialize_after_jax_started_is_refused():
    jax.devices()   # the backend is up in this process
    with pytest.raises(DistributedError, match="before anything touches a JAX device"):
        dist.initialize("127.0.0.1:1234", 2, 0)
    assert not jax.distributed.is_initialized()


JOIN_ALONE = ["-c", textwrap.dedent("""
    import sys, jax, progdesc as pd
    from progdesc import distributed as dist
    try:
        dist.initialize(f"127.0.0.1:{sys.argv[1]}", 2, int(sys.argv[2]), timeout=2)
    except pd.DistributedError as e:
        print("ERROR:", e)
    print("after:", jax.process_count(), float(jax.numpy.ones(3).sum()))
""")]


@pytest.mark.parametrize("process_id", [0, pytest.param(1, marks=pytest.mark.slow)])
def test_a_process_left_alone_gets_an_error_naming_the_coordinator(process_id):
    port = free_port()
    [(code, out)] = finish([start(JOIN_ALONE, port, process_id)])
    assert code == 0, out
    assert (f"ERROR: process {process_id} of 2 could not join the run coordinated at "
            f"127.0.0.1:{port} within 2 s") in out
    assert "after: 1 3.0" in out   # the process lives on, as a one-process run


def test_a_coordinator_port_in_use_is_named():
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        [(code, out)] = finish([start(JOIN_ALONE, port, 0)])
    assert code == 0, out
    assert f"ERROR: process 0 could not serve the coordinator at 127.0.0.1:{port}" in out
    assert "after: 1 3.0" in out


def test_shard_files_round_trip_in_one_process(tmp_path):
    main, startup, _, _ = mlp_program()
    scope = pd.Scope()
    pd.Executor().run(startup, scope=scope)
    dist.save_checkpoint_shards(tmp_path / "ckpt", main, scope)
    assert os.listdir(tmp_path / "ckpt") == ["shard-00000-of-00001.safetensors"]
    loaded = pd.Scope()
    names = dist.load_checkpoint_shards(tmp_path / "ckpt", main, loaded)
    assert sorted(names) == sorted(io.persistable_vars(main))
    for name in names:
        np.testing.assert_array_equal(np.asarray(loaded.get(name)), np.asarray(scope.get(name)))


def test_shard_files_missing_or_incomplete_are_refused(tmp_path):
    main, startup, _, _ = mlp_program()
    scope = pd.Scope()
    pd.Executor().run(startup, scope=scope)
    weight = main.all_parameters()[0].name
    value = np.asarray(scope.get(weight))
    half = value.shape[0] // 2
    (tmp_path / "a").mkdir()
    io.atomic_write(tmp_path / "a" / "shard-00001-of-00002.safetensors", io.tensors_bytes(
        {f"{weight}|0:{half},0:{value.shape[1]}|{value.shape[0]},{value.shape[1]}":
         value[:half]}))
    with pytest.raises(FormatError, match="lacks shard-00000-of-00002.safetensors"):
        dist.load_checkpoint_shards(tmp_path / "a", main, pd.Scope())
    io.atomic_write(tmp_path / "a" / "shard-00000-of-00002.safetensors", io.tensors_bytes({}))
    target = pd.Scope()
    with pytest.raises(FormatError, match=f"variable '{weight}': the shards .* do not cover"):
        dist.load_checkpoint_shards(tmp_path / "a", main, target)
    assert not target.local_var_names()
    with pytest.raises(FormatError, match="holds no checkpoint shards"):
        dist.load_checkpoint_shards(tmp_path, main, pd.Scope())


@pytest.mark.parametrize("key, message", [
    ("w|0:2,0:3|4,3", "does not fit the others"),          # the box is not the data's shape
    ("w|0:2,0:4|2,3", "does not fit the others"),          # the box leaves the value
    ("w|0:2|2", "does not fit the others"),                # box and shape of another rank
    ("w|0:2,0:2|100000,100000,100000", "box and shape disagree"),
    ("w|0:2,0:2|2,2", None),                               # a whole value: loads
    ("w|0:2,0:2|100000,100000", "do not cover"),           # refused before any allocation
    ("no bars", "not a shard key"),
])
def test_shard_keys_are_checked(tmp_path, key, message):
    io.atomic_write(tmp_path / "shard-00000-of-00001.safetensors",
                    io.tensors_bytes({key: np.ones((2, 2), np.float32)}))
    if message is None:
        np.testing.assert_array_equal(dist.multihost.read_checkpoint_shards(tmp_path)["w"],
                                      np.ones((2, 2), np.float32))
        return
    with pytest.raises(FormatError, match=message):
        dist.multihost.read_checkpoint_shards(tmp_path)


def one_process_run(steps=None):
    """The reference: the plain MLP on this process's one device, on the same global
    batches (the first `steps`): (main program, scope after training, losses, last logits)."""
    main, startup, loss, logits = mlp_program()
    exe, scope = pd.Executor(), pd.Scope()
    exe.run(startup, scope=scope)
    losses = []
    for x, y in global_batches()[:steps]:
        lost, out = exe.run(main, feed={"x": x, "y": y}, fetch_list=[loss, logits], scope=scope)
        losses.append(lost)
    return main, scope, np.array(losses), out


def test_two_processes_train_like_one(tmp_path):
    """Two processes of 2 CPU devices each run the README's example, then train data
    parallel and FSDP on a 4-device mesh, each feeding half of every batch: the same
    parameters, losses and logits in both, equal to a one-process run; the checkpoints
    they write load on one device."""
    port = free_port()
    worker = [os.path.join(ROOT, "tests", "multihost_worker.py")]
    results = finish([start(worker, port, i, tmp_path, devices=2) for i in (0, 1)])
    for i, (code, out) in enumerate(results):
        assert code == 0, f"process {i} failed:\n{out}"
    main, scope, losses, logits = one_process_run()
    params = [p.name for p in main.all_parameters()]
    # the README's example: one step, its loss in both processes, its checkpoint
    _, after_one, first_loss, _ = one_process_run(steps=1)
    for i in (0, 1):
        np.testing.assert_allclose(np.load(tmp_path / f"process-{i}-readme.npz")["loss"],
                                   first_loss[0], rtol=1e-5)
    readme_scope = pd.Scope()
    io.load_checkpoint(tmp_path / "ckpt.safetensors", main, readme_scope)
    for name in params:
        np.testing.assert_allclose(np.asarray(readme_scope.get(name)),
                                   np.asarray(after_one.get(name)), rtol=1e-5, atol=1e-5)
    for mode in ("dp", "fsdp"):
        first, second = (np.load(tmp_path / f"process-{i}-{mode}.npz") for i in (0, 1))
        assert sorted(first.files) == sorted(["losses", "logits", *params])
        for key in first.files:
            np.testing.assert_array_equal(first[key], second[key], err_msg=f"{mode} {key}")
        np.testing.assert_allclose(first["losses"], losses, rtol=1e-5, atol=1e-5)
        assert first["logits"].shape == (GLOBAL_BATCH, 4)
        np.testing.assert_allclose(first["logits"], logits, rtol=1e-5, atol=1e-5)
        for name in params:
            np.testing.assert_allclose(first[name], np.asarray(scope.get(name)), rtol=1e-5,
                                       atol=1e-5, err_msg=f"{mode} {name}")
        from_file, from_shards = pd.Scope(), pd.Scope()
        io.load_checkpoint(tmp_path / f"{mode}.safetensors", main, from_file)
        dist.load_checkpoint_shards(tmp_path / f"{mode}-shards", main, from_shards)
        for name in io.persistable_vars(main):
            if name in from_file:
                np.testing.assert_array_equal(np.asarray(from_shards.get(name)),
                                              np.asarray(from_file.get(name)), err_msg=name)
        for name in params:
            np.testing.assert_array_equal(np.asarray(from_file.get(name)), first[name])
    # FSDP: each process wrote the halves of the parameters (and their Adam state) it holds
    halves = [io.read_checkpoint(tmp_path / "fsdp-shards" / f"shard-0000{i}-of-00002.safetensors")
              for i in (0, 1)]
    for name in (params[0], params[0] + ".moment1"):
        assert [sorted(k for k in half if k.startswith(name + "|")) for half in halves] == [
            [f"{name}|0:2,0:16|8,16", f"{name}|2:4,0:16|8,16"],
            [f"{name}|4:6,0:16|8,16", f"{name}|6:8,0:16|8,16"]]


# Trains the data-parallel MLP step after step, printing each; argv: port, rank, heartbeat.
TRAIN_ON = ["-c", textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, os.path.join(os.getcwd(), "tests"))
    import numpy as np
    import progdesc as pd
    from progdesc import distributed as dist
    from multihost_worker import mlp_program
    port, rank, heartbeat = map(int, sys.argv[1:4])
    dist.initialize(f"127.0.0.1:{port}", 2, rank, timeout=60, heartbeat_timeout=heartbeat)
    mesh = dist.Mesh({"data": 2})
    main, startup, loss, _ = mlp_program("dp")
    exe, scope = pd.Executor(mesh=mesh), pd.Scope()
    exe.run(startup, scope=scope)
    rng, rows = np.random.default_rng(0), slice(rank * 8, rank * 8 + 8)
    for step in range(100000):
        x = rng.standard_normal((16, 8)).astype(np.float32)
        y = rng.integers(0, 4, (16, 1))
        feed = {"x": dist.global_batch(x[rows], mesh), "y": dist.global_batch(y[rows], mesh)}
        (value,) = exe.run(main, feed=feed, fetch_list=[loss], scope=scope)
        print("step", step, float(value), flush=True)
        time.sleep(0.1)
""")]


@pytest.mark.parametrize("lost", [1, 0], ids=["a peer", "the coordinator"])
def test_a_lost_process_ends_the_survivor_with_a_distributed_error(tmp_path, lost):
    """SIGKILL one of two training processes: the other raises DistributedError naming
    it and exits with status 1 (not a signal, no abort) within the heartbeat timeout.
    Losing process 0 (the coordinator's host) usually reaches the survivor through jaxlib's
    own thread, which ends it at once with the same message and no Python traceback; when
    the survivor's run notices first, it raises the same DistributedError from the run."""
    import signal
    import time
    port, heartbeat = free_port(), 3
    env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")
    logs = [tmp_path / f"process-{i}.log" for i in (0, 1)]
    procs = []
    try:
        for i in (0, 1):
            with open(logs[i], "a") as out:
                procs.append(subprocess.Popen(
                    [sys.executable, *TRAIN_ON, str(port), str(i), str(heartbeat)],
                    env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + PROCESS_TIMEOUT
        while not all("step 2 " in log.read_text() for log in logs):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), \
                "\n".join(log.read_text()[-3000:] for log in logs)
            time.sleep(0.2)
        survivor = 1 - lost
        procs[lost].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        code = procs[survivor].wait(timeout=heartbeat + 30)
        took = time.monotonic() - killed
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    out = logs[survivor].read_text()
    assert code == 1, f"exit status {code}:\n{out[-3000:]}"
    who = "process 1" if lost else "process 0 (the coordinator)"
    assert f"DistributedError: {who} of the 2-process run was lost" in out, out[-3000:]
    assert "bad_cast" not in out, out[-3000:]
    if lost:
        assert "Traceback" in out, out[-3000:]
    assert took < heartbeat + 15, took
