"""Eager mode that records (issue 16): values at once, the same program compiled afterwards.

Every check compares the eager path (ops run one at a time as they are appended) with
the compiled path (the recorded program run by an Executor from a fresh Scope): two
different executions of the same lowering rules, and the compiled one is checked
against NumPy, jax.vjp and Flax elsewhere in the suite.
"""
import os

import numpy as np
import pytest

import progdesc as pd
from progdesc import layers, ops

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RNG = np.random.default_rng(0)
X = RNG.normal(size=(8, 4)).astype("float32")
Y = X.sum(1, keepdims=True)


def record(build, feeds, scope):
    """Build a model in eager mode into fresh programs; `build(data vars) -> {name: var}`."""
    main, startup = pd.Program(random_seed=3), pd.Program(random_seed=7)
    with pd.scope_guard(scope), pd.program_guard(main, startup), pd.eager():
        inputs = {name: pd.data(name, [None, *v.shape[1:]], str(v.dtype), value=v)
                  for name, v in feeds.items()}
        out = build(**inputs)
        eager = {name: var.numpy() for name, var in out.items()}
    return main, startup, out, eager


def compiled_steps(main, startup, feeds, fetch, steps=1):
    """Each step's fetched values of the recorded program, compiled, from a fresh Scope."""
    exe, scope = pd.Executor(), pd.Scope()
    exe.run(startup, scope=scope)
    return [exe.run(main, feed=feeds, fetch_list=fetch, scope=scope) for _ in range(steps)], \
        scope


def mlp(x, y):
    h = layers.fc(x, 16, act="tanh")
    loss = layers.mse_loss(layers.fc(h, 1), y)
    return {"h": h, "loss": loss}


def cnn(image, label):
    h = layers.conv2d(image, 4, 3, padding=1, act="relu")
    h = layers.pool2d(h, 2)
    logits = layers.fc(h, 3)
    loss = ops.mean(layers.softmax_with_cross_entropy(logits, label))
    return {"logits": logits, "loss": loss}


def transformer(tokens, target):
    h = layers.transformer_encoder_layer(tokens, num_heads=2, dim_feedforward=16,
                                         dropout_rate=0.1)
    loss = layers.mse_loss(h, target)
    return {"h": h, "loss": loss}


MODELS = {
    "mlp": (mlp, {"x": X, "y": Y}),
    "cnn": (cnn, {"image": RNG.normal(size=(4, 1, 6, 6)).astype("float32"),
                  "label": RNG.integers(0, 3, size=(4, 1)).astype("int64")}),
    "transformer": (transformer, {"tokens": RNG.normal(size=(2, 5, 8)).astype("float32"),
                                  "target": RNG.normal(size=(2, 5, 8)).astype("float32")}),
}


@pytest.mark.parametrize("model", [
    "mlp", "cnn", pytest.param("transformer", marks=pytest.mark.slow)])   # slow: 25 s
def test_forward_and_gradients_equal_the_compiled_program(model):
    build, feeds = MODELS[model]
    scope = pd.Scope()

    def with_grads(**inputs):
        out = build(**inputs)
        params = out["loss"].block.program.all_parameters()
        grads = pd.gradients(out["loss"], params)
        return {**out, **{g.name: g for g in grads}}

    main, startup, out, eager = record(with_grads, feeds, scope)
    for name, value in feeds.items():   # data values keep the program's dtypes (int64 labels)
        assert main.global_block().var(name).numpy().dtype == value.dtype
    names = list(out)
    (fetched,), _ = compiled_steps(main, startup, feeds, [out[n] for n in names])
    for name, value in zip(names, fetched):
        np.testing.assert_allclose(eager[name], value, rtol=1e-6, atol=1e-6, err_msg=name)
    assert len([n for n in names if n.endswith("@GRAD")]) == len(main.all_parameters())


@pytest.mark.parametrize("model", [
    "mlp", "cnn", pytest.param("transformer", marks=pytest.mark.slow)])   # slow: 10 s
def test_five_adam_steps_eager_then_compiled_equal_five_compiled_steps(model):
    build, feeds = MODELS[model]
    scope = pd.Scope()

    def train(**inputs):
        out = build(**inputs)
        pd.optimizer.Adam(0.01).minimize(out["loss"])
        return out

    main, startup, out, eager = record(train, feeds, scope)
    losses = [eager["loss"]]                  # step 1 ran eagerly, as it was recorded
    exe = pd.Executor()
    for _ in range(4):                        # steps 2..5: the recorded program, compiled
        losses += exe.run(main, feed=feeds, fetch_list=[out["loss"]], scope=scope)
    reference, ref_scope = compiled_steps(main, startup, feeds, [out["loss"]], steps=5)
    np.testing.assert_allclose(losses, [r[0] for r in reference], rtol=1e-5, atol=1e-6)
    assert losses[-1] < losses[0]
    for p in main.all_parameters():
        if p.name.endswith("attn.key.b_0"):
            # Softmax ignores a bias added to every key, so this gradient is rounding noise
            # (about 1e-9), which Adam's normalisation turns into steps of the learning rate.
            continue
        np.testing.assert_allclose(scope.get(p.name), ref_scope.get(p.name), rtol=1e-5,
                                   atol=1e-6, err_msg=p.name)


def test_readme_example_trains_the_recorded_program(monkeypatch):
    readme = open(os.path.join(ROOT, "README.md")).read()
    section = readme[readme.index("## Eager mode"):]
    code = section[section.index("```python") + len("```python"):section.index("```\n", 10)]
    code = code.replace("range(200)", "range(30)")
    namespace = {}
    with pd.scope_guard(pd.Scope()):
        exec(compile(code, "README.md", "exec"), namespace)   # noqa: S102
    first = namespace["loss"].numpy()
    assert namespace["value"] < first
    assert [op.type for op in namespace["main"].global_block().ops].count("adam") == 4


def test_enable_and_disable_switch_eager_mode_for_a_whole_session():
    assert not pd.eager.active
    main = pd.Program()
    with pd.scope_guard(pd.Scope()), pd.program_guard(main, pd.Program()):
        pd.eager.enable()
        try:
            x = pd.data("x", [None, 4], value=X)
            with pd.eager():                     # nested blocks keep it on
                y = ops.tanh(x)
            assert pd.eager.active
            z = ops.scale(y, scale=2.0)
        finally:
            pd.eager.disable()
        assert not pd.eager.active
        after = ops.tanh(z)
        np.testing.assert_allclose(z.numpy(), 2 * np.tanh(X), rtol=1e-6)
        with pytest.raises(pd.RecordingError, match="has no value"):
            after.numpy()
