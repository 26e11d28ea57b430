"""ONNX If, Loop and Scan imported by progdesc.onnx: values against NumPy and onnxruntime
with a symbolic batch dim at two sizes, gradients against jax.vjp of the same computation
written in JAX, and the loops whose shapes are not static refused by name."""
import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import progdesc as pd
from lowering.errors import BackwardError, UnsupportedOpError
from progdesc import onnx as ponnx

FLOAT, BOOL, INT64 = TensorProto.FLOAT, TensorProto.BOOL, TensorProto.INT64
RNG = np.random.default_rng(3)
W = RNG.normal(scale=0.6, size=(3, 3)).astype(np.float32)
BATCHES = (2, 5)


def _info(name, elem, dims):
    return helper.make_tensor_value_info(name, elem, dims)


def _model(nodes, inputs, outputs, inits=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs,
                              [numpy_helper.from_array(v, k) for k, v in inits])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=8)
    onnx.checker.check_model(model)
    return model


def _const(name, value):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(
        np.asarray(value), name))


def _run_both(model, feed):
    """(progdesc's outputs, onnxruntime's) for one feed of the model (loaded once per
    model: see `_loaded`)."""
    program, fetches, scope = _loaded(model)
    ours = pd.Executor(precision="highest").run(program, feed=feed, fetch_list=fetches,
                                                scope=scope)
    session = onnxruntime.InferenceSession(model.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    return ours, session.run(None, feed)


_LOADED = {}


def _loaded(model):
    key = model.SerializeToString()
    if key not in _LOADED:
        scope = pd.Scope()
        program, _, fetches = ponnx.load(model, scope)
        _LOADED[key] = (program, fetches, scope)
    return _LOADED[key]


def _grads(model, wrt, feed, cotangents):
    """Gradients of the model's outputs, weighted by `cotangents`, w.r.t. initializers."""
    scope = pd.Scope()
    program, _, fetches = ponnx.load(model, scope)
    with pd.program_guard(program):
        seeds = [pd.data(f"seed{k}", list(v.shape), "float32") for k, v in enumerate(fetches)]
        grads = pd.gradients(fetches, [program.global_block().var(n) for n in wrt],
                             target_gradients=seeds)
    feed = dict(feed, **{f"seed{k}": c for k, c in enumerate(cotangents)})
    return program, grads, scope, feed


def _check_grads(model, wrt, feeds, reference):
    """For each feed, the gradients w.r.t. `wrt` (initializer name -> value) against
    jax.vjp of reference(feed, *values)."""
    program = None
    for feed in feeds:
        with jax.default_matmul_precision("highest"):
            outs, vjp = jax.vjp(lambda *v: reference(feed, *v),
                                *[jnp.asarray(v) for v in wrt.values()])
            cts = [RNG.normal(size=o.shape).astype(np.float32) for o in outs]
            want = vjp(tuple(jnp.asarray(c) for c in cts))
        if program is None:
            program, grads, scope, _ = _grads(model, list(wrt), feed, cts)
        fed = dict(feed, **{f"seed{k}": c for k, c in enumerate(cts)})
        got = pd.Executor(precision="highest").run(program, feed=fed, fetch_list=grads,
                                                   scope=scope)
        for g, ref in zip(got, want):
            np.testing.assert_allclose(g, ref, rtol=1e-4, atol=1e-5)


# --- If ---

def _if_model():
    """y = tanh(x @ W) if c else x - x @ W, both branches reading x and W by name."""
    then = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["t0"]),
         helper.make_node("Tanh", ["t0"], ["t1"])],
        "then", [], [_info("t1", FLOAT, ["N", 3])])
    other = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["e0"]),
         helper.make_node("Sub", ["x", "e0"], ["e1"])],
        "else", [], [_info("e1", FLOAT, ["N", 3])])
    node = helper.make_node("If", ["c"], ["y"], name="the_if", then_branch=then,
                            else_branch=other)
    return _model([node], [_info("x", FLOAT, ["N", 3]), _info("c", BOOL, [])],
                  [_info("y", FLOAT, ["N", 3])], [("W", W)])


def _if_reference(feed, w):
    x = feed["x"]
    return (jnp.tanh(x @ w) if feed["c"] else x - x @ w,)


def test_if_with_a_run_time_condition():
    model = _if_model()
    feeds = [{"x": RNG.normal(size=(n, 3)).astype(np.float32), "c": np.array(c)}
             for n in BATCHES for c in (True, False)]
    for feed in feeds:
        ours, theirs = _run_both(model, feed)
        x = feed["x"]
        want = np.tanh(x @ W) if feed["c"] else x - x @ W
        np.testing.assert_allclose(ours[0], want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(ours[0], theirs[0], rtol=1e-5, atol=1e-6)
    _check_grads(model, {"W": W}, feeds, _if_reference)


def test_if_with_a_known_condition_inlines_the_branch_taken():
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [],
                             [_info("t", FLOAT, ["N", 3])])
    other = helper.make_graph([_const("e", np.zeros(2, np.float32))], "else", [],
                              [_info("e", FLOAT, [2])])
    nodes = [_const("c", np.array(True)),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)]
    model = _model(nodes, [_info("x", FLOAT, ["N", 3])], [_info("y", FLOAT, ["N", 3])])
    program, _, _ = ponnx.load(model, pd.Scope())
    assert "cond" not in [op.type for op in program.global_block().ops]
    x = RNG.normal(size=(4, 3)).astype(np.float32)
    ours, theirs = _run_both(model, {"x": x})
    np.testing.assert_allclose(ours[0], np.maximum(x, 0))
    np.testing.assert_allclose(ours[0], theirs[0])


def test_if_whose_branches_disagree_is_refused_with_the_node():
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [],
                             [_info("t", FLOAT, ["N", 3])])
    other = helper.make_graph([_const("e", np.zeros(2, np.float32))], "else", [],
                              [_info("e", FLOAT, [2])])
    node = helper.make_node("If", ["c"], ["y"], name="the_if", then_branch=then,
                            else_branch=other)
    model = _model([node], [_info("x", FLOAT, ["N", 3]), _info("c", BOOL, [])],
                   [_info("y", FLOAT, ["N", 3])])
    with pytest.raises(UnsupportedOpError, match=r"the_if.*different shapes"):
        ponnx.load(model, pd.Scope())


# --- Loop ---

def _loop_body(cond_out_node, scan_out=True):
    """h' = tanh(h @ W + x), reading x and W by name; the scan output is h'."""
    nodes = [helper.make_node("MatMul", ["h", "W"], ["hw"]),
             helper.make_node("Add", ["hw", "x"], ["pre"]),
             helper.make_node("Tanh", ["pre"], ["h_next"]), cond_out_node]
    outs = [_info("cond_out", BOOL, []), _info("h_next", FLOAT, ["N", 3])]
    if scan_out:
        nodes.append(helper.make_node("Identity", ["h_next"], ["h_seen"]))
        outs.append(_info("h_seen", FLOAT, ["N", 3]))
    return helper.make_graph(nodes, "body", [_info("i", INT64, []), _info("cond_in", BOOL, []),
                                             _info("h", FLOAT, ["N", 3])], outs)


def _loop_reference(steps, scanned=True):
    def run(feed, w):
        h, seen = feed["h0"], []
        for _ in range(steps(feed)):
            h = jnp.tanh(h @ w + feed["x"])
            seen.append(h)
        return (h, jnp.stack(seen)) if scanned else (h,)
    return run


@pytest.mark.parametrize("cond", ["absent", "true passed on"])
def test_loop_of_a_known_trip_count_with_scan_outputs(cond):
    body = _loop_body(helper.make_node("Identity", ["cond_in"], ["cond_out"]))
    nodes = [_const("M", np.array(4, np.int64)), _const("go", np.array(True))]
    nodes.append(helper.make_node("Loop", ["M", "" if cond == "absent" else "go", "h0"],
                                  ["h_final", "hs"], body=body))
    model = _model(nodes, [_info("x", FLOAT, ["N", 3]), _info("h0", FLOAT, ["N", 3])],
                   [_info("h_final", FLOAT, ["N", 3]), _info("hs", FLOAT, [4, "N", 3])],
                   [("W", W)])
    program, _, _ = _loaded(model)
    assert "scan" in [op.type for op in program.global_block().ops]
    feeds = [{"x": RNG.normal(size=(n, 3)).astype(np.float32),
              "h0": RNG.normal(size=(n, 3)).astype(np.float32)} for n in BATCHES]
    reference = _loop_reference(lambda feed: 4)
    for feed in feeds:
        ours, theirs = _run_both(model, feed)
        for a, b, c in zip(ours, theirs, reference(feed, W)):
            np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    _check_grads(model, {"W": W}, feeds, reference)


def test_loop_stopped_by_its_condition_within_a_known_bound():
    """A condition the body recomputes (here: an input read by name): a while bounded by
    M, which differentiates."""
    body = _loop_body(helper.make_node("Identity", ["keep"], ["cond_out"]), scan_out=False)
    nodes = [_const("M", np.array(3, np.int64)),
             helper.make_node("Loop", ["M", "go", "h0"], ["h_final"], body=body)]
    model = _model(nodes, [_info("x", FLOAT, ["N", 3]), _info("h0", FLOAT, ["N", 3]),
                           _info("go", BOOL, []), _info("keep", BOOL, [])],
                   [_info("h_final", FLOAT, ["N", 3])], [("W", W)])
    program, _, _ = _loaded(model)
    assert "while" in [op.type for op in program.global_block().ops]
    feeds = [{"x": RNG.normal(size=(n, 3)).astype(np.float32),
              "h0": RNG.normal(size=(n, 3)).astype(np.float32),
              "go": np.array(go), "keep": np.array(keep)}
             for n in BATCHES for go, keep in ((True, True), (True, False), (False, True))]

    def steps(feed):
        return 0 if not feed["go"] else 3 if feed["keep"] else 1

    reference = _loop_reference(steps, scanned=False)
    for feed in feeds:
        ours, theirs = _run_both(model, feed)
        np.testing.assert_allclose(ours[0], reference(feed, W)[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(ours[0], theirs[0], rtol=1e-5, atol=1e-6)
    _check_grads(model, {"W": W}, feeds[:2], reference)


def test_loop_of_int64_max_trips_runs_while_its_condition_holds():
    """INT64_MAX, as exporters write a while loop's trip count, bounds nothing (and does
    not overflow the int32 iteration number)."""
    body = _loop_body(helper.make_node("Identity", ["keep"], ["cond_out"]), scan_out=False)
    nodes = [_const("M", np.array(np.iinfo(np.int64).max, np.int64)),
             helper.make_node("Loop", ["M", "go", "h0"], ["h_final"], body=body)]
    model = _model(nodes, [_info("x", FLOAT, ["N", 3]), _info("h0", FLOAT, ["N", 3]),
                           _info("go", BOOL, []), _info("keep", BOOL, [])],
                   [_info("h_final", FLOAT, ["N", 3])], [("W", W)])
    program, _, _ = _loaded(model)
    loops = [op for op in program.global_block().ops if op.type == "while"]
    assert len(loops) == 1 and loops[0].attr("max_iters") == -1
    for go, steps in ((True, 1), (False, 0)):   # keep is false: one iteration at most
        feed = {"x": RNG.normal(size=(2, 3)).astype(np.float32),
                "h0": RNG.normal(size=(2, 3)).astype(np.float32),
                "go": np.array(go), "keep": np.array(False)}
        ours, theirs = _run_both(model, feed)
        want = _loop_reference(lambda feed: steps, scanned=False)(feed, W)[0]
        np.testing.assert_allclose(ours[0], want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(ours[0], theirs[0], rtol=1e-5, atol=1e-6)


def _runtime_loop(scan_out):
    body = _loop_body(helper.make_node("Identity", ["cond_in"], ["cond_out"]), scan_out)
    outs = [_info("h_final", FLOAT, ["N", 3])] + (
        [_info("hs", FLOAT, ["M", "N", 3])] if scan_out else [])
    node = helper.make_node("Loop", ["M", "", "h0"], [o.name for o in outs], body=body,
                            name="the_loop")
    return _model([node], [_info("x", FLOAT, ["N", 3]), _info("h0", FLOAT, ["N", 3]),
                           _info("M", INT64, [])], outs, [("W", W)])


def test_loop_of_a_run_time_trip_count_runs_but_does_not_differentiate():
    model = _runtime_loop(scan_out=False)
    reference = _loop_reference(lambda feed: int(feed["M"]), scanned=False)
    for n, m in ((2, 3), (5, 6)):
        feed = {"x": RNG.normal(size=(n, 3)).astype(np.float32),
                "h0": RNG.normal(size=(n, 3)).astype(np.float32), "M": np.array(m, np.int64)}
        ours, theirs = _run_both(model, feed)
        np.testing.assert_allclose(ours[0], reference(feed, W)[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(ours[0], theirs[0], rtol=1e-5, atol=1e-6)
    with pytest.raises(BackwardError, match="while"):
        _grads(model, ["W"], {}, [])


def test_scan_outputs_of_a_run_time_trip_count_are_refused_with_the_node():
    with pytest.raises(UnsupportedOpError, match=r"the_loop.*scan outputs"):
        ponnx.load(_runtime_loop(scan_out=True), pd.Scope())


# --- Scan ---

def _scan_model():
    """State s [N, 2]; a [N, T, 2] scanned along axis 1, b [T, N, 2] backwards along axis 0:
    s' = tanh(s * V + a_t - b_t); outputs s' (axis 1) and s' * b_t (backwards, axis 0)."""
    body = helper.make_graph(
        [helper.make_node("Mul", ["s", "V"], ["sv"]), helper.make_node("Add", ["sv", "a_t"], ["p"]),
         helper.make_node("Sub", ["p", "b_t"], ["q"]), helper.make_node("Tanh", ["q"], ["s_next"]),
         helper.make_node("Identity", ["s_next"], ["out1"]),
         helper.make_node("Mul", ["s_next", "b_t"], ["out2"])],
        "body", [_info("s", FLOAT, ["N", 2]), _info("a_t", FLOAT, ["N", 2]),
                 _info("b_t", FLOAT, ["N", 2])],
        [_info("s_next", FLOAT, ["N", 2]), _info("out1", FLOAT, ["N", 2]),
         _info("out2", FLOAT, ["N", 2])])
    node = helper.make_node("Scan", ["s0", "a", "b"], ["s_final", "y1", "y2"], body=body,
                            num_scan_inputs=2, scan_input_axes=[1, 0],
                            scan_input_directions=[0, 1], scan_output_axes=[1, -3],
                            scan_output_directions=[0, 1])
    v = np.array([0.5, -1.2], np.float32)
    return _model([node], [_info("s0", FLOAT, ["N", 2]), _info("a", FLOAT, ["N", "T", 2]),
                           _info("b", FLOAT, ["T", "N", 2])],
                  [_info("s_final", FLOAT, ["N", 2]), _info("y1", FLOAT, ["N", "T", 2]),
                   _info("y2", FLOAT, ["T", "N", 2])], [("V", v)]), v


def _scan_reference(feed, v):
    s, y1, y2 = feed["s0"], [], []
    steps = feed["a"].shape[1]
    for k in range(steps):
        b_t = feed["b"][steps - 1 - k]
        s = jnp.tanh(s * v + feed["a"][:, k] - b_t)
        y1.append(s)
        y2.append(s * b_t)
    return s, jnp.stack(y1, axis=1), jnp.stack(y2[::-1], axis=0)


def test_scan_with_axes_and_directions():
    model, v = _scan_model()
    feeds = []
    for n, steps in ((2, 3), (4, 5)):
        feeds.append({"s0": RNG.normal(size=(n, 2)).astype(np.float32),
                      "a": RNG.normal(size=(n, steps, 2)).astype(np.float32),
                      "b": RNG.normal(size=(steps, n, 2)).astype(np.float32)})
    for feed in feeds:
        ours, theirs = _run_both(model, feed)
        for a, b, c in zip(ours, theirs, _scan_reference(feed, v)):
            np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    _check_grads(model, {"V": v}, feeds, _scan_reference)
