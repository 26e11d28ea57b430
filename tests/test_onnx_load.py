"""progdesc.onnx.load's promises: external data read safely, hostile or unsupported files
refused with a typed error and the Scope untouched, symbolic dims as -1 feeds; and the
`progdesc show/run/export` commands on .onnx files."""
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import progdesc as pd  # noqa: E402
from lowering.errors import FeedError, FormatError, ScopeError, UnsupportedOpError  # noqa: E402
from progdesc import onnx as pd_onnx  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RNG = np.random.default_rng(0)
HERE = jax.export.default_export_platform()   # the platform the artifacts are called on here
W = RNG.standard_normal((4, 3)).astype(np.float32)
B = RNG.standard_normal(3).astype(np.float32)


def mlp(nodes=None, opset=17, batch="batch"):
    """Gemm + Relu with a symbolic batch dim (or the `nodes` given, between x and y)."""
    nodes = nodes or [helper.make_node("Gemm", ["x", "W", "b"], ["h"], name="fc"),
                      helper.make_node("Relu", ["h"], ["y"], name="act")]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 3])],
        [numpy_helper.from_array(W, "W"), numpy_helper.from_array(B, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def expected(x):
    return np.maximum(x @ W + B, 0)


def run(program, feeds, fetches, x, scope):
    exe = pd.Executor(device="cpu")
    return exe.run(program, feed={feeds[0]: x}, fetch_list=fetches, scope=scope)[0]


def with_external_data(tmp_path, name="m.onnx"):
    """The mlp saved with its initializers in `<name>.data` beside it."""
    path = tmp_path / name
    onnx.save_model(mlp(), str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=name + ".data", size_threshold=0)
    return path


def external(path):
    """The model at `path` parsed without reading its external data, and its W tensor."""
    model = onnx.load(str(path), load_external_data=False)
    return model, [t for t in model.graph.initializer if t.name == "W"][0]


def set_entry(tensor, key, value):
    for entry in tensor.external_data:
        if entry.key == key:
            entry.value = value
            return
    tensor.external_data.add(key=key, value=value)


def test_external_data_beside_the_model_loads(tmp_path):
    path = with_external_data(tmp_path)
    model, w = external(path)
    assert w.data_location == TensorProto.EXTERNAL and not w.raw_data   # really external
    assert os.path.getsize(tmp_path / "m.onnx.data") >= W.nbytes + B.nbytes
    scope = pd.Scope()
    program, feeds, fetches = pd_onnx.load(path, scope)
    np.testing.assert_array_equal(np.asarray(scope.get("W")), W)
    x = RNG.standard_normal((5, 4)).astype(np.float32)
    np.testing.assert_allclose(run(program, feeds, fetches, x, scope), expected(x), rtol=1e-6,
                               atol=1e-6)
    # from another working directory, by a relative path: found beside the model
    cwd = os.getcwd()
    try:
        os.chdir(tmp_path.parent)
        pd_onnx.load(os.path.join(tmp_path.name, "m.onnx"), pd.Scope())
    finally:
        os.chdir(cwd)


def test_external_data_needs_the_models_path(tmp_path):
    path = with_external_data(tmp_path)
    with pytest.raises(FormatError, match="external data"):
        pd_onnx.load(path.read_bytes(), pd.Scope())
    model, _ = external(path)
    with pytest.raises(FormatError, match="external data"):
        pd_onnx.load(model, pd.Scope())


@pytest.mark.parametrize("location", ["../outside.data", "sub/../../outside.data",
                                      "/etc/passwd", "", "link.data"])
def test_an_external_location_outside_the_models_directory_is_refused(tmp_path, location):
    models = tmp_path / "models"
    models.mkdir()
    path = with_external_data(models)
    (tmp_path / "outside.data").write_bytes((models / "m.onnx.data").read_bytes())
    os.symlink(tmp_path / "outside.data", models / "link.data")   # points out of the dir
    model, w = external(path)
    set_entry(w, "location", location)
    onnx.save_model(model, str(path))
    scope = pd.Scope()
    with pytest.raises(FormatError, match="tensor 'W': external data location .* inside"):
        pd_onnx.load(path, scope)
    assert scope.local_var_names() == []


@pytest.mark.parametrize("offset, length", [("0", "100000"), ("100000", None), ("-4", "8"),
                                            ("8", "-1"), ("x", None), ("0", "1e3")])
def test_external_data_outside_the_file_is_refused(tmp_path, offset, length):
    path = with_external_data(tmp_path)
    model, w = external(path)
    set_entry(w, "offset", offset)
    if length is None:
        del w.external_data[:]
        w.external_data.add(key="location", value="m.onnx.data")
        w.external_data.add(key="offset", value=offset)
    else:
        set_entry(w, "length", length)
    onnx.save_model(model, str(path))
    with pytest.raises(FormatError, match="tensor 'W': external data"):
        pd_onnx.load(path, pd.Scope())


def test_external_data_of_the_wrong_size_for_its_tensor_is_refused(tmp_path):
    path = with_external_data(tmp_path)
    model, w = external(path)
    set_entry(w, "length", "20")   # inside the file, but 5 floats for a 4x3 tensor
    onnx.save_model(model, str(path))
    with pytest.raises(FormatError, match="'W'"):
        pd_onnx.load(path, pd.Scope())


def test_external_data_that_is_no_regular_file_is_refused(tmp_path):
    path = with_external_data(tmp_path)
    (tmp_path / "dir.data").mkdir()
    model, w = external(path)
    set_entry(w, "location", "dir.data")
    onnx.save_model(model, str(path))
    with pytest.raises(FormatError, match="tensor 'W'"):
        pd_onnx.load(path, pd.Scope())
    if hasattr(os, "mkfifo"):   # a FIFO nobody writes to: refused, never waited on
        os.mkfifo(tmp_path / "fifo.data")
        set_entry(w, "location", "fifo.data")
        onnx.save_model(model, str(path))
        with pytest.raises(FormatError, match="tensor 'W'"):
            pd_onnx.load(path, pd.Scope())


def test_garbage_and_truncated_files_are_format_errors(tmp_path):
    for name, data in (("empty", b""), ("garbage", b"\xff\x00garbage" * 50),
                       ("text", b"ir_version: 8\n"), ("zip", b"PK\x03\x04" + bytes(100))):
        (tmp_path / f"{name}.onnx").write_bytes(data)
        with pytest.raises(FormatError, match="not an ONNX model"):
            pd_onnx.load(tmp_path / f"{name}.onnx", pd.Scope())
    whole = mlp().SerializeToString()
    failed = 0
    for cut in range(1, len(whole), 7):   # every kind of cut: inside a field or between two
        scope = pd.Scope()
        try:
            pd_onnx.load(whole[:cut], scope)
        except (FormatError, UnsupportedOpError) as e:
            failed += 1
            assert str(e).strip()
            assert scope.local_var_names() == []
    assert failed == len(range(1, len(whole), 7))   # no prefix of the file is a whole model


def wire_field(number, payload):
    """A length-delimited protobuf field, written by hand."""
    out, n = bytearray([number << 3 | 2]), len(payload)
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out) + payload


def test_sub_graphs_nested_too_deep_are_a_format_error():
    graph = b""
    for _ in range(300):   # GraphProto.node > NodeProto.attribute > AttributeProto.g > ...
        graph = wire_field(1, wire_field(5, wire_field(6, graph)))
    with pytest.raises(FormatError, match="not an ONNX model"):
        pd_onnx.load(wire_field(7, graph), pd.Scope())   # ModelProto.graph


@pytest.mark.parametrize("field, what", [(b"\x1a\x03act", "a node name"),   # NodeProto.name
                                         (b"\x12\x05batch", "a dim name"),  # Dimension.dim_param
                                         (b'"\x04Relu', "an op type")])     # NodeProto.op_type
def test_names_that_are_not_utf8_are_a_format_error(field, what):
    data = mlp().SerializeToString()
    assert field in data
    bad = data.replace(field, field[:-1] + b"\x83")   # the same length, no UTF-8 text
    with pytest.raises(FormatError, match=f"{what} is not UTF-8 text"):
        pd_onnx.load(bad, pd.Scope())


def test_flipped_bytes_load_or_raise_our_errors():
    from lowering.errors import ProgdescError
    data = mlp().SerializeToString()
    rng = np.random.default_rng(7)
    refused = 0
    for _ in range(200):
        bad = bytearray(data)
        for i in rng.integers(len(bad), size=rng.integers(1, 4)):
            bad[i] = rng.integers(256)
        scope = pd.Scope()
        try:
            pd_onnx.load(bytes(bad), scope)
        except ProgdescError:
            refused += 1
            assert scope.local_var_names() == []
    assert refused > 50   # most flips break the model; the rest still make one


def test_a_missing_file_is_a_format_error_naming_it(tmp_path):
    with pytest.raises(FormatError, match="cannot read ONNX model .*missing.onnx"):
        pd_onnx.load(tmp_path / "missing.onnx", pd.Scope())


@pytest.mark.parametrize("opset", [7, 11, 12])
def test_an_opset_before_13_is_refused(opset):
    with pytest.raises(UnsupportedOpError, match=f"opset is {opset}.*13 and up"):
        pd_onnx.load(mlp(opset=opset), pd.Scope())


def test_every_unsupported_node_is_named_in_one_error():
    nodes = [helper.make_node("Gemm", ["x", "W", "b"], ["h"], name="fc"),
             helper.make_node("NoSuchOp", ["h"], ["h2"], name="first_unknown"),
             helper.make_node("Relu", ["h2"], ["h3"], name="act"),
             helper.make_node("AlsoMissing", ["h3"], ["y"], name="second_unknown",
                              domain="ai.onnx"),
             helper.make_node("FusedThing", ["h3"], ["unused"], name="third_unknown",
                              domain="com.example")]
    model = mlp(nodes)
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    scope = pd.Scope()
    with pytest.raises(UnsupportedOpError) as info:
        pd_onnx.load(model, scope)
    message = str(info.value)
    for name, op in (("first_unknown", "NoSuchOp"), ("second_unknown", "AlsoMissing"),
                     ("third_unknown", "com.example.FusedThing")):
        assert name in message and op in message, message
    assert {u[0] for u in info.value.unsupported} >= {"NoSuchOp", "AlsoMissing",
                                                      "com.example.FusedThing"}
    assert scope.local_var_names() == []


def test_a_failed_load_leaves_the_scope_as_it_was():
    scope = pd.Scope()
    scope.set("W", np.zeros((4, 3), np.float32))
    scope.set("other", np.ones(2, np.float32))
    bad = mlp([helper.make_node("Gemm", ["x", "W", "b"], ["h"], name="fc"),
               helper.make_node("NoSuchOp", ["h"], ["y"], name="odd")])
    for source in (bad, mlp(opset=11), b"\x00garbage"):
        with pytest.raises((UnsupportedOpError, FormatError)):
            pd_onnx.load(source, scope)
        assert sorted(scope.local_var_names()) == ["W", "other"]
        np.testing.assert_array_equal(np.asarray(scope.get("W")), 0)
        np.testing.assert_array_equal(np.asarray(scope.get("other")), 1)


def test_a_scope_holding_other_values_is_refused_unless_overwrite():
    scope = pd.Scope()
    scope.set("W", np.zeros((4, 3), np.float32))
    with pytest.raises(ScopeError, match="'W'"):
        pd_onnx.load(mlp(), scope)
    assert scope.local_var_names() == ["W"]          # b not written either
    np.testing.assert_array_equal(np.asarray(scope.get("W")), 0)
    program, feeds, fetches = pd_onnx.load(mlp(), scope, overwrite=True)
    np.testing.assert_array_equal(np.asarray(scope.get("W")), W)
    x = RNG.standard_normal((2, 4)).astype(np.float32)
    np.testing.assert_allclose(run(program, feeds, fetches, x, scope), expected(x), rtol=1e-6,
                               atol=1e-6)
    pd_onnx.load(mlp(), scope)   # the same values again: nothing to overwrite


@pytest.mark.parametrize("batch", ["batch", None])   # a dim_param, or an unnamed dim
def test_symbolic_dims_become_minus_one_feeds(batch):
    scope = pd.Scope()
    program, feeds, fetches = pd_onnx.load(mlp(batch=batch), scope)
    assert feeds == ["x"] and [v.name for v in fetches] == ["y"]   # the ONNX names
    assert list(program.global_block().var("x").shape) == [-1, 4]
    assert list(fetches[0].shape) == [-1, 3]
    for n in (1, 7):
        x = RNG.standard_normal((n, 4)).astype(np.float32)
        np.testing.assert_allclose(run(program, feeds, fetches, x, scope), expected(x),
                                   rtol=1e-6, atol=1e-6)
    with pytest.raises(FeedError, match="'x'"):
        run(program, feeds, fetches, np.zeros((2, 5), np.float32), scope)
    with pytest.raises(FeedError, match="'x'"):
        run(program, feeds, fetches, np.zeros((2, 4, 1), np.float32), scope)


def test_input_dims_name_the_symbolic_dims_as_identifiers():
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "c"], ["y"], name="add")], "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["batch size", "seq", 8]),
         helper.make_tensor_value_info("c", TensorProto.FLOAT, [None, "seq", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    dims = pd_onnx.input_dims(helper.make_model(graph))
    assert dims == {"a": ("batch_size", "seq", 8), "c": ("c_0", "seq", 8)}


@pytest.mark.parametrize("dim", ["max", "2batch", "_n", "batch-size"])
def test_a_model_exports_whatever_its_dim_params_are_named(tmp_path, dim):
    scope = pd.Scope()
    model = mlp(batch=dim)
    program, feeds, fetches = pd_onnx.load(model, scope)
    named = pd_onnx.input_dims(model)["x"]
    assert named[0].isidentifier() and named[1] == 4
    header = pd.export.export_compiled(tmp_path / "m.pdx", program, feeds, fetches, scope,
                                       platforms=(HERE,),
                                       batch_polymorphic={"x": (named[0], None)})
    assert header["feeds"][0]["shape"] == [named[0], 4]
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(pd.export.load_compiled(tmp_path / "m.pdx")(x)[0]),
                               expected(x), rtol=1e-5, atol=1e-5)


def small(nodes, inputs, inits=()):
    """A model of `nodes` on float [2] `inputs`, whose output is 'z'."""
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(i, TensorProto.FLOAT, [2]) for i in inputs],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2])], list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_onnx_names_shaped_like_ours_stay_separate_variables():
    # our name for node 'a''s Relu output would be 'a.relu_0.out': an input and an
    # initializer of that name must stay what the model says they are
    x = np.array([-1.0, 2.0], np.float32)
    other = np.array([10.0, 20.0], np.float32)
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="a"),
             helper.make_node("Add", ["y", "a.relu_0.out"], ["z"], name="b")]
    for model, feed in ((small(nodes, ["x", "a.relu_0.out"]), {"x": x, "a.relu_0.out": other}),
                        (small(nodes, ["x"], [numpy_helper.from_array(other, "a.relu_0.out")]),
                         {"x": x})):
        scope = pd.Scope()
        program, feeds, fetches = pd_onnx.load(model, scope)
        out, = pd.Executor(device="cpu").run(program, feed=feed, fetch_list=fetches, scope=scope)
        np.testing.assert_array_equal(out, np.maximum(x, 0) + other)


def test_graph_outputs_keep_their_onnx_names():
    x = np.array([-1.0, 2.0], np.float32)
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="act"),
             helper.make_node("Tanh", ["r"], ["z"], name="squash")]
    model = small(nodes, ["x"])
    model.graph.output.extend([helper.make_tensor_value_info("r", TensorProto.FLOAT, [2]),
                               helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])])
    scope = pd.Scope()
    program, feeds, fetches = pd_onnx.load(model, scope)
    assert [v.name for v in fetches] == ["z", "r", "x"]
    z, r, same = pd.Executor(device="cpu").run(program, feed={"x": x}, fetch_list=["z", "r", "x"],
                                               scope=scope)
    np.testing.assert_array_equal(r, np.maximum(x, 0))
    np.testing.assert_allclose(z, np.tanh(np.maximum(x, 0)), rtol=1e-6)
    np.testing.assert_array_equal(same, x)


def test_a_value_defined_twice_is_refused():
    nodes = [helper.make_node("Relu", ["x"], ["z"], name="first"),
             helper.make_node("Neg", ["x"], ["z"], name="second")]
    with pytest.raises(FormatError, match="node 'second' writes 'z', which is defined before"):
        pd_onnx.load(small(nodes, ["x"]), pd.Scope())
    nodes = [helper.make_node("Relu", ["x"], ["x"], name="over_input")]
    with pytest.raises(FormatError, match="'over_input' writes 'x'"):
        pd_onnx.load(small(nodes, ["x"]), pd.Scope())


def test_initializers_of_types_we_cannot_hold_are_named():
    nodes = [helper.make_node("Relu", ["x"], ["z"], name="act")]
    inits = [helper.make_tensor("words", TensorProto.STRING, [1], [b"hi"]),
             numpy_helper.from_array(np.zeros(2, np.uint16), "halves")]
    scope = pd.Scope()
    with pytest.raises(UnsupportedOpError, match="'words' .*'halves'"):
        pd_onnx.load(small(nodes, ["x"], inits), scope)
    assert scope.local_var_names() == []


# --- the progdesc command on .onnx files ---

def progdesc(*args):
    env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, "-m", "progdesc", *map(str, args)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)


def two_inputs():
    """y = relu(a + c) @ W2, with a and c sharing the symbolic dims 'batch' and 'seq'."""
    w2 = RNG.standard_normal((4, 2)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "c"], ["s"], name="add"),
         helper.make_node("Relu", ["s"], ["r"], name="act"),
         helper.make_node("MatMul", ["r", "W2"], ["y"], name="proj")], "two",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["batch", "seq", 4]),
         helper.make_tensor_value_info("c", TensorProto.FLOAT, ["batch", "seq", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 2])],
        [numpy_helper.from_array(w2, "W2")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), w2


def test_the_command_shows_runs_and_exports_an_onnx_model(tmp_path):
    model, w2 = two_inputs()
    path = tmp_path / "two.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, location="two.onnx.data",
                    size_threshold=0)
    done = progdesc("show", path)
    assert done.returncode == 0, done.stderr
    assert f"ONNX model {path}, translated" in done.stdout
    assert "feed  a: float32[-1, -1, 4] (batch, seq, 4)" in done.stdout
    assert "W2: float32[4, 2]" in done.stdout
    assert "= matmul(" in done.stdout
    a, c = (RNG.standard_normal((3, 5, 4)).astype(np.float32) for _ in range(2))
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "c.npy", c)
    done = progdesc("run", path, "--feed", f"a={tmp_path / 'a.npy'}", "--feed",
                    f"c={tmp_path / 'c.npy'}", "--out", tmp_path / "out")
    assert done.returncode == 0, done.stderr
    assert os.listdir(tmp_path / "out") == ["y.npy"]   # fetched under its ONNX name
    saved = "y.npy"
    reference = np.maximum(a + c, 0) @ w2
    np.testing.assert_allclose(np.load(tmp_path / "out" / saved), reference, rtol=1e-5,
                               atol=1e-5)
    done = progdesc("export", path, "-o", tmp_path / "two.pdx", "--platforms", HERE)
    assert done.returncode == 0, done.stderr
    assert "a: float32[batch, seq, 4]; c: float32[batch, seq, 4]; y: float32[batch, seq, 2]" \
        in done.stdout
    compiled = pd.export.load_compiled(tmp_path / "two.pdx")
    for shape in ((1, 2, 4), (3, 5, 4)):
        a, c = (RNG.standard_normal(shape).astype(np.float32) for _ in range(2))
        np.testing.assert_allclose(np.asarray(compiled(a, c)[0]), np.maximum(a + c, 0) @ w2,
                                   rtol=1e-5, atol=1e-5)


def test_the_command_reports_a_bad_onnx_model_in_one_line(tmp_path):
    (tmp_path / "bad.onnx").write_bytes(b"\xff\x00garbage")
    onnx.save_model(mlp(opset=11), str(tmp_path / "old.onnx"))
    for command, why in ((("show", tmp_path / "bad.onnx"), "not an ONNX model"),
                         (("export", tmp_path / "old.onnx", "-o", tmp_path / "x.pdx"),
                          "opset is 11")):
        done = progdesc(*command)
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert why in done.stderr
    assert not (tmp_path / "x.pdx").exists()


GPT2 = os.path.join(ROOT, "tests", "fixtures", "onnx", "gpt2_block_dynamo.onnx")


@pytest.mark.skipif(not os.path.exists(GPT2), reason="the PyTorch fixtures are not here")
def test_the_command_exports_pytorchs_gpt2_block_with_its_batch_and_sequence_dims(tmp_path):
    reference = np.load(GPT2.replace("_dynamo.onnx", ".npz"), allow_pickle=False)
    done = progdesc("export", GPT2, "-o", tmp_path / "gpt2.pdx", "--platforms", HERE)
    assert done.returncode == 0, done.stderr
    assert "x: float32[batch, seq, 32]; output: float32[batch, seq, 32]" in done.stdout
    compiled = pd.export.load_compiled(tmp_path / "gpt2.pdx")
    for case in ("b2_t7", "b5_t12"):   # two batch sizes, two sequence lengths
        np.testing.assert_allclose(np.asarray(compiled(reference[f"{case}_input_x"])[0]),
                                   reference[f"{case}_output"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("equation", ["i.j->i", "ij.,jk", "i..j,jk->ik"])
def test_an_einsum_with_a_stray_dot_is_refused_without_hanging(equation):
    # onnx 1.23's shape inference loops forever on such an equation: load must not run it
    model = small([helper.make_node("Einsum", ["x", "y"], ["z"], name="mix",
                                    equation=equation)], ["x", "y"])
    with pytest.raises(UnsupportedOpError, match="node 'mix'"):
        pd_onnx.load(model, pd.Scope())
