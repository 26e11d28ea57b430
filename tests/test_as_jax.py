"""pd.as_jax: a program as a pure JAX function, under jit, grad, vmap, checkpoint, shard_map
and jax.export.

Forward values are checked against NumPy written from the params dict; gradients of
`jax.grad(fn)` against the program's own compile-time gradients (`pd.gradients`, made by
the gradient makers), which checks each side with the other.
"""
import os
import subprocess
import sys
import textwrap
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

import progdesc as pd
from progdesc import layers, ops
from test_backward import random_program

ROOT = Path(__file__).resolve().parents[1]


def mlp_program():
    """(main, startup, x, label, logits, loss) of a small classifier."""
    main, startup = pd.Program(precision="highest"), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 4])
        label = pd.data("label", [None, 1], "int64")
        logits = layers.fc(layers.fc(x, 8, act="tanh"), 3)
        loss = ops.mean(layers.softmax_with_cross_entropy(logits, label))
    return main, startup, x, label, logits, loss


def cnn_program():
    main, startup = pd.Program(precision="highest"), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 1, 8, 8])
        label = pd.data("label", [None, 1], "int64")
        h = layers.conv2d(x, 4, 3, padding=1)
        h = layers.pool2d(layers.batch_norm(h, act="relu"), 2)
        logits = layers.fc(h, 3)
        loss = ops.mean(layers.softmax_with_cross_entropy(logits, label))
    return main, startup, x, label, logits, loss


def transformer_program():
    main, startup = pd.Program(precision="highest"), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 5, 8])
        label = pd.data("label", [None, 1], "int64")
        h = layers.transformer_encoder_layer(x, 2, 16, dropout_rate=0.0)
        logits = layers.fc(ops.reduce_mean(h, axis=[1]), 3)
        loss = ops.mean(layers.softmax_with_cross_entropy(logits, label))
    return main, startup, x, label, logits, loss


def data_for(x, n=6, seed=0):
    rng = np.random.default_rng(seed)
    shape = [n] + list(x.shape[1:])
    return (rng.normal(size=shape).astype(np.float32),
            rng.integers(0, 3, size=(n, 1)).astype(np.int64))


def started(build, optimizer=None):
    """The built program (trained by `optimizer` if given) and a scope its startup program
    has filled."""
    main, startup, *rest = build()
    if optimizer is not None:
        with pd.program_guard(main, startup):
            optimizer.minimize(rest[-1])
    scope = pd.Scope()
    pd.Executor().run(startup, scope=scope)
    return (main, scope, *rest)


def mlp_numpy(params, x):
    h = np.tanh(x @ np.asarray(params["fc_0.w_0"]) + np.asarray(params["fc_0.b_0"]))
    return h @ np.asarray(params["fc_1.w_0"]) + np.asarray(params["fc_1.b_0"])


def test_fn_is_the_program_forward_eagerly_and_under_jit():
    main, scope, x, label, logits, loss = started(mlp_program)
    fn, params = pd.as_jax(main, [x], [logits], scope)
    assert sorted(params) == ["fc_0.b_0", "fc_0.w_0", "fc_1.b_0", "fc_1.w_0"]
    assert fn.feed_names == ("x",) and fn.fetch_names == (logits.name,) and not fn.needs_rng
    xv, _ = data_for(x)
    (eager,) = fn(params, xv)
    (jitted,) = jax.jit(fn)(params, xv)
    np.testing.assert_allclose(eager, mlp_numpy(params, xv), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(jitted, mlp_numpy(params, xv), rtol=1e-5, atol=1e-6)
    single, _ = pd.as_jax(main, ["x"], logits.name, scope)   # one fetch, not a list
    np.testing.assert_allclose(single(params, xv), eager, rtol=1e-6)
    assert set(fn.param_names) == set(params)
    more = dict(params, unrelated=np.zeros(3))                # any dict with those keys
    np.testing.assert_allclose(single(more, xv), eager, rtol=1e-6)


def test_64_bit_types_follow_the_callers_x64_setting():
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 3])
        wide = ops.cast(x, dtype="float64")
        index = ops.argmax(wide, axis=1)
    fn, params = pd.as_jax(main, [x], [wide, index])
    xv = np.array([[1.0, 3.0, 2.0]], np.float32)
    narrow = jax.jit(fn)(params, xv)
    assert [v.dtype for v in narrow] == [jnp.float32, jnp.int32]
    with jax.enable_x64(True):
        kept = jax.jit(fn)(params, xv)
    assert [v.dtype for v in kept] == [jnp.float64, jnp.int64]
    assert int(narrow[1][0]) == int(kept[1][0]) == 1


def test_vmap_maps_over_a_batch_of_inputs():
    main, scope, x, label, logits, loss = started(mlp_program)
    fn, params = pd.as_jax(main, [x], logits, scope)
    xs = np.random.default_rng(1).normal(size=(3, 5, 4)).astype(np.float32)
    out = jax.vmap(fn, in_axes=(None, 0))(params, xs)
    assert out.shape == (3, 5, 3)
    for k in range(3):
        np.testing.assert_allclose(out[k], mlp_numpy(params, xs[k]), rtol=1e-5, atol=1e-6)


def test_params_are_copies_the_executor_cannot_donate_away():
    main, scope, x, label, logits, loss = started(mlp_program, pd.optimizer.SGD(0.5))
    fn, params = pd.as_jax(main, [x], logits, scope)
    before = {n: np.array(v) for n, v in params.items()}
    xv, yv = data_for(x)
    pd.Executor().run(main, feed={"x": xv, "label": yv}, scope=scope)   # donates the scope's
    assert not np.allclose(scope.get("fc_0.w_0"), before["fc_0.w_0"])
    for name, value in params.items():
        np.testing.assert_array_equal(value, before[name])


def compile_time_gradients(main, scope, loss, params, feeds, run=jax.jit):
    """d loss / d params from the gradient ops `pd.gradients` appends (zeros for what the
    loss does not depend on: batch-norm statistics in training)."""
    grads = pd.gradients(loss, [main.global_block().var(n) for n in params])
    present = [(n, g) for n, g in zip(params, grads) if g is not None]
    grad_fn, values = pd.as_jax(main, list(feeds), [g for _, g in present], scope)
    with jax.default_matmul_precision("highest"):
        found = dict(zip([n for n, _ in present], run(grad_fn)(values, *feeds.values())))
    return {n: found.get(n, np.zeros(np.shape(v), np.float32)) for n, v in params.items()}


@pytest.mark.parametrize("build", [mlp_program, cnn_program, transformer_program],
                         ids=["mlp", "cnn", "transformer"])
def test_jax_grad_equals_the_compile_time_gradients(build):
    main, scope, x, label, logits, loss = started(build)
    fn, params = pd.as_jax(main, [x, label], loss, scope)
    xv, yv = data_for(x)
    x.stop_gradient = False    # data has no gradient unless asked; fn's inputs always do
    expected = compile_time_gradients(main, scope, loss, {**params, "x": xv},
                                      {"x": xv, "label": yv})
    with jax.default_matmul_precision("highest"):
        got, dx = jax.jit(jax.grad(fn, argnums=(0, 1)))(params, xv, yv)
    assert set(got) | {"x"} == set(expected)
    np.testing.assert_allclose(dx, expected.pop("x"), rtol=1e-4, atol=1e-6)
    for name, want in expected.items():
        np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-5, err_msg=name)


def test_grad_under_jit_and_checkpoint():
    main, scope, x, label, logits, loss = started(mlp_program)
    fn, params = pd.as_jax(main, [x, label], loss, scope)
    xv, yv = data_for(x)
    expected = compile_time_gradients(main, scope, loss, params, {"x": xv, "label": yv})
    with jax.default_matmul_precision("highest"):
        jitted = jax.jit(jax.grad(fn))(params, xv, yv)
        remat = jax.jit(jax.grad(jax.checkpoint(fn)))(params, xv, yv)
    for name, want in expected.items():
        np.testing.assert_allclose(jitted[name], want, rtol=1e-5, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(remat[name], want, rtol=1e-5, atol=1e-6, err_msg=name)


def test_jax_grad_equals_the_compile_time_gradients_on_random_programs():
    checked = 0
    for seed in range(60):
        main, _, feed, loss, state = random_program(seed)
        scope = pd.Scope()
        for name, value in state.items():
            scope.set(name, value)
        fn, params = pd.as_jax(main, list(feed), loss, scope)
        with jax.default_matmul_precision("highest"):
            got = jax.grad(fn)(params, *feed.values())
        try:
            # op by op: small programs of few shapes run faster than they compile
            want = compile_time_gradients(main, scope, loss, params, feed, run=lambda f: f)
        except pd.BackwardError as e:     # the loss depends on no parameter: jax agrees
            assert "does not depend" in str(e), seed
            assert not any(np.any(g) for g in got.values()), seed
            continue
        for name, g in got.items():
            np.testing.assert_allclose(want[name], g, rtol=2e-5, atol=2e-6,
                                       err_msg=f"seed {seed}, d{name}\n{main}")
        checked += 1
    assert checked > 40


def dropout_program():
    main, startup = pd.Program(random_seed=3), pd.Program(random_seed=3)
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 64])
        # an op the dropout does not need (fn leaves it out): the dropout keeps its index
        counter = pd.param.create_global_var("counter", [], 0.0)
        main.global_block().append_op("increment", {"X": counter}, {"Out": counter})
        out = layers.dropout(x, 0.5)
    return main, startup, x, out


def test_a_program_that_draws_random_numbers_takes_an_explicit_key():
    main, startup, x, out = dropout_program()
    scope = pd.Scope()
    fn, params = pd.as_jax(main, [x], out, scope)
    assert fn.needs_rng and params == {}
    xv = np.ones((4, 64), np.float32)
    with pytest.raises(pd.FeedError, match="rng=jax.random.key"):
        fn(params, xv)
    key = jax.random.key(7)
    first = np.asarray(jax.jit(fn)(params, xv, rng=key))
    assert set(np.unique(first)) == {0.0, 2.0}                    # dropped, or kept and scaled
    np.testing.assert_array_equal(fn(params, xv, rng=key), first)             # pure
    np.testing.assert_array_equal(fn(params, xv, rng=jax.random.key_data(key)), first)
    assert not np.array_equal(fn(params, xv, rng=jax.random.key(8)), first)
    batched = jax.vmap(partial(fn, rng=key), in_axes=(None, 0))(params, np.stack([xv, xv]))
    np.testing.assert_array_equal(batched[1], first)
    test_fn, _ = pd.as_jax(main.clone(for_test=True), [x], out, scope)
    assert not test_fn.needs_rng
    np.testing.assert_array_equal(test_fn({}, xv), xv)


def test_a_key_draws_what_the_executor_draws_from_that_rng_state():
    main, startup, x, out = dropout_program()
    scope = pd.Scope()
    pd.Executor().run(startup, scope=scope)
    fn, params = pd.as_jax(main, [x], out, scope)
    assert params == {}
    xv = np.random.default_rng(0).normal(size=(4, 64)).astype(np.float32)
    key = jax.random.key(11)
    with jax.enable_x64(True):   # the Executor runs programs with 64-bit types, as fn then does
        got = jax.jit(fn)(params, xv, rng=key)
        scope.set("@RNG_STATE@", np.asarray(jax.random.key_data(key)))
        (want,) = pd.Executor().run(main, feed={"x": xv}, fetch_list=[out], scope=scope)
    np.testing.assert_array_equal(got, want)
    assert float(scope.get("counter")) == 1.0      # the Executor ran the increment


def test_mutable_returns_what_the_program_writes():
    main, startup = pd.Program(precision="highest"), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 3, 2, 2])
        y = layers.batch_norm(x, momentum=0.8)
        loss = ops.mean(ops.square(y))
    scope = pd.Scope()
    pd.Executor().run(startup, scope=scope)
    fn, params = pd.as_jax(main, [x], y, scope, mutable=True)
    assert set(params) == {f"batch_norm_0.{s}" for s in ("w_0", "b_0", "w_1", "w_2")}
    xv = np.random.default_rng(0).normal(size=(5, 3, 2, 2)).astype(np.float32)
    out, updates = jax.jit(fn)(params, xv)
    assert set(updates) == {"batch_norm_0.w_1", "batch_norm_0.w_2"}
    mean, var = xv.mean(axis=(0, 2, 3)), xv.var(axis=(0, 2, 3))
    np.testing.assert_allclose(updates["batch_norm_0.w_1"], 0.2 * mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out, (xv - mean[:, None, None]) / np.sqrt(
        var[:, None, None] + 1e-5), rtol=1e-4, atol=1e-5)
    pure, pure_params = pd.as_jax(main, [x], y, scope)     # only what the fetch needs
    np.testing.assert_allclose(pure(pure_params, xv), out, rtol=1e-6)


def test_a_training_program_becomes_a_pure_training_step():
    main, scope, x, label, logits, loss = started(mlp_program, pd.optimizer.SGD(0.1))
    forward, params = pd.as_jax(main, [x, label], loss, scope)
    # the loss reads no optimizer state; the step reads the learning rate too
    assert sorted(params) == ["fc_0.b_0", "fc_0.w_0", "fc_1.b_0", "fc_1.w_0"]
    step, state = pd.as_jax(main, [x, label], loss, scope, mutable=True)
    assert set(state) > set(params)
    xv, yv = data_for(x)
    value, updates = jax.jit(step)(state, xv, yv)
    np.testing.assert_allclose(value, forward(params, xv, yv), rtol=1e-6)
    with jax.default_matmul_precision("highest"):
        grads = jax.grad(forward)(params, xv, yv)
    for name, g in grads.items():
        np.testing.assert_allclose(updates[name], params[name] - 0.1 * g, rtol=1e-5, atol=1e-6)


def test_an_adam_step_takes_back_its_own_updates_as_the_executor_does():
    main, scope, x, label, logits, loss = started(mlp_program, pd.optimizer.Adam(0.01))
    step, state = pd.as_jax(main, [x, label], loss, scope, mutable=True)
    assert "@LR_STEP@" in state      # an int64 counter: 32-bit in here, where x64 is off
    step = jax.jit(step)
    exe = pd.Executor()
    for seed in range(3):
        xv, yv = data_for(x, seed=seed)
        value, updates = step(state, xv, yv)
        state = dict(state, **updates)
        (want,) = exe.run(main, feed={"x": xv, "label": yv}, fetch_list=[loss], scope=scope)
        np.testing.assert_allclose(value, want, rtol=1e-5)
    for name, value in state.items():
        np.testing.assert_allclose(value, scope.get(name), rtol=1e-5, atol=1e-7, err_msg=name)


def test_jax_export_round_trip_with_a_symbolic_batch():
    main, scope, x, label, logits, loss = started(mlp_program)
    fn, params = pd.as_jax(main, [x], logits, scope)
    batch = jax.export.symbolic_shape("b, 4")
    exported = jax.export.export(jax.jit(fn))(
        jax.tree.map(lambda v: jax.ShapeDtypeStruct(v.shape, v.dtype), params),
        jax.ShapeDtypeStruct(batch, jnp.float32))
    restored = jax.export.deserialize(exported.serialize())
    for n in (2, 7):
        xv = np.random.default_rng(n).normal(size=(n, 4)).astype(np.float32)
        np.testing.assert_allclose(restored.call(params, xv), mlp_numpy(params, xv),
                                   rtol=1e-5, atol=1e-6)


def test_shard_map_on_the_single_device_mesh():
    main, scope, x, label, logits, loss = started(mlp_program)
    fn, params = pd.as_jax(main, [x], logits, scope)
    mesh = Mesh(np.array(jax.devices()[:1]), ("batch",))
    sharded = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=(P(), P("batch")),
                                    out_specs=P("batch")))
    xv, _ = data_for(x)
    np.testing.assert_allclose(sharded(params, xv), mlp_numpy(params, xv), rtol=1e-5, atol=1e-6)


def test_shard_map_data_parallel_gradients_on_four_host_devices():
    """jax.grad of the shards' losses averaged with pmean equals the full batch's compile-time
    gradient."""
    script = textwrap.dedent("""
        import jax, numpy as np
        from jax.sharding import Mesh, PartitionSpec as P
        import progdesc as pd
        from test_as_jax import compile_time_gradients, data_for, mlp_program, started
        assert len(jax.devices()) == 4
        main, scope, x, label, logits, loss = started(mlp_program)
        fn, params = pd.as_jax(main, [x, label], loss, scope)
        mesh = Mesh(np.array(jax.devices()), ("batch",))
        def mean_loss(p, xs, ys):     # each device's loss on its shard, averaged
            return jax.lax.pmean(fn(p, xs, ys), "batch")
        grads = jax.jit(jax.shard_map(jax.grad(mean_loss), mesh=mesh,
                                      in_specs=(P(), P("batch"), P("batch")), out_specs=P()))
        xv, yv = data_for(x, n=8)
        got = grads(params, xv, yv)
        want = compile_time_gradients(main, scope, loss, params, {"x": xv, "label": yv})
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-6)
        print("ok", len(want))
    """)
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'tests'}",
               XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["ok", "4"]


def test_bad_input_is_named():
    main, scope, x, label, logits, loss = started(mlp_program)
    with pytest.raises(pd.FeedError, match="'nope'"):
        pd.as_jax(main, ["nope"], logits, scope)
    with pytest.raises(pd.FetchError, match="'nope'"):
        pd.as_jax(main, [x], "nope", scope)
    with pytest.raises(pd.ScopeError, match="'fc_0.w_0'.*startup"):
        pd.as_jax(main, [x], logits, pd.Scope())
    fn, params = pd.as_jax(main, [x], logits, scope)
    xv, _ = data_for(x)
    with pytest.raises(pd.FeedError, match="takes 1 feeds"):
        fn(params, xv, xv)
    with pytest.raises(pd.FeedError, match="'x'.*shape"):
        fn(params, xv[:, :3])
    with pytest.raises(pd.ScopeError, match="'fc_1.b_0'.*no value"):
        fn({n: v for n, v in params.items() if n != "fc_1.b_0"}, xv)
    with pytest.raises(pd.ScopeError, match=r"'fc_0.w_0'.*float32\[4, 8\]"):
        fn(dict(params, **{"fc_0.w_0": params["fc_0.w_0"].T}), xv)
