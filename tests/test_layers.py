"""Layers beyond the parity tests: attention masks, transformer training, ParamAttr, readers."""
import numpy as np
import pytest

import progdesc as pd
from progdesc import initializer, layers, ops, reader
from progdesc.optimizer import SGD, Adam


def _attention_program(causal=False, padding=False, seq=5, d_model=8, dropout_rate=0.0):
    main, startup = pd.Program(random_seed=2), pd.Program(random_seed=2)
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, seq, d_model])
        mask = pd.data("mask", [None, seq]) if padding else None
        out = layers.multi_head_attention(x, num_heads=2, causal=causal, key_padding_mask=mask,
                                          dropout_rate=dropout_rate)
    scope, exe = pd.Scope(), pd.Executor(precision="highest")   # compared with NumPy
    exe.run(startup, scope=scope)
    return main, exe, scope, out


def test_causal_attention_ignores_later_positions():
    main, exe, scope, out = _attention_program(causal=True)
    x = np.random.default_rng(0).normal(size=(2, 5, 8)).astype(np.float32)
    changed = x.copy()
    changed[:, 3:] += 5.0                                   # only positions 3 and 4 change
    a, = exe.run(main, feed={"x": x}, fetch_list=[out], scope=scope)
    b, = exe.run(main, feed={"x": changed}, fetch_list=[out], scope=scope)
    np.testing.assert_allclose(a[:, :3], b[:, :3], rtol=1e-5, atol=1e-6)
    assert not np.allclose(a[:, 3:], b[:, 3:])


def test_key_padding_mask_hides_padded_keys():
    main, exe, scope, out = _attention_program(padding=True)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2, 5, 8)).astype(np.float32)
    mask = np.ones((2, 5), np.float32)
    mask[:, 4] = 0                                          # the last key is padding
    changed = x.copy()
    changed[:, 4] = rng.normal(size=(2, 8))
    a, = exe.run(main, feed={"x": x, "mask": mask}, fetch_list=[out], scope=scope)
    b, = exe.run(main, feed={"x": changed, "mask": mask}, fetch_list=[out], scope=scope)
    np.testing.assert_allclose(a[:, :4], b[:, :4], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("causal, padding, dropout_rate", [
    (False, False, 0.0), (True, False, 0.0), (False, True, 0.0), (True, True, 0.0),
    (True, True, 0.5),   # built with attention dropout (composed ops), run as clone(for_test)
], ids=["plain", "causal", "key_padding", "causal_key_padding", "dropout_ops_for_test"])
def test_attention_matches_a_numpy_reference(causal, padding, dropout_rate):
    main, exe, scope, out = _attention_program(causal, padding, dropout_rate=dropout_rate)
    fused = any(op.type == "scaled_dot_product_attention" for op in main.global_block().ops)
    assert fused == (dropout_rate == 0)
    rng = np.random.default_rng(2)
    x = rng.normal(size=(2, 5, 8)).astype(np.float32)
    keep = np.ones((2, 5), np.float32)
    keep[0, 3:] = 0                                         # the last two keys of row 0: padding
    feed = {"x": x, "mask": keep} if padding else {"x": x}
    got, = exe.run(main.clone(for_test=True), feed=feed, fetch_list=[out], scope=scope)
    p = lambda name: np.asarray(scope.get(name), np.float64)  # noqa: E731
    proj = lambda h, tag: h @ p(f"multi_head_attention_0.{tag}.w_0") + p(  # noqa: E731
        f"multi_head_attention_0.{tag}.b_0")
    heads = lambda h: h.reshape(2, 5, 2, 4).transpose(0, 2, 1, 3)  # noqa: E731
    q, k, v = (heads(proj(x, t)) for t in ("query", "key", "value"))
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(4)     # [B, N, T, S]
    allowed = np.ones((2, 1, 5, 5), bool)
    if causal:
        allowed &= np.tril(np.ones((5, 5), bool))
    if padding:
        allowed &= keep[:, None, None, :] > 0
    scores = np.where(allowed, scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    context = (weights @ v).transpose(0, 2, 1, 3).reshape(2, 5, 8)
    np.testing.assert_allclose(got, proj(context, "output"), rtol=1e-5, atol=1e-6)


def test_attention_has_no_second_order_gradient_and_says_so():
    main = pd.Program()
    with pd.program_guard(main):
        q = pd.data("q", [2, 3, 1, 4], stop_gradient=False)
        (g,) = pd.gradients([ops.mean(ops.scaled_dot_product_attention(q, q, q))], [q])
        with pytest.raises(pd.BackwardError, match="scaled_dot_product_attention_grad"):
            pd.gradients([ops.reduce_sum(ops.square(g))], [q])


@pytest.mark.parametrize("dropout_rate", [0.0, 0.1], ids=["fused_attention", "dropout_ops"])
def test_transformer_encoder_trains(dropout_rate):
    main, startup = pd.Program(random_seed=0), pd.Program(random_seed=0)
    with pd.program_guard(main, startup):
        tokens = pd.data("tokens", [None, 6], "int64")
        label = pd.data("label", [None, 1], "int64")
        h = layers.embedding(tokens, [10, 16])
        h = layers.transformer_encoder_layer(h, num_heads=2, dim_feedforward=32,
                                             dropout_rate=dropout_rate)
        logits = layers.fc(ops.reduce_mean(h, axis=[1]), 2)
        loss = ops.mean(layers.softmax_with_cross_entropy(logits, label))
        Adam(3e-3).minimize(loss)
    scope, exe = pd.Scope(), pd.Executor()
    exe.run(startup, scope=scope)
    rng = np.random.default_rng(0)
    toks = rng.integers(0, 10, size=(32, 6))
    labels = (toks == 3).any(axis=1).astype(np.int64)[:, None]   # "does token 3 occur?"
    losses = [float(exe.run(main, feed={tokens: toks, label: labels}, fetch_list=[loss],
                            scope=scope)[0]) for _ in range(60)]
    assert losses[-1] < 0.5 * losses[0]


def test_param_attr_names_initializes_and_freezes():
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 3])
        frozen = pd.ParamAttr(name="frozen_w", initializer=initializer.Constant(0.5),
                              trainable=False)
        h = layers.fc(x, 2, param_attr=frozen, bias_attr=False)
        out = layers.fc(h, 1, param_attr="head_w", bias_attr=pd.ParamAttr(
            initializer=initializer.Constant(0.25)))
        loss = ops.mean(out)
        pairs = SGD(0.1).minimize(loss)[1]
    assert {p.name for p, _ in pairs} == {"head_w", "fc_1.b_0"}
    scope, exe = pd.Scope(), pd.Executor()
    exe.run(startup, scope=scope)
    np.testing.assert_array_equal(np.asarray(scope.get("frozen_w")), np.full((3, 2), 0.5))
    np.testing.assert_array_equal(np.asarray(scope.get("fc_1.b_0")), [0.25])
    exe.run(main, feed={x: np.ones((4, 3), np.float32)}, fetch_list=[loss], scope=scope)
    np.testing.assert_array_equal(np.asarray(scope.get("frozen_w")), np.full((3, 2), 0.5))
    assert not np.allclose(np.asarray(scope.get("fc_1.b_0")), [0.25])


def test_seeded_startup_is_reproducible_and_seed_dependent():
    def init(seed):
        main, startup = pd.Program(), pd.Program(random_seed=seed)
        with pd.program_guard(main, startup):
            layers.fc(pd.data("x", [None, 4]), 3,
                      param_attr=pd.ParamAttr(initializer=initializer.KaimingNormal()))
        scope = pd.Scope()
        pd.Executor().run(startup, scope=scope)
        return np.asarray(scope.get("fc_0.w_0"))
    np.testing.assert_array_equal(init(7), init(7))
    assert not np.array_equal(init(7), init(8))


def test_batch_shuffle_and_datafeeder():
    images = np.arange(10 * 4, dtype=np.float64).reshape(10, 4)
    labels = np.arange(10)
    batches = list(reader.batch(reader.from_arrays(images, labels), 4)())
    assert [len(b) for b in batches] == [4, 4, 2]
    assert [len(b) for b in reader.batch(reader.from_arrays(images, labels), 4,
                                         drop_last=True)()] == [4, 4]
    shuffled = [s[1] for s in reader.shuffle(reader.from_arrays(images, labels), 10, seed=0)()]
    assert sorted(shuffled) == list(range(10)) and shuffled != list(range(10))
    main = pd.Program()
    with pd.program_guard(main):
        x = pd.data("x", [None, 4])
        y = pd.data("y", [None, 1], "int64")
    feed = reader.DataFeeder([x, y]).feed(batches[0])
    assert feed["x"].dtype == np.float32 and feed["x"].shape == (4, 4)
    assert feed["y"].dtype == np.int64 and feed["y"].shape == (4, 1)
    with pytest.raises(pd.FeedError, match="sample 0 has 1 columns"):
        reader.DataFeeder([x, y]).feed([(images[0],)])
