"""The ONNX importer's neural-network rows (progdesc/onnx/rules_nn.py, rules_resize.py,
rules_attention.py, rules_microsoft.py): one-node models built with onnx.helper, run
through progdesc and checked against onnxruntime (or NumPy where onnxruntime lacks the
op); BatchNormalization in training mode; gradients through a convolution; refusals."""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from onnx_checks import directional_gradient_check  # noqa: E402
import progdesc  # noqa: E402
from lowering.errors import UnsupportedOpError  # noqa: E402
from progdesc import onnx as ponnx  # noqa: E402

F32 = TensorProto.FLOAT
RNG = np.random.default_rng(0)


def _model(op, inputs, outputs, attrs=None, *, inits=(), opset=17, domain=""):
    """A one-node model: `inputs` [(name, array)] are graph inputs, `inits` [(name, array)]
    initializers, `outputs` [(name, rank)] float outputs of unknown dims."""
    node = helper.make_node(op, [n for n, _ in inputs] + [n for n, _ in inits],
                            [n for n, _ in outputs], name="the_node", domain=domain,
                            **(attrs or {}))
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for n, a in inputs],
        [helper.make_tensor_value_info(n, F32, [None] * r) for n, r in outputs if n],
        initializer=[numpy_helper.from_array(np.asarray(a), n) for n, a in inits])
    opsets = [helper.make_opsetid("", opset)]
    if domain:
        opsets.append(helper.make_opsetid(domain, 1))
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def _ours(model, feed, *, for_training=False):
    scope = progdesc.Scope()
    program, feeds, fetches = ponnx.load(model, scope, for_training=for_training)
    outs = progdesc.Executor().run(program, feed=dict(zip(feeds, feed)), fetch_list=fetches,
                                   scope=scope)
    return [np.asarray(o) for o in outs], scope, (program, fetches)


def _theirs(model, feed):
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return session.run(None, dict(zip(names, feed)))


def _check(op, inputs, outputs, attrs=None, *, inits=(), opset=17, domain="", tol=1e-5,
           reference=None):
    model = _model(op, inputs, outputs, attrs, inits=inits, opset=opset, domain=domain)
    feed = [a for _, a in inputs]
    ours, _, _ = _ours(model, feed)
    theirs = reference(model, feed) if reference else _theirs(model, feed)
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert a.shape == np.asarray(b).shape
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


def _x(*shape, rng=RNG):
    return rng.standard_normal(shape).astype(np.float32)


def _onnx_reference(model, feed):
    from onnx.reference import ReferenceEvaluator
    ref = ReferenceEvaluator(model)
    return ref.run(None, dict(zip([i.name for i in model.graph.input], feed)))


# --- convolution ---
@pytest.mark.parametrize("shape, w_shape, attrs", [
    ((2, 3, 9), (4, 3, 3), dict(pads=[1, 2], strides=[2])),
    ((1, 4, 7, 8), (6, 2, 3, 2), dict(group=2, dilations=[2, 1], pads=[1, 0, 2, 1])),
    ((1, 3, 7, 8), (5, 3, 3, 3), dict(auto_pad="SAME_UPPER", strides=[2, 2])),
    ((1, 3, 7, 8), (5, 3, 2, 2), dict(auto_pad="SAME_LOWER", strides=[2, 3])),
    ((1, 2, 5, 6, 4), (3, 2, 3, 3, 2), dict(strides=[1, 2, 1], pads=[1, 1, 0, 1, 0, 1])),
])
def test_conv_matches_onnxruntime(shape, w_shape, attrs):
    _check("Conv", [("x", _x(*shape))], [("y", len(shape))], attrs,
           inits=[("w", _x(*w_shape)), ("b", _x(w_shape[0]))], tol=1e-4)


@pytest.mark.parametrize("shape, w_shape, attrs", [
    ((1, 2, 5), (2, 3, 3), dict(strides=[2], output_padding=[1], pads=[1, 0])),
    ((1, 4, 3, 4), (4, 2, 3, 3), dict(group=2, strides=[2, 2], dilations=[1, 2])),
    ((1, 2, 3, 3), (2, 3, 3, 3), dict(strides=[3, 2], output_shape=[10, 8])),
    ((1, 2, 3, 3), (2, 3, 3, 3), dict(strides=[2, 2], auto_pad="SAME_UPPER")),
    ((1, 2, 2, 3, 3), (2, 2, 2, 2, 2), dict(strides=[1, 2, 2], pads=[0, 1, 0, 0, 0, 1])),
])
def test_conv_transpose_matches_onnxruntime(shape, w_shape, attrs):
    _check("ConvTranspose", [("x", _x(*shape))], [("y", len(shape))], attrs,
           inits=[("w", _x(*w_shape)), ("b", _x(w_shape[1] * attrs.get("group", 1)))],
           tol=1e-4)


# --- pooling ---
@pytest.mark.parametrize("op, attrs", [
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
    ("MaxPool", dict(kernel_shape=[2, 2], dilations=[2, 2], pads=[1, 1, 1, 1])),
    ("MaxPool", dict(kernel_shape=[3, 2], auto_pad="SAME_UPPER", strides=[2, 2])),
    ("AveragePool", dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1)),
    ("AveragePool", dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2])),
    ("AveragePool", dict(kernel_shape=[2, 3], strides=[2, 2], ceil_mode=1)),
    ("LpPool", dict(kernel_shape=[2, 2], p=3, strides=[1, 2])),
    ("GlobalAveragePool", {}),
    ("GlobalMaxPool", {}),
])
def test_pooling_matches_onnxruntime(op, attrs):
    _check(op, [("x", _x(2, 3, 7, 8))], [("y", 4)], attrs, opset=18)


@pytest.mark.parametrize("attrs", [
    dict(kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 1], dilations=[1, 2]),
    dict(kernel_shape=[2, 2], strides=[2, 2], storage_order=1, ceil_mode=1),
])
def test_max_pool_indices_match_onnxruntime(attrs):
    x = _x(2, 3, 7, 6)
    model = _model("MaxPool", [("x", x)], [("y", 4), ("i", 4)], attrs)
    model.graph.output[1].type.tensor_type.elem_type = TensorProto.INT64
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"   # a symbolic batch
    ours, _, _ = _ours(model, [x])
    theirs = _theirs(model, [x])
    np.testing.assert_allclose(ours[0], theirs[0])
    np.testing.assert_array_equal(ours[1], theirs[1])


def test_max_pool_1d_and_3d():
    _check("MaxPool", [("x", _x(2, 3, 9))], [("y", 3)], dict(kernel_shape=[3], strides=[2]))
    _check("AveragePool", [("x", _x(1, 2, 4, 5, 6))], [("y", 5)],
           dict(kernel_shape=[2, 2, 3], pads=[0, 1, 1, 1, 0, 1]))


# --- normalization ---
def test_batch_normalization_inference():
    c = 3
    _check("BatchNormalization", [("x", _x(2, c, 4, 5))], [("y", 4)], dict(epsilon=1e-3),
           inits=[("s", _x(c)), ("b", _x(c)), ("m", _x(c)),
                  ("v", RNG.uniform(0.5, 2, c).astype(np.float32))])


def test_normalizations_match_onnxruntime():
    x = _x(2, 4, 3, 5)
    _check("InstanceNormalization", [("x", x)], [("y", 4)], dict(epsilon=1e-3),
           inits=[("s", _x(4)), ("b", _x(4))], tol=1e-4)
    _check("LayerNormalization", [("x", x)], [("y", 4), ("mean", 4), ("inv", 4)],
           dict(axis=2), inits=[("s", _x(3, 5)), ("b", _x(3, 5))], tol=1e-4)
    for axis, shape in ((1, (4, 3, 5)), (-1, (5,))):   # Y alone: our layer_norm op
        _check("LayerNormalization", [("x", x)], [("y", 4)], dict(axis=axis),
               inits=[("s", _x(*shape)), ("b", _x(*shape))], tol=1e-4)
    _check("GroupNormalization", [("x", x)], [("y", 4)], dict(num_groups=2),
           inits=[("s", _x(4)), ("b", _x(4))], opset=21, tol=1e-4)
    _check("LRN", [("x", x)], [("y", 4)], dict(size=3, alpha=1e-2, beta=0.5, bias=2.0),
           tol=1e-4)
    _check("MeanVarianceNormalization", [("x", x)], [("y", 4)], tol=1e-4)


def test_rms_normalization_matches_numpy():
    x, s = _x(2, 3, 6), _x(6)

    def numpy_rms(model, feed):
        return [feed[0] / np.sqrt(np.mean(feed[0] ** 2, -1, keepdims=True) + 1e-5) * s]

    _check("RMSNormalization", [("x", x)], [("y", 3)], inits=[("s", s)], opset=23,
           reference=numpy_rms, tol=1e-5)


def test_batch_normalization_trains_with_batch_statistics():
    """for_training: batch statistics normalize, the running ones are updated in place
    (momentum * running + (1 - momentum) * batch, biased variance), and are not trained."""
    c, momentum, eps = 3, 0.8, 1e-5
    x = _x(4, c, 3, 3) * 2 + 1
    scale, bias = _x(c), _x(c)
    mean0, var0 = _x(c), RNG.uniform(0.5, 2, c).astype(np.float32)
    model = _model("BatchNormalization", [("x", x)], [("y", 4)],
                   dict(momentum=momentum, epsilon=eps),
                   inits=[("s", scale), ("b", bias), ("m", mean0), ("v", var0)])
    (y,), scope, (program, fetches) = _ours(model, [x], for_training=True)
    bmean, bvar = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3))
    want = ((x - bmean[:, None, None]) / np.sqrt(bvar[:, None, None] + eps)
            * scale[:, None, None] + bias[:, None, None])
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(scope.get("m")), mean0 * momentum
                               + bmean * (1 - momentum), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(scope.get("v")), var0 * momentum
                               + bvar * (1 - momentum), rtol=1e-5, atol=1e-6)
    trained = {v.name for v in program.all_parameters()}
    assert {"s", "b"} <= trained and not {"m", "v"} & trained
    # the eval clone normalizes with the (updated) running statistics
    test = program.clone(for_test=True)
    (y_eval,) = progdesc.Executor().run(test, feed={"x": x}, fetch_list=[fetches[0].name],
                                        scope=scope)
    m, v = np.asarray(scope.get("m")), np.asarray(scope.get("v"))
    want = ((x - m[:, None, None]) / np.sqrt(v[:, None, None] + eps)
            * scale[:, None, None] + bias[:, None, None])
    np.testing.assert_allclose(np.asarray(y_eval), want, rtol=1e-4, atol=1e-4)


def test_batch_normalization_training_mode_outputs():
    """training_mode=1 (opset 15): Y and the updated running statistics as outputs."""
    c = 2
    x = _x(3, c, 4)
    inits = [("s", _x(c)), ("b", _x(c)), ("m", _x(c)), ("v", np.ones(c, np.float32))]
    model = _model("BatchNormalization", [("x", x)], [("y", 3), ("rm", 1), ("rv", 1)],
                   dict(training_mode=1, momentum=0.7), inits=inits, opset=15)
    ours, _, _ = _ours(model, [x])
    theirs = _onnx_reference(model, [x])
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


# --- softmax, Gemm, Dropout ---
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
def test_softmax_family(op):
    _check(op, [("x", _x(2, 5, 3))], [("y", 3)], dict(axis=1), opset=13)


def test_gemm_and_dropout():
    _check("Gemm", [("a", _x(4, 3))], [("y", 2)],
           dict(alpha=0.5, beta=2.0, transA=1, transB=1),
           inits=[("b", _x(5, 4)), ("c", _x(5))])
    x = _x(3, 4)
    model = _model("Dropout", [("x", x)], [("y", 2), ("mask", 2)],
                   inits=[("r", np.asarray(0.3, np.float32))], opset=13)
    model.graph.output[1].type.tensor_type.elem_type = TensorProto.BOOL
    (y, mask), _, _ = _ours(model, [x])
    np.testing.assert_array_equal(y, x)
    assert mask.dtype == bool and mask.all()


def test_dropout_for_training_drops():
    x = np.ones((50, 40), np.float32)
    model = _model("Dropout", [("x", x)], [("y", 2)],
                   inits=[("r", np.asarray(0.25, np.float32))], opset=13)
    (y,), _, (program, fetches) = _ours(model, [x], for_training=True)
    assert set(np.unique(y)) <= {0.0, np.float32(1 / 0.75)}
    assert 0.15 < (y == 0).mean() < 0.35
    (y_eval,) = progdesc.Executor().run(program.clone(for_test=True), feed={"x": x},
                                        fetch_list=[fetches[0].name])
    np.testing.assert_array_equal(np.asarray(y_eval), x)


# --- Resize ---
@pytest.mark.parametrize("attrs, scales", [
    (dict(mode="linear"), [1, 1, 2, 1.5]),
    (dict(mode="linear", coordinate_transformation_mode="align_corners"), [1, 1, 0.6, 2]),
    (dict(mode="cubic", cubic_coeff_a=-0.5, exclude_outside=1), [1, 1, 1.7, 0.8]),
    (dict(mode="linear", antialias=1), [1, 1, 0.5, 0.6]),
    (dict(mode="nearest", coordinate_transformation_mode="asymmetric",
          nearest_mode="floor"), [1, 1, 2, 3]),
    (dict(mode="nearest", nearest_mode="round_prefer_ceil"), [1, 1, 0.5, 1.5]),
])
def test_resize_matches_onnxruntime(attrs, scales):
    _check("Resize", [("x", _x(1, 2, 5, 6))], [("y", 4)], attrs, opset=18,
           inits=[("roi", np.zeros(0, np.float32)),
                  ("scales", np.asarray(scales, np.float32))], tol=1e-4)


def test_resize_to_sizes_on_axes():
    _check("Resize", [("x", _x(1, 2, 5, 6))], [("y", 4)], dict(mode="linear", axes=[3, 2]),
           opset=18, inits=[("roi", np.zeros(0, np.float32)), ("scales", np.zeros(0, np.float32)),
                            ("sizes", np.asarray([9, 3], np.int64))], tol=1e-4)


# --- attention ---
@pytest.mark.parametrize("attrs, mask, v_head, past", [
    (dict(is_causal=1), False, 6, False),
    (dict(), True, 6, False),
    (dict(softcap=2.0, scale=0.3), True, 6, True),
    (dict(is_causal=1), False, 8, False),        # our fused attention op
    (dict(is_causal=1, scale=0.2), False, 8, True),   # fused, the causal mask after the past
])
def test_attention_matches_the_reference(attrs, mask, v_head, past):
    q, k, v = _x(2, 4, 3, 8), _x(2, 2, 5, 8), _x(2, 2, 5, v_head)   # grouped-query heads
    inputs = [("q", q), ("k", k), ("v", v)]
    inputs.append(("mask", RNG.uniform(size=(3, 9 if past else 5)) > 0.3) if mask else ("", None))
    if past:
        inputs += [("past_k", _x(2, 2, 4, 8)), ("past_v", _x(2, 2, 4, v_head))]
    while inputs[-1][0] == "":
        inputs.pop()
    model = _model("Attention", [i for i in inputs if i[0]], [("y", 4)], attrs, opset=23)
    model.graph.node[0].input[:] = [n for n, _ in inputs]
    feed = [a for n, a in inputs if n]
    ours, _, _ = _ours(model, feed)
    np.testing.assert_allclose(ours[0], _onnx_reference(model, feed)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mask", [False, True])
def test_causal_attention_over_dynamic_lengths(mask):
    """A causal Attention whose query, key and past lengths are symbolic: one program runs
    at two lengths (fused without a mask, composed with one)."""
    names = ["q", "k", "v", "mask" if mask else "", "past_k", "past_v"]
    node = helper.make_node("Attention", names, ["y"], name="att", is_causal=1)
    info = [helper.make_tensor_value_info(n, F32, [2, h, s, 8]) for n, h, s in (
        ("q", 4, "T"), ("k", 2, "T"), ("v", 2, "T"), ("past_k", 2, "P"), ("past_v", 2, "P"))]
    if mask:
        info.append(helper.make_tensor_value_info("mask", TensorProto.BOOL, ["T", "S"]))
    graph = helper.make_graph([node], "g", info, [helper.make_tensor_value_info("y", F32, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)], ir_version=10)
    scope = progdesc.Scope()
    program, feeds, fetches = ponnx.load(model, scope)
    for length, past in ((3, 2), (5, 4)):
        values = {"q": _x(2, 4, length, 8), "k": _x(2, 2, length, 8), "v": _x(2, 2, length, 8),
                  "past_k": _x(2, 2, past, 8), "past_v": _x(2, 2, past, 8),
                  "mask": RNG.uniform(size=(length, length + past)) > 0.3}
        (ours,) = progdesc.Executor().run(program, feed={n: values[n] for n in feeds},
                                          fetch_list=fetches, scope=scope)
        theirs = _onnx_reference(model, [values[i.name] for i in model.graph.input])[0]
        np.testing.assert_allclose(np.asarray(ours), theirs, rtol=1e-5, atol=1e-5)


def test_rotary_embedding_matches_the_reference():
    x = _x(2, 3, 4, 8)
    pos = np.asarray([[0, 2, 1, 5], [3, 3, 0, 1]], np.int64)
    cos, sin = np.cos(_x(6, 4)), np.sin(_x(6, 4))
    for interleaved in (0, 1):
        _check("RotaryEmbedding", [("x", x), ("cos", cos), ("sin", sin), ("pos", pos)],
               [("y", 4)], dict(interleaved=interleaved), opset=23, reference=_onnx_reference)


# --- com.microsoft ---
@pytest.mark.parametrize("op, shapes, attrs", [
    ("Gelu", [(3, 4)], {}),
    ("FastGelu", [(3, 4), (4,)], {}),
    ("BiasGelu", [(3, 4), (4,)], {}),
    ("QuickGelu", [(3, 4)], dict(alpha=1.5)),
    ("FusedMatMul", [(2, 4, 3), (2, 5, 4)], dict(alpha=0.5, transA=1, transB=1)),
])
def test_microsoft_ops_match_onnxruntime(op, shapes, attrs):
    inputs = [(f"i{n}", _x(*s)) for n, s in enumerate(shapes)]
    _check(op, inputs, [("y", len(shapes[0]))], attrs, domain="com.microsoft", tol=1e-4)


def test_microsoft_bias_add():   # onnxruntime has it on CUDA only
    inputs = [("x", _x(2, 3, 4)), ("bias", _x(4)), ("skip", _x(2, 3, 4))]
    _check("BiasAdd", inputs, [("y", 3)], domain="com.microsoft",
           reference=lambda model, feed: [feed[0] + feed[1] + feed[2]])


def test_microsoft_skip_layer_normalizations():
    x, skip, gamma, beta, bias = _x(2, 3, 8), _x(2, 3, 8), _x(8), _x(8), _x(8)
    feed = [("x", x), ("skip", skip), ("gamma", gamma), ("beta", beta), ("bias", bias)]
    _check("SkipLayerNormalization", feed, [("y", 3), ("", 3), ("", 3), ("sum", 3)],
           dict(epsilon=1e-5), domain="com.microsoft", tol=1e-4)
    _check("SkipSimplifiedLayerNormalization", [f for f in feed if f[0] != "beta"],
           [("y", 3), ("", 3), ("", 3), ("sum", 3)], dict(epsilon=1e-5),
           domain="com.microsoft", tol=1e-4)
    _check("SimplifiedLayerNormalization", [("x", x), ("gamma", gamma)], [("y", 3)],
           dict(epsilon=1e-5), domain="com.microsoft", tol=1e-5,
           reference=lambda model, feed: [x / np.sqrt(np.mean(x * x, -1, keepdims=True) + 1e-5)
                                          * gamma])


@pytest.mark.parametrize("activation, params", [
    ("Relu", None), ("LeakyRelu", [0.2]), ("Clip", [-0.5, 0.7]), ("HardSigmoid", [0.3, 0.4])])
def test_microsoft_fused_conv(activation, params):
    attrs = dict(activation=activation, pads=[1, 1, 1, 1], strides=[2, 1])
    if params:
        attrs["activation_params"] = params
    _check("FusedConv", [("x", _x(1, 3, 6, 5))], [("y", 4)], attrs, domain="com.microsoft",
           inits=[("w", _x(4, 3, 3, 3)), ("b", _x(4))], tol=1e-4)


# --- gradients ---
def test_gradient_through_a_conv_model():
    """d <seed, relu(conv(x, w) + b)> / d(w, b) against the same gradients worked out in
    NumPy (the convolution written as a sum of shifted products)."""
    x, w, b = _x(2, 3, 6, 5), _x(4, 3, 3, 2), _x(4)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 0, 1, 1],
                              strides=[2, 1]),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F32, x.shape)],
                              [helper.make_tensor_value_info("y", F32, None)],
                              initializer=[numpy_helper.from_array(w, "w"),
                                           numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    scope = progdesc.Scope()
    program, feeds, (y,) = ponnx.load(model, scope)
    weights = _x(2, 4, 3, 5)
    with progdesc.program_guard(program):
        seed = progdesc.data("seed", list(weights.shape))
        gw, gb = progdesc.gradients([y], [program.global_block().var("w"),
                                          program.global_block().var("b")],
                                    target_gradients=[seed])
    ours = progdesc.Executor().run(program, feed={"x": x, "seed": weights},
                                   fetch_list=[y, gw, gb], scope=scope)

    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (0, 1)))
    taps = {(i, j): xp[:, :, i:i + 5:2, j:j + 5] for i in range(3) for j in range(2)}
    pre = sum(np.einsum("nchw,oc->nohw", tap, w[:, :, i, j]) for (i, j), tap in taps.items())
    pre = pre + b[None, :, None, None]
    np.testing.assert_allclose(np.asarray(ours[0]), np.maximum(pre, 0), rtol=1e-4, atol=1e-4)
    dpre = weights * (pre > 0)
    dw = np.zeros_like(w)
    for (i, j), tap in taps.items():
        dw[:, :, i, j] = np.einsum("nohw,nchw->oc", dpre, tap)
    np.testing.assert_allclose(np.asarray(ours[1]), dw, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(ours[2]), dpre.sum(axis=(0, 2, 3)), rtol=1e-4,
                               atol=1e-4)


# --- refusals ---
@pytest.mark.parametrize("op, inputs, attrs, why", [
    ("Conv", [("x", (1, 2, 4, 4)), ("w", (2, 2, 3, 3))], dict(auto_pad="BOGUS"), "auto_pad"),
    ("MaxPool", [("x", (1, 2, 4, 4))], dict(kernel_shape=[2]), "kernel_shape"),
    ("Resize", [("x", (1, 2, 4, 4)), ("roi", (0,)), ("scales", (4,))], dict(mode="linear"),
     "scales are computed at run time"),
    ("Resize", [("x", (1, 2, 4, 4))], dict(mode="area"), "mode='area'"),
])
def test_refusals_name_the_node(op, inputs, attrs, why):
    model = _model(op, [(n, np.zeros(s, np.float32)) for n, s in inputs], [("y", 4)], attrs,
                   opset=18)
    with pytest.raises(UnsupportedOpError) as info:
        ponnx.load(model, progdesc.Scope())
    assert "the_node" in str(info.value) and why in str(info.value), str(info.value)


def test_imported_cnn_fine_tunes():
    """Conv -> BatchNormalization -> Relu -> GlobalAveragePool imported for training: SGD
    lowers the loss, trains the conv and the batch norm's scale, updates (not trains) the
    running statistics."""
    x = _x(8, 3, 6, 6)
    target = RNG.uniform(0.5, 1.5, (8, 4, 1, 1)).astype(np.float32)
    inits = {"w": _x(4, 3, 3, 3) * 0.3, "s": np.ones(4, np.float32),
             "b": np.zeros(4, np.float32), "m": np.zeros(4, np.float32),
             "v": np.ones(4, np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["n"],
                              name="bn"),
             helper.make_node("Relu", ["n"], ["r"], name="relu"),
             helper.make_node("GlobalAveragePool", ["r"], ["y"], name="gap")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F32, x.shape)],
                              [helper.make_tensor_value_info("y", F32, None)],
                              initializer=[numpy_helper.from_array(v, k)
                                           for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    scope = progdesc.Scope()
    program, feeds, (y,) = ponnx.load(model, scope, for_training=True)
    startup = progdesc.Program()
    with progdesc.program_guard(program, startup):
        label = progdesc.data("label", list(target.shape))
        loss = progdesc.layers.mse_loss(y, label)
        progdesc.optimizer.SGD(learning_rate=0.5).minimize(loss)
    exe = progdesc.Executor()
    exe.run(startup, scope=scope)
    losses = [float(np.asarray(exe.run(program, feed={"x": x, "label": target},
                                       fetch_list=[loss], scope=scope)[0]).reshape(()))
              for _ in range(10)]
    assert losses[-1] < 0.5 * losses[0], losses
    assert not np.allclose(np.asarray(scope.get("s")), 1.0)
    assert not np.allclose(np.asarray(scope.get("m")), 0.0)
    assert {"w", "s", "b"} <= {v.name for v in program.all_parameters()}


def test_resize_and_pooling_keep_a_symbolic_batch():
    """An input of symbolic batch: Resize by scales (1 on the batch), Conv, AveragePool
    with padding: one program runs at two batch sizes."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", auto_pad="SAME_UPPER"),
             helper.make_node("Resize", ["c", "", "scales"], ["r"], name="resize",
                              mode="linear"),
             helper.make_node("AveragePool", ["r"], ["y"], name="pool", kernel_shape=[3, 3],
                              pads=[1, 1, 1, 1])]
    w = _x(2, 3, 3, 3)
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", F32, ["N", 3, 5, 4])],
        [helper.make_tensor_value_info("y", F32, None)],
        initializer=[numpy_helper.from_array(w, "w"),
                     numpy_helper.from_array(np.asarray([1, 1, 2, 1.5], np.float32), "scales")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    scope = progdesc.Scope()
    program, feeds, fetches = ponnx.load(model, scope)
    assert fetches[0].shape[0] == -1
    for n in (1, 3):
        x = _x(n, 3, 5, 4)
        (ours,) = progdesc.Executor().run(program, feed={"x": x}, fetch_list=fetches,
                                          scope=scope)
        np.testing.assert_allclose(np.asarray(ours), _theirs(model, [x])[0], rtol=1e-4,
                                   atol=1e-4)


def test_half_precision_normalizations_keep_float32_statistics():
    """stash_type 1: a float16 input's statistics are computed in float32 (a large mean
    and a small spread, which float16 statistics would lose)."""
    x = (1000 + _x(2, 4, 16)).astype(np.float16)
    s, b = np.ones(16, np.float16), np.zeros(16, np.float16)
    x32 = x.astype(np.float32)
    want = (x32 - x32.mean(-1, keepdims=True)) / np.sqrt(x32.var(-1, keepdims=True) + 1e-5)
    for op, inits, ref in (("LayerNormalization", [("s", s), ("b", b)], want),
                           ("RMSNormalization", [("s", s)],
                            x32 / np.sqrt(np.mean(x32 ** 2, -1, keepdims=True) + 1e-5))):
        model = _model(op, [("x", x)], [("y", 3)], inits=inits, opset=23)
        model.graph.output[0].type.tensor_type.elem_type = TensorProto.FLOAT16
        (y,), _, _ = _ours(model, [x])
        assert y.dtype == np.float16
        np.testing.assert_allclose(y.astype(np.float32), ref, atol=2e-2)


def test_gradients_through_pooling_resize_and_normalization():
    rng = np.random.default_rng(2)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("MaxPool", ["c"], ["m"], kernel_shape=[2, 2], strides=[2, 2],
                              ceil_mode=1),
             helper.make_node("Resize", ["m", "", "scales"], ["r"], mode="cubic"),
             helper.make_node("AveragePool", ["r"], ["a"], kernel_shape=[3, 3],
                              pads=[1, 1, 1, 1]),
             helper.make_node("LayerNormalization", ["a", "g"], ["y"], axis=1)]
    directional_gradient_check(nodes, _x(2, 2, 5, 5, rng=rng),
                               {"w": _x(3, 2, 3, 3, rng=rng), "g": 1 + _x(3, 4, 6, rng=rng)},
                               {"scales": np.asarray([1, 1, 1.5, 2], np.float32)})


def test_gradients_through_masked_attention():
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("Attention", ["x", "k", "v", "mask"], ["y"], is_causal=1,
                              softcap=3.0)]
    directional_gradient_check(nodes, _x(1, 2, 3, 4, rng=rng),
                               {"k": _x(1, 2, 5, 4, rng=rng), "v": _x(1, 2, 5, 4, rng=rng)},
                               {"mask": np.asarray(rng.uniform(size=(3, 5)) > 0.2)})
