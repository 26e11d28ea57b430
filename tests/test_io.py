"""Programs, checkpoints and inference models on disk: round trips, resume, hostile files."""
import json
import os
import pickle
import zlib

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save as st_save

import progdesc as pd
from lowering import progdesc_pb2 as pb
from lowering.lower import RNG_VAR
from progdesc import atomic, io, layers
from progdesc.optimizer import Adam


def mlp(seed=0, hidden=16):
    """A small regression net with batch_norm and dropout, trained by Adam."""
    main, startup = pd.Program(random_seed=seed), pd.Program(random_seed=seed)
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 4])
        y = pd.data("y", [None, 1])
        h = layers.batch_norm(layers.fc(x, hidden, act="tanh"))
        out = layers.fc(layers.dropout(h, 0.25), 1)
        loss = layers.mse_loss(out, y)
        test_program = main.clone(for_test=True)
        Adam(0.01).minimize(loss)
    return main, startup, test_program, out, loss


def batches(n, seed=0, size=8):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        x = rng.normal(size=(size, 4)).astype(np.float32)
        yield {"x": x, "y": x.sum(1, keepdims=True)}


def started(model):
    main, startup = model[:2]
    scope, exe = pd.Scope(), pd.Executor()
    exe.run(startup, scope=scope)
    return scope, exe


def train(exe, program, scope, loss, feeds):
    return np.array([exe.run(program, feed=f, fetch_list=[loss], scope=scope)[0] for f in feeds])


def snapshot(scope):
    return {n: np.array(scope.get(n)) for n in scope.local_var_names() if n in scope}


def same_values(a, b):
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and np.array_equal(a[name], b[name]), name


# --- programs ---

def test_program_binary_and_text_round_trips_are_identical(tmp_path):
    main = mlp()[0]
    io.save_program(main, tmp_path / "p.pb")
    io.save_program(main, tmp_path / "p.pbtxt")
    assert (tmp_path / "p.pb").read_bytes() == main.to_bytes()
    assert (tmp_path / "p.pbtxt").read_text() == main.to_text()
    for name in ("p.pb", "p.pbtxt"):
        assert io.load_program(tmp_path / name).to_bytes() == main.to_bytes()
    (tmp_path / "text_without_suffix").write_text(main.to_text())
    assert io.load_program(tmp_path / "text_without_suffix").to_bytes() == main.to_bytes()


def _desc(program):
    desc = pb.ProgramDesc()
    desc.CopyFrom(program.desc)
    return desc


def test_hostile_program_files_are_refused(tmp_path):
    main = mlp()[0]
    good = main.to_bytes()
    missing = tmp_path / "missing.pb"
    with pytest.raises(pd.FormatError, match="missing.pb"):
        io.load_program(missing)
    for name, data in (("random.pb", os.urandom(4096)), ("truncated.pb", good[:len(good) // 2]),
                       ("empty.pb", b"")):
        (tmp_path / name).write_bytes(data)
        with pytest.raises(pd.FormatError, match=name):
            io.load_program(tmp_path / name)
    desc = _desc(main)
    desc.format_version = 99
    (tmp_path / "v99.pb").write_bytes(desc.SerializeToString())
    with pytest.raises(pd.FormatError, match="format version 99"):
        io.load_program(tmp_path / "v99.pb")
    (tmp_path / "bad.pbtxt").write_text("blocks { idx: oops }")
    with pytest.raises(pd.FormatError, match="bad.pbtxt"):
        io.load_program(tmp_path / "bad.pbtxt")
    os.mkfifo(tmp_path / "fifo.pb")                 # reading these would block or never end
    for path in (tmp_path / "fifo.pb", "/dev/zero", tmp_path):
        with pytest.raises(pd.FormatError, match="not a regular file|Is a directory"):
            io.load_program(path)


def test_invalid_ops_are_reported_with_index_and_type(tmp_path):
    main = mlp()[0]
    desc = _desc(main)
    desc.blocks[0].ops[2].type = "no_such_op"
    (tmp_path / "unknown.pb").write_bytes(desc.SerializeToString())
    with pytest.raises(pd.UnknownOpError) as info:
        io.load_program(tmp_path / "unknown.pb")
    assert info.value.op_index == 2 and info.value.op_type == "no_such_op"
    desc = _desc(main)
    op = next(o for o in desc.blocks[0].ops if "is_test" in o.attrs)
    index = list(desc.blocks[0].ops).index(op)
    op.attrs["is_test"].s = "not a bool"
    (tmp_path / "attr.pb").write_bytes(desc.SerializeToString())
    with pytest.raises(pd.ProgramError) as info:
        io.load_program(tmp_path / "attr.pb")
    assert info.value.op_index == index and "attr.pb" in str(info.value)


def test_var_descs_and_roles_no_api_makes_are_refused():
    good = _desc(mlp()[0])
    name = good.blocks[0].vars[0].name

    def edited(edit):
        desc = pb.ProgramDesc()
        desc.CopyFrom(good)
        edit(desc.blocks[0])
        return desc.SerializeToString()

    for edit, match in ((lambda b: b.vars[0].dims.append(-2), r"dims \[.*-2\]"),
                        (lambda b: setattr(b.vars[0], "kind", 99), "unknown kind 99"),
                        (lambda b: setattr(b.vars[0], "dtype", 0), "unknown dtype 0"),
                        (lambda b: b.vars.add().CopyFrom(b.vars[0]), "declared twice"),
                        (lambda b: setattr(b.ops[1], "role", 7), "unknown op role 7")):
        with pytest.raises(pd.FormatError, match=match) as info:
            io.program_from_bytes(edited(edit))
        assert info.value.var == name or info.value.op_index == 1


# --- checkpoints ---

def test_checkpoint_round_trip_is_exact_for_every_persistable(tmp_path):
    model = mlp()
    scope, exe = started(model)
    train(exe, model[0], scope, model[4], batches(3))
    io.save_checkpoint(tmp_path / "ck", model[0], scope)
    saved = io.read_checkpoint(tmp_path / "ck")
    assert RNG_VAR in saved and saved["@LR_STEP@"].dtype == np.int64
    assert any(n.endswith(".moment1") for n in saved) and "batch_norm_0.w_1" in saved
    fresh = pd.Scope()
    loaded = io.load_checkpoint(tmp_path / "ck", model[0], fresh)
    assert sorted(loaded) == sorted(saved)
    same_values(snapshot(scope), snapshot(fresh))
    assert fresh.get("@LR_STEP@").dtype == np.int64      # 64-bit state stays 64-bit


def test_bfloat16_and_bool_state_round_trip(tmp_path):
    program = pd.Program()
    block = program.global_block()
    block.create_var("half", [2, 3], "bfloat16", persistable=True)
    block.create_var("flags", [4], "bool", persistable=True)
    scope = pd.Scope()
    scope.set("half", np.arange(6, dtype=ml_dtypes.bfloat16).reshape(2, 3) / 3)
    scope.set("flags", np.array([True, False, True, True]))
    io.save_checkpoint(tmp_path / "ck", program, scope)
    fresh = pd.Scope()
    io.load_checkpoint(tmp_path / "ck", program, fresh)
    same_values(snapshot(scope), snapshot(fresh))


def test_resumed_training_is_bitwise_identical_to_an_uninterrupted_run(tmp_path):
    model = mlp()
    main, loss = model[0], model[4]
    data = list(batches(10, seed=1))
    scope, exe = started(model)
    train(exe, main, scope, loss, data[:5])
    io.save_checkpoint(tmp_path / "ck.safetensors", main, scope)
    io.save_program(main, tmp_path / "main.pb")
    uninterrupted = train(exe, main, scope, loss, data[5:])

    program = io.load_program(tmp_path / "main.pb")        # a fresh process's state
    fresh, exe2 = pd.Scope(), pd.Executor()
    io.load_checkpoint(tmp_path / "ck.safetensors", program, fresh)
    resumed = train(exe2, program, fresh, loss.name, data[5:])
    assert resumed.dtype == np.float32 and np.array_equal(resumed, uninterrupted)
    same_values(snapshot(scope), snapshot(fresh))


def _write_checkpoint(path, tensors, version="1", fmt=io.CHECKPOINT_FORMAT):
    path.write_bytes(st_save(tensors, metadata={"format": fmt, "format_version": version}))


class _Evil:
    """Unpickling this creates a marker directory: proof that nobody unpickled it."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.mkdir, (self.marker,)


def _hostile_files(tmp_path, good):
    marker = str(tmp_path / "UNPICKLED")
    with open(tmp_path / "payload.pkl", "wb") as f:
        pickle.dump({"fc_0.w_0": _Evil(marker)}, f)
    np.savez(tmp_path / "arrays.npz", **good)
    values = {n: v for n, v in good.items()}
    yield "pickle payload", lambda p: os.replace(tmp_path / "payload.pkl", p)
    yield "npz archive", lambda p: os.replace(tmp_path / "arrays.npz", p)
    yield "random bytes", lambda p: p.write_bytes(os.urandom(1000))
    yield "empty", lambda p: p.write_bytes(b"")
    yield "truncated", lambda p: p.write_bytes(st_save(values)[:-10])
    yield "wrong version", lambda p: _write_checkpoint(p, values, version="3")
    yield "foreign safetensors", lambda p: _write_checkpoint(p, values, fmt="other")
    shape = dict(values, **{"fc_0.w_0": np.zeros((4, 8), np.float32)})
    yield "mismatched shape", lambda p: _write_checkpoint(p, shape)
    dtype = dict(values, **{"fc_0.w_0": values["fc_0.w_0"].astype(np.float64)})
    yield "mismatched dtype", lambda p: _write_checkpoint(p, dtype)
    missing = {n: v for n, v in values.items() if n != "fc_0.w_0"}
    yield "missing variable", lambda p: _write_checkpoint(p, missing)
    yield "unsupported dtype", lambda p: _write_checkpoint(
        p, dict(values, odd=np.zeros(2, np.uint16)))


def test_hostile_checkpoints_are_refused_and_change_nothing(tmp_path):
    model = mlp()
    scope, exe = started(model)
    io.save_checkpoint(tmp_path / "good", model[0], scope)
    good = io.read_checkpoint(tmp_path / "good")
    before = snapshot(scope)
    arrays = {n: scope.get(n) for n in before}
    reasons = {}
    for what, make in _hostile_files(tmp_path, good):
        path = tmp_path / "ck.safetensors"
        make(path)
        with pytest.raises(pd.FormatError) as info:
            io.load_checkpoint(path, model[0], scope)
        reasons[what] = str(info.value)
        assert all(scope.get(n) is arrays[n] for n in arrays), what
    assert not os.path.exists(tmp_path / "UNPICKLED")
    same_values(before, snapshot(scope))
    assert "version" in reasons["wrong version"]
    for what in ("mismatched shape", "mismatched dtype", "missing variable"):
        assert "'fc_0.w_0'" in reasons[what], reasons[what]
    assert "float32[4, 8]" in reasons["mismatched shape"]
    assert "float32[4, 16]" in reasons["mismatched shape"]
    assert "float64[4, 16]" in reasons["mismatched dtype"]


def _tensor_bytes(data, name):
    """Start and end of tensor `name`'s bytes in safetensors `data`, from its JSON header."""
    n = int.from_bytes(data[:8], "little")
    begin, end = json.loads(data[8:8 + n])[name]["data_offsets"]
    return 8 + n + begin, 8 + n + end


def test_checkpoints_store_each_tensors_crc32_dtype_and_shape(tmp_path):
    model = mlp()
    scope, exe = started(model)
    io.save_checkpoint(tmp_path / "ck", model[0], scope)
    data = (tmp_path / "ck").read_bytes()
    n = int.from_bytes(data[:8], "little")
    checksums = json.loads(json.loads(data[8:8 + n])["__metadata__"]["tensor_checksums"])
    assert sorted(checksums) == sorted(io.persistable_vars(model[0]))
    weight = np.asarray(scope.get("fc_0.w_0"))
    assert checksums["fc_0.w_0"] == {"dtype": "F32", "shape": [4, 16],
                                     "crc32": f"{zlib.crc32(weight.tobytes()):08x}"}
    step = np.asarray(scope.get("@LR_STEP@"))
    assert checksums["@LR_STEP@"]["dtype"] == "I64"
    assert checksums["@LR_STEP@"]["crc32"] == f"{zlib.crc32(step.tobytes()):08x}"


def test_corrupted_tensors_are_refused_naming_the_tensor(tmp_path):
    model = mlp()
    scope, exe = started(model)
    io.save_checkpoint(tmp_path / "good", model[0], scope)
    good = (tmp_path / "good").read_bytes()
    target = pd.Scope()
    io.load_checkpoint(tmp_path / "good", model[0], target)
    arrays = {n: target.get(n) for n in target.local_var_names()}
    path, rng = tmp_path / "bad", np.random.default_rng(0)
    for name in ("fc_0.w_0", "batch_norm_0.w_1", "@LR_STEP@", RNG_VAR):
        begin, end = _tensor_bytes(good, name)
        for at in rng.integers(begin, end, size=4):
            bad = bytearray(good)
            bad[at] ^= 1 << int(rng.integers(8))
            path.write_bytes(bad)
            with pytest.raises(pd.FormatError, match="checksum") as info:
                io.load_checkpoint(path, model[0], target)
            assert info.value.var == name and str(path) in str(info.value)
    assert all(target.get(n) is a for n, a in arrays.items())
    # The checksum covers the dtype and shape too: F32 read as I32 has the same bytes.
    retyped = good.replace(b'"fc_0.w_0":{"dtype":"F32"', b'"fc_0.w_0":{"dtype":"I32"')
    assert retyped != good
    with pytest.raises(pd.FormatError, match="checksum") as info:
        io.checkpoint_from_bytes(retyped)
    assert info.value.var == "fc_0.w_0"


def test_checkpoints_without_checksums_still_load(tmp_path):
    model = mlp()
    scope, exe = started(model)
    train(exe, model[0], scope, model[4], batches(2))
    saved = snapshot(scope)
    _write_checkpoint(tmp_path / "old", saved)     # metadata as written before checksums
    fresh = pd.Scope()
    io.load_checkpoint(tmp_path / "old", model[0], fresh)
    same_values(saved, snapshot(fresh))
    meta = {"format": io.CHECKPOINT_FORMAT, "format_version": "1", "tensor_checksumz": "{}"}
    (tmp_path / "renamed").write_bytes(st_save(saved, metadata=meta))
    with pytest.raises(pd.FormatError, match="tensor_checksumz"):
        io.load_checkpoint(tmp_path / "renamed", model[0], fresh)


def test_variable_names_cannot_escape_the_target_directory(tmp_path):
    program = pd.Program()
    names = ["../evil", "/abs", "a/../../b", "..", "C:\\x"]
    for name in names:
        program.global_block().create_var(name, [2], persistable=True)
    scope = pd.Scope()
    for i, name in enumerate(names):
        scope.set(name, np.full(2, i, np.float32))
    target = tmp_path / "inner" / "deeper"
    target.mkdir(parents=True)
    io.save_checkpoint(target / "ck", program, scope)
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert written == [os.path.join("inner", "deeper", "ck")]
    fresh = pd.Scope()
    io.load_checkpoint(target / "ck", program, fresh)
    same_values(snapshot(scope), snapshot(fresh))


@pytest.mark.parametrize("where", ["half-way through the write", "at the rename"])
def test_a_failed_save_leaves_the_previous_checkpoint_loadable(tmp_path, monkeypatch, where):
    model = mlp()
    scope, exe = started(model)
    path = tmp_path / "ck.safetensors"
    io.save_checkpoint(path, model[0], scope)
    saved = snapshot(scope)
    original = path.read_bytes()
    train(exe, model[0], scope, model[4], batches(2))

    def half_then_crash(f, data):
        f.write(bytes(data)[:len(data) // 2])
        raise OSError("disk full")

    def crash(*args):
        raise OSError("power cut")

    if where == "at the rename":
        monkeypatch.setattr(io.os, "replace", crash)
    else:
        monkeypatch.setattr(atomic, "_write_all", half_then_crash)
    with pytest.raises(OSError):
        io.save_checkpoint(path, model[0], scope)
    monkeypatch.undo()
    assert path.read_bytes() == original
    assert os.listdir(tmp_path) == ["ck.safetensors"]      # no temporary file left behind
    fresh = pd.Scope()
    io.load_checkpoint(path, model[0], fresh)
    same_values(saved, snapshot(fresh))


def test_saving_without_values_names_the_variable(tmp_path):
    model = mlp()
    with pytest.raises(pd.ScopeError, match="fc_0.w_0"):
        io.save_checkpoint(tmp_path / "ck", model[0], pd.Scope())
    assert not os.listdir(tmp_path)


# --- inference models ---

def test_inference_model_matches_the_test_program(tmp_path):
    main, startup, test_program, out, loss = model = mlp()
    scope, exe = started(model)
    train(exe, main, scope, loss, batches(4))
    pruned = io.save_inference_model(tmp_path / "m", ["x"], [out], exe, main, scope)
    assert sorted(os.listdir(tmp_path / "m")) == ["model.json", "model.pb", "params.safetensors"]
    fresh = pd.Scope()
    program, feeds, fetches = io.load_inference_model(tmp_path / "m", pd.Executor(), fresh)
    assert feeds == ["x"] and [v.name for v in fetches] == [out.name]
    assert program.to_bytes() == pruned.to_bytes() == (tmp_path / "m" / "model.pb").read_bytes()
    assert all(op.role == "forward" for op in program.global_block().ops)
    assert not any("@GRAD" in v.name or "moment" in v.name for v in program.list_vars())
    assert "batch_norm_0.w_1" in fresh       # running statistics travel with the parameters
    for size in (1, 5):
        x = np.random.default_rng(size).normal(size=(size, 4)).astype(np.float32)
        want, = exe.run(test_program, feed={"x": x}, fetch_list=[out], scope=scope)
        got, = exe.run(program, feed={"x": x}, fetch_list=fetches, scope=fresh)
        assert np.array_equal(want, got)


def _sign(manifest):
    manifest = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    return json.dumps(dict(manifest, manifest_sha256=io.json_digest(manifest)))


def test_tampered_inference_models_are_refused(tmp_path):
    main, startup, test_program, out, loss = model = mlp()
    scope, exe = started(model)
    io.save_inference_model(tmp_path / "m", ["x"], [out], exe, main, scope)
    params = (tmp_path / "m" / "params.safetensors").read_bytes()
    manifest = (tmp_path / "m" / "model.json").read_text()
    target = pd.Scope()
    (tmp_path / "m" / "params.safetensors").write_bytes(params[:-4] + b"\0\0\0\0")
    with pytest.raises(pd.FormatError, match="digest"):
        io.load_inference_model(tmp_path / "m", None, target)
    (tmp_path / "m" / "params.safetensors").write_bytes(params)
    fields = json.loads(manifest)
    for text, match in (
            ("{not json", "JSON"),
            (manifest.replace(f'"format_version": {io.MODEL_VERSION}', '"format_version": 7'),
             "version 7"),
            (json.dumps({**fields, "fetch": ["nope"]}), "manifest_sha256"),
            (_sign({**fields, "fetch": ["nope"]}), "nope"),
            (_sign({**fields, "extra": 1}), "unknown key 'extra'"),
            (_sign({**fields, "sha256": {**fields["sha256"], "../x": "0" * 64}}), "exactly")):
        (tmp_path / "m" / "model.json").write_text(text)
        with pytest.raises(pd.FormatError, match=match):
            io.load_inference_model(tmp_path / "m", None, target)
    with pytest.raises(pd.FormatError, match="not an inference model"):
        io.load_inference_model(tmp_path / "nowhere", None, target)
    assert target.local_var_names() == []


def test_inference_model_files_must_lie_inside_the_directory(tmp_path):
    main, startup, test_program, out, loss = model = mlp()
    scope, exe = started(model)
    io.save_inference_model(tmp_path / "m", ["x"], [out], exe, main, scope)
    io.save_inference_model(tmp_path / "copy", ["x"], [out], exe, main, scope)
    target = pd.Scope()
    for name in ("model.json", "model.pb", "params.safetensors"):
        path = tmp_path / "m" / name
        os.replace(path, tmp_path / "real")
        for make, match in ((lambda: path.symlink_to(tmp_path / "copy" / name), "outside"),
                            (lambda: path.symlink_to(os.path.join("..", "copy", name)), "outside"),
                            (lambda: path.symlink_to("/dev/zero"), "outside"),
                            (lambda: os.mkfifo(path), "regular file|not an inference model")):
            make()
            with pytest.raises(pd.FormatError, match=match):
                io.load_inference_model(tmp_path / "m", None, target)
            os.unlink(path)
        os.replace(tmp_path / "real", tmp_path / "m" / "inner")     # a link inside is fine
        path.symlink_to("inner")
        io.load_inference_model(tmp_path / "m", None, pd.Scope())
        os.unlink(path)
        os.replace(tmp_path / "m" / "inner", path)
    assert target.local_var_names() == []


def test_manifests_without_their_own_digest_still_load(tmp_path):
    main, startup, test_program, out, loss = model = mlp()
    scope, exe = started(model)
    io.save_inference_model(tmp_path / "m", ["x"], [out], exe, main, scope)
    fields = json.loads((tmp_path / "m" / "model.json").read_text())
    del fields["manifest_sha256"]                    # as written before it existed
    fields["format_version"] = 1
    (tmp_path / "m" / "model.json").write_text(json.dumps(fields))
    fresh = pd.Scope()
    program, feeds, fetches = io.load_inference_model(tmp_path / "m", None, fresh)
    assert feeds == ["x"] and [v.name for v in fetches] == [out.name]
    assert np.array_equal(fresh.get("fc_0.w_0"), scope.get("fc_0.w_0"))
