"""Paddle's static-graph spellings (progdesc.paddle_names): a script ported from Paddle runs.

The references are NumPy: one SGD step of a linear model with L2 decay computed by hand,
and Paddle's `axis` alignment of elementwise ops written as explicit NumPy reshapes (the
alignment was checked once against Paddle 3.3.1's own Executor, by hand).
"""
import pathlib

import jax
import numpy as np
import pytest

import progdesc as pd
from progdesc import layers, paddle_names
from progdesc.regularizer import L2Decay

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_every_name_resolves_and_aliases_are_the_objects_they_name():
    for name in paddle_names.NAMES:
        obj = paddle_names.resolve(name.where)
        if name.same_as:
            assert obj is paddle_names.resolve(name.same_as), name.paddle
        assert f".{name.where.rsplit('.', 1)[-1]}(" in name.ours, name.ours   # what is shown


def test_readme_shows_the_table():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert paddle_names.markdown_table() in readme, \
        "README's Paddle table differs from paddle_names.markdown_table(): paste it again"


def test_a_paddle_style_script_trains(tmp_path):
    # written as a paddle.static / fluid script is, with progdesc's imports
    rng = np.random.default_rng(0)
    data = rng.normal(size=(64, 4)).astype(np.float32)
    target = (data @ np.array([[1.0], [-2.0], [0.5], [3.0]], np.float32) + 0.25)
    main, startup = pd.Program(random_seed=3), pd.Program(random_seed=3)
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 4])
        y = pd.data("y", [None, 1])
        pred = layers.fc(x, 1, param_attr=pd.ParamAttr(name="w", regularizer=L2Decay(0.01)),
                         bias_attr=pd.ParamAttr(name="b",
                                                initializer=pd.initializer.Constant(0.5)))
        diff = layers.elementwise_sub(pred, y)
        loss = layers.mean(layers.elementwise_mul(diff, diff))
        # fluid's keyword; the decay of every parameter without a regularizer of its own
        pd.optimizer.SGD(learning_rate=0.1,
                         weight_decay=L2Decay(regularization_coeff=0.02)).minimize(loss)
    place = pd.CPUPlace()
    exe = pd.Executor(place)
    with pd.scope_guard(pd.Scope()):
        scope = pd.global_scope()
        exe.run(startup)
        w0 = np.array(scope.find_var("w").get_tensor())
        b0 = np.array(scope.find_var("b").get_tensor())
        first, = exe.run(main, feed={"x": data, "y": target}, fetch_list=[loss])
        w1 = np.array(scope.find_var("w").get_tensor())
        b1 = np.array(scope.find_var("b").get_tensor())
        # NumPy: the loss before the step, and one SGD step with the L2 terms 0.01 * w
        # (w's own regularizer) and 0.02 * b (the optimizer's weight decay)
        err = data @ w0 + b0 - target
        np.testing.assert_allclose(first, np.mean(err ** 2), rtol=1e-5)
        grad_w = 2 * data.T @ err / len(data) + 0.01 * w0
        np.testing.assert_allclose(w1, w0 - 0.1 * grad_w, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(b1, b0 - 0.1 * (2 * err.mean(0) + 0.02 * b0), rtol=1e-5)
        losses = [float(exe.run(main, feed={"x": data, "y": target}, fetch_list=[loss])[0])
                  for _ in range(40)]
        assert losses[-1] < 0.05 * float(first)
        pd.io.save_inference_model(str(tmp_path / "model"), ["x"], [pred], exe,
                                   main_program=main)
        program, feeds, fetches = pd.io.load_inference_model(str(tmp_path / "model"), exe)
        saved, = exe.run(program, feed={"x": data}, fetch_list=fetches)
        w, b = (np.array(scope.find_var(n).get_tensor()) for n in ("w", "b"))
    assert feeds == ["x"]
    np.testing.assert_allclose(saved, data @ w + b, rtol=1e-5, atol=1e-6)


def test_save_without_a_program_says_the_default_was_used(tmp_path):
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 4])
        pred = layers.fc(x, 1)
    with pytest.raises(pd.FeedError, match=r"default main program \(no program= given\)"):
        pd.io.save_inference_model(str(tmp_path / "m"), ["x"], [pred], pd.Executor())
    with pytest.raises(TypeError, match="not both"):
        pd.io.save_inference_model(str(tmp_path / "m"), ["x"], [pred], pd.Executor(),
                                   program=main, main_program=pd.Program())
    assert not (tmp_path / "m").exists()


@pytest.fixture(scope="module")
def aligned_results():
    """Each case's (progdesc result, NumPy reference), from one program run once."""
    rng = np.random.default_rng(1)
    cases = [  # (op, x shape, y shape, axis, act, NumPy of (x, y))
        ("add", (2, 3, 4, 5), (3, 4), 1, None, lambda a, b: a + b[None, :, :, None]),
        ("sub", (2, 3, 4), (2,), 0, None, lambda a, b: a - b[:, None, None]),
        ("mul", (2, 3, 4), (4,), -1, None, lambda a, b: a * b),
        ("div", (3,), (2, 3, 4), 1, None, lambda a, b: a[None, :, None] / b),
        ("add", (2, 3), (2, 3), 0, "relu", lambda a, b: np.maximum(a + b, 0)),
        ("mul", (2, 3, 4, 5), (4, 5), -2, None, lambda a, b: a * b),
    ]
    main = pd.Program()
    feed, fetch, want = {}, [], []
    with pd.program_guard(main, pd.Program()):
        for i, (op, xs, ys, axis, act, ref) in enumerate(cases):
            xv = rng.normal(size=xs).astype(np.float32)
            yv = rng.uniform(0.5, 2.0, size=ys).astype(np.float32)
            x, y = pd.data(f"x{i}", list(xs)), pd.data(f"y{i}", list(ys))
            fn = getattr(layers, f"elementwise_{op}")
            fetch.append(fn(x, y, axis=axis, act=act))
            feed.update({f"x{i}": xv, f"y{i}": yv})
            want.append(ref(xv, yv))
    got = pd.Executor().run(main, feed=feed, fetch_list=fetch, scope=pd.Scope())
    return list(zip(got, want))


@pytest.mark.parametrize("case", range(6))
def test_elementwise_axis_aligns_as_paddle_does(aligned_results, case):
    got, want = aligned_results[case]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_elementwise_axis_out_of_range_is_a_shape_error():
    main = pd.Program()
    with pd.program_guard(main, pd.Program()):
        x, y = pd.data("x", [2, 3, 4, 5]), pd.data("y", [3, 4])
        with pytest.raises(pd.ShapeError, match=r"elementwise_add: axis=3 .*axis must be -1 "
                                                r"or in 0\.\.2"):
            layers.elementwise_add(x, y, axis=3)
        with pytest.raises(pd.ShapeError):   # aligned (unsqueezed) at axis 0, it cannot add
            layers.elementwise_add(x, y, axis=0)
    assert main.global_block().ops == []   # neither left an op behind


def test_places():
    assert pd.CPUPlace() == jax.devices("cpu")[0]
    assert pd.Executor(pd.CPUPlace()).device.platform == "cpu"
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        gpus = []
    with pytest.raises(ValueError, match=rf"CUDAPlace\({len(gpus)}\): JAX has {len(gpus)} GPU"):
        pd.CUDAPlace(len(gpus))


def test_regularizer_names():
    assert L2Decay(1e-4) == 1e-4 and repr(L2Decay(1e-4)) == "L2Decay(0.0001)"
    assert L2Decay(regularization_coeff=0.5) == 0.5 and L2Decay() == 0.0
    with pytest.raises(AttributeError, match="no L1 regularization"):
        pd.regularizer.L1Decay(1e-4)
