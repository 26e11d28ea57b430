"""Executor(check_numerics=True): op by op, stopped at the first NaN or Inf, naming its op.

A clean program gives what the compiled Executor gives (fetched values and
everything written to the Scope, random ops and sub-blocks included); a bad
one names the op, its index, the line that created it, the bad output and the
forward op of a gradient op, and leaves the Scope as it was.
"""
import math

import numpy as np
import pytest

import progdesc as pd
from lowering import progdesc_pb2 as pb
from lowering.desc import FORWARD_OP
from progdesc import control_flow as cf
from progdesc import layers, ops
from source_lines import line_of

RNG = np.random.default_rng(0)


def _scope_values(scope):
    return {n: np.asarray(scope.get(n)) for n in scope.local_var_names()}


def _checked():
    return pd.Executor(precision="highest", check_numerics=True)


def _compiled():
    return pd.Executor(precision="highest")


def _deep_program(depth, log_at=None):
    """An MLP of `depth` tanh layers and a softmax loss, trained by Adam; with `log_at`, layer
    `log_at` takes the log of its input minus itself (log 0 = -Inf)."""
    main, startup = pd.Program(random_seed=3), pd.Program(random_seed=3)
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 6])
        label = pd.data("label", [None, 1], "int64")
        h = x
        for i in range(depth):
            h = layers.fc(h, 6, act="tanh")
            if i == log_at:
                h = ops.log(ops.sub(h, h))   # the injected log(0)
        h = layers.dropout(h, 0.1)
        loss = ops.mean(layers.softmax_with_cross_entropy(layers.fc(h, 3), label))
        pd.optimizer.Adam(0.01).minimize(loss)
    feed = {"x": RNG.normal(size=(4, 6)).astype(np.float32),
            "label": RNG.integers(0, 3, size=(4, 1))}
    return main, startup, loss, feed


def test_a_clean_training_program_runs_as_the_compiled_one_does():
    main, startup, loss, feed = _deep_program(depth=3)
    results = []
    for exe in (_compiled(), _checked()):
        scope = pd.Scope()
        exe.run(startup, scope=scope)
        initial = _scope_values(scope)
        losses = [exe.run(main, feed=feed, fetch_list=[loss, "fc_0.w_0@GRAD"], scope=scope)
                  for _ in range(3)]
        results.append((initial, losses, _scope_values(scope)))
    (init_a, losses_a, after_a), (init_b, losses_b, after_b) = results
    for name in init_a:   # the startup program: same seeds, same values
        np.testing.assert_allclose(init_b[name], init_a[name], rtol=1e-6, err_msg=name)
    for a, b in zip(losses_a, losses_b):
        for x, y in zip(a, b):
            np.testing.assert_allclose(y, x, rtol=1e-5, atol=1e-7)
    assert after_a.keys() == after_b.keys()
    for name in after_a:   # parameters, Adam moments, the step counter, the RNG state
        np.testing.assert_allclose(after_b[name], after_a[name], rtol=1e-5, atol=1e-7,
                                   err_msg=name)


def test_steps_and_return_numpy_as_the_compiled_executor_has_them():
    main, startup, loss, feed = _deep_program(depth=2)
    stacked = {k: np.stack([v, v[::-1]]) for k, v in feed.items()}
    results = []
    for exe in (_compiled(), _checked()):
        scope = pd.Scope()
        exe.run(startup, scope=scope)
        fetched, = exe.run(main, feed=stacked, fetch_list=[loss], scope=scope, steps=2)
        on_device, = exe.run(main, feed=feed, fetch_list=[loss], scope=scope,
                             return_numpy=False)
        assert not isinstance(on_device, np.ndarray)
        results.append((fetched, np.asarray(on_device), _scope_values(scope)))
    np.testing.assert_allclose(results[1][0], results[0][0], rtol=1e-5)
    assert results[1][0].shape == (2,)
    np.testing.assert_allclose(results[1][1], results[0][1], rtol=1e-5)
    for name, value in results[0][2].items():
        np.testing.assert_allclose(results[1][2][name], value, rtol=1e-5, atol=1e-7)


def test_an_injected_log_of_zero_in_a_deep_program_names_its_op_and_line():
    main, startup, loss, feed = _deep_program(depth=12, log_at=7)
    scope = pd.Scope()
    _compiled().run(startup, scope=scope)
    compiled, = _compiled().run(main.clone(for_test=True), feed=feed, fetch_list=[loss],
                                scope=scope)
    assert not np.isfinite(compiled)   # the compiled run says only that the loss is bad
    before = _scope_values(scope)
    with pytest.raises(pd.NumericsError) as info:
        _checked().run(main, feed=feed, fetch_list=[loss], scope=scope)
    e = info.value
    ops_ = main.global_block().desc.ops
    log_index = [i for i, d in enumerate(ops_) if d.type == "log"][0]
    assert (e.op_type, e.op_index, e.block_idx) == ("log", log_index, 0)
    assert e.callsite == line_of(__file__, "# the injected log(0)")
    assert e.slot == "Out" and e.var == ops_[log_index].outputs[0].arguments[0]
    out = e.values["output Out"]
    assert (out.nan, out.posinf, out.neginf) == (0, 0, 24) and math.isnan(out.min)
    assert e.values["input X"].finite and e.values["input X"].max == 0.0
    assert e.forward_op is None and e.outer_op is None
    assert str(e).startswith(f"op #{log_index} 'log', created at {e.callsite}, variable "
                             f"'{e.var}': this op produced the run's first NaN or Inf")
    assert "24 -Inf of 24 values" in str(e)
    after = _scope_values(scope)   # nothing written: not the parameters, not the RNG state
    assert after.keys() == before.keys()
    for name in before:
        np.testing.assert_array_equal(after[name], before[name], err_msg=name)


def test_a_nan_first_made_by_a_gradient_op_names_the_forward_op():
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 3])
        h = layers.fc(x, 4, act="relu")
        root = ops.sqrt(h)   # sqrt(0) is fine, its gradient 1 / (2 sqrt(0)) is not
        loss = ops.mean(root)
        pd.optimizer.SGD(0.1).minimize(loss)
    scope = pd.Scope()
    _checked().run(startup, scope=scope)
    feed = {"x": RNG.normal(size=(5, 3)).astype(np.float32)}
    loss_value, = _checked().run(main.clone(for_test=True), feed=feed, fetch_list=[loss],
                                 scope=scope)
    assert np.isfinite(loss_value)   # the forward pass is clean
    with pytest.raises(pd.NumericsError) as info:   # a loaded program says the same
        _checked().run(pd.Program.from_bytes(main.to_bytes()), feed=feed, fetch_list=[loss],
                       scope=scope)
    e = info.value
    sqrt_index = [d.type for d in main.global_block().desc.ops].index("sqrt")
    assert main.global_block().desc.ops[e.op_index].role == pb.BACKWARD
    assert e.forward_op == (0, sqrt_index, "sqrt", line_of(__file__, "# sqrt(0) is fine"))
    assert e.callsite == e.forward_op.callsite
    assert e.values[f"output {e.slot}"].posinf > 0
    assert f"it computes a gradient of op #{sqrt_index} 'sqrt'" in str(e)


def test_gradient_ops_record_their_forward_op_and_the_link_survives_saving():
    main = pd.Program()
    with pd.program_guard(main, pd.Program()):
        x = pd.data("x", [3], stop_gradient=False)
        y = ops.tanh(x)
        loss = ops.mean(ops.mul(y, y))
        pd.gradients([loss], [x])
    loaded = pd.Program.from_bytes(main.to_bytes())
    ops_ = loaded.global_block().desc.ops
    linked = {i: tuple(d.attrs[FORWARD_OP].ints.values) for i, d in enumerate(ops_)
              if FORWARD_OP in d.attrs}
    assert {b for b, _ in linked.values()} == {0}
    forward_types = [ops_[i].type for i in sorted({i for _, i in linked.values()})]
    assert forward_types == ["tanh", "mul", "mean"]
    for i, (_, f) in linked.items():
        assert ops_[i].role == pb.BACKWARD and ops_[f].role == pb.FORWARD
        assert ops_[i].callsite == ops_[f].callsite
    assert "@forward_op" not in str(loaded)   # not shown as an attribute of the op


def test_a_nan_inside_a_scan_names_the_inner_op_and_the_scan():
    main = pd.Program()
    with pd.program_guard(main, pd.Program()):
        xs = pd.data("xs", [4, 2])
        c0 = pd.data("c0", [2])

        def step(c, x):
            c = c + x
            return c, ops.sqrt(c)   # the inner sqrt

        c, ys = cf.scan(step, c0, xs)   # the scan
        total = ops.reduce_sum(ys)
    feed = {"xs": np.array([[1, 1], [1, 1], [-5, 1], [1, 1]], np.float32),
            "c0": np.zeros(2, np.float32)}
    with pytest.raises(pd.NumericsError) as info:
        _checked().run(main, feed=feed, fetch_list=[total], scope=pd.Scope())
    e = info.value
    assert (e.op_type, e.block_idx) == ("sqrt", 1)
    assert e.callsite == line_of(__file__, "# the inner sqrt")
    scan_index = [d.type for d in main.global_block().desc.ops].index("scan")
    assert e.outer_op == (0, scan_index, "scan", line_of(__file__, "# the scan"))
    out = e.values["output Out"]   # the first step that went bad: c = [-3, 3]
    assert (out.nan, out.min, out.max) == (1, np.float32(math.sqrt(3)), np.float32(math.sqrt(3)))
    assert f"inside op #{scan_index} 'scan'" in str(e)


def test_a_nan_in_the_gradient_of_a_scan_step_names_the_forward_op_in_the_step():
    main = pd.Program()
    with pd.program_guard(main, pd.Program()):
        xs = pd.data("xs", [4, 2], stop_gradient=False)
        c0 = pd.data("c0", [2])

        def step(c, x):
            c = c + x
            return c, ops.sqrt(c)   # the step's sqrt

        _, ys = cf.scan(step, c0, xs)
        total = ops.reduce_sum(ys)
        grad, = pd.gradients([total], [xs])
    feed = {"xs": np.array([[1, 1], [1, -1], [1, 1], [1, 1]], np.float32),
            "c0": np.zeros(2, np.float32)}
    assert np.isfinite(_checked().run(main, feed=feed, fetch_list=[total], scope=pd.Scope()))
    with pytest.raises(pd.NumericsError) as info:
        _checked().run(main, feed=feed, fetch_list=[grad], scope=pd.Scope())
    e = info.value
    assert e.block_idx > 1 and e.outer_op.type == "scan"   # in the gradient step's block
    step_block = main.global_block().desc.ops[[d.type for d in main.global_block().desc.ops]
                                              .index("scan")].attrs["block"].block_idx
    sqrt_index = [d.type for d in main.desc.blocks[step_block].ops].index("sqrt")
    assert e.forward_op == (step_block, sqrt_index, "sqrt", line_of(__file__, "# the step's sqrt"))
    assert f"it computes a gradient of op #{sqrt_index} 'sqrt' in block {step_block}" in str(e)


def test_a_nan_inside_a_cond_and_a_while_loop():
    main = pd.Program()
    with pd.program_guard(main, pd.Program()):
        x = pd.data("x", [2])
        p = pd.data("p", [], "bool")
        picked = cf.cond(p, lambda: ops.log(x), lambda: x * 2.0)   # log in a branch
        three = ops.fill_constant(shape=[], dtype="int64", value=3.0)
        _, v = cf.while_loop(lambda i, v: ops.less_than(i, three),
                             lambda i, v: (ops.increment(i), ops.exp(v * 40.0)),   # overflow
                             (ops.fill_constant(shape=[], dtype="int64"), x))
    feed = {"x": np.array([1.0, -1.0], np.float32), "p": np.array(True)}
    with pytest.raises(pd.NumericsError) as info:
        _checked().run(main, feed=feed, fetch_list=[picked], scope=pd.Scope())
    assert info.value.op_type == "log" and info.value.outer_op.type == "cond"
    assert info.value.callsite == line_of(__file__, "# log in a branch")
    got, = _checked().run(main, feed=dict(feed, p=np.array(False)), fetch_list=[picked],
                          scope=pd.Scope())
    np.testing.assert_array_equal(got, [2.0, -2.0])
    with pytest.raises(pd.NumericsError) as info:
        _checked().run(main, feed=dict(feed, p=np.array(False)), fetch_list=[v],
                       scope=pd.Scope())
    assert info.value.op_type == "exp" and info.value.outer_op.type == "while"
    assert info.value.values["output Out"].posinf == 1


def test_a_bad_feed_and_a_bad_scope_value_are_named_as_such():
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 2])
        y = layers.fc(x, 2)
    scope = pd.Scope()
    _checked().run(startup, scope=scope)
    with pytest.raises(pd.NumericsError, match="variable 'x': the value fed holds a NaN or Inf: "
                                               r"'x' float32\[1, 2\]: 1 NaN of 2 values"):
        _checked().run(main, feed={"x": np.array([[np.nan, 1]], np.float32)}, fetch_list=[y],
                       scope=scope)
    scope.set("fc_0.w_0", np.full((2, 2), np.inf, np.float32))
    with pytest.raises(pd.NumericsError, match="input Y 'fc_0.w_0' was already bad when the op "
                                               r"was reached \(the Scope held it before this"):
        _checked().run(main, feed={"x": np.ones((1, 2), np.float32)}, fetch_list=[y],
                       scope=scope)


def test_bad_input_errors_are_those_of_the_compiled_executor():
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 3])
        y = layers.fc(x, 2)
    for exe in (_compiled(), _checked()):
        with pytest.raises(pd.ScopeError, match="run the startup program first"):
            exe.run(main, feed={"x": np.ones((1, 3))}, fetch_list=[y], scope=pd.Scope())
        with pytest.raises(pd.FeedError, match=r"variable 'x': feed has shape \[1, 4\]"):
            exe.run(main, feed={"x": np.ones((1, 4))}, fetch_list=[y], scope=pd.Scope())
        with pytest.raises(pd.FeedError, match="variable 'x': is needed but not fed"):
            exe.run(main, feed={}, fetch_list=[y], scope=pd.Scope())
