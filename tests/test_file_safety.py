"""What a file can do to a load, and what a failed or killed save leaves (issue 22, items
3, 4 and 6): checksums cannot be dropped from a current checkpoint, text read from a file
cannot forge an error message, program sizes are bounded, every save failure is a
SaveError naming the path, an inference model is replaced whole or not at all, and the
temporaries of killed writers are removed by the next save.

Disk-full and read-only cases run twice: on a real small tmpfs (mounted when the test
may mount, else skipped) and with the write seam raising ENOSPC after some bytes.
"""
import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import progdesc as pd
from lowering import progdesc_pb2 as pb
from progdesc import atomic, export, io, layers, limits
from progdesc.optimizer import SGD

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def net(hidden=64):
    main, startup = pd.Program(random_seed=1), pd.Program(random_seed=1)
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 8])
        out = layers.fc(layers.fc(x, hidden, act="tanh"), 2)
        loss = pd.ops.mean(out * out)
        SGD(0.1).minimize(loss)
    scope, rng = pd.Scope(), np.random.default_rng(hidden)
    for name, var in io.persistable_vars(main).items():   # values, without compiling startup
        if name != pd.framework.RNG_VAR:
            scope.set(name, rng.normal(size=var.shape).astype(var.dtype))
    return main, out, loss, scope, None


def step(model):
    """New parameter values, as a training step would leave (without compiling one)."""
    scope = model[3]
    for name in ("fc_0.w_0", "fc_1.w_0"):
        scope.set(name, np.asarray(scope.get(name)) + 1)


def params(scope, names=("fc_0.w_0", "fc_1.w_0")):
    return {n: np.array(scope.get(n)) for n in names}


def loaded_params(dirname):
    fresh = pd.Scope()
    io.load_inference_model(dirname, None, fresh)
    return params(fresh)


def same(a, b):
    return sorted(a) == sorted(b) and all(np.array_equal(a[n], b[n]) for n in a)


def leftovers(directory):
    return sorted(e for e in os.listdir(directory) if e.endswith(".tmp"))


@contextlib.contextmanager
def tmpfs(path, size, read_only=False):
    """A tmpfs of `size` mounted at `path`; skips the test where mounting is not allowed."""
    os.makedirs(path, exist_ok=True)
    options = f"size={size}" + (",ro" if read_only else "")
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                              capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"cannot mount a tmpfs here: {e}")
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def enospc_after(monkeypatch, limit):
    """Make every save write at most `limit` bytes per file, then fail as a full disk."""
    real = atomic._write_all

    def full(f, data):
        real(f, bytes(data)[:limit])
        if len(data) > limit:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(atomic, "_write_all", full)


# --- item 3: checkpoint checksums cannot be dropped ---

def _rewrite_metadata(data, edit):
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    edit(header["__metadata__"])
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + data[8 + n:]


def test_a_current_checkpoint_without_its_checksums_is_refused(tmp_path):
    model = net(8)
    path = tmp_path / "ck"
    io.save_checkpoint(path, model[0], model[3])
    data = path.read_bytes()
    stripped = _rewrite_metadata(data, lambda meta: meta.pop(io.CHECKSUMS_KEY))
    damaged = bytearray(stripped)
    damaged[-3] ^= 0x10                     # a bit of the last tensor flipped
    for edited in (stripped, bytes(damaged)):
        path.write_bytes(edited)
        with pytest.raises(pd.FormatError, match="no tensor checksums") as info:
            io.load_checkpoint(path, model[0], pd.Scope())
        assert str(path) in str(info.value)
    # Version 1 (before checksums were required) still verifies the checksums it carries.
    damaged = bytearray(_rewrite_metadata(data, lambda meta: meta.update(format_version="1")))
    io.checkpoint_from_bytes(bytes(damaged))
    damaged[-3] ^= 0x10
    with pytest.raises(pd.FormatError, match="checksum"):
        io.checkpoint_from_bytes(bytes(damaged))


def test_a_current_model_manifest_without_its_own_digest_is_refused(tmp_path):
    model = net(8)
    io.save_inference_model(tmp_path / "m", ["x"], [model[1]], None, model[0], model[3])
    path = tmp_path / "m" / io.MODEL_MANIFEST
    fields = json.loads(path.read_text())
    del fields["manifest_sha256"]
    fields["fetch"] = ["x"]                      # an edit the digest would have caught
    path.write_text(json.dumps(fields))
    with pytest.raises(pd.FormatError, match="no manifest_sha256"):
        io.load_inference_model(tmp_path / "m", None, pd.Scope())


# --- item 4a: text read from a file cannot forge messages ---

def _bad_attr_program(callsite):
    main = pd.Program()
    with pd.program_guard(main, pd.Program()):
        x = pd.data("x", [None, 3])
        pd.ops.scale(x, scale=2.0)
    desc = pb.ProgramDesc.FromString(main.to_bytes())
    op = desc.blocks[0].ops[0]
    op.callsite = callsite
    op.attrs["scale"].s = "not a number"      # fails validation: the message shows the op
    return desc.SerializeToString()


def test_callsites_from_files_are_printable_and_bounded(tmp_path):
    forged = "\x1b[2K\rtrain.py:1\nFormatError: your model was deleted" + "x" * 1000
    path = tmp_path / "p.pb"
    path.write_bytes(_bad_attr_program(forged))
    with pytest.raises(pd.ProgramError) as info:
        io.load_program(path)
    message = str(info.value)
    assert message.isprintable(), message
    assert info.value.callsite.isprintable()
    assert len(info.value.callsite) <= limits.MAX_CALLSITE_CHARS
    assert info.value.callsite.startswith("?[2K?train.py:1?FormatError")
    # A program that loads keeps its cleaned callsites; a normal one is untouched.
    desc = pb.ProgramDesc.FromString(_bad_attr_program("a.py:3\x07"))
    desc.blocks[0].ops[0].attrs["scale"].f = 2.0
    program = pd.Program.from_bytes(desc.SerializeToString())
    assert program.global_block().ops[0].callsite == "a.py:3?"
    desc.blocks[0].ops[0].callsite = "In[3]:2"
    assert pd.Program.from_bytes(desc.SerializeToString()).global_block().ops[0].callsite \
        == "In[3]:2"


def test_names_read_from_checkpoints_and_manifests_are_shown_cleaned():
    data = bytearray(io.tensors_bytes({"w\x1b[2J\nFormatError: fake": np.ones(4, np.float32)}))
    data[-1] ^= 1
    with pytest.raises(pd.FormatError, match="checksum") as info:
        io.checkpoint_from_bytes(bytes(data))
    assert str(info.value).isprintable() and info.value.var == "w?[2J?FormatError: fake"


def test_names_with_control_characters_are_refused():
    desc = pb.ProgramDesc.FromString(_bad_attr_program("a.py:1"))
    desc.blocks[0].vars[0].name = "x\x1b[31m"
    with pytest.raises(pd.FormatError, match="printable") as info:
        pd.Program.from_bytes(desc.SerializeToString())
    assert str(info.value).isprintable()


# --- item 4c: bounded program sizes ---

def _program_with(blocks=1, variables=0, depth=0):
    desc = pb.ProgramDesc(format_version=1)
    one = pb.BlockDesc()
    one.vars.add(name="v", kind=pb.DENSE_TENSOR, dtype=pb.FLOAT32, dims=[1])
    root = pb.BlockDesc.FromString(one.SerializeToString() * variables)   # quick to build
    desc.blocks.add(idx=0, parent_idx=-1).MergeFrom(root)
    for i in range(1, blocks):
        desc.blocks.add(idx=i, parent_idx=i - 1 if i <= depth else 0)
    return desc.SerializeToString()


@pytest.mark.parametrize("what, kwargs", [
    ("blocks", dict(blocks=limits.MAX_BLOCKS + 1)),
    ("variables", dict(variables=limits.MAX_VARS + 1)),
    ("nesting", dict(blocks=limits.MAX_BLOCK_DEPTH + 2, depth=limits.MAX_BLOCK_DEPTH + 1)),
])
def test_program_sizes_past_the_bounds_are_refused_at_once(what, kwargs):
    data = _program_with(**kwargs)
    start = time.perf_counter()
    with pytest.raises(pd.FormatError, match="at most .* allowed"):
        io.program_from_bytes(data)
    assert time.perf_counter() - start < 1.0
    # At the bound itself, the program loads.
    at_bound = {k: v - 1 for k, v in kwargs.items()}
    if what != "variables":        # (200,000 variables load, in seconds: not re-run here)
        io.program_from_bytes(_program_with(**at_bound))


def test_attribute_lists_and_names_are_bounded(monkeypatch):
    desc = pb.ProgramDesc.FromString(_bad_attr_program("a.py:1"))
    op = desc.blocks[0].ops[0]
    op.attrs["scale"].f = 2.0
    op.attrs["huge"].longs.values.extend(range(100))
    monkeypatch.setattr(limits, "MAX_LIST_VALUES", 99)
    with pytest.raises(pd.FormatError, match="100 values in attribute 'huge'") as info:
        pd.Program.from_bytes(desc.SerializeToString())
    assert info.value.op_index == 0
    del op.attrs["huge"]
    desc.blocks[0].vars[0].name = "v" * (limits.MAX_NAME_CHARS + 1)
    with pytest.raises(pd.FormatError, match="at most 1024 printable"):
        pd.Program.from_bytes(desc.SerializeToString())


# --- item 4b: failed saves are SaveErrors naming the path ---

def _every_save(model, target):
    """(what, call) of every save function, each writing under directory `target`."""
    main, out, _, scope, _ = model
    return [
        ("program", lambda: io.save_program(main, os.path.join(target, "p.pb"))),
        ("checkpoint", lambda: io.save_checkpoint(os.path.join(target, "ck"), main, scope)),
        ("inference model", lambda: io.save_inference_model(
            os.path.join(target, "m"), ["x"], [out], None, main, scope)),
        ("compiled", lambda: export.export_compiled(
            os.path.join(target, "m.pdx"), main, ["x"], [out], scope, platforms=("cpu",))),
    ]


def test_every_save_on_a_full_disk_raises_save_error_naming_the_path(tmp_path, monkeypatch):
    model = net(8)
    enospc_after(monkeypatch, 100)
    for what, save in _every_save(model, str(tmp_path)):
        with pytest.raises(pd.SaveError) as info:
            save()
        assert info.value.errno == errno.ENOSPC, what
        assert str(tmp_path) in str(info.value) and "No space" in str(info.value), what
        assert isinstance(info.value, OSError) and isinstance(info.value, pd.ProgdescError)
    assert os.listdir(tmp_path) == []       # nothing half-written, no temporaries


def test_saves_to_a_real_full_or_read_only_filesystem_raise_save_error(tmp_path):
    model = net(512)       # each file is over a page (4 KiB)
    for read_only, code in ((False, errno.ENOSPC), (True, errno.EROFS)):
        with tmpfs(tmp_path / f"fs{int(read_only)}", "4k", read_only) as fs:
            for what, save in _every_save(model, str(fs))[:3]:
                with pytest.raises(pd.SaveError) as info:
                    save()
                assert info.value.errno == code, (what, info.value)
                assert str(fs) in str(info.value), what
            assert leftovers(fs) == [] and os.listdir(fs) == []


# --- item 6: an inference model is replaced whole or not at all ---

def test_a_failed_resave_leaves_the_old_model_loading_its_old_values(tmp_path, monkeypatch):
    model = net()
    target = tmp_path / "m"
    io.save_inference_model(target, ["x"], [model[1]], None, model[0], model[3])
    old = params(model[3])
    step(model)
    assert not same(old, params(model[3]))
    size = (target / io.MODEL_PARAMS).stat().st_size
    # model.pb (small) is written whole, the parameters fail half-way
    enospc_after(monkeypatch, size // 2)
    with pytest.raises(pd.SaveError):
        io.save_inference_model(target, ["x"], [model[1]], None, model[0], model[3])
    monkeypatch.undo()
    assert same(loaded_params(target), old)
    assert leftovers(tmp_path) == [] and leftovers(target) == []
    # Crashing at the swap itself leaves it too; a save that succeeds replaces it whole.
    def power_cut(a, b):
        raise OSError(errno.EIO, "power cut")
    monkeypatch.setattr(atomic, "_exchange", power_cut)
    with pytest.raises(pd.SaveError, match="power cut"):
        io.save_inference_model(target, ["x"], [model[1]], None, model[0], model[3])
    monkeypatch.undo()
    assert same(loaded_params(target), old)
    io.save_inference_model(target, ["x"], [model[1]], None, model[0], model[3])
    assert same(loaded_params(target), params(model[3]))
    assert sorted(os.listdir(target)) == sorted([io.MODEL_PROGRAM, io.MODEL_PARAMS,
                                                 io.MODEL_MANIFEST])
    assert leftovers(tmp_path) == []


def test_a_resave_on_a_real_full_tmpfs_keeps_the_old_model(tmp_path):
    model = net(2048)
    with tmpfs(tmp_path / "fs", "160k") as fs:
        target = os.path.join(fs, "m")
        io.save_inference_model(target, ["x"], [model[1]], None, model[0], model[3])
        assert os.path.getsize(os.path.join(target, io.MODEL_PARAMS)) > 80_000
        old = params(model[3])
        step(model)
        with pytest.raises(pd.SaveError) as info:     # the new copy does not fit beside it
            io.save_inference_model(target, ["x"], [model[1]], None, model[0], model[3])
        assert info.value.errno == errno.ENOSPC and target in str(info.value)
        assert same(loaded_params(target), old)
        assert leftovers(fs) == [] and leftovers(target) == []


def test_a_model_directory_holding_other_files_keeps_them(tmp_path):
    model = net(8)
    target = tmp_path / "m"
    target.mkdir()
    (target / "README").write_text("mine")
    io.save_inference_model(target, ["x"], [model[1]], None, model[0], model[3])
    step(model)
    io.save_inference_model(target, ["x"], [model[1]], None, model[0], model[3])
    assert (target / "README").read_text() == "mine"
    assert same(loaded_params(target), params(model[3]))
    assert leftovers(target) == []


_KILLED_WRITER = textwrap.dedent("""
    import importlib.util, os, sys, threading, time
    # progdesc.atomic alone, without importing progdesc (and JAX): a quick start
    spec = importlib.util.spec_from_file_location("atomic", os.path.join("progdesc", "atomic.py"))
    atomic = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(atomic)
    work, markers = sys.argv[1], sys.argv[2]
    real = atomic._write_all

    def hang(f, data):                  # half the bytes reach the disk, then the writer stops
        real(f, bytes(data)[:len(data) // 2]); f.flush()
        open(os.path.join(markers, str(threading.get_ident())), "w").close()
        time.sleep(600)
    atomic._write_all = hang
    big = os.urandom(1 << 20)
    threading.Thread(target=atomic.atomic_write, args=(os.path.join(work, "ck"), big)).start()
    threading.Thread(target=atomic.write_directory,
                     args=(os.path.join(work, "m"), {"model.pb": big})).start()
    time.sleep(600)
""")


def test_temporaries_of_a_killed_saver_are_removed_by_the_next_save(tmp_path):
    work, markers = tmp_path / "work", tmp_path / "markers"
    work.mkdir()
    markers.mkdir()
    env = dict(os.environ, PYTHONPATH=ROOT)
    child = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, str(work), str(markers)],
                             env=env, cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while len(os.listdir(markers)) < 2 and time.monotonic() < deadline:
            assert child.poll() is None, "the writer died early"
            time.sleep(0.05)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    stale = leftovers(work)
    assert len(stale) == 2 and all(f".{child.pid}-" in n for n in stale), stale
    # Temporaries of live writers (this process) and young ones named without a pid stay;
    # an old one named without a pid (by an older progdesc) goes.
    alive = work / f".ck.{os.getpid()}-0123456789ab.tmp"
    young, old = work / ".ck.aaaaaaaaaaaa.tmp", work / ".ck.bbbbbbbbbbbb.tmp"
    for path in (alive, young, old):
        path.write_bytes(b"x")
    os.utime(old, (time.time() - 7200,) * 2)
    (work / ".other.1-0123456789ab.tmp").write_bytes(b"x")     # another target's
    model = net(8)
    io.save_checkpoint(work / "ck", model[0], model[3])
    io.save_inference_model(work / "m", ["x"], [model[1]], None, model[0], model[3])
    assert leftovers(work) == sorted([alive.name, young.name, ".other.1-0123456789ab.tmp"])
    io.load_checkpoint(work / "ck", model[0], pd.Scope())
    assert same(loaded_params(work / "m"), params(model[3]))


def test_without_an_atomic_exchange_two_renames_replace_the_model(tmp_path, monkeypatch):
    model = net(8)
    target = tmp_path / "m"
    io.save_inference_model(target, ["x"], [model[1]], None, model[0], model[3])
    old = params(model[3])
    step(model)
    monkeypatch.setattr(atomic, "_renameat2", lambda: None)
    real_rename, calls = os.rename, []

    def second_fails(a, b):
        calls.append(b)
        if len(calls) == 2:
            raise OSError(errno.EIO, "I/O error")
        real_rename(a, b)
    monkeypatch.setattr(atomic.os, "rename", second_fails)
    with pytest.raises(pd.SaveError):       # the old model is moved back
        io.save_inference_model(target, ["x"], [model[1]], None, model[0], model[3])
    monkeypatch.setattr(atomic.os, "rename", real_rename)
    assert same(loaded_params(target), old) and os.listdir(tmp_path) == ["m"]
    io.save_inference_model(target, ["x"], [model[1]], None, model[0], model[3])
    assert same(loaded_params(target), params(model[3])) and os.listdir(tmp_path) == ["m"]
