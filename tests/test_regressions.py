"""Regression tests for problems found in review (each names what used to go wrong)."""
import os

import jax.numpy as jnp
import numpy as np
import pytest

import progdesc as pd
from progdesc import io, layers, ops
from progdesc.optimizer import SGD


def test_ops_added_to_a_loaded_program_get_fresh_names():
    main = pd.Program()
    with pd.program_guard(main):
        h = ops.tanh(pd.data("x", [1]))
    loaded = pd.Program.from_bytes(main.to_bytes())
    with pd.program_guard(loaded, pd.Program()):
        g = ops.tanh(loaded.global_block().var(h.name))
        layers.fc(g, 2)
    assert g.name != h.name
    out = pd.Executor().run(loaded, feed={"x": np.ones(1, np.float32)}, fetch_list=[h, g],
                            scope=pd.Scope())
    np.testing.assert_allclose(out[0], np.tanh(1.0), rtol=1e-6)   # h keeps its value


def test_block_parents_that_loop_are_a_format_error():
    main = pd.Program()
    with pd.program_guard(main):
        ops.tanh(pd.data("x", [1]))
    main.desc.blocks[0].parent_idx = 0
    with pytest.raises(pd.FormatError, match="parent"):
        pd.Program.from_bytes(main.to_bytes())


def _dropout_model():
    main, startup = pd.Program(random_seed=4), pd.Program(random_seed=4)
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 4])
        out = layers.fc(layers.dropout(layers.fc(x, 16, act="relu"), 0.5), 1)
        loss = ops.mean(ops.square(out))
        test_program = main.clone(for_test=True)
        SGD(0.1).minimize(loss)
    return main, startup, test_program, x, loss


def test_evaluating_does_not_change_the_training_trajectory():
    batch = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
    losses = []
    for evaluate in (False, True):
        main, startup, test_program, x, loss = _dropout_model()
        scope, exe = pd.Scope(), pd.Executor()
        exe.run(startup, scope=scope)
        run = []
        for _ in range(3):
            run.append(exe.run(main, feed={x: batch}, fetch_list=[loss], scope=scope)[0])
            if evaluate:
                exe.run(test_program, feed={x: batch}, fetch_list=[loss.name], scope=scope)
        losses.append(run)
    np.testing.assert_array_equal(losses[0], losses[1])


def test_steps_converts_device_array_feeds():
    main = pd.Program()
    with pd.program_guard(main):
        x = pd.data("x", [2])
        y = ops.scale(x, scale=0.5)
    exe = pd.Executor()
    out, = exe.run(main, feed={x: jnp.arange(6, dtype=jnp.int32).reshape(3, 2)},
                   fetch_list=[y], scope=pd.Scope(), steps=3)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, np.arange(6).reshape(3, 2) * 0.5)


def test_scalar_persistable_cannot_be_redeclared_by_an_op():
    main = pd.Program()
    block = main.global_block()
    block.create_var("count", [], "int64", persistable=True)
    with pytest.raises(pd.ProgramError, match="variable 'count'"):
        block.append_op("fill_constant", {}, {"Out": ["count"]}, {"shape": [5]})


def test_clone_keeps_parameter_settings():
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 3])
        out = layers.fc(x, 1, param_attr=pd.ParamAttr(learning_rate=0.0))
    copy = main.clone()
    with pd.program_guard(copy, startup):
        SGD(0.1).minimize(ops.mean(copy.global_block().var(out.name)))
    scope, exe = pd.Scope(), pd.Executor()
    exe.run(startup, scope=scope)
    before = np.asarray(scope.get("fc_0.w_0")).copy()
    exe.run(copy, feed={"x": np.ones((2, 3), np.float32)}, scope=scope)
    np.testing.assert_array_equal(np.asarray(scope.get("fc_0.w_0")), before)


def test_list_feeds_compile_once():
    main = pd.Program()
    with pd.program_guard(main):
        x = pd.data("x", [3])
        y = ops.exp(x)
    exe, scope = pd.Executor(), pd.Scope()
    for _ in range(4):
        exe.run(main, feed={"x": [0.0, 1.0, 2.0]}, fetch_list=[y], scope=scope)
    exe.run(main, feed={"x": np.zeros(3, np.float64)}, fetch_list=[y], scope=scope)
    assert exe.trace_count == 1


def test_scope_values_replaced_after_a_run_are_checked_and_may_share_buffers():
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 4])
        loss = ops.mean(layers.fc(layers.fc(x, 4), 4))
        SGD(0.1).minimize(loss)
    scope, exe = pd.Scope(), pd.Executor()
    exe.run(startup, scope=scope)
    feed = {x: np.ones((2, 4), np.float32)}
    exe.run(main, feed=feed, fetch_list=[loss], scope=scope)
    scope.set("fc_1.w_0", scope.get("fc_0.w_0"))          # "copy init": one buffer, two names
    exe.run(main, feed=feed, fetch_list=[loss], scope=scope)
    scope.set("fc_0.w_0", np.ones((4, 5), np.float32))
    with pytest.raises(pd.ScopeError, match="variable 'fc_0.w_0'"):
        exe.run(main, feed=feed, fetch_list=[loss], scope=scope)


def test_saving_over_a_file_keeps_its_permissions(tmp_path):
    path = tmp_path / "main.pb"
    path.write_bytes(b"old")
    os.chmod(path, 0o600)
    main = pd.Program()
    with pd.program_guard(main):
        ops.tanh(pd.data("x", [1]))
    io.save_program(main, str(path))
    assert (os.stat(path).st_mode & 0o777) == 0o600


def test_attention_with_a_named_param_attr_names_each_projection():
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 3, 4])
        layers.multi_head_attention(x, num_heads=2, param_attr=pd.ParamAttr(name="attn"))
    names = {p.name for p in main.all_parameters()}
    assert {"attn.query", "attn.key", "attn.value", "attn.output"} <= names
