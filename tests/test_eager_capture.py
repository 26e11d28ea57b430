"""Capture, what cannot be recorded, eager parameter initialisation, NumPy constants, and
the recorded program saved, loaded and exported (issue 16 items 1-3)."""
import os
import warnings

import jax
import numpy as np
import pytest

import progdesc as pd
from progdesc import control_flow as cf
from progdesc import export, initializer, io, layers, ops
from source_lines import line_of

HERE = os.path.abspath(__file__)
X = np.random.default_rng(1).normal(size=(6, 3)).astype("float32")


def small_net(x):
    return ops.tanh(layers.fc(x, 2))


def test_capture_returns_an_ordinary_program_that_replays_compiled():
    scope = pd.Scope()
    with pd.scope_guard(scope):
        captured = pd.capture(small_net, X)
        program, feed_names, fetch_vars = captured
        startup = captured.startup_program
        eager_value = fetch_vars[0].numpy()
    assert feed_names == ["x"] and program.global_block().var("x").shape == (-1, 3)
    assert [op.type for op in program.global_block().ops] == ["matmul", "add", "tanh"]
    w, b = scope.get("fc_0.w_0"), scope.get("fc_0.b_0")
    np.testing.assert_allclose(eager_value, np.tanh(X @ w + b), rtol=1e-6)
    other = np.ones((2, 3), "float32")       # another batch size, compiled
    (out,) = pd.Executor().run(program, feed={"x": other}, fetch_list=fetch_vars, scope=scope)
    np.testing.assert_allclose(out, np.tanh(other @ w + b), rtol=1e-6)
    fresh = pd.Scope()                       # the startup program gives the same parameters
    pd.Executor().run(startup, scope=fresh)
    np.testing.assert_array_equal(fresh.get("fc_0.w_0"), w)


def branchy(x):
    y = layers.fc(x, 1)
    if ops.mean(y) > 0:   # a Python `if` on a value
        return y
    return -y


def counted(x):
    n = ops.reduce_sum(ops.fill_constant(shape=[2], dtype="int64", value=1.0))
    for _ in range(n):    # `range` on a value
        x = x * 2.0
    return x


def reads_loss(x):
    loss = ops.mean(layers.fc(x, 1))
    print(float(loss))
    return loss


def test_python_decisions_on_values_are_errors_naming_the_line():
    with pd.scope_guard(pd.Scope()):
        with pytest.raises(TypeError):   # comparisons are not ops: Python refuses `>`
            pd.capture(branchy, X)

        def if_on_tensor(x):
            y = ops.mean(layers.fc(x, 1))
            if y:
                return y
            return -y

        with pytest.raises(pd.RecordingError) as e:
            pd.capture(if_on_tensor, X)
        assert line_of(HERE, "            if y:") in str(e.value)
        assert "bool()" in str(e.value) and "pd.control_flow.cond" in str(e.value)

        with pytest.raises(pd.RecordingError) as e:
            pd.capture(counted, X)
        assert line_of(HERE, "for _ in range(n):") in str(e.value)
        assert "while_loop" in str(e.value)

        with pytest.raises(pd.RecordingError) as e:
            pd.capture(reads_loss, X)
        assert line_of(HERE, "print(float(loss))") in str(e.value)
        assert ".numpy()" in str(e.value)
    assert not pd.eager.active and not pd.eager.recording


def test_control_flow_ops_record_both_branches_and_run_eagerly():
    def both_branches(x):
        y = ops.mean(x)
        return cf.cond(ops.greater_than(y, ops.fill_constant(shape=[], value=0.0)),
                       lambda: y * 2.0, lambda: -y)

    with pd.scope_guard(pd.Scope()):
        program, _, (out,) = pd.capture(both_branches, X)
        assert float(out.numpy()) == pytest.approx(abs(X.mean()) * (2 if X.mean() > 0 else 1))
        (neg,) = pd.Executor().run(program, feed={"x": -np.abs(X)}, fetch_list=[out])
    assert float(neg) == pytest.approx(np.abs(X).mean(), rel=1e-6)


def test_reading_values_is_allowed_and_changes_nothing():
    def looks(x):
        y = layers.fc(x, 2)
        before = y.block.program.desc.SerializeToString()
        shown = repr(y), y.numpy(), repr(x)
        assert y.block.program.desc.SerializeToString() == before
        assert "fc_0.out" in shown[0] and shown[1].shape == (6, 2)
        return y

    with pd.scope_guard(pd.Scope()):
        pd.capture(looks, X)


def test_plain_eager_mode_gives_python_values_and_warns_on_decisions():
    main, startup = pd.Program(), pd.Program()
    with pd.scope_guard(pd.Scope()), pd.program_guard(main, startup), pd.eager():
        x = pd.data("x", [None, 3], value=X)
        m = ops.mean(x)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert float(m) == pytest.approx(X.mean(), rel=1e-6)   # printing: no warning
        with pytest.warns(pd.RecordingWarning, match="only\\s+the branch") as caught:
            assert bool(ops.greater_than(m, ops.fill_constant(shape=[], value=-9.0)))
        assert caught[0].filename == HERE   # attributed to this line: warned once per line
        with pytest.raises(pd.RecordingError, match="one element"):
            float(x)
    with pytest.raises(pd.RecordingError, match="has no value"):
        float(m.block.program.clone().global_block().var(m.name))


def test_outside_eager_mode_variables_have_no_value():
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        out = layers.fc(pd.data("x", [None, 3]), 2)
        loss = ops.mean(out)
    with pytest.raises(pd.RecordingError) as e:
        float(loss)
    assert "fetch_list" in str(e.value) and "pd.eager()" in str(e.value)
    with pytest.raises(pd.RecordingError):
        bool(loss)
    scope = pd.Scope()   # a parameter's value is the one in the current Scope
    pd.Executor().run(startup, scope=scope)
    with pd.scope_guard(scope):
        weight = main.global_block().var("fc_0.w_0")
        np.testing.assert_array_equal(weight.numpy(), scope.get("fc_0.w_0"))
    with pd.scope_guard(pd.Scope()), pytest.raises(pd.RecordingError, match="has no value"):
        weight.numpy()   # a Scope without it


def test_an_op_that_cannot_run_is_taken_back():
    main = pd.Program()
    with pd.scope_guard(pd.Scope()), pd.program_guard(main, pd.Program()), pd.eager():
        x = pd.data("x", [None, 3])   # no value
        before = main.desc.SerializeToString()
        with pytest.raises(pd.FeedError) as e:
            ops.tanh(x)
        assert "value=array" in str(e.value) and line_of(HERE, "ops.tanh(x)") in str(e.value)
        assert main.desc.SerializeToString() == before
        with pytest.raises(pd.ShapeError):   # a constant made for an op goes with it
            ops.add(ops.fill_constant(shape=[2], value=1.0), np.ones(3, "float32"))
        assert main.desc.blocks[0].ops[-1].type == "fill_constant"
        with pytest.raises(pd.FeedError, match=r"expects \[-1, 3\]"):
            pd.data("z", [None, 3], value=np.zeros((2, 4), "float32"))
        assert main.global_block().find_var("z") is None


def test_eager_parameter_initialisation_equals_the_startup_program():
    main, startup = pd.Program(random_seed=5), pd.Program(random_seed=11)
    scope = pd.Scope()
    with pd.scope_guard(scope), pd.program_guard(main, startup), pd.eager():
        image = pd.data("image", [None, 2, 5, 5], value=np.ones((1, 2, 5, 5), "float32"))
        ids = pd.data("ids", [None, 1], "int64", value=np.zeros((1, 1), "int64"))
        h = layers.conv2d(image, 3, 3)
        layers.fc(h, 4, param_attr=initializer.Normal(0.5, 2.0))
        layers.fc(h, 4, param_attr=initializer.Uniform(-3, 3))
        layers.fc(h, 4, param_attr=initializer.TruncatedNormal(std=0.1))
        layers.embedding(ids, [10, 6])
        layers.layer_norm(h)
        layers.fc(layers.dropout(h, 0.5), 2)
    params = [v.name for v in main.all_parameters()]
    assert len(params) == 13
    fresh = pd.Scope()
    pd.Executor().run(startup, scope=fresh)
    for name in params:
        np.testing.assert_array_equal(scope.get(name), fresh.get(name), err_msg=name)


def test_numpy_arrays_become_constants_of_the_program():
    offset = np.arange(3, dtype=np.float64)
    main = pd.Program()
    with pd.scope_guard(pd.Scope()), pd.program_guard(main, pd.Program()), pd.eager():
        x = pd.data("x", [None, 3], value=X)
        y = x + offset                       # operator: the constant takes x's dtype
        z = offset * y                       # NumPy on the left defers to the Variable
        w = ops.matmul(z, np.eye(3, dtype=np.float32))   # an op input
        np.testing.assert_allclose(w.numpy(), offset * (X + offset), rtol=1e-6)
        with pytest.warns(pd.LargeConstantWarning, match="feed it instead") as caught:
            ops.tanh(np.zeros(5000, "float32"))
        assert caught[0].filename == HERE
    assert [op.type for op in main.global_block().ops].count("assign_value") == 4
    constant = main.global_block().ops[0]
    assert constant.attr("dtype") == "float32" and constant.attr("values") == (0.0, 1.0, 2.0)
    (replayed,) = pd.Executor().run(main, feed={"x": 2 * X}, fetch_list=[w])
    np.testing.assert_allclose(replayed, offset * (2 * X + offset), rtol=1e-6)


def test_recorded_program_saves_loads_and_exports(tmp_path):
    scope = pd.Scope()
    with pd.scope_guard(scope):
        program, feed_names, (out,) = pd.capture(small_net, X)
        expected = out.numpy()
    io.save_program(program, tmp_path / "main.pb")
    loaded = io.load_program(tmp_path / "main.pb")
    assert loaded.to_bytes() == program.to_bytes()
    (again,) = pd.Executor().run(loaded, feed={"x": X}, fetch_list=[out.name], scope=scope)
    np.testing.assert_allclose(again, expected, rtol=1e-6)
    io.save_checkpoint(tmp_path / "ckpt.safetensors", program, scope)
    restored = pd.Scope()
    io.load_checkpoint(tmp_path / "ckpt.safetensors", program, restored)
    np.testing.assert_array_equal(restored.get("fc_0.w_0"), scope.get("fc_0.w_0"))
    export.export_compiled(tmp_path / "net.pdx", program, feed_names, [out], scope,
                           platforms=(jax.export.default_export_platform(),))   # called here
    (exported,) = export.load_compiled(tmp_path / "net.pdx")(X[:4])
    np.testing.assert_allclose(exported, expected[:4], rtol=1e-6)


def test_custom_ops_run_eagerly_and_a_replaced_definition_is_used():
    from progdesc import custom_op

    def define(factor):
        @custom_op.op("eager_test_scale", inputs=[custom_op.In("X", "float")],
                      outputs=[custom_op.Out("Out")], replace=True)
        def rule(X):
            return X * factor

    try:
        define(3.0)
        main = pd.Program()
        with pd.scope_guard(pd.Scope()), pd.program_guard(main, pd.Program()), pd.eager():
            x = pd.data("x", [None, 3], value=X)
            np.testing.assert_allclose(ops.eager_test_scale(x).numpy(), 3 * X, rtol=1e-6)
            define(5.0)
            np.testing.assert_allclose(ops.eager_test_scale(x).numpy(), 5 * X, rtol=1e-6)
    finally:
        custom_op.unregister("eager_test_scale")
