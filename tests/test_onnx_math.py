"""The ONNX importer's elementwise, activation, reduction, Einsum and Det rows
(progdesc/onnx/rules_math.py, rules_reduce.py, rules_linalg.py): single-node models
built with onnx.helper, run through progdesc.onnx.load and the Executor, against NumPy
formulas or onnxruntime; gradients against jax.grad of a jnp formula; refused
attributes against the error that names the node."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import progdesc as pd
from lowering.errors import UnsupportedOpError
from progdesc import onnx as ponnx
from progdesc import ops
from progdesc.backward import gradients

RNG = np.random.default_rng(0)


def model_of(node, inputs, *, opset=18, initializers=None, outputs=None):
    """A model of `node` (or a list of nodes): `inputs` {name: array} are graph inputs,
    `initializers` {name: array} initializers; the outputs are the nodes' (untyped)."""
    initializers = initializers or {}
    nodes = node if isinstance(node, list) else [node]
    outputs = outputs or [o for n in nodes for o in n.output]
    infos = [helper.make_tensor_value_info(
        n, helper.np_dtype_to_tensor_dtype(np.asarray(v).dtype), np.shape(v))
        for n, v in inputs.items()]
    outs = [helper.make_empty_tensor_value_info(o) for o in outputs]
    graph = helper.make_graph(nodes, "g", infos, outs,
                              [numpy_helper.from_array(np.asarray(v), n)
                               for n, v in initializers.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=10)   # one onnxruntime 1.31 reads


def run(model, inputs):
    """The outputs of `model` run by progdesc on `inputs` ({name: array})."""
    scope = pd.Scope()
    program, feeds, fetches = ponnx.load(model, scope)
    return pd.Executor().run(program, feed={n: inputs[n] for n in feeds},
                             fetch_list=fetches, scope=scope)


def node_out(op, inputs, *, opset=18, initializers=None, **attrs):
    """The single output of one `op` node over graph inputs `inputs` (a dict, in the
    node's input order; a None value leaves that input empty) and `initializers`."""
    initializers = initializers or {}
    names = list(inputs)
    node = helper.make_node(op, [n if inputs[n] is not None else "" for n in names],
                            ["y"], name=f"the_{op.lower()}", **attrs)
    feeds = {n: v for n, v in inputs.items() if v is not None and n not in initializers}
    model = model_of(node, feeds, opset=opset, initializers=initializers)
    return np.asarray(run(model, feeds)[0])


def ort_outs(model, inputs):
    """The outputs of `model` (outputs typed as its first input) from onnxruntime."""
    import onnxruntime
    model = onnx.ModelProto.FromString(model.SerializeToString())
    elem = model.graph.input[0].type.tensor_type.elem_type
    for out in model.graph.output:
        out.CopyFrom(helper.make_tensor_value_info(out.name, elem, None))
    session = onnxruntime.InferenceSession(model.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    return session.run(None, inputs)


X = RNG.standard_normal((3, 4)).astype(np.float32)
ROW = RNG.standard_normal((4,)).astype(np.float32)
POS = RNG.uniform(0.5, 2.0, (3, 4)).astype(np.float32)
UNIT = RNG.uniform(-0.9, 0.9, (3, 4)).astype(np.float32)
erf = np.vectorize(math.erf, otypes=[np.float32])

UNARY = [
    ("Neg", X, np.negative), ("Abs", X, np.abs), ("Sign", X, np.sign),
    ("Reciprocal", POS, np.reciprocal), ("Floor", X * 3, np.floor), ("Ceil", X * 3, np.ceil),
    ("Round", np.array([0.5, 1.5, 2.5, -0.5, -1.5, 1.2], np.float32), np.round),
    ("Sqrt", POS, np.sqrt), ("Exp", X, np.exp), ("Log", POS, np.log), ("Erf", X, erf),
    ("Sin", X, np.sin), ("Cos", X, np.cos), ("Tan", UNIT, np.tan), ("Asin", UNIT, np.arcsin),
    ("Acos", UNIT, np.arccos), ("Atan", X, np.arctan), ("Sinh", X, np.sinh),
    ("Cosh", X, np.cosh), ("Asinh", X, np.arcsinh), ("Acosh", POS + 1, np.arccosh),
    ("Atanh", UNIT, np.arctanh), ("Tanh", X, np.tanh),
    ("Sigmoid", X, lambda x: 1 / (1 + np.exp(-x))),
    ("Softsign", X, lambda x: x / (1 + np.abs(x))),
    ("Softplus", X, lambda x: np.log1p(np.exp(x))),
    ("Relu", np.array([-3, 0, 5], np.int32), lambda x: np.maximum(x, 0)),
    ("Abs", np.array([-3, 0, 5], np.int64), np.abs),
    ("Not", X > 0, np.logical_not),
    ("BitwiseNot", np.array([0, 5, -7], np.int32), np.invert),
    ("IsNaN", np.array([np.nan, 1.0, np.inf], np.float32), np.isnan),
    ("IsInf", np.array([np.nan, 1.0, np.inf, -np.inf], np.float32), np.isinf),
]


def test_unary_against_numpy():
    """Every row of UNARY as a node of one model (one compilation)."""
    nodes = [helper.make_node(op, [f"x{k}"], [f"y{k}"]) for k, (op, _, _) in enumerate(UNARY)]
    inputs = {f"x{k}": x for k, (_, x, _) in enumerate(UNARY)}
    outs = run(model_of(nodes, inputs), inputs)
    for (op, x, ref), out in zip(UNARY, outs):
        out = np.asarray(out)
        np.testing.assert_allclose(out, ref(x).astype(out.dtype), rtol=1e-5, atol=1e-6,
                                   err_msg=f"{op} of {x.dtype}")


@pytest.mark.parametrize("positive,negative,want", [(1, 0, [0, 0, 1, 0]), (0, 1, [0, 0, 0, 1]),
                                                    (0, 0, [0, 0, 0, 0])])
def test_isinf_directions(positive, negative, want):
    x = np.array([np.nan, 1.0, np.inf, -np.inf], np.float32)
    out = node_out("IsInf", {"x": x}, detect_positive=positive, detect_negative=negative)
    np.testing.assert_array_equal(out, np.array(want, bool))


INTS = np.array([[7, -7, 6, -6], [5, -5, 0, 9], [-9, 1, -1, 3]], np.int32)
DIVISORS = np.array([2, 3, -2, -4], np.int32)
BINARY = [
    ("Add", X, ROW, np.add), ("Sub", X, ROW, np.subtract), ("Mul", X, ROW, np.multiply),
    ("Div", X, ROW + 3, np.divide),
    ("Div", INTS, DIVISORS, lambda a, b: np.trunc(a / b).astype(a.dtype)),
    ("Pow", POS, X, np.power), ("Pow", X, np.float32(2.0), np.power),
    ("Pow", np.array([2, 3, -3], np.int32), np.array([10, 5, 3], np.int32), np.power),
    ("Pow", np.array([2, 3, 4], np.int64), np.array([0.5, 2.0, 1.5], np.float32),
     lambda a, b: np.power(a, b).astype(a.dtype)),
    ("Equal", INTS, DIVISORS, np.equal), ("Less", X, ROW, np.less),
    ("LessOrEqual", INTS, DIVISORS, np.less_equal), ("Greater", X, ROW, np.greater),
    ("GreaterOrEqual", INTS, DIVISORS, np.greater_equal),
    ("And", X > 0, ROW > 0, np.logical_and), ("Or", X > 0, ROW > 0, np.logical_or),
    ("Xor", X > 0, ROW > 0, np.logical_xor),
    ("BitwiseAnd", INTS, DIVISORS, np.bitwise_and), ("BitwiseOr", INTS, DIVISORS, np.bitwise_or),
    ("BitwiseXor", INTS, DIVISORS, np.bitwise_xor),
    ("PRelu", X, np.float32([0.1, 0.2, 0.3, 0.4]), lambda x, s: np.where(x < 0, x * s, x)),
]


def test_binary_against_numpy():
    """Every row of BINARY as a node of one model (one compilation)."""
    nodes = [helper.make_node(op, [f"a{k}", f"b{k}"], [f"y{k}"])
             for k, (op, _, _, _) in enumerate(BINARY)]
    inputs = {}
    for k, (_, a, b, _) in enumerate(BINARY):
        inputs[f"a{k}"], inputs[f"b{k}"] = a, np.asarray(b)
    outs = run(model_of(nodes, inputs), inputs)
    for (op, a, b, ref), out in zip(BINARY, outs):
        np.testing.assert_allclose(out, ref(a, b), rtol=1e-5, atol=1e-6,
                                   err_msg=f"{op} of {a.dtype}, {np.asarray(b).dtype}")


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float32])
def test_mod_follows_the_divisor_sign_and_fmod_the_dividend(dtype):
    a, b = INTS.astype(dtype), DIVISORS.astype(dtype)
    np.testing.assert_array_equal(node_out("Mod", {"a": a, "b": b}, fmod=1), np.fmod(a, b))
    if dtype != np.float32:   # ONNX: fmod=0 is for integers
        np.testing.assert_array_equal(node_out("Mod", {"a": a, "b": b}), np.mod(a, b))


def test_bitshift_directions():
    x = np.array([16, 4, 1], np.uint8)
    s = np.array([1, 2, 3], np.uint8)
    np.testing.assert_array_equal(node_out("BitShift", {"x": x, "s": s}, direction="LEFT"), x << s)
    np.testing.assert_array_equal(node_out("BitShift", {"x": x, "s": s}, direction="RIGHT"), x >> s)


def test_variadic_min_max_sum_mean_broadcast():
    a, b, c = X, ROW, np.float32(0.25)
    ins = {"a": a, "b": b, "c": np.asarray(c)}
    np.testing.assert_allclose(node_out("Min", ins), np.minimum(np.minimum(a, b), c))
    np.testing.assert_allclose(node_out("Max", ins), np.maximum(np.maximum(a, b), c))
    np.testing.assert_allclose(node_out("Sum", ins), a + b + c, rtol=1e-6)
    np.testing.assert_allclose(node_out("Mean", ins), (a + b + c) / 3, rtol=1e-6)
    np.testing.assert_allclose(node_out("Max", {"a": a}), a)


def test_clip_with_constant_runtime_and_missing_bounds():
    lo, hi = np.float32(-0.5), np.float32(0.7)
    consts = {"x": X, "lo": lo, "hi": hi}
    np.testing.assert_allclose(node_out("Clip", consts, initializers={"lo": lo, "hi": hi}),
                               np.clip(X, lo, hi))
    np.testing.assert_allclose(node_out("Clip", consts), np.clip(X, lo, hi))
    np.testing.assert_allclose(node_out("Clip", {"x": X, "lo": None, "hi": hi}),
                               np.minimum(X, hi))
    np.testing.assert_allclose(node_out("Clip", {"x": X}), X)
    ints = {"x": INTS, "lo": np.int32(-5), "hi": np.int32(4)}
    np.testing.assert_array_equal(node_out("Clip", ints), np.clip(INTS, -5, 4))


def test_where_cast_castlike():
    cond = X > 0
    np.testing.assert_allclose(node_out("Where", {"c": cond, "a": X, "b": ROW}),
                               np.where(cond, X, ROW))
    floats = np.array([-2.7, -0.5, 0.0, 1.9, 3.2], np.float32)
    np.testing.assert_array_equal(node_out("Cast", {"x": floats}, to=TensorProto.INT32),
                                  floats.astype(np.int32))   # toward zero
    np.testing.assert_array_equal(node_out("Cast", {"x": floats}, to=TensorProto.BOOL),
                                  floats.astype(bool))
    like = np.zeros((1,), np.float16)
    out = node_out("CastLike", {"x": INTS, "like": like})
    assert out.dtype == np.float16
    np.testing.assert_array_equal(out, INTS.astype(np.float16))


ACTIVATIONS = [
    ("Relu", {}), ("LeakyRelu", {"alpha": 0.1}), ("Elu", {"alpha": 0.7}), ("Selu", {}),
    ("Celu", {"alpha": 1.3}), ("ThresholdedRelu", {"alpha": 0.4}),
    ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}), ("HardSwish", {}), ("Softplus", {}),
    ("Softsign", {}), ("Shrink", {"lambd": 0.6, "bias": 0.2}), ("Sigmoid", {}), ("Mish", {}),
]


def test_activations_against_onnxruntime():
    """Every row of ACTIVATIONS as a node of one model, run by progdesc and onnxruntime."""
    x = (X * 2).astype(np.float32)
    nodes = [helper.make_node(op, ["x"], [f"y{k}"], **attrs)
             for k, (op, attrs) in enumerate(ACTIVATIONS)]
    model = model_of(nodes, {"x": x})
    for (op, _), got, want in zip(ACTIVATIONS, run(model, {"x": x}), ort_outs(model, {"x": x})):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=op)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_opset_20(approximate):
    x = X * 2
    cdf = (0.5 * (1 + erf(x / np.sqrt(2))) if approximate == "none" else
           0.5 * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))))
    np.testing.assert_allclose(node_out("Gelu", {"x": x}, opset=20, approximate=approximate),
                               x * cdf, rtol=1e-5, atol=1e-6)


def test_swish_opset_24():
    out = node_out("Swish", {"x": X}, opset=24, alpha=1.5)
    np.testing.assert_allclose(out, X / (1 + np.exp(-1.5 * X)), rtol=1e-5, atol=1e-6)


CUBE = RNG.uniform(0.2, 1.5, (2, 3, 4)).astype(np.float32)
REDUCTIONS = {
    "ReduceSum": lambda x, a, k: np.sum(x, axis=a, keepdims=k),
    "ReduceMean": lambda x, a, k: np.mean(x, axis=a, keepdims=k),
    "ReduceMax": lambda x, a, k: np.max(x, axis=a, keepdims=k),
    "ReduceMin": lambda x, a, k: np.min(x, axis=a, keepdims=k),
    "ReduceProd": lambda x, a, k: np.prod(x, axis=a, keepdims=k),
    "ReduceL1": lambda x, a, k: np.sum(np.abs(x), axis=a, keepdims=k),
    "ReduceL2": lambda x, a, k: np.sqrt(np.sum(x * x, axis=a, keepdims=k)),
    "ReduceLogSum": lambda x, a, k: np.log(np.sum(x, axis=a, keepdims=k)),
    "ReduceLogSumExp": lambda x, a, k: np.log(np.sum(np.exp(x), axis=a, keepdims=k)),
    "ReduceSumSquare": lambda x, a, k: np.sum(x * x, axis=a, keepdims=k),
}


@pytest.mark.parametrize("axes,keepdims", [((1,), 1), ((0, -1), 0), (None, 1)])
@pytest.mark.parametrize("opset", [13, 18])
def test_reductions_axes_as_attribute_and_input(axes, keepdims, opset):
    """Opset 13: axes an attribute (but ReduceSum's, an input); 18: an input."""
    ops_ = sorted(REDUCTIONS)
    as_input = {op: opset >= 18 or op == "ReduceSum" for op in ops_}
    ins = {op: ["x"] + (["axes"] if as_input[op] and axes is not None else []) for op in ops_}
    attrs = {op: {} if as_input[op] or axes is None else {"axes": list(axes)} for op in ops_}
    nodes = [helper.make_node(op, ins[op], [op], keepdims=keepdims, **attrs[op]) for op in ops_]
    init = {} if axes is None else {"axes": np.array(axes, np.int64)}
    outs = run(model_of(nodes, {"x": CUBE}, opset=opset, initializers=init), {"x": CUBE})
    for op, out in zip(ops_, outs):
        np.testing.assert_allclose(out, REDUCTIONS[op](CUBE, axes, bool(keepdims)),
                                   rtol=1e-5, atol=1e-6, err_msg=op)


def test_reduction_noop_empty_set_ints_and_bools():
    empty = np.zeros((0,), np.int64)
    noop = node_out("ReduceSumSquare", {"x": CUBE, "axes": empty}, initializers={"axes": empty},
                    noop_with_empty_axes=1)
    np.testing.assert_allclose(noop, CUBE * CUBE, rtol=1e-6)
    hollow = np.zeros((2, 0, 3), np.float32)
    axis1 = np.array([1], np.int64)
    for op, value in (("ReduceMax", -np.inf), ("ReduceProd", 1), ("ReduceLogSumExp", -np.inf),
                      ("ReduceSum", 0)):
        out = node_out(op, {"x": hollow, "axes": axis1}, initializers={"axes": axis1})
        np.testing.assert_array_equal(out, np.full((2, 1, 3), value, np.float32))
    mean = node_out("ReduceMean", {"x": INTS + 10}, opset=18, keepdims=0)
    assert mean.dtype == np.int32 and mean == np.trunc((INTS + 10).mean())
    flags = X > 0
    np.testing.assert_array_equal(node_out("ReduceMax", {"x": flags}, opset=20, keepdims=0),
                                  flags.any())


@pytest.mark.parametrize("op,ref", [("ArgMax", np.argmax), ("ArgMin", np.argmin)])
def test_argmax_argmin_first_and_last_index(op, ref):
    x = np.array([[1, 3, 3, 0], [2, 2, 0, 0]], np.float32)
    first = node_out(op, {"x": x}, axis=1, keepdims=0)
    np.testing.assert_array_equal(first, ref(x, axis=1))
    last = node_out(op, {"x": x}, axis=-1, keepdims=1, select_last_index=1)
    np.testing.assert_array_equal(last, (3 - ref(x[:, ::-1], axis=1))[:, None])


@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumsum(exclusive, reverse):
    axis = np.array(1, np.int32)
    out = node_out("CumSum", {"x": INTS, "axis": axis}, initializers={"axis": axis},
                   exclusive=exclusive, reverse=reverse)
    x = INTS[:, ::-1] if reverse else INTS
    want = np.cumsum(x, axis=1) - (x if exclusive else 0)
    np.testing.assert_array_equal(out, want[:, ::-1] if reverse else want)


def test_exclusive_cumsum_shifts_rather_than_subtracts():
    x = np.array([1.0, np.inf, 2.0, 1e8, 1.0], np.float32)
    axis = np.array(0, np.int64)
    out = node_out("CumSum", {"x": x, "axis": axis}, initializers={"axis": axis}, exclusive=1)
    np.testing.assert_array_equal(out, np.concatenate([[0], np.cumsum(x)[:-1]]))


@pytest.mark.parametrize("equation,shapes", [
    ("ij,jk->ik", [(2, 3), (3, 4)]), ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("...ij,...jk", [(2, 3, 4), (2, 4, 5)]), ("ii->i", [(3, 3)]), ("ij->", [(2, 3)]),
    ("i,j->ij", [(3,), (4,)]), ("ij,jk,kl->li", [(2, 3), (3, 4), (4, 2)]),
    ("ijk->kji", [(2, 3, 4)]),
])
def test_einsum_against_numpy(equation, shapes):
    xs = {f"x{k}": RNG.standard_normal(s).astype(np.float32) for k, s in enumerate(shapes)}
    out = node_out("Einsum", xs, equation=equation)
    np.testing.assert_allclose(out, np.einsum(equation, *xs.values()), rtol=1e-5, atol=1e-5)


def test_symbolic_batch_dim_at_two_sizes():
    """A `batch` dim_param stays symbolic: ArgMax's last index along it, a reduction and
    CumSum, run at two batch sizes from one import."""
    axis0 = np.array(0, np.int64)
    nodes = [helper.make_node("ArgMax", ["x"], ["last"], axis=0, keepdims=0,
                              select_last_index=1),
             helper.make_node("ReduceLogSumExp", ["x", "axes"], ["lse"], keepdims=0),
             helper.make_node("CumSum", ["x", "axis0"], ["cum"], exclusive=1)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_empty_tensor_value_info(n) for n in ("last", "lse", "cum")],
        [numpy_helper.from_array(np.array([1], np.int64), "axes"),
         numpy_helper.from_array(axis0, "axis0")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    scope = pd.Scope()
    program, feeds, fetches = ponnx.load(model, scope)
    assert program.global_block().var("x").shape[0] == -1
    for batch in (2, 5):
        x = np.round(RNG.standard_normal((batch, 4)), 1).astype(np.float32)
        x[-1] = x[0]   # ties: the last index wins
        last, lse, cum = pd.Executor().run(program, feed={"x": x}, fetch_list=fetches,
                                           scope=scope)
        np.testing.assert_array_equal(last, batch - 1 - np.argmax(x[::-1], axis=0))
        np.testing.assert_allclose(lse, np.log(np.exp(x).sum(axis=1)), rtol=1e-5)
        np.testing.assert_allclose(cum, np.cumsum(x, axis=0) - x, rtol=1e-5, atol=1e-6)


def test_det_and_its_gradient():
    a = (np.eye(3, dtype=np.float32) * 2 + RNG.uniform(-1, 1, (2, 3, 3))).astype(np.float32)
    np.testing.assert_allclose(node_out("Det", {"a": a}), np.linalg.det(a), rtol=1e-5)
    graph = helper.make_graph([helper.make_node("Det", ["A"], ["d"])], "g", [],
                              [helper.make_empty_tensor_value_info("d")],
                              [numpy_helper.from_array(a, "A")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    scope = pd.Scope()
    program, _, (d,) = ponnx.load(model, scope)
    with pd.program_guard(program):
        (ga,) = gradients([ops.reduce_sum(ops.square(d))], [program.global_block().var("A")])
    got, = pd.Executor().run(program, feed={}, fetch_list=[ga], scope=scope)
    want = jax.jit(jax.grad(lambda m: jnp.sum(jnp.linalg.det(m) ** 2)))(a)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_gradients_through_imported_math_against_jax():
    """d loss / d W of softsign(elu(x @ W)) reduced by ReduceLogSumExp, then Mod-free
    arithmetic: progdesc's gradient program against jax.grad of the formula."""
    w = RNG.standard_normal((4, 5)).astype(np.float32)
    nodes = [helper.make_node("Einsum", ["x", "W"], ["h"], equation="ij,jk->ik"),
             helper.make_node("Elu", ["h"], ["e"], alpha=0.5),
             helper.make_node("Softsign", ["e"], ["s"]),
             helper.make_node("Clip", ["s", "lo", ""], ["c"]),
             helper.make_node("ReduceLogSumExp", ["c", "axes"], ["y"], keepdims=0)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
        [helper.make_empty_tensor_value_info("y")],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(np.float32(-0.3), "lo"),
         numpy_helper.from_array(np.array([1], np.int64), "axes")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    scope = pd.Scope()
    program, feeds, (y,) = ponnx.load(model, scope)
    with pd.program_guard(program):
        loss = ops.reduce_sum(ops.mul(y, ops.tanh(y)))
        (gw,) = gradients([loss], [program.global_block().var("W")])
    got, = pd.Executor().run(program, feed={"x": X[:, :4]}, fetch_list=[gw], scope=scope)

    def formula(w):
        h = X[:, :4] @ w
        e = jnp.where(h > 0, h, 0.5 * jnp.expm1(h))
        c = jnp.maximum(e / (1 + jnp.abs(e)), -0.3)
        y = jax.scipy.special.logsumexp(c, axis=1)
        return jnp.sum(y * jnp.tanh(y))
    np.testing.assert_allclose(got, jax.jit(jax.grad(formula))(w), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op,alpha", [("Elu", 0.5), ("Celu", 2.0), ("Selu", 1.5)])
def test_exponential_units_have_finite_gradients_at_large_inputs(op, alpha):
    x = np.array([100.0, -3.0, 0.5], np.float32)
    graph = helper.make_graph([helper.make_node(op, ["X"], ["y"], alpha=alpha)], "g", [],
                              [helper.make_empty_tensor_value_info("y")],
                              [numpy_helper.from_array(x, "X")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    scope = pd.Scope()
    program, _, (y,) = ponnx.load(model, scope)
    with pd.program_guard(program):
        (gx,) = gradients([ops.reduce_sum(y)], [program.global_block().var("X")])
    got, = pd.Executor().run(program, feed={}, fetch_list=[gx], scope=scope)
    slope = alpha * np.exp(-3.0 / alpha) / alpha if op == "Celu" else alpha * np.exp(-3.0)
    want = np.array([1.0, slope, 1.0]) * (1.0507009873554805 if op == "Selu" else 1.0)
    np.testing.assert_allclose(got, want, rtol=1e-5)


S = np.float32([0.3, -0.2, 0.7, 1.3])
COMPOSED = [   # rows made of several ops of ours: (op, attrs, extra inputs (initializers))
    ("Celu", {"alpha": 0.7}, []), ("Shrink", {"lambd": 0.1, "bias": 0.3}, []),
    ("Softsign", {}, []), ("PRelu", {}, [S]), ("Mod", {"fmod": 1}, [S]), ("Mean", {}, [S]),
    ("Clip", {}, [np.float32(-0.5), None]), ("ReduceL2", {}, [np.array([1], np.int64)]),
    ("ReduceLogSumExp", {}, [np.array([0], np.int64)]),
    ("CumSum", {"exclusive": 1, "reverse": 1}, [np.array(1, np.int64)]),
    ("Einsum", {"equation": "ij,kj->ik"}, ["x"]), ("Swish", {"alpha": 1.7}, []),
]


@pytest.mark.parametrize("op,attrs,extra", COMPOSED, ids=[c[0] for c in COMPOSED])
def test_gradients_of_composed_rows_against_finite_differences(op, attrs, extra):
    """d sum(c * y) / d x of the node, by progdesc's gradient program, against central
    differences of the same imported program's forward."""
    names = ["x"] + [e if isinstance(e, str) else "" if e is None else f"in{k}"
                     for k, e in enumerate(extra)]
    init = {f"in{k}": e for k, e in enumerate(extra) if e is not None and not isinstance(e, str)}
    node = helper.make_node(op, names, ["y"], **attrs)
    model = model_of(node, {"x": X}, opset=24, initializers=init)
    scope = pd.Scope()
    program, _, (y,) = ponnx.load(model, scope)
    with pd.program_guard(program):
        c = pd.data("c", list(y.shape))
        loss = ops.reduce_sum(ops.mul(y, c))
        (gx,) = gradients([loss], [program.global_block().var("x")])
    weights = np.linspace(0.5, 1.5, int(np.prod(y.shape)), dtype=np.float32).reshape(y.shape)
    exe = pd.Executor()

    def f(x):
        return float(exe.run(program, feed={"x": x, "c": weights}, fetch_list=[loss],
                             scope=scope)[0])
    x = X * 2
    got, = exe.run(program, feed={"x": x, "c": weights}, fetch_list=[gx], scope=scope)
    want = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        step = np.zeros_like(x)
        step[i] = 1e-3
        want[i] = (f(x + step) - f(x - step)) / 2e-3
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)


def _error_of(op, inputs, **attrs):
    node = helper.make_node(op, list(inputs), ["y"], name="bad_node", **attrs)
    with pytest.raises(UnsupportedOpError) as info:
        run(model_of(node, inputs, opset=20), inputs)
    return info.value


@pytest.mark.parametrize("op,inputs,attrs,why", [
    ("Gelu", {"x": X}, {"approximate": "erf"}, "approximate"),
    ("Cast", {"x": X}, {"to": TensorProto.STRING}, "STRING"),
    ("Cast", {"x": X}, {"to": TensorProto.FLOAT8E4M3FN}, "FLOAT8E4M3FN"),
    ("BitShift", {"x": INTS.astype(np.uint8), "s": DIVISORS.astype(np.uint8)},
     {"direction": "UP"}, "direction"),
    ("ReduceSum", {"x": X, "axes": np.array([1], np.int64)}, {}, "computed at run time"),
    ("CumSum", {"x": X, "axis": np.array(0, np.int64)}, {}, "computed at run time"),
    ("Einsum", {"x": X}, {"equation": "ij,jk->ik"}, "operands"),
    ("ReduceMean", {"x": X}, {"axes": [1]}, "'axes' attribute"),
])
def test_refused_attributes_name_the_node(op, inputs, attrs, why):
    error = _error_of(op, inputs, **attrs)
    assert "bad_node" in str(error) and why in str(error)
    assert [u[0] for u in error.unsupported] == [op]


def test_refusals_are_collected_over_the_whole_graph():
    nodes = [helper.make_node("Cast", ["x"], ["s"], name="to_text", to=TensorProto.STRING),
             helper.make_node("Relu", ["x"], ["r"], name="fine"),
             helper.make_node("Gelu", ["r"], ["y"], name="odd_gelu", approximate="cubic")]
    with pytest.raises(UnsupportedOpError) as info:
        ponnx.load(model_of(nodes, {"x": X}, opset=20, outputs=["s", "y"]), pd.Scope())
    assert [(u[0], u[1]) for u in info.value.unsupported] == [
        ("Cast", "node 'to_text'"), ("Gelu", "node 'odd_gelu'")]


def test_nodes_of_an_opset_before_the_op_are_refused():
    node = helper.make_node("Gelu", ["x"], ["y"], name="early_gelu")
    with pytest.raises(UnsupportedOpError, match="early_gelu"):
        ponnx.load(model_of(node, {"x": X}, opset=18), pd.Scope())


def test_an_onnx_file_of_these_ops_checks(tmp_path):
    node = helper.make_node("Mod", ["a", "b"], ["y"], fmod=0)
    model = model_of(node, {"a": INTS, "b": DIVISORS})
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", TensorProto.INT32, [3, 4]))
    onnx.checker.check_model(model, full_check=True)
    path = tmp_path / "mod.onnx"
    onnx.save(model, path)
    out, = run(str(path), {"a": INTS, "b": DIVISORS})
    np.testing.assert_array_equal(out, ort_outs(model, {"a": INTS, "b": DIVISORS})[0])
