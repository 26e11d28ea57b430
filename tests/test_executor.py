"""Executor: feed/fetch, caching, startup, dead-op removal, and errors that lose nothing."""
import jax
import numpy as np
import pytest

import progdesc as pd
from progdesc import ops
from progdesc.feeding import with_feed_fetch
from lowering.lower import lower_block


def affine_program():
    """y = x * w + b with persistable w, b initialized by the startup program."""
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 3])
        for prog, value in ((startup, 2.0), (main, None)):
            w = prog.global_block().create_parameter("w", [3])
            b = prog.global_block().create_parameter("b", [3])
            if value is not None:
                prog.global_block().append_op("fill_constant", {}, {"Out": [w]},
                                              {"shape": [3], "value": value})
                prog.global_block().append_op("fill_constant", {}, {"Out": [b]},
                                              {"shape": [3], "value": 0.5})
        y = ops.add(ops.mul(x, w), b)
    return main, startup, x, y


def test_startup_initializes_persistables_and_main_reads_them():
    main, startup, x, y = affine_program()
    scope, exe = pd.Scope(), pd.Executor()
    exe.run(startup, scope=scope)
    assert np.asarray(scope.get("w")).tolist() == [2.0, 2.0, 2.0]
    out, = exe.run(main, feed={"x": np.ones((2, 3), np.float32)}, fetch_list=[y], scope=scope)
    np.testing.assert_allclose(out, np.full((2, 3), 2.5))


def test_feed_and_fetch_by_name_or_variable():
    main, startup, x, y = affine_program()
    scope, exe = pd.Scope(), pd.Executor()
    exe.run(startup, scope=scope)
    a, = exe.run(main, feed={x: np.ones((1, 3))}, fetch_list=[y], scope=scope)
    b, = exe.run(main, feed={"x": np.ones((1, 3))}, fetch_list=[y.name], scope=scope)
    assert np.array_equal(a, b)


def test_same_feed_signature_does_not_retrace():
    main, startup, x, y = affine_program()
    scope, exe = pd.Scope(), pd.Executor()
    exe.run(startup, scope=scope)
    traces = exe.trace_count
    for _ in range(3):
        exe.run(main, feed={"x": np.ones((4, 3), np.float32)}, fetch_list=[y], scope=scope)
    assert exe.trace_count == traces + 1
    exe.run(main, feed={"x": np.ones((5, 3), np.float32)}, fetch_list=[y], scope=scope)
    assert exe.trace_count == traces + 2      # a new batch size is a new signature
    with pd.program_guard(main):
        ops.neg(y)                             # editing the program invalidates the cache
    exe.run(main, feed={"x": np.ones((5, 3), np.float32)}, fetch_list=[y], scope=scope)
    assert exe.trace_count == traces + 3


def test_fetch_by_name_and_by_variable_share_one_compilation():
    main, startup, x, y = affine_program()
    scope, exe = pd.Scope(), pd.Executor()
    exe.run(startup, scope=scope)
    traces = exe.trace_count
    feed = np.ones((2, 3), np.float32)
    exe.run(main, feed={x: feed}, fetch_list=[y], scope=scope)
    exe.run(main, feed={"x": feed}, fetch_list=[y.name], scope=scope)
    assert exe.trace_count == traces + 1


def test_fetch_list_of_other_things_is_a_type_error():
    main, startup, x, y = affine_program()
    scope, exe = pd.Scope(), pd.Executor()
    exe.run(startup, scope=scope)
    with pytest.raises(TypeError, match="fetch_list holds Variables or variable names, got 3"):
        exe.run(main, feed={"x": np.ones((1, 3))}, fetch_list=[3], scope=scope)
    with pytest.raises(TypeError, match="expects a Program, got str"):
        exe.run("main", feed={"x": np.ones((1, 3))}, fetch_list=[y], scope=scope)


def test_switching_scopes_and_replacing_values_between_runs_reads_the_new_values():
    main, startup, x, y = affine_program()
    exe, first, second = pd.Executor(), pd.Scope(), pd.Scope()
    exe.run(startup, scope=first)
    exe.run(startup, scope=second)
    second.set("w", np.full(3, 3.0, np.float32))
    feed = {"x": np.ones((1, 3), np.float32)}
    for _ in range(2):      # the second round takes the cached path
        assert exe.run(main, feed=feed, fetch_list=[y], scope=first)[0].tolist() == [[2.5] * 3]
        assert exe.run(main, feed=feed, fetch_list=[y], scope=second)[0].tolist() == [[3.5] * 3]
    first.set("b", np.zeros(3, np.float32))
    assert exe.run(main, feed=feed, fetch_list=[y], scope=first)[0].tolist() == [[2.0] * 3]
    first.set("b", np.zeros(4, np.float32))
    with pytest.raises(pd.ScopeError, match="variable 'b'"):
        exe.run(main, feed=feed, fetch_list=[y], scope=first)


def test_return_numpy_false_gives_device_arrays():
    main, startup, x, y = affine_program()
    scope, exe = pd.Scope(), pd.Executor()
    exe.run(startup, scope=scope)
    out, = exe.run(main, feed={"x": np.ones((1, 3))}, fetch_list=[y], scope=scope,
                   return_numpy=False)
    assert isinstance(out, jax.Array)


def test_ops_not_needed_by_fetches_or_persistables_are_not_lowered():
    main = pd.Program()
    with pd.program_guard(main):
        x = pd.data("x", [3])
        used = ops.exp(x)
        ops.log(x)  # dead
    desc = with_feed_fetch(main, ("x",), (used.name,))
    lowered = lower_block(desc, 0)
    kept_types = [desc.blocks[0].ops[i].type for i in lowered.kept_ops]
    assert "log" not in kept_types and "exp" in kept_types


def test_float64_feed_is_converted_to_float32():
    main, startup, x, y = affine_program()
    scope, exe = pd.Scope(), pd.Executor()
    exe.run(startup, scope=scope)
    out, = exe.run(main, feed={"x": np.ones((1, 3), np.float64)}, fetch_list=[y], scope=scope)
    assert out.dtype == np.float32


def test_float_feed_into_int64_label_is_refused():
    main = pd.Program()
    with pd.program_guard(main):
        label = pd.data("label", [None, 1], "int64")
        out = ops.neg(label)
    with pytest.raises(pd.FeedError, match="variable 'label'.*float64.*int64"):
        pd.Executor().run(main, feed={"label": np.ones((2, 1))}, fetch_list=[out],
                          scope=pd.Scope())


def test_missing_feed_wrong_shape_and_unknown_names():
    main, startup, x, y = affine_program()
    scope, exe = pd.Scope(), pd.Executor()
    exe.run(startup, scope=scope)
    with pytest.raises(pd.FeedError, match="variable 'x': is needed but not fed"):
        exe.run(main, feed={}, fetch_list=[y], scope=scope)
    with pytest.raises(pd.FeedError, match=r"variable 'x': feed has shape \[2, 4\].*\[-1, 3\]"):
        exe.run(main, feed={"x": np.ones((2, 4))}, fetch_list=[y], scope=scope)
    with pytest.raises(pd.FeedError, match="'nope'"):
        exe.run(main, feed={"nope": np.ones(3)}, fetch_list=[y], scope=scope)
    with pytest.raises(pd.FetchError, match="'missing'"):
        exe.run(main, feed={"x": np.ones((2, 3))}, fetch_list=["missing"], scope=scope)


def test_running_main_before_startup_says_so():
    main, startup, x, y = affine_program()
    with pytest.raises(pd.ScopeError, match="run the startup program first"):
        pd.Executor().run(main, feed={"x": np.ones((1, 3))}, fetch_list=[y], scope=pd.Scope())


def test_failed_run_leaves_the_scope_unchanged():
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [3])
        for prog in (startup, main):
            prog.global_block().create_var("counter", [3], persistable=True)
        startup.global_block().append_op("fill_constant", {}, {"Out": ["counter"]},
                                         {"shape": [3], "value": 1.0})
        main.global_block().append_op("add", {"X": ["counter"], "Y": [x]}, {"Out": ["counter"]})
    scope, exe = pd.Scope(), pd.Executor()
    exe.run(startup, scope=scope)
    exe.run(main, feed={"x": np.ones(3)}, scope=scope)
    before = np.asarray(scope.get("counter")).copy()
    with pytest.raises(pd.FeedError):
        exe.run(main, feed={"x": np.ones(4)}, scope=scope)
    with pytest.raises(pd.FeedError):
        exe.run(main, feed={"x": np.array(["a", "b", "c"])}, scope=scope)
    assert np.array_equal(np.asarray(scope.get("counter")), before)
    exe.run(main, feed={"x": np.ones(3)}, scope=scope)   # the in-place update still works
    assert np.asarray(scope.get("counter")).tolist() == [3.0, 3.0, 3.0]


def test_scope_value_that_does_not_fit_the_program_is_refused():
    main, startup, x, y = affine_program()
    scope = pd.Scope()
    scope.set("w", np.ones(4, np.float32))
    scope.set("b", np.ones(3, np.float32))
    with pytest.raises(pd.ScopeError, match="variable 'w'"):
        pd.Executor().run(main, feed={"x": np.ones((1, 3))}, fetch_list=[y], scope=scope)


def test_many_steps_in_one_call_match_separate_calls():
    def build():
        main, startup = pd.Program(random_seed=1), pd.Program(random_seed=1)
        with pd.program_guard(main, startup):
            x = pd.data("x", [None, 4])
            label = pd.data("label", [None, 1], "int64")
            h = pd.layers.dropout(pd.layers.fc(x, 8, act="relu"), 0.2)
            loss = ops.mean(pd.layers.softmax_with_cross_entropy(pd.layers.fc(h, 3), label))
            pd.optimizer.Adam(0.01).minimize(loss)
        return main, startup, loss

    rng = np.random.default_rng(0)
    xs = rng.normal(size=(5, 6, 4)).astype(np.float32)
    ys = rng.integers(0, 3, size=(5, 6, 1))
    results = []
    for stacked in (False, True):   # one program compiled two ways: float32 products in both
        main, startup, loss = build()
        scope, exe = pd.Scope(), pd.Executor(precision="highest")
        exe.run(startup, scope=scope)
        if stacked:
            losses, = exe.run(main, feed={"x": xs, "label": ys}, fetch_list=[loss],
                              scope=scope, steps=5)
        else:
            losses = np.stack([exe.run(main, feed={"x": xs[i], "label": ys[i]},
                                       fetch_list=[loss], scope=scope)[0] for i in range(5)])
        results.append((losses, np.asarray(scope.get("fc_0.w_0"))))
    np.testing.assert_allclose(results[1][0], results[0][0], rtol=1e-5)
    np.testing.assert_allclose(results[1][1], results[0][1], rtol=1e-5, atol=1e-6)
    with pytest.raises(pd.FeedError, match="leading axis of 5"):
        main, startup, loss = build()
        scope, exe = pd.Scope(), pd.Executor()
        exe.run(startup, scope=scope)
        exe.run(main, feed={"x": xs[:3], "label": ys[:3]}, fetch_list=[loss], scope=scope,
                steps=5)


def test_compiler_options_reach_xla_and_unknown_ones_are_refused():
    main, startup, x, y = affine_program()
    feed = {"x": np.ones((1, 3), np.float32)}
    exe, scope = pd.Executor(compiler_options={"xla_cpu_enable_fast_math": False}), pd.Scope()
    exe.run(startup, scope=scope)
    assert exe.run(main, feed=feed, fetch_list=[y], scope=scope)[0].tolist() == [[2.5] * 3]
    bad = pd.Executor(compiler_options={"no_such_option": 1})
    with pytest.raises(Exception, match="no_such_option"):
        bad.run(main, feed=feed, fetch_list=[y], scope=scope)
    assert exe.run(main, feed=feed, fetch_list=[y], scope=scope)[0].tolist() == [[2.5] * 3]


def int64_counter_program():
    """counter (int64 [3], persistable, starts at 2**40) += x (int64 [3] feed); out = counter."""
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [3], "int64")
        for prog in (startup, main):
            prog.global_block().create_var("counter", [3], "int64", persistable=True)
        startup.global_block().append_op("fill_constant", {}, {"Out": ["counter"]},
                                         {"shape": [3], "value": float(2 ** 40),
                                          "dtype": "int64"})
        main.global_block().append_op("add", {"X": ["counter"], "Y": [x]}, {"Out": ["counter"]})
    return main, startup


def test_int64_feeds_as_numpy_or_device_arrays_keep_64_bits_on_every_run():
    main, startup = int64_counter_program()
    scope, exe = pd.Scope(), pd.Executor()
    exe.run(startup, scope=scope)
    with jax.enable_x64(True):
        device_feed = jax.device_put(np.full(3, 2 ** 33, np.int64))
    expected = 2 ** 40
    for feed in (np.full(3, 2 ** 33, np.int64), device_feed) * 3:   # cold, then cached calls
        out, = exe.run(main, feed={"x": feed}, fetch_list=["counter"], scope=scope)
        expected += 2 ** 33                     # beyond int32: a 32-bit cast would lose it
        assert out.dtype == np.int64 and out.tolist() == [expected] * 3
    assert scope.get("counter").dtype == np.int64
    assert exe.trace_count == 2                # startup and main, once each


def test_device_array_feeds_are_checked_and_a_refused_one_changes_nothing():
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 3])
        for prog in (startup, main):
            prog.global_block().create_var("counter", [3], persistable=True)
        startup.global_block().append_op("fill_constant", {}, {"Out": ["counter"]},
                                         {"shape": [3], "value": 1.0})
        column_sums = ops.reduce_sum(x, axis=[0])
        main.global_block().append_op("add", {"X": ["counter"], "Y": [column_sums]},
                                      {"Out": ["counter"]})
    scope, exe = pd.Scope(), pd.Executor()
    exe.run(startup, scope=scope)
    good = jax.numpy.ones((2, 3), jax.numpy.float32)
    for _ in range(2):                          # the second run takes the cached path
        exe.run(main, feed={"x": good}, scope=scope)
    before = scope.get("counter")
    assert np.asarray(before).tolist() == [5.0, 5.0, 5.0]
    refused = {
        r"feed has shape \[2, 4\].*\[-1, 3\]": jax.numpy.ones((2, 4), jax.numpy.float32),
        r"feed has shape \[3\]": jax.numpy.ones(3, jax.numpy.float32),
        "feed has dtype bool, the variable is float32": jax.numpy.ones((2, 3), bool),
    }
    for message, value in refused.items():
        with pytest.raises(pd.FeedError, match=f"variable 'x': {message}"):
            exe.run(main, feed={"x": value}, scope=scope)
        assert scope.get("counter") is before   # the same, undonated buffer
        assert np.asarray(before).tolist() == [5.0, 5.0, 5.0]
    exe.run(main, feed={"x": good}, scope=scope)
    assert np.asarray(scope.get("counter")).tolist() == [7.0, 7.0, 7.0]


def test_float_device_array_fed_to_an_int64_variable_is_refused():
    main, startup = int64_counter_program()
    scope, exe = pd.Scope(), pd.Executor()
    exe.run(startup, scope=scope)
    exe.run(main, feed={"x": np.ones(3, np.int64)}, scope=scope)
    before = np.asarray(scope.get("counter"))
    with pytest.raises(pd.FeedError, match="variable 'x'.*float32.*int64"):
        exe.run(main, feed={"x": jax.numpy.ones(3, jax.numpy.float32)}, scope=scope)
    assert np.array_equal(np.asarray(scope.get("counter")), before)


def test_feed_of_bfloat16_runs_as_numpy_holds_it():
    """A bfloat16 NumPy array (ml_dtypes: NumPy kind 'V') is a numeric feed."""
    import ml_dtypes
    main = pd.Program()
    with pd.program_guard(main):
        x = pd.data("x", [-1, 3], dtype="bfloat16")
        y = ops.scale(x, scale=2.0)
    value = np.array([[1.5, -2.0, 0.25]], dtype=ml_dtypes.bfloat16)
    out, = pd.Executor().run(main, feed={"x": value}, fetch_list=[y])
    assert out.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(out.astype(np.float32), [[3.0, -4.0, 0.5]])
