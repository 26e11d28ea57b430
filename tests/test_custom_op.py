"""progdesc.custom_op: an op registered from user code works like a built-in.

Each test registers its op under a fresh name and unregisters it afterwards,
so the registry-wide table tests never see it.
"""
import inspect
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import progdesc as pd
from lowering import progdesc_pb2 as pb
from lowering import registry
from progdesc import custom_op, layers, ops
from progdesc.custom_op import Attr, In, Out

_names = itertools.count()


def softsign_ref(x):
    return x / (1 + np.abs(x))


def register_softsign(name, replace=False):
    """softsign(x) * alpha, with its gradient as a composition of registered ops."""
    @custom_op.op(name, inputs=[In("X", "float")], outputs=[Out("Out")],
                  attrs={"alpha": 1.0}, replace=replace)
    def softsign(X, *, alpha):
        """alpha * x / (1 + |x|)."""
        return alpha * X / (1 + jnp.abs(X))

    @softsign.gradient
    def _(g):   # d/dx = alpha / (1 + |x|)^2
        denom = g.call("scale", g.call("abs", g.input("X")), bias=1.0)
        scaled = g.call("scale", g.out_grad("Out"), scale=g.attr("alpha"))
        g.call("div", scaled, g.call("square", denom), out=g.in_grad("X"))

    return softsign


@pytest.fixture
def softsign():
    name = f"test_softsign_{next(_names)}"
    register_softsign(name)
    yield name
    if name in custom_op.custom_ops():
        custom_op.unregister(name)
    assert not registry.is_registered(name)


def _eval(program, feed, fetch, scope=None):
    return pd.Executor().run(program, feed=feed, fetch_list=fetch, scope=scope or pd.Scope())


def test_op_function_exists_with_signature_and_doc(softsign):
    fn = getattr(ops, softsign)
    assert fn.__name__ == softsign
    assert "alpha * x / (1 + |x|)" in fn.__doc__ and "alpha: float, default 1.0" in fn.__doc__
    assert softsign in dir(ops) and softsign in custom_op.custom_ops()
    assert custom_op.is_registered(softsign) and custom_op.get(softsign).type == softsign


def test_forward_and_shapes_match_numpy(softsign):
    x_np = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    main = pd.Program()
    with pd.program_guard(main, pd.Program()):
        x = pd.data("x", [None, 3])
        y = getattr(ops, softsign)(x, alpha=2.0)
    assert y.shape == (-1, 3) and y.dtype == "float32"
    (out,) = _eval(main, {"x": x_np}, [y])
    np.testing.assert_allclose(out, 2.0 * softsign_ref(x_np), rtol=1e-6)
    assert f"{softsign}(X=x) {{alpha=2}}" in str(main)


def test_gradient_against_numpy_and_finite_differences(softsign):
    rng = np.random.default_rng(1)
    x_np = rng.normal(size=(4, 3)) * 2
    main = pd.Program()
    with pd.program_guard(main, pd.Program()):
        x = pd.data("x", [4, 3], "float64", stop_gradient=False)
        total = ops.reduce_sum(getattr(ops, softsign)(x, alpha=1.5))
        (dx,) = pd.gradients(total, x)
        (ddx,) = pd.gradients(ops.reduce_sum(dx), x)      # second order, through the maker's ops
    assert any(op.role == "backward" for op in main.global_block().ops)
    value, grad, grad2 = _eval(main, {"x": x_np}, [total, dx, ddx])
    f = lambda v: float(np.sum(1.5 * softsign_ref(v)))   # noqa: E731
    np.testing.assert_allclose(value, f(x_np), rtol=1e-12)
    np.testing.assert_allclose(grad, 1.5 / (1 + np.abs(x_np)) ** 2, rtol=1e-10)
    eps, fd = 1e-6, np.zeros_like(x_np)
    for idx in np.ndindex(*x_np.shape):
        step = np.zeros_like(x_np)
        step[idx] = eps
        fd[idx] = (f(x_np + step) - f(x_np - step)) / (2 * eps)
    np.testing.assert_allclose(grad, fd, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(grad2, -3.0 * np.sign(x_np) / (1 + np.abs(x_np)) ** 3, rtol=1e-8)


def _model(name):
    # "highest": its results are compared across the Executor, an inference model and an export
    main, startup = pd.Program(random_seed=3, precision="highest"), pd.Program(random_seed=3)
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 4])
        y = pd.data("y", [None, 1])
        hidden = getattr(ops, name)(layers.fc(x, 16))
        pred = layers.fc(hidden, 1)
        loss = layers.mse_loss(pred, y)
    return main, startup, x, y, pred, loss


def _train(main, startup, loss):
    """30 steps on a fixed regression batch; asserts the loss halves. Returns (exe, scope, data)."""
    data = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    target = np.sin(data.sum(1, keepdims=True))
    exe, scope = pd.Executor(), pd.Scope()
    exe.run(startup, scope=scope)
    losses = [float(exe.run(main, feed={"x": data, "y": target}, fetch_list=[loss],
                            scope=scope)[0]) for _ in range(30)]
    assert losses[-1] < 0.5 * losses[0]
    return exe, scope, data


def test_trains_with_append_backward_and_sgd(softsign):
    main, startup, x, y, pred, loss = _model(softsign)
    with pd.program_guard(main, startup):
        pairs = pd.append_backward(loss)
    assert {p.name for p, _ in pairs} == {"fc_0.w_0", "fc_0.b_0", "fc_1.w_0", "fc_1.b_0"}
    with pd.program_guard(main, startup):   # SGD by hand: Param -= lr * Grad
        lr = ops.fill_constant(shape=[1], dtype="float32", value=0.1)
        for p, g in pairs:
            main.global_block().append_op("sgd", inputs={"Param": p, "Grad": g,
                                                         "LearningRate": lr},
                                          outputs={"ParamOut": p}, role=pb.OPTIMIZE)
    exe, scope, data = _train(main, startup, loss)


def test_trains_with_optimizer_and_round_trips_bytes(softsign, tmp_path):
    main, startup, x, y, pred, loss = _model(softsign)
    test_program = main.clone(for_test=True)
    with pd.program_guard(main, startup):
        pd.optimizer.SGD(0.1).minimize(loss)
    exe, scope, data = _train(main, startup, loss)
    (expected,) = exe.run(test_program, feed={"x": data}, fetch_list=[pred], scope=scope)

    # the program's bytes name the custom op; loading them needs it registered
    loaded = pd.Program.from_bytes(test_program.to_bytes())
    assert softsign in [op.type for op in loaded.global_block().ops]
    (again,) = pd.Executor().run(loaded, feed={"x": data}, fetch_list=[pred.name], scope=scope)
    np.testing.assert_array_equal(again, expected)
    assert pd.Program.from_text(main.to_text()).to_bytes() == main.to_bytes()

    # an inference model and a compiled export
    from progdesc.export import export_compiled, load_compiled
    from progdesc.io import load_inference_model, save_inference_model
    save_inference_model(tmp_path / "model", [x], [pred], exe, main, scope)
    artifact = tmp_path / "model.pdx"
    export_compiled(artifact, main, [x], [pred], scope,
                    platforms=(jax.export.default_export_platform(),))   # called here below
    inf_scope = pd.Scope()
    program, feeds, fetches = load_inference_model(tmp_path / "model", scope=inf_scope)
    (inferred,) = pd.Executor().run(program, feed={feeds[0]: data}, fetch_list=fetches,
                                    scope=inf_scope)
    np.testing.assert_allclose(inferred, expected, rtol=1e-6)

    custom_op.unregister(softsign)
    with pytest.raises(pd.UnknownOpError, match=softsign):
        pd.Program.from_bytes(test_program.to_bytes())
    with pytest.raises(pd.ProgdescError):
        load_inference_model(tmp_path / "model", scope=pd.Scope())
    # the compiled artifact holds the lowered computation: no registration needed
    model = load_compiled(artifact)
    for batch in (1, 7):
        (out,) = model(data[:batch])
        np.testing.assert_allclose(out, expected[:batch], rtol=1e-5, atol=1e-6)


def test_double_registration_is_an_error_unless_replace(softsign):
    with pytest.raises(pd.ProgramError, match="already registered"):
        register_softsign(softsign)
    with pytest.raises(pd.ProgramError, match="already registered"):   # built-ins too
        custom_op.op("relu", inputs=["X"], outputs=["Out"])(lambda X: X)
    assert registry.get("relu").type == "relu" and "relu" not in custom_op.custom_ops()

    @custom_op.op(softsign, inputs=[In("X", "float")], outputs=[Out("Out")],
                  attrs={"power": Attr("power", "int", 2)}, replace=True)
    def _(X, *, power):
        return X ** power

    fn = getattr(ops, softsign)
    assert "power" in str(inspect.signature(fn)) and "alpha" not in str(inspect.signature(fn))
    main = pd.Program()
    with pd.program_guard(main, pd.Program()):
        out = fn(pd.data("x", [3]), power=3)
    (value,) = _eval(main, {"x": np.array([1.0, 2.0, -3.0], np.float32)}, [out])
    np.testing.assert_allclose(value, [1.0, 8.0, -27.0])


def test_replacing_a_builtin_and_unregistering_restores_it():
    original = registry.get("softplus")
    try:
        @custom_op.op("softplus", inputs=[In("X", "float")], outputs=[Out("Out")],
                      replace=True)
        def _(X):
            return X * 0 + 42.0
        main = pd.Program()
        with pd.program_guard(main, pd.Program()):
            out = ops.softplus(pd.data("x", [2]))
        (value,) = _eval(main, {"x": np.zeros(2, np.float32)}, [out])
        np.testing.assert_allclose(value, [42.0, 42.0])
    finally:
        custom_op.unregister("softplus")
    assert registry.get("softplus") is original
    assert "softplus" not in custom_op.custom_ops()


def test_bad_names_and_unregister_errors():
    for bad in ("not an identifier", "1abc", "class", "_private", "registry", "inspect"):
        with pytest.raises(pd.ProgramError):
            custom_op.op(bad, inputs=["X"], outputs=["Out"])(lambda X: X)
    bad_parameters = [dict(inputs=["X"], attrs={"lambda": 1.0}),
                      dict(inputs=["X"], attrs={"name": "a"}),
                      dict(inputs=["X", "x"]),
                      dict(inputs=["X"], attrs={"x": 1})]
    for spec in bad_parameters:
        with pytest.raises(pd.ProgramError, match="become parameters of progdesc.ops"):
            custom_op.op(f"test_params_{next(_names)}", outputs=["Out"], **spec)(lambda **kw: 0)
    with pytest.raises(pd.ProgramError, match="not registered through"):
        custom_op.unregister("relu")
    with pytest.raises(TypeError):
        custom_op.register("not an OpDef")


def test_register_an_opdef_directly():
    name = f"test_twice_{next(_names)}"
    opdef = custom_op.OpDef(type=name, inputs=(In("X", "float"),), outputs=(Out("Out"),),
                            attrs=(), lower=lambda X: 2 * X)
    assert custom_op.register(opdef) is opdef
    try:
        with pytest.raises(pd.ProgramError):
            custom_op.register(opdef)
        main = pd.Program()
        with pd.program_guard(main, pd.Program()):
            out = getattr(ops, name)(pd.data("x", [2]))
        (value,) = _eval(main, {"x": np.ones(2, np.float32)}, [out])
        np.testing.assert_allclose(value, [2.0, 2.0])
    finally:
        custom_op.unregister(name)
    with pytest.raises(AttributeError):
        getattr(ops, name)


def test_a_maker_passing_a_gradient_through_emits_no_op_for_intermediates():
    name = f"test_straight_through_{next(_names)}"

    @custom_op.op(name, inputs=[In("X", "float")], outputs=[Out("Out")])
    def straight_through(X):
        """round(x) forward, identity backward (the straight-through estimator)."""
        return jnp.round(X)

    @straight_through.gradient
    def _(g):
        g.pass_through("X", g.out_grad("Out"))

    def assigns(program):
        return sum(op.type == "assign" for op in program.global_block().ops)

    try:
        main = pd.Program()
        with pd.program_guard(main):
            w = main.global_block().create_parameter("w", [3])
            h = ops.tanh(w)
            loss = ops.reduce_sum(ops.square(getattr(ops, name)(h)))
            (gw,) = pd.gradients(loss, [w])
            assert assigns(main) == 0      # h is an intermediate here: no copy, no h@GRAD
            assert not main.global_block().has_var(h.name + "@GRAD")
            (gh,) = pd.gradients(loss, [h])
            assert assigns(main) == 1      # h asked for: copied under its conventional name
        assert gh.name == h.name + "@GRAD"
        w0 = np.array([0.3, -1.2, 2.0], np.float32)
        scope = pd.Scope()
        scope.set("w", w0)
        got_w, got_h = _eval(main, {}, [gw, gh], scope)
        r = np.round(np.tanh(w0))
        np.testing.assert_allclose(got_h, 2 * r, rtol=1e-6)
        np.testing.assert_allclose(got_w, 2 * r * (1 - np.tanh(w0) ** 2), rtol=1e-5)
    finally:
        custom_op.unregister(name)
