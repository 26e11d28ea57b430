"""Compiled artifacts: export once, call anywhere with JAX alone, any batch size."""
import hashlib
import json
import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

import progdesc as pd
from progdesc import export, io, layers, ops


def model():
    """Float and int64 feeds, a float and an int64 fetch, an embedding and dropout.

    At the "highest" precision policy: the artifact's results are compared with the
    Executor's, and on a GPU both would otherwise round their products to TF32."""
    main, startup = pd.Program(random_seed=3, precision="highest"), pd.Program(random_seed=3)
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 4])
        ids = pd.data("ids", [None, 3], "int64")
        emb = ops.reduce_sum(layers.embedding(ids, [10, 4]), axis=[1])
        h = layers.dropout(layers.fc(ops.add(x, emb), 8, act="relu"), 0.5)
        out = layers.fc(h, 3)
        pred = ops.argmax(out, axis=-1)
    scope, exe = pd.Scope(), pd.Executor()
    exe.run(startup, scope=scope)
    return main, scope, exe, out, pred


def feeds(batch):
    rng = np.random.default_rng(batch)
    return {"x": rng.normal(size=(batch, 4)).astype(np.float32),
            "ids": rng.integers(0, 10, size=(batch, 3)).astype(np.int64)}


def expected(main, scope, exe, out, pred, batch):
    test = main.clone(for_test=True)
    return exe.run(test, feed=feeds(batch), fetch_list=[out, pred], scope=scope)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    main, scope, exe, out, pred = built = model()
    path = tmp_path_factory.mktemp("export") / "model.pdx"
    header = export.export_compiled(path, main, ["x", "ids"], [out, pred], scope)
    return path, header, built


PLAIN_JAX = textwrap.dedent("""
    import json, struct, sys
    import jax, numpy as np
    blob = open(sys.argv[1], "rb").read()
    magic, version, n = struct.unpack_from("<8sII", blob)
    assert magic == b"PDEXPORT" and version == 1
    header = json.loads(blob[16:16 + n])
    exported = jax.export.deserialize(bytearray(blob[16 + n:]))
    for stem in sys.argv[2:]:
        inputs = np.load(stem + ".in.npz")
        args = [inputs[f["name"]].astype(f["dtype"]) for f in header["feeds"]]
        results = exported.call(*args)
        np.savez(stem + ".out.npz", **{f["name"]: np.asarray(r)
                                      for f, r in zip(header["fetches"], results)})
    assert "progdesc" not in sys.modules and "lowering" not in sys.modules
    assert not jax.config.jax_enable_x64
    print("plain jax ok")
""")


def test_header_describes_the_boundary(exported):
    path, header, (main, scope, exe, out, pred) = exported
    assert header["feeds"] == [
        {"name": "x", "dtype": "float32", "shape": ["batch", 4], "program_dtype": "float32"},
        {"name": "ids", "dtype": "int32", "shape": ["batch", 3], "program_dtype": "int64"}]
    assert [(f["name"], f["dtype"], f["program_dtype"], f["shape"]) for f in header["fetches"]] \
        == [(out.name, "float32", "float32", ["batch", 3]),
            (pred.name, "int32", "int64", ["batch"])]
    assert header["platforms"] == ["cpu", "cuda", "tpu"] and header["x64"] is False
    assert header["params_as_inputs"] is False and header["params"] == []
    assert export.read_compiled(path.read_bytes())[0] == header


def test_artifact_runs_in_a_fresh_process_with_jax_alone(exported, tmp_path):
    path, header, built = exported
    stems = []
    for batch in (2, 7):
        stem = str(tmp_path / f"b{batch}")
        np.savez(stem + ".in.npz", **feeds(batch))
        stems.append((batch, stem))
    done = subprocess.run([sys.executable, "-c", PLAIN_JAX, str(path)] + [s for _, s in stems],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300,
                          env=_plain_env())
    assert done.returncode == 0, done.stderr
    assert "plain jax ok" in done.stdout
    for batch, stem in stems:
        want_out, want_pred = expected(*built, batch)
        got = np.load(stem + ".out.npz")
        np.testing.assert_allclose(got[header["fetches"][0]["name"]], want_out, rtol=1e-6,
                                   atol=1e-6)
        assert got[header["fetches"][1]["name"]].dtype == np.int32
        assert np.array_equal(got[header["fetches"][1]["name"]], want_pred)
        assert want_out.shape == (batch, 3)


def _plain_env():
    """This environment without PYTHONPATH or JAX_ENABLE_X64: nothing can bring progdesc in."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "JAX_ENABLE_X64")}
    return dict(env, JAX_PLATFORMS="cpu")


def test_load_compiled_returns_a_callable(exported):
    path, header, built = exported
    compiled = export.load_compiled(path)
    assert compiled.feed_names == ["x", "ids"]
    for batch in (1, 5):
        want_out, want_pred = expected(*built, batch)
        got_out, got_pred = compiled(**feeds(batch))
        np.testing.assert_allclose(got_out, want_out, rtol=1e-6, atol=1e-6)
        assert np.array_equal(got_pred, want_pred)
    with pytest.raises(pd.FeedError, match="ids"):
        compiled(feeds(2)["x"], np.zeros((2, 4), np.int64))
    with pytest.raises(pd.FeedError, match="float"):
        compiled(feeds(2)["x"], np.zeros((2, 3), np.float32))
    with pytest.raises(pd.FeedError):
        compiled(feeds(2)["x"])


def test_parameters_as_inputs(tmp_path):
    main, scope, exe, out, pred = built = model()
    path = tmp_path / "p.pdx"
    here = jax.export.default_export_platform()   # the artifact is called in this process
    header = export.export_compiled(path, main, ["x", "ids"], [out], scope,
                                    platforms=(here,), embed_params=False)
    assert header["params_as_inputs"] and header["platforms"] == [here]
    names = [p["name"] for p in header["params"]]
    assert "embedding_0.w_0" in names and all(n in scope for n in names)
    io.save_checkpoint(tmp_path / "ck", main, scope)
    compiled = export.load_compiled(path, params=io.read_checkpoint(tmp_path / "ck"))
    got, = compiled(**feeds(4))
    np.testing.assert_allclose(got, expected(*built, 4)[0], rtol=1e-6, atol=1e-6)
    with pytest.raises(pd.FeedError, match="params"):
        export.load_compiled(path)(**feeds(4))


def test_fixed_batch_and_64bit_boundary(tmp_path):
    main, scope, exe, out, pred = built = model()
    header = export.export_compiled(tmp_path / "f.pdx", main, ["x", "ids"], [pred], scope,
                                    platforms=(jax.export.default_export_platform(),),
                                    batch_polymorphic=False, batch_size=5,
                                    keep_64bit=True)
    assert header["feeds"][1] == {"name": "ids", "dtype": "int64", "shape": [5, 3],
                                  "program_dtype": "int64"}
    compiled = export.load_compiled(tmp_path / "f.pdx")
    with jax.enable_x64(True):                     # a 64-bit boundary needs x64 in the caller
        got, = compiled(**feeds(5))
    assert got.dtype == np.int64 and np.array_equal(got, expected(*built, 5)[1])
    with pytest.raises(pd.FeedError, match="shape"):
        compiled(**feeds(4))
    with pytest.raises(pd.FeedError, match="unknown"):
        export.export_compiled(tmp_path / "g.pdx", main, ["x", "ids"], [pred], scope,
                               batch_polymorphic=False)
    assert not (tmp_path / "g.pdx").exists()


def test_hostile_artifacts_are_refused(exported, tmp_path):
    data = exported[0].read_bytes()
    n = int.from_bytes(data[12:16], "little")
    header = json.loads(data[16:16 + n])
    bad_head = json.dumps({**header, "feeds": [{"name": "x"}]}).encode()
    cases = {
        "bad magic": b"NOTMAGIC" + data[8:],
        "random": np.random.default_rng(0).bytes(3000),
        "empty": b"",
        "version": data[:8] + (2).to_bytes(4, "little") + data[12:],
        "truncated": data[:-100],
        "header length": data[:12] + (1 << 30).to_bytes(4, "little") + data[16:],
        "bad header": data[:12] + len(bad_head).to_bytes(4, "little") + bad_head + data[16 + n:],
        "garbage payload": _with_payload(header, np.random.default_rng(1).bytes(5000)),
    }
    for what, blob in cases.items():
        path = tmp_path / "x.pdx"
        path.write_bytes(blob)
        with pytest.raises(pd.FormatError):
            export.load_compiled(path)
    with pytest.raises(pd.FormatError, match="missing.pdx"):
        export.load_compiled(tmp_path / "missing.pdx")


def _with_payload(header, payload):
    return _file(dict(header, payload_sha256=hashlib.sha256(payload).hexdigest()), payload)


def _file(header, payload):
    """A version-1 artifact of `header` (re-signed if it has a header_sha256) and `payload`."""
    if "header_sha256" in header:
        header = {k: v for k, v in header.items() if k != "header_sha256"}
        header["header_sha256"] = io.json_digest(header)
    head = json.dumps(header).encode()
    prefix = b"PDEXPORT" + (1).to_bytes(4, "little") + len(head).to_bytes(4, "little")
    return prefix + head + payload


def _parts(data):
    n = int.from_bytes(data[12:16], "little")
    return json.loads(data[16:16 + n]), data[16 + n:]


def test_a_corrupted_header_is_refused(exported, tmp_path):
    data = exported[0].read_bytes()
    header, payload = _parts(data)
    renamed = data.replace(b'"name": "ids"', b'"name": "idz"', 1)
    assert renamed != data and len(renamed) == len(data)
    reshaped = data.replace(b'"shape": ["batch", 3]', b'"shape": ["batch", 5]', 1)
    assert reshaped != data
    for blob in (renamed, reshaped):
        (tmp_path / "x.pdx").write_bytes(blob)
        with pytest.raises(pd.FormatError, match="header digest"):
            export.load_compiled(tmp_path / "x.pdx")
    assert header["header_sha256"] == io.json_digest(
        {k: v for k, v in header.items() if k != "header_sha256"})


def test_artifacts_without_a_header_digest_still_load(exported, tmp_path):
    path, header, built = exported
    fields, payload = _parts(path.read_bytes())
    del fields["header_sha256"]                    # as written before it existed
    (tmp_path / "old.pdx").write_bytes(_file(fields, payload))
    compiled = export.load_compiled(tmp_path / "old.pdx")
    got_out, got_pred = compiled(**feeds(3))
    want_out, want_pred = expected(*built, 3)
    np.testing.assert_allclose(got_out, want_out, rtol=1e-6, atol=1e-6)
    assert np.array_equal(got_pred, want_pred)


def test_feeds_sharing_an_unknown_inner_dim_name_it(tmp_path):
    main = pd.Program()
    with pd.program_guard(main, pd.Program()):
        ids, mask = pd.data("ids", [None, None]), pd.data("mask", [None, None])
        y = ops.add(ids, mask)
    path = str(tmp_path / "m.pdx")
    dims = {"ids": ("batch", "seq"), "mask": ("batch", "seq")}
    header = export.export_compiled(path, main, ["ids", "mask"], [y], pd.Scope(),
                                    batch_polymorphic=dims)
    assert [f["shape"] for f in header["feeds"]] == [["batch", "seq"], ["batch", "seq"]]
    compiled = export.load_compiled(path)
    for shape in ((2, 7), (5, 10)):
        a, b = np.ones(shape, np.float32), np.full(shape, 2.0, np.float32)
        np.testing.assert_array_equal(compiled(a, b)[0], a + b)
    with pytest.raises(pd.FeedError, match="names 1 dims of a feed of rank 2"):
        export.export_compiled(path, main, ["ids", "mask"], [y], pd.Scope(),
                               batch_polymorphic={"ids": ("batch",)})
    with pytest.raises(pd.FeedError, match="name each unknown"):
        export.export_compiled(path, main, ["ids", "mask"], [y], pd.Scope(),
                               batch_polymorphic={"ids": ("batch", None)})


def test_per_feed_dims_name_feeds_of_the_program(tmp_path):
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 3])
        y = ops.scale(x, scale=2.0)
    with pytest.raises(pd.FeedError, match="names 'nodes', which is no feed"):
        export.export_compiled(str(tmp_path / "m.pdx"), main, ["x"], [y], pd.Scope(),
                               batch_polymorphic={"nodes": "nodes"})
    with pytest.raises(pd.FeedError, match="must be True, False, a dim name"):
        export.export_compiled(str(tmp_path / "m.pdx"), main, ["x"], [y], pd.Scope(),
                               batch_polymorphic={"x": "two words"})
