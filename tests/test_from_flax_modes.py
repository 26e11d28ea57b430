"""from_flax's eval_mode (issue 24 item 2): a module imported with its training and its
evaluation behaviour; `clone(for_test=True)` runs the second. The references are the
original Flax modules run in each mode."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx

import progdesc as pd

RNG = np.random.default_rng(0)
X = RNG.normal(size=(8, 4)).astype(np.float32)


class _Net(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool):
        x = nn.Dense(6)(x)
        x = nn.BatchNorm(use_running_average=not train, momentum=0.5)(x)
        return nn.Dense(2)(nn.relu(x))


def test_linen_train_and_eval_behaviour_in_one_program(tmp_path):
    net = _Net()
    variables = net.init(jax.random.key(0), X, train=False)
    scope = pd.Scope()
    program, _, (out,) = pd.from_flax(net, variables, X, scope=scope, train=True,
                                      eval_mode={"train": False})
    assert any(op.type == "mode_select" for op in program.global_block().ops)
    exe = pd.Executor()
    got, = exe.run(program, feed={"x": X}, fetch_list=[out], scope=scope)
    want, updates = net.apply(variables, X, train=True, mutable=["batch_stats"])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    stats = updates["batch_stats"]["BatchNorm_0"]
    np.testing.assert_allclose(scope.get("BatchNorm_0.mean"), stats["mean"], rtol=1e-5,
                               atol=1e-6)

    test = program.clone(for_test=True)
    x2 = X[:3] * 2.0
    got, = exe.run(test, feed={"x": x2}, fetch_list=[out.name], scope=scope)
    trained = {"params": variables["params"], "batch_stats": updates["batch_stats"]}
    np.testing.assert_allclose(got, net.apply(trained, x2, train=False), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(scope.get("BatchNorm_0.mean"), stats["mean"])   # unchanged

    # exported (test mode): each example's output is its own, at any batch size
    path = tmp_path / "net.pdx"
    pd.export.export_compiled(str(path), program, ["x"], [out], scope,
                              platforms=(jax.export.default_export_platform(),))
    model = pd.export.load_compiled(str(path))
    one, three = model(x2[:1])[0], model(x2)[0]
    np.testing.assert_allclose(one[0], three[0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(three, net.apply(trained, x2, train=False), rtol=1e-5, atol=1e-6)


def test_gradients_flow_through_the_training_behaviour():
    net = _Net()
    variables = net.init(jax.random.key(1), X, train=False)
    scope = pd.Scope()
    program, _, (out,) = pd.from_flax(net, variables, X, scope=scope, train=True,
                                      eval_mode={"train": False})
    with pd.program_guard(program, pd.Program()):
        loss = pd.ops.mean(pd.ops.square(out))
        (grad,) = pd.gradients(loss, [program.global_block().var("Dense_0.kernel")])
    got, = pd.Executor().run(program, feed={"x": X}, fetch_list=[grad], scope=scope)

    def train_loss(params):
        y, _ = net.apply({**variables, "params": params}, X, train=True,
                         mutable=["batch_stats"])
        return jnp.mean(y ** 2)
    want = jax.grad(train_loss)(variables["params"])["Dense_0"]["kernel"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def test_nnx_module_imported_in_both_modes():
    model = nnx.Sequential(nnx.Linear(4, 6, rngs=nnx.Rngs(0)),
                           nnx.BatchNorm(6, momentum=0.5, rngs=nnx.Rngs(0)),
                           nnx.Linear(6, 2, rngs=nnx.Rngs(1)))
    scope = pd.Scope()
    program, (feed,), (out,) = pd.from_flax(model, None, X, scope=scope, eval_mode=True)
    exe = pd.Executor()
    got, = exe.run(program, feed={feed: X}, fetch_list=[out], scope=scope)
    model.train()
    np.testing.assert_allclose(got, model(X), rtol=1e-5, atol=1e-6)   # updates model's stats
    model.eval()
    got, = exe.run(program.clone(for_test=True), feed={feed: X[:2]}, fetch_list=[out.name],
                   scope=scope)
    np.testing.assert_allclose(got, model(X[:2]), rtol=1e-5, atol=1e-6)


def test_eval_mode_of_the_wrong_kind_is_refused():
    net = _Net()
    variables = net.init(jax.random.key(0), X, train=False)
    with pytest.raises(TypeError, match="eval_mode is True for an nnx module, a dict"):
        pd.from_flax(net, variables, X, scope=pd.Scope(), train=True, eval_mode=True)
