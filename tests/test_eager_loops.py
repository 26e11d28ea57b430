"""Eager code run in a PyTorch-style training loop: the errors and the warning say what to do
(progdesc/recording/loops.py), and long programs that are no loop get no warning."""
import warnings

import numpy as np
import pytest

import progdesc as pd
from progdesc import layers

X = np.random.default_rng(0).normal(size=(8, 4)).astype("float32")
Y = X.sum(1, keepdims=True)


def _step(i, named):
    """One PyTorch-style eager iteration: data, forward, loss, minimize."""
    w1 = pd.ParamAttr(name="w1") if named else None
    x = pd.data(f"x{i}", [None, 4], value=X)
    y = pd.data(f"y{i}", [None, 1], value=Y)
    h = layers.fc(x, 8, param_attr=w1, act="relu")
    loss = layers.mse_loss(layers.fc(h, 1), y)
    pd.optimizer.SGD(0.1).minimize(loss)
    return loss


def _names_both_ways(text):
    return "pd.Model" in text and "train_one_batch" in text and "pd.capture" in text \
        and "Executor.run" in text


def test_a_named_parameter_made_again_in_an_eager_loop_says_why_and_what_to_do():
    main, startup = pd.Program(), pd.Program()
    with pd.scope_guard(pd.Scope()), pd.program_guard(main, startup), pd.eager():
        _step(0, named=True)
        n_ops, n_vars = len(main.global_block().desc.ops), len(main.global_block().desc.vars)
        with pytest.raises(pd.ProgramError) as info:
            _step(1, named=True)
    text = str(info.value)
    assert "'w1'" in text and "already exists" in text and "loop" in text
    assert _names_both_ways(text), text
    assert "test_eager_loops.py:" in text   # the user's line
    # the failed layer was taken back: only the second iteration's data variables stay
    assert len(main.global_block().desc.ops) == n_ops
    assert len(main.global_block().desc.vars) == n_vars + 2


def test_outside_eager_mode_the_error_keeps_its_static_text():
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        _step(0, named=True)
        with pytest.raises(pd.ProgramError) as info:
            _step(1, named=True)
    assert "give the parameter another name" in str(info.value)
    assert "pd.Model" not in str(info.value)


def test_a_data_variable_declared_again_in_an_eager_loop_names_both_ways():
    with pd.scope_guard(pd.Scope()), pd.program_guard(pd.Program(), pd.Program()), pd.eager():
        pd.data("x", [None, 4], value=X)
        with pytest.raises(pd.ProgramError) as info:
            pd.data("x", [None, 4], value=X)
    assert "'x'" in str(info.value) and _names_both_ways(str(info.value))


def test_the_same_loss_minimized_again_in_eager_mode_names_both_ways():
    with pd.scope_guard(pd.Scope()), pd.program_guard(pd.Program(), pd.Program()), pd.eager():
        loss = _step(0, named=False)
        with pytest.raises(pd.ProgramError) as info:
            pd.optimizer.SGD(0.1).minimize(loss)
    assert "already updated" in str(info.value) and _names_both_ways(str(info.value))


def test_an_eager_training_loop_warns_once_naming_both_ways():
    main, startup = pd.Program(), pd.Program()
    with pd.scope_guard(pd.Scope()), pd.program_guard(main, startup), pd.eager(), \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(5):
            _step(i, named=False)
    loops = [w for w in caught if issubclass(w.category, pd.EagerLoopWarning)]
    assert len(loops) == 1, [str(w.message) for w in loops]   # once per program
    assert _names_both_ways(str(loops[0].message))
    assert "3 training steps" in str(loops[0].message)
    assert loops[0].filename == __file__   # points at the user's code


def _no_loop_warning(build, eager=True):
    with pd.scope_guard(pd.Scope()), pd.program_guard(pd.Program(), pd.Program()), \
            (pd.eager() if eager else _null()), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build()
    return [str(w.message) for w in caught if issubclass(w.category, pd.EagerLoopWarning)]


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_a_deep_model_built_with_a_python_loop_is_no_training_loop():
    def build():
        h = pd.data("x", [None, 4], value=X)
        for _ in range(12):   # twelve layers: the same op sequence twelve times
            h = layers.fc(h, 4, act="tanh") + h
        loss = layers.mse_loss(layers.fc(h, 1), pd.data("y", [None, 1], value=Y))
        pd.optimizer.SGD(0.01).minimize(loss)
    assert _no_loop_warning(build) == []


def test_two_optimizers_and_repeated_gradients_are_no_training_loop():
    def build():
        x = pd.data("x", [None, 4], value=X)
        y = pd.data("y", [None, 1], value=Y)
        a, b = layers.fc(x, 1, name="a"), layers.fc(x, 1, name="b")
        pd.optimizer.SGD(0.1).minimize(layers.mse_loss(a, y))   # two optimizers, as a GAN
        pd.optimizer.SGD(0.1).minimize(layers.mse_loss(b, y))   # has them
        for _ in range(4):   # gradients without updates in between
            pd.gradients(layers.mse_loss(a * b, y), [x])
    assert _no_loop_warning(build) == []


def test_a_static_program_gets_no_eager_warning():
    assert _no_loop_warning(lambda: [_step(i, named=False) for i in range(3)], eager=False) == []
