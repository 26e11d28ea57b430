"""progdesc.flax.ProgramModule: a program as an nnx.Module, trained by nnx.Optimizer + optax.

References: the same program trained by its own `Adam.minimize` (compile-time gradients,
the adam op), hand-written nnx layers holding the same weights, and NumPy.
"""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import progdesc as pd
from progdesc import layers, ops
from progdesc.flax import ProgramModule, attribute_name
from progdesc.optimizer import Adam


@pytest.fixture(autouse=True)
def _float32_products():
    """The nnx layers at true float32, as the programs here ("highest"): on a GPU they would
    otherwise run TF32."""
    with jax.default_matmul_precision("highest"):
        yield


def cnn(seed=0):
    """(main, startup, image, label, logits, loss): conv, batch norm, pool, fc."""
    main = pd.Program(random_seed=seed, precision="highest")
    startup = pd.Program(random_seed=seed)
    with pd.program_guard(main, startup):
        image = pd.data("image", [None, 1, 8, 8])
        label = pd.data("label", [None, 1], "int64")
        # no conv bias: batch norm removes it, and Adam would turn its gradient (rounding
        # noise around 0) into full-size steps that differ between any two implementations
        h = layers.conv2d(image, 4, 3, padding=1, bias_attr=False)
        h = layers.pool2d(layers.batch_norm(h, act="relu"), 2)
        logits = layers.fc(h, 3)
        loss = ops.mean(layers.softmax_with_cross_entropy(logits, label))
    return main, startup, image, label, logits, loss


def batches(n, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(16, 1, 8, 8)).astype(np.float32),
             rng.integers(0, 3, size=(16, 1)).astype(np.int64)) for _ in range(n)]


class Classifier(nnx.Module):
    """A larger model around the program: the loss is computed here, in JAX."""

    def __init__(self, body):
        self.body = body

    def __call__(self, image, label):
        logits = self.body(image)
        return optax.softmax_cross_entropy_with_integer_labels(logits, label[:, 0]).mean()


@nnx.jit
def train_step(model, optimizer, *batch):
    loss, grads = nnx.value_and_grad(lambda m: m(*batch))(model)
    optimizer.update(model, grads)
    return loss


def test_nnx_adam_training_reaches_the_parameters_of_the_program_own_adam():
    main, startup, image, label, logits, loss = cnn()
    forward = main.clone()
    with pd.program_guard(main, startup):
        Adam(1e-2).minimize(loss)
    exe, scope = pd.Executor(), pd.Scope()
    exe.run(startup, scope=scope)
    model = Classifier(ProgramModule(forward, [image], logits, scope))
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    for xb, yb in batches(20):
        got = train_step(model, optimizer, xb, yb)
        (want,) = exe.run(main, feed={"image": xb, "label": yb}, fetch_list=[loss], scope=scope)
        np.testing.assert_allclose(got, want, rtol=1e-5)
    body = model.body
    assert len(body.variable_names) == 7
    for attr, name in body.variable_names.items():   # parameters and batch statistics
        np.testing.assert_allclose(getattr(body, attr)[...], scope.get(name), rtol=1e-5,
                                   atol=1e-5, err_msg=name)
    model.eval()                     # the test program: batch norm reads its statistics
    assert body.deterministic
    test_program = forward.clone(for_test=True)
    xb, _ = batches(1, seed=1)[0]
    (want,) = exe.run(test_program, feed={"image": xb}, fetch_list=[logits], scope=scope)
    np.testing.assert_allclose(body(xb), want, rtol=1e-4, atol=1e-5)
    stats = np.asarray(body.batch_norm_0__w_1[...])
    body(xb)
    np.testing.assert_array_equal(body.batch_norm_0__w_1[...], stats)   # eval updates nothing


def mlp_body():
    """A program x[?, 6] -> tanh(fc 8), started in a scope: (program, x, out, scope)."""
    main, startup = pd.Program(precision="highest"), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 6])
        out = layers.fc(x, 8, act="tanh")
    scope = pd.Scope()
    pd.Executor().run(startup, scope=scope)
    return main, x, out, scope


class Larger(nnx.Module):
    def __init__(self, body, rngs):
        self.inp = nnx.Linear(4, 6, rngs=rngs)
        self.body = body
        self.head = nnx.Linear(8, 2, rngs=rngs)

    def __call__(self, x, y):
        pred = self.head(self.body(nnx.relu(self.inp(x))))
        return jnp.mean((pred - y) ** 2)


class Reference(Larger):
    """The same model with the program's layer written as nnx.Linear + tanh."""

    def __init__(self, rngs):
        super().__init__(nnx.Linear(6, 8, rngs=rngs), rngs)

    def __call__(self, x, y):
        pred = self.head(jnp.tanh(self.body(nnx.relu(self.inp(x)))))
        return jnp.mean((pred - y) ** 2)


def test_inside_a_larger_model_it_trains_as_the_same_layer_written_in_nnx():
    program, x, out, scope = mlp_body()
    model = Larger(ProgramModule(program, [x], out, scope), nnx.Rngs(0))
    ref = Reference(nnx.Rngs(1))
    for name in ("inp", "head"):
        for p in ("kernel", "bias"):
            getattr(getattr(ref, name), p)[...] = getattr(getattr(model, name), p)[...]
    ref.body.kernel[...] = scope.get("fc_0.w_0")
    ref.body.bias[...] = scope.get("fc_0.b_0")
    opt = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    ref_opt = nnx.Optimizer(ref, optax.adam(1e-2), wrt=nnx.Param)
    rng = np.random.default_rng(0)
    for _ in range(10):
        xb, yb = rng.normal(size=(8, 4)).astype(np.float32), rng.normal(size=(8, 2))
        np.testing.assert_allclose(train_step(model, opt, xb, yb),
                                   train_step(ref, ref_opt, xb, yb), rtol=1e-5)
    np.testing.assert_allclose(model.body.fc_0__w_0[...], ref.body.kernel[...], rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(model.body.fc_0__b_0[...], ref.body.bias[...], rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(model.head.kernel[...], ref.head.kernel[...], rtol=1e-5,
                               atol=1e-6)
    assert not np.allclose(model.body.fc_0__w_0[...], scope.get("fc_0.w_0"))  # it trained
    assert set(nnx.state(model, nnx.Param)["body"]) == {"fc_0__w_0", "fc_0__b_0"}


def test_variables_are_named_after_the_program_and_typed_by_what_they_are():
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 3, 4, 4])
        h = layers.batch_norm(x)
        out = layers.fc(h, 2, param_attr=pd.ParamAttr(trainable=False))
    scope = pd.Scope()
    pd.Executor().run(startup, scope=scope)
    module = ProgramModule(main, [x], out, scope)
    assert module.variable_names == {
        "batch_norm_0__w_0": "batch_norm_0.w_0", "batch_norm_0__b_0": "batch_norm_0.b_0",
        "batch_norm_0__w_1": "batch_norm_0.w_1", "batch_norm_0__w_2": "batch_norm_0.w_2",
        "fc_0__w_0": "fc_0.w_0", "fc_0__b_0": "fc_0.b_0"}
    assert module.attribute_of == {v: k for k, v in module.variable_names.items()}
    assert set(nnx.state(module, nnx.Param)) == {"batch_norm_0__w_0", "batch_norm_0__b_0",
                                                 "fc_0__b_0"}
    assert set(nnx.state(module, nnx.BatchStat)) == {"batch_norm_0__w_1", "batch_norm_0__w_2",
                                                     "fc_0__w_0"}   # trainable=False
    np.testing.assert_array_equal(module.fc_0__w_0[...], scope.get("fc_0.w_0"))


def test_attribute_names():
    assert attribute_name("fc_0.w_0") == "fc_0__w_0"
    assert attribute_name("conv2d_1.b_0") == "conv2d_1__b_0"
    assert attribute_name("my-weight") == "my_weight"
    assert attribute_name("0w") == "v_0w"
    assert attribute_name("lambda") == "v_lambda"


def test_names_that_become_the_same_attribute_are_refused():
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 2])
        a = pd.create_parameter([1, 2], "float32", attr="a.b")
        b = pd.create_parameter([1, 2], "float32", attr="a__b")
        out = ops.add(ops.add(x, a), b)
    scope = pd.Scope()
    pd.Executor().run(startup, scope=scope)
    with pytest.raises(pd.ProgramError, match="'a__b'.*attribute 'a__b'.*'a.b'"):
        ProgramModule(main, [x], out, scope)


def test_a_program_with_an_optimizer_is_refused_naming_the_op():
    main, startup, image, label, logits, loss = cnn()
    with pd.program_guard(main, startup):
        Adam(1e-2).minimize(loss)
    with pytest.raises(pd.ProgramError, match="backward or optimizer.*before minimize"):
        ProgramModule(main, [image], logits, pd.Scope())


def dropout_body():
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 6])
        out = layers.dropout(layers.fc(x, 32), 0.5)
    scope = pd.Scope()
    pd.Executor().run(startup, scope=scope)
    return main, x, out, scope


def test_dropout_draws_from_the_rngs_in_training_and_is_off_in_eval():
    program, x, out, scope = dropout_body()
    module = ProgramModule(program, [x], out, scope, rngs=nnx.Rngs(dropout=3))
    xb = np.random.default_rng(0).normal(size=(4, 6)).astype(np.float32)
    dense = xb @ np.asarray(scope.get("fc_0.w_0")) + np.asarray(scope.get("fc_0.b_0"))
    first, second = np.asarray(module(xb)), np.asarray(nnx.jit(lambda m: m(xb))(module))
    assert not np.array_equal(first, second)               # the stream moves on
    for drawn in (first, second):
        kept = drawn != 0
        assert 0 < kept.mean() < 1
        np.testing.assert_allclose(drawn[kept], 2 * dense[kept], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(nnx.view(module, deterministic=True)(xb), dense, rtol=1e-5,
                               atol=1e-6)
    module.eval()
    np.testing.assert_allclose(module(xb), dense, rtol=1e-5, atol=1e-6)
    module.train()
    assert not module.deterministic
    default_stream = ProgramModule(program, [x], out, scope, rngs=nnx.Rngs(0))
    assert 0 < (np.asarray(default_stream(xb)) != 0).mean() < 1
    without = ProgramModule(program, [x], out, scope)
    with pytest.raises(pd.ProgramError, match="rngs=nnx.Rngs"):
        without(xb)
    without.eval()
    np.testing.assert_allclose(without(xb), dense, rtol=1e-5, atol=1e-6)


class FlaxMLP(nnx.Module):
    def __init__(self, rngs):
        self.hidden = nnx.Linear(5, 8, rngs=rngs)
        self.out = nnx.Linear(8, 2, rngs=rngs)

    def __call__(self, x, y):
        return jnp.mean((self.out(nnx.relu(self.hidden(x))) - y) ** 2)


def test_a_flax_model_taken_into_a_program_comes_back_as_a_module_that_trains_alike():
    flax_model = FlaxMLP(nnx.Rngs(0))
    rng = np.random.default_rng(0)
    xb, yb = rng.normal(size=(4, 5)).astype(np.float32), rng.normal(size=(4, 2)).astype(
        np.float32)
    scope = pd.Scope()
    program, feed_names, (loss,) = pd.from_flax(flax_model, None, xb, yb, scope=scope)
    module = ProgramModule(program, feed_names, loss, scope)
    assert set(module.variable_names.values()) == {"hidden.kernel", "hidden.bias",
                                                   "out.kernel", "out.bias"}
    opt = nnx.Optimizer(module, optax.adam(1e-2), wrt=nnx.Param)
    flax_opt = nnx.Optimizer(flax_model, optax.adam(1e-2), wrt=nnx.Param)
    for _ in range(5):
        np.testing.assert_allclose(train_step(module, opt, xb, yb),
                                   train_step(flax_model, flax_opt, xb, yb), rtol=1e-5)
    np.testing.assert_allclose(module.hidden__kernel[...], flax_model.hidden.kernel[...],
                               rtol=1e-5, atol=1e-6)
