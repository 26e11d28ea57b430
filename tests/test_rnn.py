"""layers.lstm and layers.gru, built from control_flow.scan over time.

Forward against NumPy loops of PyTorch's equations written here, gradients
against jax.grad of a hand-written lax.scan and against finite differences,
all with the weights the startup program put in the Scope; a symbolic batch,
save/load, clone(for_test), and an LSTM that learns a few sentences.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import progdesc as pd
from progdesc import layers, ops

RNG = np.random.default_rng(0)
B, T, D, H = 3, 5, 4, 6


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _lstm_numpy(x, w_x, w_h, b, h, c, reverse=False):
    outs = [None] * x.shape[1]
    for t in (reversed(range(x.shape[1])) if reverse else range(x.shape[1])):
        i, f, g, o = np.split(x[:, t] @ w_x + h @ w_h + b, 4, axis=1)
        c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
        h = _sigmoid(o) * np.tanh(c)
        outs[t] = h
    return np.stack(outs, 1), h, c


def _gru_numpy(x, w_x, w_h, b_x, b_h, h, reverse=False):
    outs = [None] * x.shape[1]
    for t in (reversed(range(x.shape[1])) if reverse else range(x.shape[1])):
        xr, xz, xn = np.split(x[:, t] @ w_x + b_x, 3, axis=1)
        hr, hz, hn = np.split(h @ w_h + b_h, 3, axis=1)
        r, z = _sigmoid(xr + hr), _sigmoid(xz + hz)
        n = np.tanh(xn + r * hn)
        h = (1 - z) * n + z * h
        outs[t] = h
    return np.stack(outs, 1), h


def _lstm_jax(x, w_x, w_h, b, h, c):
    def step(carry, x_t):
        h, c = carry
        i, f, g, o = jnp.split(x_t @ w_x + h @ w_h + b, 4, axis=1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return (h, c), h
    (h, c), hs = jax.lax.scan(step, (h, c), jnp.swapaxes(x, 0, 1))
    return jnp.sum(jnp.swapaxes(hs, 0, 1) ** 2) + jnp.sum(h * c)


def _gru_jax(x, w_x, w_h, b_x, b_h, h):
    def step(h, x_t):
        xr, xz, xn = jnp.split(x_t @ w_x + b_x, 3, axis=1)
        hr, hz, hn = jnp.split(h @ w_h + b_h, 3, axis=1)
        r, z = jax.nn.sigmoid(xr + hr), jax.nn.sigmoid(xz + hz)
        n = jnp.tanh(xn + r * hn)
        h = (1 - z) * n + z * h
        return h, h
    h, hs = jax.lax.scan(step, h, jnp.swapaxes(x, 0, 1))
    return jnp.sum(jnp.swapaxes(hs, 0, 1) ** 2) + jnp.sum(h)


def _build(kind, dtype="float32", initial=True, reverse=False):
    """(main, startup, outputs, loss) of one `kind` layer over x [-1, T, D]: with `initial`,
    the initial states are fed (h0, c0), else zeros."""
    main, startup = pd.Program(random_seed=3), pd.Program(random_seed=3)
    with pd.program_guard(main, startup):
        x = pd.data("x", [-1, T, D], dtype, stop_gradient=False)
        h0 = pd.data("h0", [-1, H], dtype, stop_gradient=False) if initial else None
        if kind == "lstm":
            c0 = pd.data("c0", [-1, H], dtype, stop_gradient=False) if initial else None
            out, (h, c) = layers.lstm(x, H, init_h=h0, init_c=c0, reverse=reverse)
            loss = ops.reduce_sum(out * out) + ops.reduce_sum(h * c)
            outs = [out, h, c]
        else:
            out, h = layers.gru(x, H, init_h=h0, reverse=reverse)
            loss = ops.reduce_sum(out * out) + ops.reduce_sum(h)
            outs = [out, h]
    return main, startup, outs, loss


def _params(kind):
    return (["lstm_0.w_0", "lstm_0.w_1", "lstm_0.b_0"] if kind == "lstm"
            else ["gru_0.w_0", "gru_0.w_1", "gru_0.b_0", "gru_0.b_1"])


def _feed(kind, batch=B, dtype="float32"):
    feed = {"x": RNG.normal(size=(batch, T, D)), "h0": RNG.normal(size=(batch, H))}
    if kind == "lstm":
        feed["c0"] = RNG.normal(size=(batch, H))
    return {k: v.astype(dtype) for k, v in feed.items()}


def _initialized(startup, dtype="float32"):
    exe, scope = pd.Executor(precision="highest"), pd.Scope()
    with jax.enable_x64(dtype == "float64"):
        exe.run(startup, scope=scope)
    return exe, scope


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_forward_matches_numpy_with_a_symbolic_batch(kind, reverse):
    main, startup, outs, _ = _build(kind, reverse=reverse)
    assert [v.shape for v in outs] == [(-1, T, H)] + [(-1, H)] * (len(outs) - 1)
    assert outs[0].name == f"{kind}_0.out"
    step_ops = [op.type for op in main.blocks[1].ops]   # the input projection is outside
    assert len(main.blocks) == 2 and step_ops.count("matmul") == 1
    exe, scope = _initialized(startup)
    weights = [scope.get(n) for n in _params(kind)]
    reference = _lstm_numpy if kind == "lstm" else _gru_numpy
    for batch in (1, B):
        feed = _feed(kind, batch)
        got = exe.run(main, feed=feed, fetch_list=outs, scope=scope)
        states = [feed["h0"], feed["c0"]] if kind == "lstm" else [feed["h0"]]
        expect = reference(feed["x"], *weights, *states, reverse=reverse)
        for a, e in zip(got, expect):
            np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_initial_states_default_to_zeros(kind):
    main, startup, outs, _ = _build(kind, initial=False)
    exe, scope = _initialized(startup)
    feed = {"x": _feed(kind)["x"]}
    got = exe.run(main, feed=feed, fetch_list=outs, scope=scope)
    zeros = [np.zeros((B, H), np.float32)] * (2 if kind == "lstm" else 1)
    reference = _lstm_numpy if kind == "lstm" else _gru_numpy
    for a, e in zip(got, reference(feed["x"], *[scope.get(n) for n in _params(kind)], *zeros)):
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_gradients_match_jax_grad_of_a_hand_written_scan(kind):
    main, startup, _, loss = _build(kind)
    feeds = ["x", "h0", "c0"] if kind == "lstm" else ["x", "h0"]
    block = main.global_block()
    with pd.program_guard(main, startup):
        grads = pd.gradients([loss], [block.var(n) for n in _params(kind) + feeds])
    exe, scope = _initialized(startup)
    weights = [scope.get(n) for n in _params(kind)]
    feed = _feed(kind)
    got = exe.run(main, feed=feed, fetch_list=grads, scope=scope)
    if kind == "lstm":
        f = lambda w_x, w_h, b, x, h, c: _lstm_jax(x, w_x, w_h, b, h, c)   # noqa: E731
    else:
        f = lambda w_x, w_h, b_x, b_h, x, h: _gru_jax(x, w_x, w_h, b_x, b_h, h)   # noqa: E731
    args = weights + [feed[n] for n in feeds]
    with jax.default_matmul_precision("highest"):
        expect = jax.grad(f, argnums=tuple(range(len(args))))(*args)
    for name, a, e in zip(_params(kind) + feeds, got, expect):
        np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-4, err_msg=name)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_gradients_match_finite_differences_at_a_few_entries(kind):
    main, startup, _, loss = _build(kind, dtype="float64")
    wrt = _params(kind)[:2] + ["x"]
    with pd.program_guard(main, startup):
        grads = pd.gradients([loss], [main.global_block().var(n) for n in wrt])
    exe, scope = _initialized(startup, "float64")
    feed = _feed(kind, batch=2, dtype="float64")
    with jax.enable_x64(True):
        got = dict(zip(wrt, exe.run(main, feed=feed, fetch_list=grads, scope=scope)))

        def loss_at(name, index, delta):
            if name in feed:
                moved = dict(feed)
                moved[name] = feed[name].copy()
                moved[name][index] += delta
                return float(exe.run(main, feed=moved, fetch_list=[loss], scope=scope)[0])
            value = np.array(scope.get(name))
            moved = value.copy()
            moved[index] += delta
            scope.set(name, moved)
            try:
                return float(exe.run(main, feed=feed, fetch_list=[loss], scope=scope)[0])
            finally:
                scope.set(name, value)

        eps = 1e-6
        for name in wrt:
            shape = got[name].shape
            for flat in RNG.choice(np.prod(shape), size=4, replace=False):
                index = np.unravel_index(flat, shape)
                numeric = (loss_at(name, index, eps) - loss_at(name, index, -eps)) / (2 * eps)
                np.testing.assert_allclose(got[name][index], numeric, rtol=1e-5, atol=1e-7,
                                           err_msg=f"{name}{index}")


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_save_load_round_trip_and_clone_for_test(kind, tmp_path):
    main, startup, outs, loss = _build(kind)
    with pd.program_guard(main, startup):
        pd.optimizer.SGD(learning_rate=0.1).minimize(loss)
    exe, scope = _initialized(startup)
    feed = _feed(kind)
    exe.run(main, feed=feed, fetch_list=[loss], scope=scope)   # one update: weights move
    test_prog = main.clone(for_test=True)
    assert not any(op.type == "sgd" for op in test_prog.global_block().ops)
    names = [v.name for v in outs]
    expect = exe.run(test_prog, feed=feed, fetch_list=names, scope=scope)
    pd.io.save_program(test_prog, tmp_path / "rnn.pb")
    pd.io.save_checkpoint(tmp_path / "rnn.ckpt", main, scope)
    loaded, fresh = pd.io.load_program(tmp_path / "rnn.pb"), pd.Scope()
    pd.io.load_checkpoint(tmp_path / "rnn.ckpt", loaded, fresh)
    got = pd.Executor(precision="highest").run(loaded, feed=feed, fetch_list=names, scope=fresh)
    for a, e in zip(got, expect):
        np.testing.assert_array_equal(a, e)
    weights = [scope.get(n) for n in _params(kind)]
    states = [feed["h0"], feed["c0"]] if kind == "lstm" else [feed["h0"]]
    reference = _lstm_numpy if kind == "lstm" else _gru_numpy
    np.testing.assert_allclose(got[0], reference(feed["x"], *weights, *states)[0],
                               rtol=1e-5, atol=1e-5)


def test_a_named_param_attr_names_each_weight_and_a_bad_input_rank_is_refused():
    main = pd.Program()
    with pd.program_guard(main, pd.Program()):
        x = pd.data("x", [-1, T, D], "float32")
        layers.gru(x, H, param_attr="enc", bias_attr="enc_bias")
        assert {v.name for v in main.all_parameters()} == {
            "enc.w_0", "enc.w_1", "enc_bias.b_0", "enc_bias.b_1"}
        flat = pd.data("flat", [-1, D], "float32")
        with pytest.raises(pd.ProgramError, match=r"lstm takes a \[batch, time, features\]"):
            layers.lstm(flat, H)


def test_bias_attr_false_makes_no_bias():
    main, startup = pd.Program(random_seed=2), pd.Program(random_seed=2)
    with pd.program_guard(main, startup):
        x = pd.data("x", [-1, T, D], "float32")
        out, h = layers.gru(x, H, bias_attr=False)
    assert {v.name for v in main.all_parameters()} == {"gru_0.w_0", "gru_0.w_1"}
    exe, scope = _initialized(startup)
    feed = {"x": _feed("gru")["x"]}
    got = exe.run(main, feed=feed, fetch_list=[out, h], scope=scope)
    zero_bias, zero_h = np.zeros(3 * H, np.float32), np.zeros((B, H), np.float32)
    expect = _gru_numpy(feed["x"], scope.get("gru_0.w_0"), scope.get("gru_0.w_1"),
                        zero_bias, zero_bias, zero_h)
    for a, e in zip(got, expect):
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-5)


TEXT = ("the quick brown fox jumps over the lazy dog. "
        "a stitch in time saves nine. "
        "all that glitters is not gold. ")


def test_an_lstm_learns_a_few_sentences_character_by_character():
    chars = sorted(set(TEXT))
    ids = np.array([chars.index(c) for c in TEXT], np.int64)
    seq, hidden, vocab = 16, 64, len(chars)
    starts = np.arange(0, len(ids) - seq - 1, 4)
    feed = {"x": np.stack([ids[s:s + seq] for s in starts]),
            "y": np.stack([ids[s + 1:s + seq + 1] for s in starts])[..., None]}
    main, startup = pd.Program(random_seed=1), pd.Program(random_seed=1)
    with pd.program_guard(main, startup):
        x = pd.data("x", [-1, seq], "int64")
        y = pd.data("y", [-1, seq, 1], "int64")
        out, _ = layers.lstm(layers.embedding(x, size=[vocab, 32]), hidden)
        logits = layers.fc(out, vocab, num_flatten_dims=2)
        loss = ops.mean(layers.softmax_with_cross_entropy(logits, y))
        pd.optimizer.Adam(learning_rate=0.02).minimize(loss)
    exe, scope = pd.Executor(), pd.Scope()
    exe.run(startup, scope=scope)
    losses = [float(exe.run(main, feed=feed, fetch_list=[loss], scope=scope)[0])
              for _ in range(80)]
    assert losses[-1] < losses[0] / 2, losses[::10]
