"""progdesc.onnx.rules_misc: random draws (by their statistics: the numbers cannot match
ONNX's), TopK, quantization, integer matmul, windows, LpNormalization and the refused
ops. References: NumPy and the formulas of ONNX's operator specification; ONNX's own
expected outputs are checked by tests/test_onnx_node_suite.py."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from lowering.errors import UnsupportedOpError
from progdesc.onnx import Backend


def _run(node, inputs, outputs, feeds=(), initializers=(), opset=21):
    """Run a one-node model; `inputs` / `outputs` are (name, elem type, shape)."""
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(*i) for i in inputs],
        [helper.make_tensor_value_info(*o) for o in outputs],
        [numpy_helper.from_array(np.asarray(v), n) for n, v in initializers])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return Backend.run_model(model, list(feeds))


F, D, I64 = TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT64


# --- random draws: their statistics ---
def test_random_normal_statistics_and_dtype():
    y, = _run(helper.make_node("RandomNormal", [], ["y"], shape=[20000], mean=1.0,
                               scale=2.0, dtype=D), [], [("y", D, [20000])])
    assert y.dtype == np.float64 and y.shape == (20000,)
    assert abs(y.mean() - 1.0) < 4 * 2.0 / np.sqrt(20000)
    assert abs(y.std() - 2.0) < 0.05


def test_random_uniform_like_follows_its_input():
    x = np.zeros((100, 100), np.float32)
    y, = _run(helper.make_node("RandomUniformLike", ["x"], ["y"], low=-1.0, high=3.0),
              [("x", F, [100, 100])], [("y", F, [100, 100])], [x])
    assert y.shape == x.shape and y.dtype == np.float32
    assert y.min() >= -1.0 and y.max() < 3.0
    assert abs(y.mean() - 1.0) < 4 * (4 / np.sqrt(12)) / 100
    assert len(np.unique(y)) > 9000


def test_bernoulli_draws_with_the_given_probabilities():
    p = np.concatenate([np.zeros(100), np.ones(100), np.full(20000, 0.3)]).astype(np.float32)
    y, = _run(helper.make_node("Bernoulli", ["p"], ["y"], dtype=D), [("p", F, [p.size])],
              [("y", D, [p.size])], [p])
    assert y.dtype == np.float64 and set(np.unique(y)) <= {0.0, 1.0}
    assert y[:100].sum() == 0 and y[100:200].sum() == 100
    assert abs(y[200:].mean() - 0.3) < 4 * np.sqrt(0.3 * 0.7 / 20000)


def test_multinomial_draws_from_the_softmax_of_its_input():
    logits = np.log(np.array([[0.2, 0.8], [0.9, 0.1]], np.float32))
    y, = _run(helper.make_node("Multinomial", ["x"], ["y"], sample_size=10000, dtype=I64),
              [("x", F, [2, 2])], [("y", I64, [2, 10000])], [logits])
    assert y.dtype == np.int64 and y.shape == (2, 10000)
    assert abs(y[0].mean() - 0.8) < 0.02 and abs(y[1].mean() - 0.1) < 0.02


def test_random_ops_refuse_ints():
    with pytest.raises(UnsupportedOpError, match="random draws are floats"):
        _run(helper.make_node("RandomUniform", [], ["y"], shape=[2], dtype=TensorProto.INT32),
             [], [("y", TensorProto.INT32, [2])])


# --- TopK ---
@pytest.mark.parametrize("largest", [1, 0])
def test_top_k_with_k_from_an_initializer(largest):
    x = np.array([[3, 1, 3, 2], [0, 5, 5, 5]], np.float32)
    v, i = _run(helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1, largest=largest),
                [("x", F, [2, 4])], [("v", F, [2, 2]), ("i", I64, [2, 2])], [x],
                initializers=[("k", np.array([2], np.int64))])
    order = np.argsort(-x if largest else x, axis=1, kind="stable")[:, :2]
    np.testing.assert_array_equal(i, order)   # ties: the lower index first
    np.testing.assert_array_equal(v, np.take_along_axis(x, order, axis=1))


# --- quantization ---
def _quantize(x, scale, zero, low, high):
    return np.clip(np.round(x / scale) + zero, low, high)


def test_quantize_linear_per_axis_with_zero_points():
    x = np.linspace(-3, 3, 24, dtype=np.float32).reshape(2, 3, 4)
    scale = np.array([0.02, 0.05, 0.1], np.float32)
    zero = np.array([-10, 0, 7], np.int8)
    y, = _run(helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], axis=1),
              [("x", F, [2, 3, 4]), ("s", F, [3]), ("z", TensorProto.INT8, [3])],
              [("y", TensorProto.INT8, [2, 3, 4])], [x, scale, zero])
    expected = _quantize(x, scale[:, None], zero[:, None], -128, 127).astype(np.int8)
    assert y.dtype == np.int8
    np.testing.assert_array_equal(y, expected)


def test_quantize_linear_rounds_halves_to_even_and_saturates():
    x = np.array([0.5, 1.5, 2.5, -0.5, 300.0, -5.0], np.float32)
    y, = _run(helper.make_node("QuantizeLinear", ["x", "s"], ["y"]),
              [("x", F, [6]), ("s", F, [])], [("y", TensorProto.UINT8, [6])],
              [x, np.float32(1.0)])
    np.testing.assert_array_equal(y, [0, 2, 2, 0, 255, 0])


def test_quantize_linear_blocked():
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    scale = np.array([[1.0, 2.0, 4.0], [0.5, 1.0, 2.0]], np.float32)
    y, = _run(helper.make_node("QuantizeLinear", ["x", "s"], ["y"], axis=1, block_size=2,
                               output_dtype=TensorProto.INT8),
              [("x", F, [2, 6]), ("s", F, [2, 3])], [("y", TensorProto.INT8, [2, 6])],
              [x, scale])
    np.testing.assert_array_equal(y, _quantize(x, np.repeat(scale, 2, axis=1), 0, -128, 127))


def test_quantize_linear_refuses_types_we_lack():
    with pytest.raises(UnsupportedOpError, match="int8, uint8 and int16"):
        _run(helper.make_node("QuantizeLinear", ["x", "s"], ["y"],
                              output_dtype=TensorProto.INT32),
             [("x", F, [2]), ("s", F, [])], [("y", TensorProto.INT32, [2])],
             [np.zeros(2, np.float32), np.float32(1)])


def test_dequantize_linear_per_axis():
    x = np.array([[0, 128, 255], [10, 20, 30]], np.uint8)
    scale, zero = np.array([0.5, 2.0], np.float32), np.array([128, 10], np.uint8)
    y, = _run(helper.make_node("DequantizeLinear", ["x", "s", "z"], ["y"], axis=0),
              [("x", TensorProto.UINT8, [2, 3]), ("s", F, [2]), ("z", TensorProto.UINT8, [2])],
              [("y", F, [2, 3])], [x, scale, zero])
    expected = (x.astype(np.float32) - zero[:, None]) * scale[:, None]
    np.testing.assert_allclose(y, expected)


def test_dynamic_quantize_linear_follows_onnx_formula():
    x = np.array([[-1.0, 0.2, 3.4], [2.0, -0.7, 0.0]], np.float32)
    y, scale, zero = _run(helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"]),
                          [("x", F, [2, 3])], [("y", TensorProto.UINT8, [2, 3]), ("s", F, []),
                                               ("z", TensorProto.UINT8, [])], [x])
    ref_scale = np.float32((max(0, x.max()) - min(0, x.min())) / 255)
    ref_zero = np.clip(np.round(-min(0, x.min()) / ref_scale), 0, 255)
    np.testing.assert_allclose(scale, ref_scale, rtol=1e-6)
    assert zero == ref_zero
    np.testing.assert_array_equal(y, _quantize(x, ref_scale, ref_zero, 0, 255))


def test_matmul_integer_with_row_and_column_zero_points():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 255, (3, 5), dtype=np.uint8)
    b = rng.integers(-128, 127, (5, 2), dtype=np.int8)
    za, zb = np.array([1, 2, 3], np.uint8), np.array([-1, 4], np.int8)
    y, = _run(helper.make_node("MatMulInteger", ["a", "b", "za", "zb"], ["y"]),
              [("a", TensorProto.UINT8, [3, 5]), ("b", TensorProto.INT8, [5, 2]),
               ("za", TensorProto.UINT8, [3]), ("zb", TensorProto.INT8, [2])],
              [("y", TensorProto.INT32, [3, 2])], [a, b, za, zb])
    expected = (a.astype(np.int32) - za[:, None]) @ (b.astype(np.int32) - zb)
    np.testing.assert_array_equal(y, expected)


# --- windows, LpNormalization ---
@pytest.mark.parametrize("op, reference", [("HannWindow", np.hanning),
                                           ("BlackmanWindow", np.blackman)])
def test_symmetric_windows_are_numpys(op, reference):
    y, = _run(helper.make_node(op, ["n"], ["y"], periodic=0), [], [("y", F, [9])],
              initializers=[("n", np.array(9, np.int64))])
    np.testing.assert_allclose(y, reference(9), atol=1e-6)


def test_lp_normalization_of_zeros_is_zeros():
    x = np.array([[3.0, 4.0], [0.0, 0.0]], np.float32)
    for p, norm in ((1, 7.0), (2, 5.0)):
        y, = _run(helper.make_node("LpNormalization", ["x"], ["y"], axis=1, p=p),
                  [("x", F, [2, 2])], [("y", F, [2, 2])], [x])
        np.testing.assert_allclose(y, [[3 / norm, 4 / norm], [0.0, 0.0]], rtol=1e-6)


# --- refused ---
def test_sequences_are_refused_with_their_reason():
    with pytest.raises(UnsupportedOpError, match="SequenceConstruct.*sequences have no form"):
        _run(helper.make_node("SequenceConstruct", ["x"], ["s"]), [("x", F, [2])],
             [("s", F, [2])], [np.zeros(2, np.float32)])


def test_qlinear_matmul_requantizes_the_integer_product():
    rng = np.random.default_rng(1)
    a = rng.integers(0, 255, (2, 3, 4), dtype=np.uint8)
    b = rng.integers(0, 255, (4, 5), dtype=np.uint8)
    sa, za, sb, zb = np.float32(0.02), np.uint8(120), np.float32(0.03), np.uint8(130)
    sy, zy = np.float32(0.5), np.uint8(100)
    u8 = TensorProto.UINT8
    y, = _run(helper.make_node("QLinearMatMul", ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"],
                               ["y"]),
              [("a", u8, [2, 3, 4]), ("sa", F, []), ("za", u8, []), ("b", u8, [4, 5]),
               ("sb", F, []), ("zb", u8, []), ("sy", F, []), ("zy", u8, [])],
              [("y", u8, [2, 3, 5])], [a, sa, za, b, sb, zb, sy, zy])
    product = (a.astype(np.int32) - za) @ (b.astype(np.int32) - zb)
    expected = np.clip(np.round(product * np.float32(sa * sb / sy)) + zy, 0, 255)
    np.testing.assert_array_equal(y, expected)


def _conv_row():
    from progdesc.onnx.rules import RULES
    if RULES.lookup("Conv", 21) is None:
        pytest.skip("ConvInteger goes through the Conv row (rules_nn), absent here")


@pytest.mark.parametrize("channels, exact", [(2, True), (300, False)])
def test_conv_integer_is_exact_or_refused(channels, exact):
    _conv_row()
    rng = np.random.default_rng(2)
    x = rng.integers(0, 255, (1, channels, 3, 3), dtype=np.uint8)
    w = rng.integers(0, 255, (2, channels, 1, 1), dtype=np.uint8)
    u8 = TensorProto.UINT8
    run = lambda: _run(helper.make_node("ConvInteger", ["x", "w", "zx"], ["y"]),  # noqa: E731
                       [("x", u8, list(x.shape)), ("w", u8, list(w.shape)), ("zx", u8, [])],
                       [("y", TensorProto.INT32, [1, 2, 3, 3])], [x, w, np.uint8(3)])
    if not exact:
        with pytest.raises(UnsupportedOpError, match="sums 300 products"):
            run()
        return
    y, = run()
    expected = np.einsum("nchw,oc->nohw", x.astype(np.int64) - 3, w[:, :, 0, 0].astype(np.int64))
    np.testing.assert_array_equal(y, expected)


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_softmax_cross_entropy_with_weights_and_an_ignored_index(reduction):
    rng = np.random.default_rng(3)
    scores = rng.normal(size=(4, 3, 2)).astype(np.float32)
    labels = np.array([[0, 2], [1, -1], [2, 2], [-1, 0]], np.int64)
    weights = np.array([0.5, 1.0, 2.0], np.float32)
    out = _run(helper.make_node("SoftmaxCrossEntropyLoss", ["x", "y", "w"], ["loss", "lp"],
                                reduction=reduction, ignore_index=-1),
               [("x", F, [4, 3, 2]), ("y", I64, [4, 2]), ("w", F, [3])],
               [("loss", F, None), ("lp", F, [4, 3, 2])], [scores, labels, weights])
    shifted = scores - scores.max(axis=1, keepdims=True)
    log_prob = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    kept = labels != -1
    safe = np.where(kept, labels, 0)
    picked = np.take_along_axis(log_prob, safe[:, None], axis=1)[:, 0]
    w = weights[safe] * kept
    loss = -picked * w
    expected = {"none": loss, "sum": loss.sum(), "mean": loss.sum() / w.sum()}[reduction]
    np.testing.assert_allclose(out.lp, log_prob, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out.loss, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["linear", "circular"])
def test_tensor_scatter_writes_each_sample_at_its_index(mode):
    past = np.arange(2 * 5 * 2, dtype=np.float32).reshape(2, 5, 2)
    update = -np.arange(1, 2 * 3 * 2 + 1, dtype=np.float32).reshape(2, 3, 2)
    where = np.array([1, 4], np.int64)
    y, = _run(helper.make_node("TensorScatter", ["past", "update", "w"], ["y"], mode=mode),
              [("past", F, [2, 5, 2]), ("update", F, [2, 3, 2]), ("w", I64, [2])],
              [("y", F, [2, 5, 2])], [past, update, where])
    expected = past.copy()   # the pseudocode of ONNX's specification
    for b in range(2):
        for s in range(3):
            p = where[b] + s
            if mode == "circular":
                p %= 5
            if p < 5:
                expected[b, p] = update[b, s]
    np.testing.assert_array_equal(y, expected)
