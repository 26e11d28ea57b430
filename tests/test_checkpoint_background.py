"""Checkpoints saved in the background while training goes on (progdesc.checkpointing).

The reference for what a file must hold is the Scope's values at the step that asked,
copied with NumPy in a run that saves nothing; the reference for training after a save
is that run's parameters after the same steps. Writers are held before they start, or slowed
or stopped by a hook in `progdesc.atomic._write_all` (the seam crash tests use), so that
steps really run while the file is being written.
"""
import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import progdesc as pd
from lowering.errors import SaveError
from progdesc import atomic, checkpointing, io, layers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEED = 3


def mlp():
    """(main, startup, loss): a small regression net trained by Adam (whose state the
    Executor updates in place, donating its buffers)."""
    main, startup = pd.Program(random_seed=SEED), pd.Program(random_seed=SEED)
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 8])
        y = pd.data("y", [None, 1])
        h = layers.fc(x, 32, act="tanh")
        loss = layers.mse_loss(layers.fc(h, 1), y)
        pd.optimizer.Adam(0.01).minimize(loss)
    return main, startup, loss


def feeds(n, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = rng.normal(size=(16, 8)).astype(np.float32)
        out.append({"x": x, "y": np.sin(x.sum(1, keepdims=True))})
    return out


@pytest.fixture(scope="module")
def model():
    return mlp()


def started(model):
    main, startup, _ = model
    scope, exe = pd.Scope(), pd.Executor()
    exe.run(startup, scope=scope)
    return scope, exe


def train(model, exe, scope, batches):
    for feed in batches:
        exe.run(model[0], feed=feed, fetch_list=[model[2]], scope=scope)


def host_values(program, scope):
    """{name: NumPy copy} of every persistable the scope holds."""
    return {n: np.array(scope.get(n)) for n in io.persistable_vars(program) if n in scope}


def assert_same(found, expected):
    assert sorted(found) == sorted(expected)
    for name in expected:
        assert found[name].dtype == expected[name].dtype, name
        np.testing.assert_array_equal(found[name], expected[name], err_msg=name)


def same_file(a, b):
    """Whether two safetensors files hold the same header (as JSON: safetensors writes the
    metadata's keys in no fixed order) and the same tensor bytes."""
    def parts(data):
        n = int.from_bytes(data[:8], "little")
        return json.loads(data[8:8 + n]), data[8 + n:]
    return parts(a) == parts(b)


@pytest.fixture
def gated_writer(monkeypatch):
    """An Event: background writers wait for it before they do anything at all."""
    gate, real = threading.Event(), checkpointing.submit

    def gated(write):
        assert gate.wait(60), "the test never opened the gate"
        write()

    monkeypatch.setattr(checkpointing, "submit",
                        lambda path, write: real(path, lambda: gated(write)))
    return gate


BEFORE, AFTER = 3, 4


@pytest.fixture(scope="module")
def reference(model, tmp_path_factory):
    """The run that saves nothing in the background: values after BEFORE steps (and the
    bytes of a blocking save then), parameters after BEFORE + AFTER steps."""
    scope, exe = started(model)
    batches = feeds(BEFORE + AFTER)
    train(model, exe, scope, batches[:BEFORE])
    at_save = host_values(model[0], scope)
    path = tmp_path_factory.mktemp("blocking") / "ck.safetensors"
    io.save_checkpoint(path, model[0], scope)
    train(model, exe, scope, batches[BEFORE:])
    return at_save, path.read_bytes(), host_values(model[0], scope)


def test_a_background_save_holds_the_asking_step_and_leaves_training_alone(
        model, reference, gated_writer, tmp_path):
    at_save, blocking_bytes, after = reference
    scope, exe = started(model)
    batches = feeds(BEFORE + AFTER)
    train(model, exe, scope, batches[:BEFORE])
    path = tmp_path / "ck.safetensors"
    pending = io.save_checkpoint(path, model[0], scope, background=True)
    train(model, exe, scope, batches[BEFORE:])      # the Executor donates the state it updates
    assert not pending.done() and not path.exists()  # the writer is still held at the gate
    gated_writer.set()
    pending.wait()
    assert pending.done()
    assert_same(io.read_checkpoint(path), at_save)
    assert same_file(path.read_bytes(), blocking_bytes)
    assert_same(host_values(model[0], scope), after)


def test_a_second_save_or_a_load_of_a_path_waits_for_the_save_in_flight(model, gated_writer,
                                                                        tmp_path):
    scope, exe = started(model)
    path = tmp_path / "ck.safetensors"
    first = io.save_checkpoint(path, model[0], scope, background=True)
    train(model, exe, scope, feeds(1))
    expected = host_values(model[0], scope)
    threading.Timer(0.3, gated_writer.set).start()
    second = io.save_checkpoint(path, model[0], scope, background=True)   # waits for `first`
    assert first.done()
    assert_same(io.read_checkpoint(path), expected)     # a load waits for the save in flight
    assert second.done()


def test_a_background_error_surfaces_on_wait_then_on_the_next_save(model, monkeypatch,
                                                                   tmp_path):
    scope, exe = started(model)
    path = tmp_path / "ck.safetensors"
    io.save_checkpoint(path, model[0], scope)
    before = path.read_bytes()
    real = atomic._write_all

    def disk_full(f, data):
        real(f, bytes(data)[:100])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomic, "_write_all", disk_full)
    train(model, exe, scope, feeds(1))
    pending = io.save_checkpoint(path, model[0], scope, background=True)
    with pytest.raises(SaveError, match="No space left") as info:
        pending.wait()
    assert info.value.errno == errno.ENOSPC and str(path) in str(info.value)
    assert path.read_bytes() == before and os.listdir(tmp_path) == [path.name]
    # a failure no one waits for is raised by the next save, before it saves anything
    failed = io.save_checkpoint(path, model[0], scope, background=True)
    while not failed.done():
        time.sleep(0.01)
    monkeypatch.setattr(atomic, "_write_all", real)
    with pytest.raises(SaveError, match="No space left"):
        io.save_checkpoint(tmp_path / "other.safetensors", model[0], scope)
    assert not (tmp_path / "other.safetensors").exists()
    io.save_checkpoint(path, model[0], scope, background=True).wait()   # seen once only
    assert_same(io.read_checkpoint(path), host_values(model[0], scope))


_CHILD = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    sys.path.insert(0, "tests")
    from test_checkpoint_background import mlp, feeds, started, train, host_values
    from progdesc import atomic, io
    work, mode = sys.argv[1], sys.argv[2]
    model = mlp()
    scope, exe = started(model)
    train(model, exe, scope, feeds(2))
    path = os.path.join(work, "ck.safetensors")
    real = atomic._write_all
    if mode == "crash":      # a good checkpoint, then one whose writer is killed half way
        io.save_checkpoint(path, model[0], scope)
        np.savez(os.path.join(work, "expected.npz"), **host_values(model[0], scope))
        train(model, exe, scope, feeds(1, seed=1))

        def half_then_hang(f, data):
            real(f, bytes(data)[:len(data) // 2]); f.flush()
            open(os.path.join(work, "writing"), "w").close()
            time.sleep(600)
        atomic._write_all = half_then_hang
        io.save_checkpoint(path, model[0], scope, background=True)
        train(model, exe, scope, feeds(2, seed=2))
        time.sleep(600)
    else:                    # exit with a save in flight, and one that fails unwaited
        def slow(f, data):           # still writing when the main thread ends
            time.sleep(0.5)
            real(f, data)
        atomic._write_all = slow
        io.save_checkpoint(path, model[0], scope, background=True)
        np.savez(os.path.join(work, "expected.npz"), **host_values(model[0], scope))
        io.save_checkpoint(os.path.join(work, "missing", "ck.safetensors"), model[0], scope,
                           background=True)
        train(model, exe, scope, feeds(2, seed=2))
        print("main thread done", flush=True)
""")


def child(work, mode):
    env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
    return subprocess.Popen([sys.executable, "-c", _CHILD, str(work), mode], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def expected_values(work):
    with np.load(work / "expected.npz") as f:
        return {n: f[n] for n in f.files}


def test_a_crash_mid_save_leaves_the_previous_checkpoint(model, tmp_path):
    proc = child(tmp_path, "crash")
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "writing").exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the background writer never started"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    path = tmp_path / "ck.safetensors"
    stale = [n for n in os.listdir(tmp_path) if n.startswith(".ck.safetensors.")]
    assert len(stale) == 1 and f".{proc.pid}-" in stale[0]     # the half-written temporary
    assert_same(io.read_checkpoint(path), expected_values(tmp_path))
    loaded = pd.Scope()
    io.load_checkpoint(path, model[0], loaded)
    assert_same(host_values(model[0], loaded), expected_values(tmp_path))
    io.save_checkpoint(path, model[0], loaded)                   # the next save cleans up
    assert not any(n.startswith(".ck.safetensors.") for n in os.listdir(tmp_path))


def test_exit_waits_for_a_save_in_flight_and_reports_an_unseen_failure(tmp_path):
    out, err = child(tmp_path, "exit").communicate(timeout=120)
    assert "main thread done" in out, err
    assert_same(io.read_checkpoint(tmp_path / "ck.safetensors"), expected_values(tmp_path))
    assert "background checkpoint save of" in err and "missing" in err, err


def test_checkpoint_files_are_safetensors_the_library_reads():
    """The files are laid out by progdesc (io.tensors_bytes): the safetensors library's own
    parser must give back every tensor (dtype, shape, bytes), of every dtype a checkpoint
    may hold, each starting aligned to its element size."""
    import ml_dtypes
    import safetensors
    rng = np.random.default_rng(0)
    tensors = {"w": rng.normal(size=(3, 5)).astype(np.float32),
               "w.moment": rng.normal(size=(5,)).astype(ml_dtypes.bfloat16),
               "step": np.array(7, np.int64), "mask": np.array([True, False, True]),
               "half": rng.normal(size=(2, 2)).astype(np.float16),
               "d": rng.normal(size=(1, 3)).astype(np.float64),
               "empty": np.zeros((0, 4), np.int32),
               "t": np.arange(6, dtype=np.uint8)[::2]}           # not contiguous
    codes = {"float32": "F32", "bfloat16": "BF16", "int64": "I64", "bool": "BOOL",
             "float16": "F16", "float64": "F64", "int32": "I32", "uint8": "U8"}
    data = bytes(io.tensors_bytes(tensors))
    parsed = dict(safetensors.deserialize(data))
    assert sorted(parsed) == sorted(tensors)
    for name, value in tensors.items():
        entry, value = parsed[name], np.ascontiguousarray(value)   # (as ever: 0-d saved as [1])
        assert (entry["dtype"], list(entry["shape"])) == (codes[value.dtype.name],
                                                          list(value.shape)), name
        assert bytes(entry["data"]) == value.tobytes(), name
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    assert header["__metadata__"]["format"] == io.CHECKPOINT_FORMAT
    for name, value in tensors.items():
        assert (8 + n + header[name]["data_offsets"][0]) % value.dtype.itemsize == 0, name
    assert_same(io.checkpoint_from_bytes(data),
                {n: np.ascontiguousarray(v) for n, v in tensors.items()})


def test_two_saves_of_one_path_submitted_at_once_write_one_after_the_other(tmp_path):
    """Two threads past `before_save` at the same instant: the second writer starts only
    when the first has finished."""
    order, gate, second_pending = [], threading.Event(), []
    path = tmp_path / "ck.safetensors"

    def first():
        assert gate.wait(30)
        order.append("first")
    checkpointing.submit(path, first)
    late = threading.Thread(target=lambda: second_pending.append(
        checkpointing.submit(path, lambda: order.append("second"))))
    late.start()
    late.join(0.3)
    assert late.is_alive() and order == []
    gate.set()
    late.join(30)
    second_pending[0].wait()
    assert order == ["first", "second"]
