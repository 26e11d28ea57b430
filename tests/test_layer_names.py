"""Layer outputs are named after the layer ('fc_1.out'), and a bad activation is caught at the
layer call."""
import os
import subprocess
import sys

import numpy as np
import pytest

import progdesc as pd
from progdesc import layers, ops

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _build(fn):
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        result = fn()
    return main, startup, result


def test_each_layer_names_its_result_after_itself():
    def model():
        image = pd.data("image", [None, 1, 8, 8])
        ids = pd.data("ids", [None, 5], "int64")
        label = pd.data("label", [None, 1], "int64")
        h = layers.conv2d(image, 4, 3, padding=1, act="relu")
        h = layers.batch_norm(layers.pool2d(h, 2), act="tanh")
        h = layers.dropout(layers.fc(h, 8), 0.5)
        seq = layers.layer_norm(layers.embedding(ids, [20, 8]), begin_norm_axis=2)
        att = layers.multi_head_attention(seq, num_heads=2)
        enc = layers.transformer_encoder_layer(seq, 2, 16)
        logits = layers.fc(h, 3)
        loss = layers.softmax_with_cross_entropy(logits, label, return_softmax=True)
        probs = ops.softmax(logits)
        return [h, seq, att, enc, logits, *loss, layers.cross_entropy(probs, label),
                layers.mse_loss(logits, probs), layers.accuracy(logits, label)]

    main, _, outs = _build(model)
    assert [v.name for v in outs] == [
        "dropout_0.out", "layer_norm_0.out", "multi_head_attention_0.out",
        "transformer_encoder_0.out", "fc_1.out", "softmax_with_cross_entropy_0.out",
        "softmax_with_cross_entropy_0.softmax", "cross_entropy_0.out", "mse_loss_0.out",
        "accuracy_0.out"]
    block = main.global_block()
    produced = {a for op in block.ops for names in op.desc.outputs for a in names.arguments}
    assert {"conv2d_0.out", "pool2d_0.out", "batch_norm_0.out", "fc_0.out", "embedding_0.out",
            "dropout_0.mask"} <= produced
    # every value a layer makes is named after it: the program reads by layer
    assert "fc_0.matmul_0.out" in produced and "conv2d_0.add_0.out" in produced
    assert {n.split(".", 1)[0] for n in produced} == {
        "conv2d_0", "pool2d_0", "batch_norm_0", "fc_0", "fc_1", "dropout_0", "embedding_0",
        "layer_norm_0", "multi_head_attention_0", "transformer_encoder_0",
        "softmax_with_cross_entropy_0", "cross_entropy_0", "mse_loss_0", "accuracy_0",
        "softmax_0"}
    for name in ("fc_1.out", "accuracy_0.out"):   # renamed in the desc, not only on the view
        assert block.var(name).desc.name == name
        assert any(name in s.arguments for op in main.desc.blocks[0].ops for s in op.outputs)


def test_layer_results_run_and_survive_serialization():
    main, startup, (x, out) = _build(lambda: (x := pd.data("x", [None, 3]),
                                              layers.fc(x, 2, act="relu")))
    exe, scope = pd.Executor(), pd.Scope()
    exe.run(startup, scope=scope)
    feed = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
    got, = exe.run(main, feed={"x": feed}, fetch_list=["fc_0.out"], scope=scope)
    w, b = np.asarray(scope.get("fc_0.w_0")), np.asarray(scope.get("fc_0.b_0"))
    np.testing.assert_allclose(got, np.maximum(feed @ w + b, 0), rtol=1e-6, atol=1e-6)
    again = pd.Program.from_bytes(main.to_bytes())
    assert again.global_block().find_var("fc_0.out") is not None


def test_raw_ops_and_layers_of_the_same_kind_never_share_a_name():
    def model():
        x = pd.data("x", [None, 1, 8, 8])
        a = ops.pool2d(x, ksize=[2, 2], strides=[2, 2])
        b = layers.pool2d(x, 2)
        c = ops.pool2d(x, ksize=[2, 2], strides=[2, 2])
        d = layers.pool2d(x, 2)
        return a, b, c, d

    _, _, outs = _build(model)
    names = [v.name for v in outs]
    assert len(set(names)) == 4, names


def test_a_layer_name_used_twice_is_an_error():
    def model():
        x = pd.data("x", [None, 1, 8, 8])
        layers.pool2d(x, 2, name="pool")
        layers.pool2d(x, 2, name="pool")

    with pytest.raises(pd.ProgramError, match="'pool.out'.*already exists"):
        _build(model)


def test_an_unknown_activation_names_the_users_line_and_the_known_ones(tmp_path):
    script = tmp_path / "bad_act.py"
    script.write_text("import progdesc as pd\n"
                      "from progdesc import layers\n"
                      "main, startup = pd.Program(), pd.Program()\n"
                      "with pd.program_guard(main, startup):\n"
                      "    h = pd.data('h', [None, 4])\n"
                      "    layers.fc(h, 3, act='nosuch')\n")
    env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=300)
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("lowering.errors.ProgramError: "), last
    assert "bad_act.py:6" in last and "unknown activation 'nosuch' for fc" in last, last
    for known in ("relu", "tanh", "sigmoid", "gelu", "softmax"):
        assert known in last


def test_an_unknown_activation_appends_nothing():
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        h = pd.data("h", [None, 4])
        for act in ("nosuch", "concat", "add"):   # not an op, a list input, two inputs
            with pytest.raises(pd.ProgramError, match=f"unknown activation '{act}'"):
                layers.fc(h, 3, act=act)
        with pytest.raises(pd.ProgramError, match="unknown activation 'nosuch' for "
                                                  "transformer_encoder_layer"):
            layers.transformer_encoder_layer(pd.data("s", [None, 2, 4]), 2, 8,
                                             activation="nosuch")
    assert len(main.global_block().ops) == 0 and len(startup.global_block().ops) == 0
    assert [v.name for v in main.list_vars()] == ["h", "s"]
    with pd.program_guard(main, startup):
        assert layers.fc(h, 3, act="exp").name == "fc_0.out"   # any one-input op serves
