"""append_backward and gradients against jax.grad of the lowered forward program.

Random programs come from a seeded generator: chains and diamonds of ops,
variables consumed by several ops, stop_gradient in the middle, integer
side inputs (gather indices, comparison masks). Programs run eagerly through
the lowering pass (no jit), which keeps a few hundred of them fast.
"""
import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import progdesc as pd
from lowering.lower import lower_block
from progdesc import ops
from progdesc.backward import append_backward, gradients
from progdesc.feeding import with_feed_fetch

SHAPE = (3, 4)


@pytest.fixture(autouse=True)
def _float32_products():
    """Both sides of every comparison here at true float32: programs at the "default" policy
    follow JAX's setting, which on a GPU would otherwise be TF32, rounded differently by
    the registered gradients and by jax.grad."""
    with jax.default_matmul_precision("highest"):
        yield


def run_eager(program, feed, fetch, state):
    """Run `program` through the lowering pass without jit; returns the fetched arrays."""
    names = [v.name if isinstance(v, pd.Variable) else v for v in fetch]
    desc = with_feed_fetch(program, tuple(feed), tuple(names))
    lowered = lower_block(desc, 0)
    with jax.enable_x64(True):
        fetched, _ = lowered.fn(tuple(feed.values()), {},
                                {n: state[n] for n in lowered.reads})
    return [np.asarray(v) for v in fetched]


UNARY = ["tanh", "sigmoid", "square", "relu", "softplus", "neg", "silu", "exp_small", "scale"]
BINARY = ["add", "sub", "mul", "maximum", "div_pos", "add_row", "matmul", "where_gt"]


def _apply(rng, name, a, b, side):
    if name == "exp_small":
        return ops.exp(ops.scale(a, scale=0.3))
    if name == "scale":
        return ops.scale(a, scale=rng.uniform(-2, 2), bias=rng.uniform(-1, 1))
    if name in UNARY:
        return getattr(ops, name)(a)
    if name == "div_pos":
        return ops.div(a, ops.scale(ops.square(b), bias=1.0))
    if name == "add_row":
        return ops.add(a, side["row"])
    if name == "matmul":
        return ops.matmul(a, side["square_w"])
    if name == "where_gt":
        return ops.where(ops.greater_than(a, b), a, b)
    return getattr(ops, name)(a, b)


def random_program(seed):
    """(main, params, data names, feed, loss, state) of one random program."""
    rng = random.Random(seed)
    nprng = np.random.default_rng(seed)
    main, startup = pd.Program(), pd.Program()
    state, feed = {}, {}
    with pd.program_guard(main, startup):
        block = main.global_block()
        params = []
        for i in range(rng.randint(1, 3)):
            p = block.create_parameter(f"p{i}", SHAPE)
            state[p.name] = nprng.uniform(-1, 1, SHAPE).astype(np.float32)
            params.append(p)
        w = block.create_parameter("square_w", (4, 4))
        state[w.name] = nprng.uniform(-1, 1, (4, 4)).astype(np.float32)
        row = block.create_parameter("row", (4,))
        state[row.name] = nprng.uniform(-1, 1, (4,)).astype(np.float32)
        x = pd.data("x", SHAPE)
        feed["x"] = nprng.uniform(-1, 1, SHAPE).astype(np.float32)
        idx = pd.data("idx", (3,), "int64")
        feed["idx"] = nprng.integers(0, 3, 3)
        pool = params + [x, ops.gather(params[0], idx)]
        side = {"row": row, "square_w": w}
        for _ in range(rng.randint(2, 8)):
            if rng.random() < 0.4:
                out = _apply(rng, rng.choice(UNARY), rng.choice(pool), None, side)
            else:
                a, b = rng.choice(pool), rng.choice(pool)      # may pick the same var twice
                out = _apply(rng, rng.choice(BINARY), a, b, side)
            if rng.random() < 0.15:
                out.stop_gradient = True
            pool.append(out)
        tail = pool[-rng.randint(1, min(3, len(pool))):]
        total = tail[0] if len(tail) == 1 else ops.sum(tail)
        loss = ops.mean(total)
    return main, params + [w, row], feed, loss, state


def reference_grads(main, loss, params, feed, state):
    """jax.grad of the lowered forward program w.r.t. the parameters."""
    forward = main.clone()
    desc = with_feed_fetch(forward, tuple(feed), (loss.name,))
    lowered = lower_block(desc, 0)
    names = [p.name for p in params]

    def f(values):
        readonly = dict(state, **dict(zip(names, values)))
        (out,), _ = lowered.fn(tuple(feed.values()), {},
                               {n: readonly[n] for n in lowered.reads})
        return out

    with jax.enable_x64(True):
        grads = jax.grad(f)([jnp.asarray(state[n]) for n in names])
    return dict(zip(names, [np.asarray(g) for g in grads]))


def check_random_programs(build, seeds):
    """append_backward's gradients of the programs `build(seed)` makes, against jax.grad."""
    for seed in seeds:
        main, params, feed, loss, state = build(seed)
        expected = reference_grads(main, loss, params, feed, state)
        try:
            pairs = append_backward(loss)
        except pd.BackwardError as e:
            # every parameter may be cut off from the loss: jax agrees the grads are zero
            assert "does not depend" in str(e), seed
            assert all(not np.any(g) for g in expected.values()), seed
            continue
        got = dict(zip([p.name for p, _ in pairs],
                       run_eager(main, feed, [g for _, g in pairs], state)))
        for name, want in expected.items():
            np.testing.assert_allclose(got.get(name, np.zeros_like(want)), want, rtol=2e-5,
                                       atol=2e-6, err_msg=f"seed {seed}, d{name}\n{main}")


@pytest.mark.parametrize("batch", range(10))
def test_random_programs_match_jax_grad(batch):
    check_random_programs(random_program, range(batch * 30, batch * 30 + 30))


def mlp():
    main, startup = pd.Program(), pd.Program()
    rng = np.random.default_rng(0)
    state = {}
    with pd.program_guard(main, startup):
        x = pd.data("x", [5, 3], stop_gradient=False)
        h = x
        for i, (n_in, n_out) in enumerate([(3, 8), (8, 1)]):
            w = main.global_block().create_parameter(f"w{i}", [n_in, n_out])
            b = main.global_block().create_parameter(f"b{i}", [n_out])
            state[w.name] = rng.normal(size=(n_in, n_out)).astype(np.float32)
            state[b.name] = rng.normal(size=(n_out,)).astype(np.float32)
            h = ops.add(ops.matmul(h, w), b)
            if i == 0:
                h = ops.tanh(h)
        loss = ops.mean(ops.square(h))
    feed = {"x": rng.normal(size=(5, 3)).astype(np.float32)}
    return main, x, loss, state, feed


def test_hessian_vector_product_through_gradients_twice():
    main, x, loss, state, feed = mlp()
    w0 = main.global_block().var("w0")
    v = np.random.default_rng(1).normal(size=(3, 8)).astype(np.float32)
    with pd.program_guard(main):
        (gw,) = gradients([loss], [w0])
        vec = pd.data("v", [3, 8])
        (hvp,) = gradients([ops.reduce_sum(ops.mul(gw, vec))], [w0])
    got, = run_eager(main, dict(feed, v=v), [hvp], state)

    forward = mlp()[0]
    desc = with_feed_fetch(forward, ("x",), (loss.name,))
    lowered = lower_block(desc, 0)

    def f(w):
        values = dict(state, w0=w)
        (out,), _ = lowered.fn((feed["x"],), {}, {n: values[n] for n in lowered.reads})
        return out

    with jax.enable_x64(True):
        _, want = jax.jvp(jax.grad(f), (jnp.asarray(state["w0"]),), (jnp.asarray(v),))
    np.testing.assert_allclose(got, np.asarray(want), rtol=1e-4, atol=1e-5)


def test_gradients_wrt_data_and_gradient_penalty():
    main, x, loss, state, feed = mlp()
    with pd.program_guard(main):
        (gx,) = gradients(loss, x)
        penalty = ops.reduce_sum(ops.square(gx))
        (gw,) = gradients(penalty, main.global_block().var("w0"))
    got_gx, got_gw = run_eager(main, feed, [gx, gw], state)

    forward = mlp()[0]
    desc = with_feed_fetch(forward, ("x",), (loss.name,))
    lowered = lower_block(desc, 0)

    def f(xv, w):
        values = dict(state, w0=w)
        (out,), _ = lowered.fn((xv,), {}, {n: values[n] for n in lowered.reads})
        return out

    with jax.enable_x64(True):
        want_gx = jax.grad(f)(feed["x"], state["w0"])
        want_gw = jax.grad(lambda w: jnp.sum(jax.grad(f)(feed["x"], w) ** 2))(state["w0"])
    np.testing.assert_allclose(got_gx, want_gx, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_gw, want_gw, rtol=1e-4, atol=1e-5)


def test_shared_variable_gradients_are_accumulated_with_one_sum():
    main = pd.Program()
    with pd.program_guard(main):
        p = main.global_block().create_parameter("p", [3])
        loss = ops.mean(ops.add(ops.mul(p, p), ops.exp(p)))
        pairs = append_backward(loss)
    assert [op.type for op in main.global_block().ops].count("sum") == 1
    (param, grad), = pairs
    assert grad.name == "p@GRAD" and grad.shape == (3,)
    text = str(main)
    assert "p@GRAD: float32[3] = sum(" in text


def test_no_grad_set_and_stop_gradient_cut_paths():
    main = pd.Program()
    with pd.program_guard(main):
        a = main.global_block().create_parameter("a", [2])
        b = main.global_block().create_parameter("b", [2])
        h = ops.mul(a, b)
        loss = ops.mean(ops.add(h, ops.exp(b)))
        pairs = append_backward(loss, no_grad_set=[h])
    assert {p.name for p, _ in pairs} == {"b"}
    main = pd.Program()
    with pd.program_guard(main):
        a = main.global_block().create_parameter("a", [2])
        a.stop_gradient = True
        b = main.global_block().create_parameter("b", [2])
        loss = ops.mean(ops.mul(a, b))
        assert [p.name for p, _ in append_backward(loss)] == ["b"]


def test_integer_inputs_never_get_gradients():
    main = pd.Program()
    with pd.program_guard(main):
        w = main.global_block().create_parameter("w", [4, 2])
        ids = pd.data("ids", [3], "int64", stop_gradient=False)
        loss = ops.mean(ops.gather(w, ids))
        (gw,), = [g for _, g in append_backward(loss)],
        grads = gradients(loss, [ids, w])
    assert grads[0] is None and grads[1] is not None


def test_backward_errors_name_the_variable():
    main = pd.Program()
    with pd.program_guard(main):
        p = main.global_block().create_parameter("p", [3])
        out = ops.square(p)
        with pytest.raises(pd.BackwardError, match=r"variable 'square_0.out': loss must be a "
                                                   r"scalar \(shape \[\] or \[1\]\), got shape \[3\]"):
            append_backward(out)
        x = pd.data("x", [3])
        lonely = ops.mean(x)
        with pytest.raises(pd.BackwardError, match="variable 'mean_0.out'.*does not depend"):
            append_backward(lonely)
        with pytest.raises(pd.BackwardError, match="not a variable of this program"):
            gradients(lonely, ["nope"])
    empty = pd.Program()
    with pd.program_guard(empty):
        x = pd.data("x", [3])
        with pytest.raises(pd.BackwardError, match="no trainable parameter"):
            append_backward(ops.mean(x))


def test_inputs_that_were_not_broadcast_take_the_result_gradient_without_an_op():
    main = pd.Program()
    with pd.program_guard(main):
        x = pd.data("x", [None, 3])
        w = main.global_block().create_parameter("w", [3, 3])
        b = main.global_block().create_parameter("b", [3])
        h = ops.matmul(x, w)
        y = ops.add(h, b)
        loss = ops.mean(ops.tanh(ops.sum([y, ops.assign(y)])))
        grads = dict((p.name, g) for p, g in append_backward(loss))
    backward = [op for op in main.global_block().ops if op.role == "backward"]
    types = [op.type for op in backward]
    assert types.count("reduce_as") == 1 and "assign" not in types   # only b's row sum
    assert not main.global_block().has_var(h.name + "@GRAD")
    assert grads["w"].name == "w@GRAD" and grads["b"].name == "b@GRAD"

    rng = np.random.default_rng(0)
    feed = {"x": rng.normal(size=(5, 3)).astype(np.float32)}
    state = {"w": rng.normal(size=(3, 3)).astype(np.float32),
             "b": rng.normal(size=(3,)).astype(np.float32)}
    got_w, got_b = run_eager(main, feed, [grads["w"], grads["b"]], state)
    f = lambda w, b: jnp.mean(jnp.tanh(2 * (feed["x"] @ w + b)))  # noqa: E731
    want_w, want_b = jax.grad(f, argnums=(0, 1))(state["w"], state["b"])
    np.testing.assert_allclose(got_w, want_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_b, want_b, rtol=1e-5, atol=1e-6)


def test_inputs_with_unknown_dims_are_still_summed_back_when_broadcast_at_run_time():
    main = pd.Program()
    with pd.program_guard(main):
        x = pd.data("x", [None, 3], stop_gradient=False)
        z = pd.data("z", [None, 3], stop_gradient=False)
        u, v = ops.tanh(x), ops.exp(z)
        loss = ops.mean(ops.mul(u, v))      # x fed with one row broadcasts against z's four
        gx, gz = gradients(loss, [x, z])
    assert gx.name == "x@GRAD" and gz.name == "z@GRAD"
    rng = np.random.default_rng(1)
    feed = {"x": rng.normal(size=(1, 3)).astype(np.float32),
            "z": rng.normal(size=(4, 3)).astype(np.float32)}
    got_x, got_z = run_eager(main, feed, [gx, gz], {})
    f = lambda x, z: jnp.mean(jnp.tanh(x) * jnp.exp(z))  # noqa: E731
    want_x, want_z = jax.grad(f, argnums=(0, 1))(feed["x"], feed["z"])
    assert got_x.shape == (1, 3)
    np.testing.assert_allclose(got_x, want_x, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_z, want_z, rtol=1e-5, atol=1e-6)


def test_a_requested_intermediate_keeps_its_conventional_gradient_name():
    main = pd.Program()
    with pd.program_guard(main):
        x = pd.data("x", [2, 3])
        b = main.global_block().create_parameter("b", [3])
        h = ops.tanh(x)
        loss = ops.mean(ops.add(h, b))
        (gh,) = gradients(loss, [h])
    assert gh.name == h.name + "@GRAD"
    got, = run_eager(main, {"x": np.ones((2, 3), np.float32)}, [gh],
                     {"b": np.zeros(3, np.float32)})
    np.testing.assert_allclose(got, np.full((2, 3), 1 / 6, np.float32), rtol=1e-6)


def test_concat_of_inputs_of_unknown_size_on_the_axis_has_gradients():
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 3])
        y = pd.data("y", [None, 3])
        w = pd.create_parameter([3, 2], attr="w")
        z = ops.concat([ops.tanh(ops.matmul(x, w)), ops.matmul(y, w)], axis=0)   # [-1, 2] twice
        loss = ops.reduce_sum(ops.square(ops.matmul(z, w, transpose_y=True)))
        (param, grad), = pd.append_backward(loss)
        dx, dy = pd.gradients([loss], [x, y])
    exe, scope = pd.Executor(), pd.Scope()
    exe.run(startup, scope=scope)
    rng = np.random.default_rng(0)
    xv, yv = rng.normal(size=(2, 3)), rng.normal(size=(5, 3))   # sizes known only at run time
    wv = np.asarray(scope.get("w"), np.float64)
    got = exe.run(main, feed={"x": xv, "y": yv}, fetch_list=[grad, dx, dy], scope=scope)

    # by hand: z = [tanh(x w); y w], out = z w^T, loss = sum(out^2)
    h = np.tanh(xv @ wv)
    z = np.concatenate([h, yv @ wv])
    dout = 2 * (z @ wv.T)
    dz = dout @ wv
    dpre, dyw = dz[:2] * (1 - h ** 2), dz[2:]
    want_w = dout.T @ z + xv.T @ dpre + yv.T @ dyw
    want_x, want_y = dpre @ wv.T, dyw @ wv.T
    for g, want in zip(got, (want_w, want_x, want_y)):
        np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op_type", ["maximum", "minimum"])
@pytest.mark.parametrize("ties, x_share", [("x", 1.0), ("y", 0.0), ("split", 0.5)])
def test_a_tie_of_maximum_or_minimum_sends_the_gradient_where_ties_says(op_type, ties, x_share):
    x = np.array([[1.0, 2.0, 3.0], [0.0, -1.0, 5.0]], np.float32)
    y = np.array([[1.0, 4.0, 0.0], [0.0, -2.0, 5.0]], np.float32)   # ties at [0,0], [1,0], [1,2]
    main = pd.Program()
    with pd.program_guard(main):
        xv, yv = pd.data("x", [2, 3]), pd.data("y", [2, 3])
        xv.stop_gradient = yv.stop_gradient = False
        out = getattr(ops, op_type)(xv, yv, ties=ties)
        gx, gy = gradients(ops.reduce_sum(ops.scale(out, scale=3.0)), [xv, yv])
    got_x, got_y = pd.Executor().run(main, feed={"x": x, "y": y}, fetch_list=[gx, gy],
                                     scope=pd.Scope())
    x_wins = x > y if op_type == "maximum" else x < y
    want_x = 3.0 * np.where(x == y, x_share, x_wins.astype(np.float32))
    np.testing.assert_array_equal(got_x, want_x)
    np.testing.assert_array_equal(got_y, 3.0 - want_x)
