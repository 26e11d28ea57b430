"""The `while` op and `control_flow.while_loop`: forward against NumPy loops, the gradient of
a bounded loop against jax.grad and finite differences, serialization, symbolic batches,
printing and the errors a user can cause."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import progdesc as pd
from lowering import progdesc_pb2 as pb
from progdesc import control_flow as cf
from progdesc import layers, ops
from progdesc.param import create_global_var
from source_lines import line_of
from test_control_flow import _error, _fd_check, _program, _run

RNG = np.random.default_rng(1)


def _line_of(fragment):
    return line_of(__file__, fragment)


def _doubling(max_iters=None):
    """x <- 2x + 1 and i <- i + 1 while i < n (fed)."""
    def build(dtype):
        x0 = pd.data("x0", [-1, 2], dtype)
        n = pd.data("n", [], "int32")
        i0 = ops.fill_constant(shape=[], dtype="int32", value=0)
        one = ops.fill_constant(shape=[], dtype="int32", value=1)
        i, x = cf.while_loop(lambda i, x: ops.less_than(i, n),
                             lambda i, x: (i + one, x * 2.0 + 1.0), (i0, x0), max_iters=max_iters)
        return i, x
    return build


@pytest.mark.parametrize("max_iters", [None, 3, 10])
def test_while_forward_matches_a_numpy_loop(max_iters):
    main, (i, x) = _program(_doubling(max_iters))
    assert x.shape == (-1, 2) and i.dtype == "int32"
    x0 = RNG.normal(size=(3, 2)).astype("float32")
    for n in (0, 5):
        got_i, got_x = _run(main, {"x0": x0, "n": np.array(n, np.int32)}, [i, x])
        ref_i, ref_x = 0, x0.copy()
        while ref_i < n and (max_iters is None or ref_i < max_iters):
            ref_i, ref_x = ref_i + 1, ref_x * 2 + 1
        assert int(got_i) == ref_i
        np.testing.assert_allclose(got_x, ref_x, rtol=1e-6)


# --- Newton's method for sqrt(a), bounded so that it is differentiable ---

MAX_ITERS = 12


def _newton(dtype):
    a = pd.data("a", [-1], dtype, stop_gradient=False)
    tol = ops.fill_constant(shape=[], dtype=dtype, value=1e-9)
    root = cf.while_loop(lambda x: ops.greater_than(ops.reduce_max(ops.abs(x * x - a)), tol),
                         lambda x: (x + a / x) * 0.5, a * 0.5 + 0.5, max_iters=MAX_ITERS)
    return ops.reduce_sum(root * root * root), root


def _newton_jax(a):
    """The same loop hand-written as a masked lax.scan."""
    def step(x, _):
        holds = jnp.max(jnp.abs(x * x - a)) > 1e-9
        return jnp.where(holds, (x + a / x) * 0.5, x), None
    root, _ = jax.lax.scan(step, a * 0.5 + 0.5, None, length=MAX_ITERS)
    return jnp.sum(root ** 3)


def test_newton_forward_and_gradient_match_jax_and_the_closed_form():
    main, (loss, root) = _program(_newton, "float64")
    with pd.program_guard(main):
        (ga,) = pd.gradients([loss], [main.global_block().var("a")])
    a = np.array([2.0, 9.0, 0.5, 30.0])
    got_root, got_ga = _run(main, {"a": a}, [root, ga], x64=True)
    np.testing.assert_allclose(got_root, np.sqrt(a), rtol=1e-12)
    with jax.enable_x64(True):
        ref = jax.grad(_newton_jax)(jnp.asarray(a))
    np.testing.assert_allclose(got_ga, ref, rtol=1e-10)
    np.testing.assert_allclose(got_ga, 1.5 * np.sqrt(a), rtol=1e-8)   # d/da a^(3/2)


def test_newton_gradient_matches_finite_differences():
    _fd_check(_newton, {"a": np.array([2.0, 0.7])}, ["a"])


def test_serialization_round_trip_keeps_the_loop_and_its_gradient():
    main, (loss, root) = _program(_newton)
    with pd.program_guard(main):
        (ga,) = pd.gradients([loss], [main.global_block().var("a")])
    feed = {"a": np.array([2.0, 5.0], np.float32)}
    expect = _run(main, feed, [root, ga])
    for again in (pd.Program.from_bytes(main.to_bytes()), pd.Program.from_text(main.to_text())):
        assert again.to_bytes() == main.to_bytes()
        for a, b in zip(_run(again, feed, [root.name, ga.name]), expect):
            np.testing.assert_array_equal(a, b)


def test_export_compiled_runs_a_while_loop_with_a_symbolic_batch(tmp_path):
    from progdesc import export

    main, (i, x) = _program(_doubling())
    path = str(tmp_path / "while.pdx")
    export.export_compiled(path, main, ["x0", "n"], [x], pd.Scope())
    compiled = export.load_compiled(path)
    for batch in (1, 4):
        x0 = RNG.normal(size=(batch, 2)).astype("float32")
        got = compiled(x0, np.array(3, np.int32))
        got = got[0] if isinstance(got, (list, tuple)) else got
        np.testing.assert_allclose(np.asarray(got), ((x0 * 2 + 1) * 2 + 1) * 2 + 1, rtol=1e-6)


def test_print_shows_the_loop_its_body_and_the_reverse_scan_of_its_gradient():
    main, (loss, _) = _program(_newton)
    with pd.program_guard(main):
        pd.gradients([loss], [main.global_block().var("a")])
    text = str(main)
    assert re.search(r"= while\(Init=.*\{block=1, .*max_iters=12\}", text)
    assert re.search(r"^  block 1 \(parent 0\) \{$", text, re.M)
    assert re.search(r"= scan\(.*X=while_0\.stepcarry_0.*reverse=True, length=12\}", text)
    assert re.search(r"^    \S+\.masked_0: float32\[-1\] = where\(", text, re.M)


# --- persistables written inside a loop body ---

def test_a_counter_incremented_in_a_while_body_goes_back_to_the_scope():
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x0, n = pd.data("x0", [2]), pd.data("n", [], "int32")
        count = create_global_var("count", [], 0.0)
        one = ops.fill_constant(shape=[], dtype="int32", value=1)

        def body(i, x):
            main.current_block().append_op("increment", {"X": count}, {"Out": count})
            return i + one, x * 2.0
        i, x = cf.while_loop(lambda i, x: ops.less_than(i, n), body,
                             (ops.fill_constant(shape=[], dtype="int32", value=0), x0))
    assert main.blocks[1].desc.ops[1].type == "increment"
    exe, scope = pd.Executor(), pd.Scope()
    exe.run(startup, scope=scope)
    total = 0
    for n_iters in (3, 0, 5):
        got_i, got_x = exe.run(main, feed={"x0": np.ones(2, np.float32),
                                           "n": np.array(n_iters, np.int32)},
                               fetch_list=[i, x], scope=scope)
        total += n_iters
        assert int(got_i) == n_iters and got_x.tolist() == [2.0 ** n_iters] * 2
        assert float(np.asarray(scope.get("count"))) == total
    again = pd.Program.from_bytes(main.to_bytes())
    exe.run(again, feed={"x0": np.ones(2, np.float32), "n": np.array(2, np.int32)},
            fetch_list=[i.name], scope=scope)
    assert float(np.asarray(scope.get("count"))) == total + 2


def test_batch_norm_in_a_scan_step_updates_its_running_statistics():
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        xs = pd.data("xs", [4, -1, 3])
        _, ys = cf.scan(lambda c, x: (c, layers.batch_norm(x, momentum=0.8, name="bn")),
                        None, xs)
        loss = ops.reduce_sum(ys * ys)
        pd.optimizer.SGD(0.1).minimize(loss)
    exe, scope = pd.Executor(precision="highest"), pd.Scope()
    exe.run(startup, scope=scope)
    xs_v = (RNG.normal(size=(4, 6, 3)) * 2 + 1).astype("float32")
    mean, var = np.zeros(3), np.ones(3)
    for _ in range(2):
        got = exe.run(main, feed={"xs": xs_v}, fetch_list=[ys], scope=scope)[0]
        for t, x in enumerate(xs_v):
            mean = 0.8 * mean + 0.2 * x.mean(axis=0)
            var = 0.8 * var + 0.2 * x.var(axis=0)
        np.testing.assert_allclose(np.asarray(scope.get("bn.w_1")), mean, rtol=1e-5)
        np.testing.assert_allclose(np.asarray(scope.get("bn.w_2")), var, rtol=1e-5)
    assert got.shape == (4, 6, 3)


# --- errors a user can cause ---

def test_the_gradient_of_an_unbounded_loop_is_refused():
    def build():
        x0 = pd.data("x0", [2], stop_gradient=False)
        ten = ops.fill_constant(shape=[], value=10.0)
        x = cf.while_loop(lambda x: ops.less_than(ops.reduce_sum(x), ten),  # unbounded
                          lambda x: x * 2.0, x0)
        pd.gradients([ops.reduce_sum(x)], [x0])
    msg = _error(build, pd.BackwardError)
    assert "'while'" in msg and _line_of("# unbounded") in msg and "max_iters" in msg


def test_a_body_that_changes_a_loop_variable_is_refused():
    def grows():
        x0, t = pd.data("x0", [2]), pd.data("t", [], "bool")
        cf.while_loop(lambda x: t, lambda x: ops.concat([x, x]), x0)  # loop-grows
    msg = _error(grows)
    assert "'while'" in msg and _line_of("# loop-grows") in msg and "block 1" in msg
    assert "float32[2]" in msg and "float32[4]" in msg

    def casts():
        x0, t = pd.data("x0", [2]), pd.data("t", [], "bool")
        cf.while_loop(lambda x: t, lambda x: ops.cast(x, dtype="int32"), x0)  # loop-casts
    msg = _error(casts)
    assert "'while'" in msg and _line_of("# loop-casts") in msg and "int32[2]" in msg


def test_a_condition_that_is_not_a_bool_scalar_is_refused():
    def vector():
        x0 = pd.data("x0", [2])
        cf.while_loop(lambda x: ops.greater_than(x, x0), lambda x: x, x0)  # vector-cond
    msg = _error(vector)
    assert "'while'" in msg and _line_of("# vector-cond") in msg and "bool[2]" in msg
    assert "block 1" in msg

    def floating():
        x0 = pd.data("x0", [2])
        cf.while_loop(lambda x: ops.reduce_sum(x), lambda x: x, x0)  # float-cond
    msg = _error(floating)
    assert "'while'" in msg and _line_of("# float-cond") in msg and "float32[]" in msg


# --- StaticRNN ---

def test_static_rnn_matches_a_numpy_loop_and_its_gradient_matches_jax():
    main = pd.Program()
    with pd.program_guard(main, pd.Program()):
        xs = pd.data("xs", [5, -1, 3], stop_gradient=False)
        h0 = pd.data("h0", [-1, 4], stop_gradient=False)
        w, u = pd.data("w", [4, 4], stop_gradient=False), pd.data("u", [3, 4], stop_gradient=False)
        rnn = cf.StaticRNN()
        with rnn.step():
            x_t = rnn.step_input(xs)
            h = rnn.memory(init=h0)
            new_h = ops.tanh(ops.matmul(h, w) + ops.matmul(x_t, u))
            rnn.update_memory(h, new_h)
            rnn.step_output(new_h)
            rnn.step_output(ops.reduce_sum(new_h, axis=[1]))
        hs, sums = rnn()
        loss = ops.reduce_sum(hs * hs) + ops.reduce_sum(sums)
        grads = pd.gradients([loss], [xs, h0, w, u])
    assert hs.shape == (5, -1, 4) and sums.shape == (5, -1)
    feed = {"xs": RNG.normal(size=(5, 2, 3)).astype("float32"),
            "h0": RNG.normal(size=(2, 4)).astype("float32"),
            "w": (RNG.normal(size=(4, 4)) * 0.5).astype("float32"),
            "u": RNG.normal(size=(3, 4)).astype("float32")}
    got_hs, got_sums, *got_grads = _run(main, feed, [hs, sums] + grads)
    h, expect = feed["h0"], []
    for x in feed["xs"]:
        h = np.tanh(h @ feed["w"] + x @ feed["u"])
        expect.append(h)
    np.testing.assert_allclose(got_hs, np.stack(expect), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_sums, np.stack(expect).sum(axis=2), rtol=1e-5, atol=1e-5)

    def ref(xs, h0, w, u):
        def step(h, x):
            h = jnp.tanh(h @ w + x @ u)
            return h, (h, jnp.sum(h, axis=1))
        _, (hs, sums) = jax.lax.scan(step, h0, xs)
        return jnp.sum(hs * hs) + jnp.sum(sums)

    expect = jax.grad(ref, argnums=(0, 1, 2, 3))(*(feed[n] for n in ("xs", "h0", "w", "u")))
    for a, b in zip(got_grads, expect):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_static_rnn_misuse_is_refused():
    def outside():
        rnn = cf.StaticRNN()
        rnn.step_input(pd.data("xs", [3, 2]))
    assert "inside `with rnn.step():`" in _error(outside, pd.ProgramError)

    def never_updated():
        xs, h0 = pd.data("xs", [3, 2]), pd.data("h0", [2])
        rnn = cf.StaticRNN()
        with rnn.step():
            rnn.step_output(rnn.step_input(xs) + rnn.memory(init=h0))
    msg = _error(never_updated, pd.ProgramError)
    assert "never updated" in msg and "h0.mem" in msg


def test_each_iteration_of_a_while_draws_different_random_numbers():
    main = pd.Program(random_seed=3)
    with pd.program_guard(main, pd.Program()):
        ones = pd.data("ones", [64])
        n = ops.fill_constant(shape=[], dtype="int32", value=4)
        step = ops.fill_constant(shape=[], dtype="int32", value=1)
        _, total = cf.while_loop(lambda i, t: ops.less_than(i, n),
                                 lambda i, t: (i + step, t + layers.dropout(ones, 0.5)),
                                 (ops.fill_constant(shape=[], dtype="int32", value=0), ones * 0.0))
    got = _run(main, {"ones": np.ones(64, np.float32)}, [total])[0]
    assert set(np.unique(got).tolist()) - {0.0, 8.0}   # the same mask 4 times gives only 0 or 8


def test_readme_while_and_static_rnn_example_builds_and_runs():
    import os
    with open(os.path.join(os.path.dirname(__file__), os.pardir, "README.md")) as f:
        section = f.read().split("## Control flow", 1)[1].split("\n## ", 1)[0]
    example = re.findall(r"```python\n(.*?)```", section, re.S)[1]
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        names = {"a": pd.data("a", [-1], stop_gradient=False), "xs": pd.data("xs", [5, -1, 3]),
                 "h0": pd.data("h0", [-1, 64])}
        space = {"cf": cf, "ops": ops, "layers": layers, **names}
        exec(example, space)  # noqa: S102  (the README's own code)
        (ga,) = pd.gradients([ops.reduce_sum(space["root"])], [names["a"]])
    exe, scope = pd.Executor(), pd.Scope()
    exe.run(startup, scope=scope)
    a = np.array([2.0, 9.0], np.float32)
    root, grad, hs = exe.run(main, feed={"a": a, "xs": np.ones((5, 2, 3), np.float32),
                                         "h0": np.zeros((2, 64), np.float32)},
                             fetch_list=[space["root"], ga, space["hs"]], scope=scope)
    np.testing.assert_allclose(root, np.sqrt(a), rtol=1e-5)
    np.testing.assert_allclose(grad, 0.5 / np.sqrt(a), rtol=1e-4)
    assert hs.shape == (5, 2, 64)


@pytest.mark.parametrize("n", [2, 9])
def test_gradient_through_a_loop_with_an_integer_counter(n):
    main = pd.Program()
    with pd.program_guard(main, pd.Program()):
        x0 = pd.data("x0", [-1, 2], stop_gradient=False)
        stop = pd.data("n", [], "int32")
        one = ops.fill_constant(shape=[], dtype="int32", value=1)
        _, x = cf.while_loop(lambda i, x: ops.less_than(i, stop), lambda i, x: (i + one, x * x),
                             (ops.fill_constant(shape=[], dtype="int32", value=0), x0),
                             max_iters=5)
        (g,) = pd.gradients([ops.reduce_sum(x)], [x0])
    xv = np.array([[1.02, 0.97], [0.9, -1.01]], np.float32)
    got_x, got_g = _run(main, {"x0": xv, "n": np.array(n, np.int32)}, [x, g])
    power = 2.0 ** min(n, 5)   # x squared min(n, max_iters) times
    np.testing.assert_allclose(got_x, xv ** power, rtol=1e-5)
    np.testing.assert_allclose(got_g, power * xv ** (power - 1), rtol=1e-4)


def test_a_loaded_loop_whose_condition_is_not_a_bool_scalar_is_refused_when_run():
    main, (i, x) = _program(_doubling(max_iters=4))
    desc = pb.ProgramDesc()
    desc.CopyFrom(main.desc)
    loop = next(o for o in desc.blocks[0].ops if o.type == "while")
    loop.attrs["cond"].s = loop.attrs["carry_in"].strings.values[1]   # x: float32[-1, 2]
    loaded = pd.Program.from_bytes(desc.SerializeToString())
    with pytest.raises(pd.ShapeError) as info:
        _run(loaded, {"x0": np.ones((1, 2), np.float32), "n": np.array(2, np.int32)}, [x.name])
    msg = str(info.value)
    assert "'while'" in msg and "bool scalar" in msg and "float32[1, 2]" in msg
    assert _line_of("i, x = cf.while_loop(") in msg
