"""ParamAttr's optimizer settings live in the description: copies, saved programs, checkpoints
and inference models keep them, and an optimizer added later reads them from there."""
import numpy as np
import pytest

import progdesc as pd
from progdesc import io, layers
from progdesc.optimizer import SGD
from progdesc.param import param_settings

LR, W_LR, W_L2, B_LR = 0.1, 0.5, 0.2, 3.0
RNG = np.random.default_rng(0)
X = RNG.normal(size=(6, 3)).astype(np.float32)
Y = RNG.normal(size=(6, 2)).astype(np.float32)


def build():
    """An fc layer whose weight has an L2 regularizer and half the learning rate, and whose
    bias has three times the learning rate; no optimizer yet."""
    main, startup = pd.Program(random_seed=1), pd.Program(random_seed=1)
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 3])
        layers.fc(x, 2, param_attr=pd.ParamAttr(regularizer=W_L2, learning_rate=W_LR),
                  bias_attr=pd.ParamAttr(learning_rate=B_LR))
    return main, startup


def expected_step(w, b):
    """One SGD step on mean((x w + b - y)^2), by hand."""
    w, b = w.astype(np.float64), b.astype(np.float64)
    err = X @ w + b - Y
    dw = X.T @ (2 * err / err.size)
    db = (2 * err / err.size).sum(0)
    return w - LR * W_LR * (dw + W_L2 * w), b - LR * B_LR * db


def train_one_step(program, startup, scope):
    """Add the loss and SGD to `program`; run `startup` and one step; returns (w, b) before
    and after."""
    with pd.program_guard(program, startup):
        y = pd.data("y", [None, 2])
        out = program.global_block().var("fc_0.out")
        SGD(LR).minimize(layers.mse_loss(out, y))
    exe = pd.Executor()
    exe.run(startup, scope=scope)
    before = [np.asarray(scope.get(n)).copy() for n in ("fc_0.w_0", "fc_0.b_0")]
    exe.run(program, feed={"x": X, "y": Y}, scope=scope)
    return before, [np.asarray(scope.get(n)) for n in ("fc_0.w_0", "fc_0.b_0")]


def check_step(program, startup, scope=None):
    before, after = train_one_step(program, startup, scope or pd.Scope())
    for got, want in zip(after, expected_step(*before)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_the_settings_are_in_the_description():
    main, _ = build()
    w, b = (main.global_block().var(n) for n in ("fc_0.w_0", "fc_0.b_0"))
    assert w.desc.param_settings.regularizer.l2 == pytest.approx(W_L2)
    assert w.desc.param_settings.learning_rate == W_LR
    assert b.desc.param_settings.learning_rate == B_LR
    assert not b.desc.param_settings.HasField("regularizer")
    attr = param_settings(w)
    assert (attr.name, attr.learning_rate, attr.trainable) == ("fc_0.w_0", W_LR, True)
    assert attr.regularizer == pytest.approx(W_L2)


def test_default_settings_leave_the_description_as_before():
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        layers.fc(pd.data("x", [None, 3]), 2)
    for var in main.all_parameters():   # old readers see the same bytes
        assert not var.desc.HasField("param_settings")
        assert (param_settings(var).learning_rate, param_settings(var).regularizer) == (1.0, 0.0)


def test_one_step_with_the_settings():
    check_step(*build())


def test_a_clone_keeps_the_settings():
    main, startup = build()
    check_step(main.clone(), startup)


@pytest.mark.parametrize("suffix", [".pb", ".pbtxt"])
def test_a_saved_and_loaded_program_keeps_the_settings(tmp_path, suffix):
    main, startup = build()
    io.save_program(main, tmp_path / f"main{suffix}")
    check_step(io.load_program(tmp_path / f"main{suffix}"), startup)


def test_training_resumed_from_a_checkpoint_keeps_the_settings(tmp_path):
    main, startup = build()
    scope = pd.Scope()
    train_one_step(main, startup, scope)
    io.save_program(main, tmp_path / "main.pb")
    io.save_checkpoint(tmp_path / "ckpt.safetensors", main, scope)

    program, resumed = io.load_program(tmp_path / "main.pb"), pd.Scope()
    io.load_checkpoint(tmp_path / "ckpt.safetensors", program, resumed)
    before = [np.asarray(resumed.get(n)).copy() for n in ("fc_0.w_0", "fc_0.b_0")]
    pd.Executor().run(program, feed={"x": X, "y": Y}, scope=resumed)
    for name, want in zip(("fc_0.w_0", "fc_0.b_0"), expected_step(*before)):
        np.testing.assert_allclose(np.asarray(resumed.get(name)), want, rtol=1e-5, atol=1e-6)


def test_an_inference_model_keeps_the_settings_for_fine_tuning(tmp_path):
    main, startup = build()
    scope = pd.Scope()
    pd.Executor().run(startup, scope=scope)
    io.save_inference_model(tmp_path / "model", ["x"], ["fc_0.out"], None, main, scope)
    loaded_scope = pd.Scope()
    program, _, _ = io.load_inference_model(tmp_path / "model", None, loaded_scope)
    # the new startup program only initializes what fine-tuning adds (the learning rate)
    check_step(program, pd.Program(), loaded_scope)


def test_print_and_html_show_the_settings_where_set():
    main, _ = build()
    lines = str(main).splitlines()
    assert "  param fc_0.w_0: float32[3, 2] {lr=0.5, l2=0.2}" in lines
    assert "  param fc_0.b_0: float32[2] {lr=3}" in lines
    text = main.table()._repr_html_()
    assert "<td>{lr=0.5, l2=0.2}</td>" in text and "<td>{lr=3}</td>" in text
    plain = pd.Program()
    with pd.program_guard(plain, pd.Program()):
        layers.fc(pd.data("x", [None, 3]), 2)
    assert "  param fc_0.w_0: float32[3, 2]" in str(plain).splitlines()
    assert "lr=" not in str(plain) and "lr=" not in plain.table()._repr_html_()
