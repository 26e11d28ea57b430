"""The legacy Paddle format: our proto of ProgramDesc, the .pdmodel and .pdiparams readers
(hostile and truncated files), the translator's walk and the table's rules (each against
NumPy on a program written here the way Paddle writes it), and load_inference_model's
contract with the Scope. The fixtures' models are in test_paddle_models.py."""
import os
import struct
import tempfile

import numpy as np
import pytest
from google.protobuf import descriptor_pb2

import progdesc as pd
from lowering.errors import FormatError, ScopeError, UnsupportedOpError
from progdesc import io
from progdesc.paddle import framework_pb2 as fpb
from progdesc.paddle import load_inference_model
from progdesc.paddle.graph import Block, Op, PaddleProgram, Var
from progdesc.paddle.params import read_combined, read_tensor_file, write_tensor
from progdesc.paddle.pdmodel import read_pdmodel
from progdesc.paddle.translate import translate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "paddle")
MLP = os.path.join(FIXTURES, "mlp")


def _read(path):
    with open(path, "rb") as f:
        return f.read()


# --- the generated module ---
def test_generated_module_is_not_stale():
    protoc = pytest.importorskip("grpc_tools.protoc")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "set.pb")
        assert protoc.main(["protoc", f"-I{ROOT}/proto", f"--descriptor_set_out={out}",
                            "paddle_framework.proto"]) == 0
        fresh = descriptor_pb2.FileDescriptorSet.FromString(_read(out)).file[0]
    for message in fresh.message_type:   # protoc adds json names the generated code omits
        for f in message.field:
            f.ClearField("json_name")
    shipped = descriptor_pb2.FileDescriptorProto.FromString(fpb.DESCRIPTOR.serialized_pb)
    assert fresh == shipped, "progdesc/paddle/framework_pb2.py is stale: run `make proto`"


# --- the readers on Paddle's own files ---
def test_read_pdmodel_of_paddle3_legacy_mlp():
    prog = read_pdmodel(_read(os.path.join(MLP, "legacy", "model.pdmodel")))
    assert prog.format == "pdmodel" and len(prog.blocks) == 1
    block = prog.blocks[0]
    types = [op.type for op in block.ops]
    assert types[0] == "feed" and types[-1] == "fetch" and "matmul_v2" in types
    assert block.vars["x"].shape == (-1, 16) and block.vars["x"].dtype == "float32"
    assert block.vars["linear_0.w_0"].persistable
    assert block.vars["feed"].kind == "feed_minibatch"
    assert prog.op_versions.get("elementwise_add") is not None
    dropout = next(op for op in block.ops if op.type == "dropout")
    assert dropout.attrs["is_test"] is True and isinstance(dropout.attrs["dropout_prob"], float)


def _mlp_names():
    prog = read_pdmodel(_read(os.path.join(MLP, "legacy", "model.pdmodel")))
    return sorted(v.name for v in prog.blocks[0].vars.values()
                  if v.persistable and v.kind == "dense")


def test_combined_and_separate_parameter_files_agree():
    names = _mlp_names()
    combined = read_combined(_read(os.path.join(MLP, "legacy", "model.pdiparams")), names)
    assert sorted(combined) == names
    assert combined["linear_0.w_0"].shape == (16, 32)
    for name in names:
        alone = read_tensor_file(_read(os.path.join(MLP, "legacy_separate", name)), name)
        np.testing.assert_array_equal(alone, combined[name])


def test_write_tensor_reads_back():
    a = np.arange(12, dtype=np.int64).reshape(3, 4)
    np.testing.assert_array_equal(read_tensor_file(write_tensor(a)), a)
    assert read_tensor_file(write_tensor(np.zeros((0, 7), np.float32))).shape == (0, 7)


# --- hostile files ---
def test_truncated_pdiparams_names_offset_and_variable():
    data = _read(os.path.join(MLP, "legacy", "model.pdiparams"))
    names = _mlp_names()
    for cut in sorted({1, 3, 4, 12, 16, 20, 40, len(data) // 2, len(data) - 1}):
        with pytest.raises(FormatError, match=r"byte offset \d+ \(variable '[^']+'\)"):
            read_combined(data[:cut], names)
    with pytest.raises(FormatError, match="bytes left over"):
        read_combined(data + b"\0", names)


def test_random_edits_of_files_give_format_errors_only():
    rng = np.random.default_rng(0)
    params = _read(os.path.join(MLP, "legacy", "model.pdiparams"))
    model = _read(os.path.join(MLP, "legacy", "model.pdmodel"))
    names = _mlp_names()
    for _ in range(150):
        for data, read in ((params, lambda d: read_combined(d, names)), (model, read_pdmodel)):
            edited = bytearray(data)
            for _ in range(rng.integers(1, 6)):
                edited[rng.integers(len(edited))] = rng.integers(256)
            try:
                read(bytes(edited))
            except FormatError:
                pass


def test_truncated_pdmodel_names_offset():
    data = _read(os.path.join(MLP, "legacy", "model.pdmodel"))
    for cut in (1, 10, 100, len(data) // 3, len(data) - 3):
        with pytest.raises(FormatError, match=r"malformed at byte offset \d+ of " + str(cut)):
            read_pdmodel(data[:cut])


def _tensor(dims, dtype=5, lod=b"", body=b""):
    desc = fpb.PdTensorDesc(data_type=dtype, dims=dims).SerializeToString()
    return (struct.pack("<I", 0) + lod + struct.pack("<I", 0) + struct.pack("<i", len(desc))
            + desc + body)


@pytest.mark.parametrize("dims", [[2**40, 2**40], [2**62], [-3, 4], [1] * 100,
                                  [2**31, 2**31, 2**31, 0, 5]])
def test_crafted_huge_dims_are_refused_before_allocation(dims):
    data = _tensor(dims, lod=struct.pack("<Q", 0), body=b"\0" * 16)
    with pytest.raises(FormatError, match="byte offset"):
        read_tensor_file(data, "w")


def test_crafted_lod_counts_are_refused():
    with pytest.raises(FormatError, match="LoD levels cannot fit"):
        read_tensor_file(struct.pack("<IQ", 0, 2**60) + b"\0" * 32, "w")
    with pytest.raises(FormatError, match="needs 4096 bytes"):
        read_tensor_file(struct.pack("<IQQ", 0, 1, 4096) + b"\0" * 32, "w")


def test_unknown_element_type_and_bad_tensordesc():
    with pytest.raises(FormatError, match="element type 99"):
        read_tensor_file(_tensor([1], dtype=99, lod=struct.pack("<Q", 0), body=b"\0" * 4))
    bad = struct.pack("<IQI", 0, 0, 0) + struct.pack("<i", 3) + b"\x0a\xff\xff"
    with pytest.raises(FormatError, match="TensorDesc protobuf is malformed"):
        read_tensor_file(bad)


def test_malformed_pdmodel_structure():
    with pytest.raises(FormatError, match="no blocks"):
        read_pdmodel(b"")
    prog = fpb.PdProgram()
    block = prog.blocks.add(idx=0, parent_idx=-1)
    block.ops.add(type=b"sub", attrs=[fpb.PdAttr(name=b"sub_block", type=8, block_idx=5)])
    with pytest.raises(FormatError, match="names block 5"):
        read_pdmodel(prog.SerializeToString())
    prog.blocks[0].ops[0].attrs[0].type = 77
    with pytest.raises(FormatError, match="type 77"):
        read_pdmodel(prog.SerializeToString())
    prog.blocks[0].ops[0].ClearField("attrs")
    prog.blocks[0].ops[0].type = b"\xff\xfe"
    with pytest.raises(FormatError, match="not UTF-8"):
        read_pdmodel(prog.SerializeToString())


def test_negative_dims_below_minus_one_read_as_unknown():
    # Paddle writes products of the unknown batch: InstanceNorm2D(4)'s saved statistics
    # are declared [-4] (the instance_norm fixture's legacy program has them too)
    prog = fpb.PdProgram()
    block = prog.blocks.add(idx=0, parent_idx=-1)
    for name, dims in ((b"saved_mean", [-4]), (b"x", [-1, 4, 5, 5]), (b"odd", [3, -12, 2])):
        var = block.vars.add(name=name)
        var.type.type = 7
        var.type.dense_tensor.tensor.data_type = 5
        var.type.dense_tensor.tensor.dims.extend(dims)
    vars_ = read_pdmodel(prog.SerializeToString()).blocks[0].vars
    assert vars_["saved_mean"].shape == (-1,)
    assert vars_["x"].shape == (-1, 4, 5, 5)
    assert vars_["odd"].shape == (3, -1, 2)
    paddle_written = read_pdmodel(_read(os.path.join(FIXTURES, "instance_norm", "legacy",
                                                     "model.pdmodel")))
    shapes = {v.shape for v in paddle_written.blocks[0].vars.values()}
    assert (-1,) in shapes and not any(d < -1 for s in shapes for d in s)


# --- programs written here the way Paddle writes them ---
class _Builder:
    """A one-block PaddleProgram: feeds, parameters and ops, as a legacy file has them."""

    def __init__(self):
        self.vars, self.ops, self.values = {}, [], {}
        self.vars["feed"] = Var("feed", (), "", True, "feed_minibatch")
        self.vars["fetch"] = Var("fetch", (), "", True, "fetch_list")
        self.feeds = 0
        self.fetches = 0

    def feed(self, name, shape, dtype="float32"):
        self.vars[name] = Var(name, tuple(shape), dtype)
        self.op("feed", {"X": ["feed"]}, {"Out": [name]}, col=self.feeds)
        self.feeds += 1
        return name

    def param(self, name, value):
        value = np.asarray(value)
        self.vars[name] = Var(name, value.shape, str(value.dtype), persistable=True)
        self.values[name] = value
        return name

    def op(self, type, inputs, outputs, **attrs):
        for names in outputs.values():
            for n in names:
                self.vars.setdefault(n, Var(n, (), "float32"))
        self.ops.append(Op(type, inputs, outputs, attrs, 0, len(self.ops)))
        return [n for names in outputs.values() for n in names][:1]

    def fetch(self, name):
        self.op("fetch", {"X": [name]}, {"Out": ["fetch"]}, col=self.fetches)
        self.fetches += 1

    def program(self):
        return PaddleProgram([Block(0, -1, dict(self.vars), list(self.ops))], "pdmodel")

    def run(self, feed, for_training=False):
        program, feeds, fetches, state = translate(self.program(), self.values,
                                                   for_training=for_training)
        scope = pd.Scope()
        io.set_values(program, state, scope)
        return pd.Executor().run(program, feed=feed, fetch_list=fetches, scope=scope)


def _one(type, x, inputs=None, outputs=("Out",), extra=None, **attrs):
    """The output of one op of `type` on the feed x (and parameters `extra`)."""
    b = _Builder()
    b.feed("x", x.shape, str(x.dtype))
    ins = {"X": ["x"]} if inputs is None else inputs
    for name, value in (extra or {}).items():
        b.param(name, value)
    outs = {slot: [f"out_{slot}"] for slot in outputs}
    b.op(type, ins, outs, **attrs)
    b.fetch(f"out_{outputs[0]}")
    return b.run({"x": x})[0]


X = np.random.default_rng(1).standard_normal((2, 3, 4, 5)).astype(np.float32)


def test_elementwise_add_with_paddle_axis():
    y = np.arange(3, dtype=np.float32)
    got = _one("elementwise_add", X, {"X": ["x"], "Y": ["y"]}, extra={"y": y}, axis=1)
    np.testing.assert_allclose(got, X + y[None, :, None, None], rtol=1e-6)
    y2 = np.ones((3, 4), np.float32) * np.arange(4, dtype=np.float32)
    got = _one("elementwise_mul", X, {"X": ["x"], "Y": ["y"]}, extra={"y": y2}, axis=1)
    np.testing.assert_allclose(got, X * y2[None, :, :, None], rtol=1e-6)


def test_mul_flattens_by_num_col_dims():
    w = np.random.default_rng(2).standard_normal((20, 6)).astype(np.float32)
    got = _one("mul", X, {"X": ["x"], "Y": ["w"]}, extra={"w": w}, x_num_col_dims=2)
    want = X.reshape(2, 3, 20) @ w
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _adaptive_avg(x, out):
    n, c, h, w = x.shape
    res = np.zeros((n, c, out[0], out[1]), x.dtype)
    for i in range(out[0]):
        for j in range(out[1]):
            h0, h1 = (i * h) // out[0], -(-((i + 1) * h) // out[0])
            w0, w1 = (j * w) // out[1], -(-((j + 1) * w) // out[1])
            res[:, :, i, j] = x[:, :, h0:h1, w0:w1].mean(axis=(2, 3))
    return res


def test_adaptive_pool_uneven_windows():
    got = _one("pool2d", X, pooling_type="avg", ksize=[3, 2], adaptive=True)
    np.testing.assert_allclose(got, _adaptive_avg(X, (3, 2)), rtol=1e-5, atol=1e-6)
    got = _one("pool2d", X, pooling_type="max", ksize=[1, 1], adaptive=True)
    np.testing.assert_allclose(got, X.max(axis=(2, 3), keepdims=True))


def test_pool2d_ceil_mode_and_exclusive_padding():
    got = _one("pool2d", X, pooling_type="avg", ksize=[3, 3], strides=[2, 2], paddings=[1, 1],
               exclusive=True, ceil_mode=True)
    pad = np.pad(X, ((0, 0), (0, 0), (1, 2), (1, 2)))
    ones = np.pad(np.ones((4, 5)), ((1, 2), (1, 2)))
    rows, cols = got.shape[2:]
    assert (rows, cols) == (3, 3)   # ceil((4 + 2 - 3) / 2) + 1, ceil((5 + 2 - 3) / 2) + 1
    for i in range(rows):
        for j in range(cols):
            win = pad[:, :, 2 * i:2 * i + 3, 2 * j:2 * j + 3].sum(axis=(2, 3))
            np.testing.assert_allclose(got[:, :, i, j],
                                       win / ones[2 * i:2 * i + 3, 2 * j:2 * j + 3].sum(),
                                       rtol=1e-5, atol=1e-6)


def test_shape_ops():
    got = _one("flatten_contiguous_range", X, outputs=("Out", "XShape"), start_axis=1,
               stop_axis=2)
    np.testing.assert_array_equal(got, X.reshape(2, 12, 5))
    got = _one("unsqueeze2", X, outputs=("Out", "XShape"), axes=[-1, 0])
    np.testing.assert_array_equal(got, X[None, ..., None])
    got = _one("squeeze2", X[:, :1], outputs=("Out", "XShape"), axes=[1, 2])   # 2: not 1
    np.testing.assert_array_equal(got, X[:, 0])
    got = _one("reshape2", X, outputs=("Out", "XShape"), shape=[0, -1, 5])
    np.testing.assert_array_equal(got, X.reshape(2, 12, 5))
    got = _one("transpose2", X, outputs=("Out", "XShape"), axis=[0, 2, 3, 1])
    np.testing.assert_array_equal(got, X.transpose(0, 2, 3, 1))
    got = _one("slice", X, {"Input": ["x"]}, axes=[1, 3], starts=[-2, 1],
               ends=[2**31 - 1, 3], decrease_axis=[])
    np.testing.assert_array_equal(got, X[:, -2:, :, 1:3])
    got = _one("slice", X, {"Input": ["x"]}, axes=[2], starts=[1], ends=[2], decrease_axis=[2])
    np.testing.assert_array_equal(got, X[:, :, 1])
    got = _one("strided_slice", X, {"Input": ["x"]}, axes=[3], starts=[4], ends=[-6],
               strides=[-2])
    np.testing.assert_array_equal(got, X[:, :, :, 4::-2])


def test_reductions_and_search():
    np.testing.assert_allclose(_one("reduce_mean", X, dim=[-1, 1], keep_dim=True),
                               X.mean(axis=(1, 3), keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(_one("reduce_sum", X, dim=[0], reduce_all=True), X.sum(),
                               rtol=1e-5)
    np.testing.assert_array_equal(_one("arg_max", X, axis=1, dtype=3), X.argmax(axis=1))
    got = _one("top_k_v2", X, outputs=("Out", "Indices"), k=2, axis=-1)
    np.testing.assert_allclose(got, -np.sort(-X, axis=-1)[..., :2])


def test_activations():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((4, 6)) * 4).astype(np.float32)
    np.testing.assert_allclose(_one("hard_swish", x), x * np.clip(x + 3, 0, 6) / 6,
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_one("hard_sigmoid", x, slope=1 / 6, offset=0.5),
                               np.clip(x / 6 + 0.5, 0, 1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_one("relu6", x), np.clip(x, 0, 6))
    np.testing.assert_allclose(_one("swish", x, beta=1.0), x / (1 + np.exp(-x)), rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(_one("leaky_relu", x, alpha=0.1), np.where(x > 0, x, 0.1 * x),
                               rtol=1e-6)
    np.testing.assert_allclose(_one("elu", x, alpha=0.5),
                               np.where(x > 0, x, 0.5 * np.expm1(x)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_one("scale", x, scale=2.0, bias=1.0, bias_after_scale=False),
                               (x + 1) * 2, rtol=1e-6)


def test_fill_constant_shape_and_cast():
    b = _Builder()
    b.feed("x", (-1, 3))
    b.op("fill_constant", {}, {"Out": ["c"]}, shape=[1, 3], dtype=3, value=0.0, str_value="7")
    b.op("cast", {"X": ["c"]}, {"Out": ["cf"]}, in_dtype=3, out_dtype=5)
    b.op("elementwise_add", {"X": ["x"], "Y": ["cf"]}, {"Out": ["y"]}, axis=-1)
    b.op("shape", {"Input": ["x"]}, {"Out": ["s"]})
    b.fetch("y")
    b.fetch("s")
    x = np.ones((4, 3), np.float32)
    y, s = b.run({"x": x})
    np.testing.assert_array_equal(y, x + 7)
    np.testing.assert_array_equal(s, [4, 3])


def test_unsupported_ops_listed_all_at_once_with_places():
    b = _Builder()
    b.feed("x", (-1, 3))
    b.op("no_such_op", {"X": ["x"]}, {"Out": ["a"]})
    b.op("relu", {"X": ["a"]}, {"Out": ["r"]})   # reads a failed value: not reported again
    b.op("another_op", {"X": ["x"]}, {"Out": ["b"]})
    b.op("reshape2", {"X": ["x"], "ShapeTensor": ["x"]}, {"Out": ["c"]}, shape=[3])
    b.fetch("r")
    with pytest.raises(UnsupportedOpError) as e:
        b.run({"x": np.zeros((1, 3), np.float32)})
    places = [(p[0], p[1], p[2]) for p in e.value.places]
    assert places == [("no_such_op", 0, 1), ("another_op", 0, 3), ("reshape2", 0, 4)]
    assert "run time" in e.value.places[2][4]


def test_dropout_modes_and_training_import():
    b = _Builder()
    b.feed("x", (-1, 1000))
    b.op("dropout", {"X": ["x"]}, {"Out": ["d"], "Mask": ["m"]}, dropout_prob=0.25,
         is_test=True, dropout_implementation="downgrade_in_infer")
    b.fetch("d")
    x = np.ones((2, 1000), np.float32)
    np.testing.assert_allclose(b.run({"x": x})[0], x * 0.75, rtol=1e-6)
    program, feeds, fetches, state = translate(b.program(), {}, for_training=True)
    train = pd.Executor().run(program, feed={"x": x}, fetch_list=fetches)[0]
    assert set(np.unique(train)) <= {0.0, 1.0} and 0.6 < train.mean() < 0.9
    evaluated = pd.Executor().run(program.clone(for_test=True), feed={"x": x},
                                  fetch_list=fetches)[0]
    np.testing.assert_allclose(evaluated, x * 0.75, rtol=1e-6)


def test_batch_norm_training_import_updates_running_stats():
    rng = np.random.default_rng(4)
    b = _Builder()
    b.feed("x", (-1, 3, 2, 2))
    for name, value in (("s", np.ones(3)), ("o", np.zeros(3)), ("m", np.full(3, 0.5)),
                        ("v", np.full(3, 2.0))):
        b.param(name, value.astype(np.float32))
    b.op("batch_norm", {"X": ["x"], "Scale": ["s"], "Bias": ["o"], "Mean": ["m"],
                        "Variance": ["v"]},
         {"Y": ["y"], "MeanOut": ["m"], "VarianceOut": ["v"], "SavedMean": ["sm"],
          "SavedVariance": ["sv"]}, is_test=True, momentum=0.9, epsilon=1e-5)
    b.fetch("y")
    x = rng.standard_normal((4, 3, 2, 2)).astype(np.float32)
    evaluated = b.run({"x": x})[0]
    np.testing.assert_allclose(evaluated, (x - 0.5) / np.sqrt(2.0 + 1e-5), rtol=1e-5, atol=1e-6)
    program, feeds, fetches, state = translate(b.program(), b.values, for_training=True)
    scope = pd.Scope()
    io.set_values(program, state, scope)
    exe = pd.Executor()
    train = exe.run(program, feed={"x": x}, fetch_list=fetches, scope=scope)[0]
    mean = x.mean(axis=(0, 2, 3))
    np.testing.assert_allclose(train.mean(axis=(0, 2, 3)), 0, atol=1e-5)
    np.testing.assert_allclose(np.asarray(scope.get("m")), 0.9 * 0.5 + 0.1 * mean, rtol=1e-5)


# --- load_inference_model and the Scope ---
def _mlp_input():
    return np.load(os.path.join(MLP, "reference.npz"))["input_b2"]


def test_load_inference_model_takes_dir_prefix_or_file():
    ref = np.load(os.path.join(MLP, "reference.npz"))
    for path in (os.path.join(MLP, "legacy"), os.path.join(MLP, "legacy", "model"),
                 os.path.join(MLP, "legacy", "model.pdmodel")):
        scope = pd.Scope()
        program, feeds, fetches = load_inference_model(path, pd.Executor(), scope=scope)
        out = pd.Executor().run(program, feed={feeds[0]: ref["input_b2"]}, fetch_list=fetches,
                                scope=scope)[0]
        np.testing.assert_allclose(out, ref["legacy_output_b2"], atol=1e-6)
    with pytest.raises(FormatError, match="no Paddle model"):
        load_inference_model(os.path.join(MLP, "nothing_here"), pd.Executor())


def test_held_parameters_are_not_overwritten_and_failures_write_nothing():
    scope = pd.Scope()
    load_inference_model(os.path.join(MLP, "legacy"), pd.Executor(), scope=scope)
    load_inference_model(os.path.join(MLP, "legacy"), pd.Executor(), scope=scope)  # same: fine
    scope.write_many({"linear_0.w_0": np.zeros((16, 32), np.float32)})
    with pytest.raises(ScopeError, match="linear_0.w_0"):
        load_inference_model(os.path.join(MLP, "legacy"), pd.Executor(), scope=scope)
    load_inference_model(os.path.join(MLP, "legacy"), pd.Executor(), scope=scope,
                         overwrite=True)
    assert np.asarray(scope.get("linear_0.w_0")).any()
    with tempfile.TemporaryDirectory() as tmp:   # a truncated parameter file: nothing written
        for f in ("model.pdmodel", "model.pdiparams"):
            data = _read(os.path.join(MLP, "legacy", f))
            with open(os.path.join(tmp, f), "wb") as out:
                out.write(data if f.endswith("pdmodel") else data[:-10])
        empty = pd.Scope()
        with pytest.raises(FormatError, match="byte offset"):
            load_inference_model(tmp, pd.Executor(), scope=empty)
        assert "linear_0.w_0" not in empty


def test_sizes_known_at_run_time_flow_into_fill_constant_and_range():
    b = _Builder()
    b.feed("x", (-1, -1, 3))
    b.op("shape", {"Input": ["x"]}, {"Out": ["s"]})
    b.op("slice", {"Input": ["s"]}, {"Out": ["n"]}, axes=[0], starts=[1], ends=[2],
         decrease_axis=[0])
    b.op("fill_constant", {}, {"Out": ["two"]}, shape=[], dtype=2, value=2.0)
    b.op("fill_constant", {"ShapeTensorList": ["two", "n"]}, {"Out": ["z"]}, shape=[2, -1],
         dtype=5, value=1.5)
    b.op("cast", {"X": ["n"]}, {"Out": ["n64"]}, in_dtype=2, out_dtype=3)
    b.op("fill_constant", {}, {"Out": ["zero"]}, shape=[1], dtype=3, value=0.0)
    b.op("fill_constant", {}, {"Out": ["one"]}, shape=[1], dtype=3, value=1.0)
    b.op("range", {"Start": ["zero"], "End": ["n64"], "Step": ["one"]}, {"Out": ["r"]})
    b.vars["r"] = Var("r", (-1,), "int64")
    b.fetch("z")
    b.fetch("r")
    z, r = b.run({"x": np.zeros((4, 6, 3), np.float32)})
    np.testing.assert_array_equal(z, np.full((2, 6), 1.5, np.float32))
    np.testing.assert_array_equal(r, np.arange(6))
    assert r.dtype == np.int64 or r.dtype == np.int32   # int64 where x64 is on


def test_more_layers_against_numpy():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 4, 3, 3)).astype(np.float32)
    alpha = np.array([0.1, 0.2, 0.3, 0.4], np.float32)
    got = _one("prelu", x, {"X": ["x"], "Alpha": ["a"]}, extra={"a": alpha}, mode="channel")
    np.testing.assert_allclose(got, np.where(x > 0, x, x * alpha[None, :, None, None]),
                               rtol=1e-6)
    scale, bias = np.arange(1, 5, dtype=np.float32), np.arange(4, dtype=np.float32)
    got = _one("group_norm", x, {"X": ["x"], "Scale": ["s"], "Bias": ["b"]},
               outputs=("Y", "Mean", "Variance"), extra={"s": scale, "b": bias}, groups=2,
               epsilon=1e-5)
    g = x.reshape(2, 2, -1)
    want = ((g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + 1e-5))
    want = want.reshape(x.shape) * scale[:, None, None] + bias[:, None, None]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    got = _one("instance_norm", x, {"X": ["x"], "Scale": ["s"], "Bias": ["b"]},
               outputs=("Y", "SavedMean", "SavedVariance"), extra={"s": scale, "b": bias})
    m, v = x.mean((2, 3), keepdims=True), x.var((2, 3), keepdims=True)
    np.testing.assert_allclose(got, (x - m) / np.sqrt(v + 1e-5) * scale[:, None, None]
                               + bias[:, None, None], rtol=1e-4, atol=1e-5)
    got = _one("p_norm", x, porder=2.0, axis=1, keepdim=False)
    np.testing.assert_allclose(got, np.sqrt((x ** 2).sum(1)), rtol=1e-5)
    np.testing.assert_array_equal(_one("flip", x, axis=[1, -1]), x[:, ::-1, :, ::-1])
    idx = np.array([2, 0], np.int64)
    np.testing.assert_array_equal(
        _one("index_select", x, {"X": ["x"], "Index": ["i"]}, extra={"i": idx}, dim=1),
        x[:, [2, 0]])
    np.testing.assert_array_equal(_one("tile", x[0, 0], repeat_times=[2, 1, 2]),
                                  np.tile(x[0, 0], (2, 1, 2)))
    np.testing.assert_array_equal(_one("sum", x, {"X": ["x", "x"]}), x + x)
    v5 = rng.standard_normal((1, 2, 2, 2, 2)).astype(np.float32)
    got = _one("pad3d", v5, paddings=[1, 0, 0, 2, 1, 1], value=0.5)
    np.testing.assert_array_equal(got, np.pad(v5, ((0, 0), (0, 0), (1, 1), (0, 2), (1, 0)),
                                              constant_values=0.5))
    got = _one("fill_constant_batch_size_like", x, {"Input": ["x"]}, shape=[-1, 7], dtype=5,
               value=3.0, input_dim_idx=0, output_dim_idx=0)
    np.testing.assert_array_equal(got, np.full((2, 7), 3.0, np.float32))


def _program_of(build, feeds):
    """Run a _Builder program that `build(b)` fills, on `feeds` ({name: array})."""
    b = _Builder()
    for name, value in feeds.items():
        b.feed(name, value.shape, str(value.dtype))
    for name in build(b):
        b.fetch(name)
    return b.run(feeds)


def test_lists_constants_and_selection():
    rng = np.random.default_rng(6)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    ids = np.array([[1], [3]], np.int64)

    def build(b):
        b.op("split", {"X": ["x"]}, {"Out": ["s0", "s1"]}, num=0, sections=[1, -1], axis=-1)
        b.op("stack", {"X": ["s0", "s0"]}, {"Y": ["st"]}, axis=-1)
        b.op("concat", {"X": ["s1", "s0"]}, {"Out": ["cc"]}, axis=1)
        b.op("assign_value", {}, {"Out": ["av"]}, shape=[2], dtype=2, int32_values=[2, 0])
        b.op("gather", {"X": ["x"], "Index": ["av"]}, {"Out": ["g"]})
        b.op("clip", {"X": ["x"]}, {"Out": ["cl"]}, min=-0.5, max=0.25)
        b.op("greater_equal", {"X": ["x"], "Y": ["cl"]}, {"Out": ["ge"]})
        b.op("logical_not", {"X": ["ge"]}, {"Out": ["nge"]})
        b.op("where", {"Condition": ["nge"], "X": ["x"], "Y": ["cl"]}, {"Out": ["w"]})
        b.param("table", np.arange(20, dtype=np.float32).reshape(5, 4))
        b.op("lookup_table", {"W": ["table"], "Ids": ["ids"]}, {"Out": ["e"]}, padding_idx=3)
        b.op("matmul", {"X": ["x"], "Y": ["x"]}, {"Out": ["mm"]}, transpose_Y=True, alpha=0.5)
        b.op("arg_max", {"X": ["x"]}, {"Out": ["am"]}, flatten=True, dtype=3, axis=0)
        b.op("cumsum", {"X": ["x"]}, {"Out": ["cs"]}, axis=1, exclusive=True)
        b.op("expand_v2", {"X": ["s0"]}, {"Out": ["ex"]}, shape=[2, -1, 3])
        b.op("unstack", {"X": ["x"]}, {"Y": ["u0", "u1", "u2"]}, axis=0)
        b.op("one_hot_v2", {"X": ["av"]}, {"Out": ["oh"]}, depth=4, dtype=5)
        return ["s1", "st", "cc", "g", "w", "e", "mm", "am", "cs", "ex", "u2", "oh"]

    (s1, st, cc, g, w, e, mm, am, cs, ex, u2, oh) = _program_of(build, {"x": x, "ids": ids})
    np.testing.assert_array_equal(s1, x[:, 1:])
    np.testing.assert_array_equal(st, np.stack([x[:, :1], x[:, :1]], -1))
    np.testing.assert_array_equal(cc, np.concatenate([x[:, 1:], x[:, :1]], 1))
    np.testing.assert_array_equal(g, x[[2, 0]])
    np.testing.assert_array_equal(w, np.where(x < np.clip(x, -0.5, 0.25), x, np.clip(x, -0.5, 0.25)))
    np.testing.assert_array_equal(e, [np.arange(4, 8), np.zeros(4)])   # 3 is the padding row
    np.testing.assert_allclose(mm, 0.5 * x @ x.T, rtol=1e-5)
    assert int(am) == int(np.argmax(x))
    np.testing.assert_allclose(cs, np.cumsum(x, 1) - x, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(ex, np.broadcast_to(x[:, :1], (2, 3, 3)))
    np.testing.assert_array_equal(u2, x[2])
    np.testing.assert_array_equal(oh, np.eye(4, dtype=np.float32)[[2, 0]])


def test_integer_floor_division_rounds_down():
    a = np.array([7, -7, 7, -7, 6], np.int32)
    b = np.array([2, 2, -2, -2, 3], np.int32)

    def build(bld):
        bld.op("elementwise_floordiv", {"X": ["a"], "Y": ["b"]}, {"Out": ["q"]})
        return ["q"]

    np.testing.assert_array_equal(_program_of(build, {"a": a, "b": b})[0], a // b)


def test_ops_that_do_not_fit_are_reported_with_the_others():
    b = _Builder()
    b.feed("x", (-1, 3, 4, 4))
    b.param("w", np.zeros((2, 5, 3, 3), np.float32))   # 5 input channels for 3
    b.op("conv2d", {"Input": ["x"], "Filter": ["w"]}, {"Output": ["y"]})
    b.op("pool2d", {"X": ["x"]}, {"Out": ["p"]}, ksize=[2, 2], strides=[0, 0])
    b.op("no_such_op", {"X": ["x"]}, {"Out": ["z"]})
    b.fetch("z")
    with pytest.raises(UnsupportedOpError) as e:
        b.run({"x": np.zeros((1, 3, 4, 4), np.float32)})
    assert [(p[0], p[2]) for p in e.value.places] == [("conv2d", 1), ("pool2d", 2),
                                                      ("no_such_op", 3)]
    assert "does not fit" in e.value.places[0][4]


def test_attributes_of_other_types_give_typed_errors_only():
    rng = np.random.default_rng(7)
    original = read_pdmodel(_read(os.path.join(FIXTURES, "lenet", "legacy", "model.pdmodel")))
    names = sorted(v.name for v in original.blocks[0].vars.values()
                   if v.persistable and v.kind == "dense")
    values = read_combined(_read(os.path.join(FIXTURES, "lenet", "legacy", "model.pdiparams")),
                           names)
    odd = [7, -1, 0, 2.5, "NHWC", [], [3], [1, 2, 3, 4, 5], [-4, 0], True, [1.5, "a"], 2**40]
    for _ in range(40):
        prog = read_pdmodel(_read(os.path.join(FIXTURES, "lenet", "legacy", "model.pdmodel")))
        ops = [op for op in prog.blocks[0].ops if op.attrs and op.type not in ("feed", "fetch")]
        for op in rng.choice(ops, size=3):
            key = rng.choice(sorted(op.attrs))
            op.attrs[key] = odd[rng.integers(len(odd))]
        try:
            translate(prog, values)
        except (UnsupportedOpError, FormatError):
            pass


def test_nhwc_convolution_and_pooling():
    rng = np.random.default_rng(8)
    x = rng.standard_normal((2, 5, 6, 3)).astype(np.float32)   # NHWC
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    nchw = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
    want = _one("conv2d", nchw, {"Input": ["x"], "Filter": ["w"]}, outputs=("Output",),
                extra={"w": w}, paddings=[1, 1])
    got = _one("conv2d", x, {"Input": ["x"], "Filter": ["w"]}, outputs=("Output",),
               extra={"w": w}, paddings=[1, 1], data_format="NHWC")
    np.testing.assert_allclose(got, want.transpose(0, 2, 3, 1), rtol=1e-5, atol=1e-5)
    got = _one("pool2d", x, pooling_type="max", ksize=[2, 2], strides=[2, 2],
               data_format="NHWC")
    np.testing.assert_array_equal(got, x[:, :4].reshape(2, 2, 2, 3, 2, 3).max(axis=(2, 4)))


def test_directory_with_a_config_json_beside_the_program(tmp_path):
    import shutil
    for f in os.listdir(os.path.join(MLP, "pir")):
        shutil.copy(os.path.join(MLP, "pir", f), tmp_path / f)
    (tmp_path / "config.json").write_text('{"not": "a program"}')
    scope = pd.Scope()
    program, feeds, fetches = load_inference_model(str(tmp_path), pd.Executor(), scope=scope)
    ref = np.load(os.path.join(MLP, "reference.npz"))
    out = pd.Executor().run(program, feed={feeds[0]: ref["input_b5"]}, fetch_list=fetches,
                            scope=scope)[0]
    np.testing.assert_allclose(out, ref["pir_output_b5"], atol=1e-6)
    (tmp_path / "other.pdmodel").write_bytes(b"")
    (tmp_path / "more.pdmodel").write_bytes(b"")
    with pytest.raises(FormatError, match="holds 2 Paddle programs"):
        load_inference_model(str(tmp_path), pd.Executor(), scope=pd.Scope())


def test_border_padding_modes():
    x = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    for mode, numpy_mode in (("reflect", "reflect"), ("replicate", "edge"),
                             ("circular", "wrap")):
        got = _one("pad2d", x, paddings=[1, 2, 3, 0], mode=mode)
        np.testing.assert_array_equal(got, np.pad(x, ((0, 0), (0, 0), (1, 2), (3, 0)),
                                                  mode=numpy_mode))
    got = _one("pad2d", x, paddings=[0, 1, 1, 1], mode="constant", pad_value=-1.0,
               data_format="NHWC")
    np.testing.assert_array_equal(got, np.pad(x, ((0, 0), (0, 1), (1, 1), (0, 0)),
                                              constant_values=-1))


def test_interpolation_sizes_and_scales():
    x = np.random.default_rng(9).standard_normal((1, 2, 3, 4)).astype(np.float32)
    got = _one("nearest_interp_v2", x, out_h=6, out_w=8, align_corners=False)
    np.testing.assert_array_equal(got, x.repeat(2, axis=2).repeat(2, axis=3))
    got = _one("nearest_interp_v2", x, scale=[2.0, 3.0], align_corners=False)
    np.testing.assert_array_equal(got, x.repeat(2, axis=2).repeat(3, axis=3))
    got = _one("nearest_interp", x, scale=2.0, out_h=-1, out_w=-1, align_corners=False)
    np.testing.assert_array_equal(got, x.repeat(2, axis=2).repeat(2, axis=3))   # v1: a float
    x1 = np.arange(4, dtype=np.float32).reshape(1, 1, 4)
    got = _one("linear_interp_v2", x1, out_w=7, align_corners=True, data_layout="NCW")
    np.testing.assert_allclose(got, np.linspace(0, 3, 7, dtype=np.float32)[None, None],
                               rtol=1e-6, atol=1e-6)


def test_a_block_that_runs_itself_is_refused():
    from progdesc.paddle.table import PaddleRuleTable
    from progdesc.paddle.translate import PaddleTranslator
    from progdesc.translate import FAILED
    table = PaddleRuleTable()

    @table.rule("relu")
    def again(t, x):   # as a hostile file's control flow would: its body is its own block
        return t.inline(t.subgraph(0, ["x"], ["r"]), [x])[0]

    b = _Builder()
    b.feed("x", (-1, 3))
    b.op("relu", {"X": ["x"]}, {"Out": ["r"]})
    program = pd.Program()
    program.global_block().create_var("x", [-1, 3], "float32")
    translator = PaddleTranslator(program, b.program(), rules=table)
    with pd.program_guard(program):
        outs = translator.inline(translator.subgraph(0, ["x"], ["r"]), ["x"])
    assert outs == [FAILED]
    assert [(p.type, p.index) for p in translator.unsupported] == [("relu", 1)]
    assert "would run itself" in translator.unsupported[0].why


def test_a_second_row_for_an_op_is_refused():
    from progdesc.paddle.table import PaddleRuleTable
    table = PaddleRuleTable()
    table.rename("relu", "relu")
    table.rename("relu", "relu", since=2)   # a row for a later op version is another row
    with pytest.raises(ValueError, match="row for 'relu' \\(since 0\\) already"):
        table.rename("relu", "sigmoid")


# --- rows of rules_more, each against NumPy ---
def test_more_activations_against_numpy():
    rng = np.random.default_rng(10)
    x = (rng.standard_normal((3, 7)) * 3).astype(np.float32)
    x[0, :4] = [0.5, -0.5, 2.5, -2.5]   # halves: Paddle's round goes away from zero
    close = dict(rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(_one("brelu", x), np.clip(x, 0, 24))
    np.testing.assert_array_equal(_one("brelu", x, t_min=-1.0, t_max=1.0), np.clip(x, -1, 1))
    np.testing.assert_allclose(_one("celu", x, alpha=0.5),
                               np.maximum(x, 0) + np.minimum(0, 0.5 * np.expm1(x / 0.5)), **close)
    scale, alpha = 1.0507009873554804934193349852946, 1.6732632423543772848170429916717
    np.testing.assert_allclose(_one("selu", x), scale * np.where(x > 0, x, alpha * np.expm1(x)),
                               **close)
    np.testing.assert_allclose(_one("softsign", x), x / (1 + np.abs(x)), **close)
    np.testing.assert_allclose(_one("tanh_shrink", x), x - np.tanh(x), **close)
    np.testing.assert_array_equal(_one("thresholded_relu", x), np.where(x > 1.0, x, 0))
    np.testing.assert_array_equal(_one("thresholded_relu", x, threshold=0.5, value=-2.0),
                                  np.where(x > 0.5, x, -2.0).astype(np.float32))
    away = np.sign(x) * np.floor(np.abs(x) + 0.5)
    np.testing.assert_array_equal(_one("round", x), away)
    np.testing.assert_allclose(_one("round", x, decimals=1),
                               np.sign(x) * np.floor(np.abs(x) * 10 + 0.5) / 10, **close)
    np.testing.assert_array_equal(_one("share_data", x), x)


def test_value_tests_elementwise_and_whole():
    x = np.array([[1.0, np.nan, np.inf], [-np.inf, 0.0, -2.0]], np.float32)
    np.testing.assert_array_equal(_one("isnan_v2", x), np.isnan(x))
    np.testing.assert_array_equal(_one("isinf_v2", x), np.isinf(x))
    np.testing.assert_array_equal(_one("isfinite_v2", x), np.isfinite(x))
    np.testing.assert_array_equal(_one("isnan", x), [True])
    np.testing.assert_array_equal(_one("isinf", x[:, 1:2]), [False])
    np.testing.assert_array_equal(_one("isfinite", x), [False])
    np.testing.assert_array_equal(_one("isfinite", x[1:, 1:]), [True])
    ints = np.array([3, -1], np.int64)
    np.testing.assert_array_equal(_one("isnan_v2", ints), [False, False])
    np.testing.assert_array_equal(_one("isinf_v2", ints), [False, False])
    np.testing.assert_array_equal(_one("isfinite_v2", ints), [True, True])


def test_argsort_cumprod_logsumexp():
    rng = np.random.default_rng(11)
    x = rng.standard_normal((3, 5)).astype(np.float32)
    b = _Builder()
    b.feed("x", x.shape)
    b.op("argsort", {"X": ["x"]}, {"Out": ["s"], "Indices": ["i"]}, axis=1)
    b.op("argsort", {"X": ["x"]}, {"Out": ["sd"], "Indices": ["id"]}, axis=0, descending=True)
    for name in ("s", "i", "sd", "id"):
        b.fetch(name)
    s, i, sd, idd = b.run({"x": x})
    np.testing.assert_array_equal(s, np.sort(x, 1))
    np.testing.assert_array_equal(i, np.argsort(x, 1, kind="stable"))
    assert i.dtype == np.int64
    np.testing.assert_array_equal(sd, -np.sort(-x, 0))
    np.testing.assert_array_equal(idd, np.argsort(-x, 0, kind="stable"))
    close = dict(rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_one("cumprod", x, dim=1), np.cumprod(x, 1), **close)
    np.testing.assert_allclose(_one("cumprod", x, dim=-1, reverse=True),
                               np.cumprod(x[:, ::-1], 1)[:, ::-1], **close)
    ex = np.concatenate([np.ones((3, 1), np.float32), np.cumprod(x, 1)[:, :-1]], 1)
    np.testing.assert_allclose(_one("cumprod", x, dim=1, exclusive=True), ex, **close)
    exr = np.concatenate([np.cumprod(x[:, ::-1], 1)[:, ::-1][:, 1:],
                          np.ones((3, 1), np.float32)], 1)
    np.testing.assert_allclose(_one("cumprod", x, dim=1, exclusive=True, reverse=True), exr,
                               **close)

    def lse(a, axis, keepdims=False):   # in float64, where exp(30 x) does not overflow
        return np.log(np.exp(a.astype(np.float64)).sum(axis=axis, keepdims=keepdims))
    y = (x * 30).astype(np.float32)   # exp overflows float32 without the max
    np.testing.assert_allclose(_one("logsumexp", y, axis=[1]), lse(y, 1), rtol=1e-5)
    np.testing.assert_allclose(_one("logsumexp", y, axis=[0], keepdim=True), lse(y, 0, True),
                               rtol=1e-5)
    np.testing.assert_allclose(_one("logsumexp", y, axis=[0], reduce_all=True),
                               lse(y, (0, 1)), rtol=1e-5)
    z = np.array([[-np.inf, -np.inf], [0.0, -np.inf]], np.float32)
    np.testing.assert_array_equal(_one("logsumexp", z, axis=[1]), [-np.inf, 0.0])


def test_gather_nd_take_along_axis_roll_unbind_tril():
    rng = np.random.default_rng(12)
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    index = np.array([[[0, 1], [2, 3]], [[1, 0], [2, 2]]], np.int64)   # [2, 2, 2]: k = 2
    got = _one("gather_nd", x, {"X": ["x"], "Index": ["i"]}, extra={"i": index})
    np.testing.assert_array_equal(got, x[index[..., 0], index[..., 1]])
    one = np.array([[2], [0]], np.int32)                                # k = 1
    got = _one("gather_nd", x, {"X": ["x"], "Index": ["i"]}, extra={"i": one})
    np.testing.assert_array_equal(got, x[[2, 0]])
    full = np.array([[1, 2, 3]], np.int64)                              # k = rank: scalars
    got = _one("gather_nd", x, {"X": ["x"], "Index": ["i"]}, extra={"i": full})
    np.testing.assert_array_equal(got, [x[1, 2, 3]])
    idx = rng.integers(0, 4, (3, 2, 5)).astype(np.int64)
    got = _one("take_along_axis", x, {"Input": ["x"], "Index": ["i"]}, outputs=("Result",),
               extra={"i": idx}, Axis=1)
    np.testing.assert_array_equal(got, np.take_along_axis(x, idx, 1))
    np.testing.assert_array_equal(_one("roll", x, shifts=[1, -2], axis=[0, 2]),
                                  np.roll(x, (1, -2), (0, 2)))
    np.testing.assert_array_equal(_one("roll", x, shifts=[7]), np.roll(x, 7))

    def shifted(b):   # the shift held by a tensor that an assign_value makes
        b.op("assign_value", {}, {"Out": ["s"]}, shape=[1], dtype=3, int64_values=[3])
        b.op("roll", {"X": ["x"], "ShiftsTensor": ["s"]}, {"Out": ["r"]}, axis=[-1])
        return ["r"]
    np.testing.assert_array_equal(_program_of(shifted, {"x": x})[0], np.roll(x, 3, -1))
    b = _Builder()
    b.feed("x", x.shape)
    b.op("unbind", {"X": ["x"]}, {"Out": ["u0", "u1", "u2", "u3"]}, axis=1)
    b.fetch("u0")
    b.fetch("u3")
    u0, u3 = b.run({"x": x})
    np.testing.assert_array_equal(u0, x[:, 0])
    np.testing.assert_array_equal(u3, x[:, 3])
    np.testing.assert_array_equal(_one("tril_triu", x, diagonal=1, lower=True), np.tril(x, 1))
    np.testing.assert_array_equal(_one("tril_triu", x, diagonal=-1, lower=False), np.triu(x, -1))


def test_linspace_and_sync_batch_norm():
    def build(b):
        for name, value, dtype in (("start", 0.5, 5), ("stop", 2.0, 5), ("num", 7, 2)):
            b.op("fill_constant", {}, {"Out": [name]}, shape=[1], dtype=dtype, value=float(value),
                 str_value=str(value))
        b.op("linspace", {"Start": ["start"], "Stop": ["stop"], "Num": ["num"]}, {"Out": ["c"]},
             dtype=5)
        b.op("reduce_max", {"X": ["x"]}, {"Out": ["hi"]}, reduce_all=True)   # a run-time stop
        b.op("linspace", {"Start": ["start"], "Stop": ["hi"], "Num": ["num"]}, {"Out": ["r"]},
             dtype=5)
        return ["c", "r"]

    x = np.array([1.0, 4.0], np.float32)
    c, r = _program_of(build, {"x": x})
    np.testing.assert_array_equal(c, np.linspace(0.5, 2.0, 7, dtype=np.float32))
    np.testing.assert_allclose(r, np.linspace(0.5, 4.0, 7), rtol=1e-6)
    rng = np.random.default_rng(13)
    x = rng.standard_normal((2, 3, 2, 2)).astype(np.float32)
    scale = rng.standard_normal(3).astype(np.float32)
    bias = rng.standard_normal(3).astype(np.float32)
    mean, var = rng.standard_normal(3).astype(np.float32), rng.uniform(0.5, 2, 3).astype(np.float32)
    got = _one("sync_batch_norm", x,
               {"X": ["x"], "Scale": ["s"], "Bias": ["b"], "Mean": ["m"], "Variance": ["v"]},
               outputs=("Y", "MeanOut", "VarianceOut", "SavedMean", "SavedVariance"),
               extra={"s": scale, "b": bias, "m": mean, "v": var}, is_test=True, epsilon=1e-5)
    c = lambda a: a[None, :, None, None]  # noqa: E731
    np.testing.assert_allclose(got, (x - c(mean)) / np.sqrt(c(var) + 1e-5) * c(scale) + c(bias),
                               rtol=1e-5, atol=1e-5)


def test_a_scale_that_does_not_name_every_dim_is_refused():
    x = np.ones((1, 2, 3, 4), np.float32)
    with pytest.raises(UnsupportedOpError, match=r"nearest_interp_v2.*scale \[2.0\] for 2"):
        _one("nearest_interp_v2", x, scale=[2.0], align_corners=False)   # as Paddle does
