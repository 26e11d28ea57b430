"""Training end to end: parity with hand-written Flax + optax, test-mode clones, convergence.

Parity runs both sides at the "highest" precision: on a GPU, default float32
products are TF32, and the two programs would round them differently."""
import glob
import os
import re
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

import progdesc as pd
from progdesc import layers, ops
from progdesc.optimizer import Adam

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _train_progdesc(build, batches, lr=1e-3):
    """Losses of 20 Adam steps of a progdesc model; returns (losses, initial params)."""
    main, startup = pd.Program(random_seed=3), pd.Program(random_seed=3)
    with pd.program_guard(main, startup):
        x, label, loss = build()
        Adam(lr).minimize(loss)
    scope, exe = pd.Scope(), pd.Executor(precision="highest")
    exe.run(startup, scope=scope)
    params = {p.name: np.asarray(scope.get(p.name)) for p in main.all_parameters()}
    losses = [float(exe.run(main, feed={x: bx, label: by}, fetch_list=[loss], scope=scope)[0])
              for bx, by in batches]
    return losses, params


def _train_flax(model, params, batches, lr=1e-3):
    tx = optax.adam(lr)

    def loss_fn(p, bx, by):
        logits = model.apply({"params": p}, bx)
        return optax.softmax_cross_entropy_with_integer_labels(logits, by[:, 0]).mean()

    @jax.jit
    def step(p, state, bx, by):
        value, grads = jax.value_and_grad(loss_fn)(p, bx, by)
        updates, state = tx.update(grads, state, p)
        return optax.apply_updates(p, updates), state, value

    state = tx.init(params)
    losses = []
    with jax.default_matmul_precision("highest"):
        for bx, by in batches:
            params, state, value = step(params, state, bx, by)
            losses.append(float(value))
    return losses


def _batches(shape, n=20, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=shape).astype(np.float32),
             rng.integers(0, 10, size=(shape[0], 1)).astype(np.int64)) for _ in range(n)]


class FlaxMLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Dense(32)(x))
        x = nn.relu(nn.Dense(32)(x))
        return nn.Dense(10)(x)


def test_mlp_matches_flax_optax_for_20_adam_steps():
    def build():
        x = pd.data("x", [None, 20])
        label = pd.data("label", [None, 1], "int64")
        h = layers.fc(layers.fc(x, 32, act="relu"), 32, act="relu")
        loss = ops.mean(layers.softmax_with_cross_entropy(layers.fc(h, 10), label))
        return x, label, loss

    batches = _batches((16, 20))
    ours, p = _train_progdesc(build, batches)
    flax_params = {f"Dense_{i}": {"kernel": jnp.asarray(p[f"fc_{i}.w_0"]),
                                  "bias": jnp.asarray(p[f"fc_{i}.b_0"])} for i in range(3)}
    theirs = _train_flax(FlaxMLP(), flax_params, batches)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)
    assert ours[-1] < ours[0]


class FlaxCNN(nn.Module):
    @nn.compact
    def __call__(self, x):                       # x: NCHW like the progdesc model
        x = jnp.transpose(x, (0, 2, 3, 1))
        x = nn.relu(nn.Conv(8, (3, 3), padding=((1, 1), (1, 1)))(x))
        x = nn.max_pool(x, (2, 2), strides=(2, 2))
        x = nn.relu(nn.Conv(16, (3, 3), padding=((1, 1), (1, 1)))(x))
        x = nn.max_pool(x, (2, 2), strides=(2, 2))
        x = jnp.transpose(x, (0, 3, 1, 2)).reshape(x.shape[0], -1)   # flatten as C, H, W
        x = nn.relu(nn.Dense(32)(x))
        return nn.Dense(10)(x)


def test_cnn_matches_flax_optax_for_20_adam_steps():
    def build():
        x = pd.data("x", [None, 1, 8, 8])
        label = pd.data("label", [None, 1], "int64")
        h = layers.pool2d(layers.conv2d(x, 8, 3, padding=1, act="relu"), 2)
        h = layers.pool2d(layers.conv2d(h, 16, 3, padding=1, act="relu"), 2)
        h = layers.fc(h, 32, act="relu")
        loss = ops.mean(layers.softmax_with_cross_entropy(layers.fc(h, 10), label))
        return x, label, loss

    batches = _batches((8, 1, 8, 8))
    ours, p = _train_progdesc(build, batches)
    conv = lambda i: {"kernel": jnp.asarray(p[f"conv2d_{i}.w_0"].transpose(2, 3, 1, 0)),  # noqa
                      "bias": jnp.asarray(p[f"conv2d_{i}.b_0"])}
    dense = lambda i: {"kernel": jnp.asarray(p[f"fc_{i}.w_0"]),  # noqa
                       "bias": jnp.asarray(p[f"fc_{i}.b_0"])}
    flax_params = {"Conv_0": conv(0), "Conv_1": conv(1), "Dense_0": dense(0), "Dense_1": dense(1)}
    theirs = _train_flax(FlaxCNN(), flax_params, batches)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)


def test_clone_for_test_is_deterministic_and_uses_running_statistics():
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 3, 4, 4])
        h = layers.batch_norm(x, momentum=0.5)
        out = layers.dropout(layers.fc(h, 8), 0.5)
        loss = ops.mean(out)
        test_program = main.clone(for_test=True)
        Adam(1e-2).minimize(loss)
    assert not any(op.role in ("backward", "optimize") for op in test_program.global_block().ops)
    scope, exe = pd.Scope(), pd.Executor(precision="highest")   # compared with NumPy below
    exe.run(startup, scope=scope)
    rng = np.random.default_rng(0)
    batch = (rng.normal(size=(16, 3, 4, 4)) * 3 + 2).astype(np.float32)
    a, = exe.run(main, feed={x: batch}, fetch_list=[out], scope=scope)
    b, = exe.run(main, feed={x: batch}, fetch_list=[out], scope=scope)
    assert not np.array_equal(a, b)                      # training: dropout masks differ
    assert np.mean(a == 0) > 0.3
    running_mean = np.asarray(scope.get("batch_norm_0.w_1"))
    running_var = np.asarray(scope.get("batch_norm_0.w_2"))
    # two updates with momentum 0.5 from (0, 1) towards the batch statistics
    batch_mean, batch_var = batch.mean(axis=(0, 2, 3)), batch.var(axis=(0, 2, 3))
    np.testing.assert_allclose(running_mean, 0.75 * batch_mean, rtol=1e-4)
    np.testing.assert_allclose(running_var, 0.25 + 0.75 * batch_var, rtol=1e-4)

    c, = exe.run(test_program, feed={x: batch}, fetch_list=[out.name], scope=scope)
    d, = exe.run(test_program, feed={x: batch}, fetch_list=[out.name], scope=scope)
    np.testing.assert_array_equal(c, d)
    np.testing.assert_array_equal(np.asarray(scope.get("batch_norm_0.w_1")), running_mean)
    scale, bias = (np.asarray(scope.get(f"batch_norm_0.{n}")) for n in ("w_0", "b_0"))
    w, b = np.asarray(scope.get("fc_0.w_0")), np.asarray(scope.get("fc_0.b_0"))
    shape = (1, 3, 1, 1)
    normed = ((batch - running_mean.reshape(shape)) / np.sqrt(running_var.reshape(shape) + 1e-5)
              * scale.reshape(shape) + bias.reshape(shape))
    np.testing.assert_allclose(c, normed.reshape(16, -1) @ w + b, rtol=1e-4, atol=1e-5)


def test_demo_reaches_the_accuracy_bar():
    from progdesc import demo
    result = demo.train(progress=False)
    assert result["test_accuracy"] >= 0.97
    assert np.mean(result["losses"][-20:]) < 0.2 * np.mean(result["losses"][:20])


def test_readme_example_runs_as_written(tmp_path):
    with open(os.path.join(ROOT, "README.md")) as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    example = blocks[0]
    script = tmp_path / "example.py"
    script.write_text(example)
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    loss = float(re.search(r"loss after 200 steps: ([0-9.]+)", run.stdout).group(1))
    assert loss < 0.5
    assert "= matmul(" in run.stdout and "adam(" in run.stdout


def test_readme_pieces_table_names_files_that_exist():
    with open(os.path.join(ROOT, "README.md")) as f:
        table = f.read().split("## The pieces", 1)[1].split("\n## ", 1)[0]
    cells = re.findall(r"^\| (`[^|]*`) \|", table, re.M)
    assert len(cells) >= 10, table
    for cell in cells:   # `progdesc/scope.py`, `executor.py`: the second in the first's folder
        names = re.findall(r"`([^`]+)`", cell)
        for name in names:
            path = name if "/" in name else os.path.join(os.path.dirname(names[0]), name)
            assert glob.glob(os.path.join(ROOT, path.replace("<family>", "*"))), path
