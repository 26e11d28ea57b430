"""The README's examples as written: the first one, then the `as_jax` one after it
(per-example gradients under `jax.vmap`), and the count of notebooks `make test` runs.

The README's first block is the setting the `as_jax` block names ("as in the first
example"); its training loop is left out. Gradients are checked against a
NumPy backward pass of the same two-layer network.
"""
import pathlib
import re

import jax
import numpy as np
import pytest

import progdesc as pd

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _block(heading, index=0):
    """The `index`-th ```python block after `heading` in the README, as written."""
    section = README[README.index(heading):]
    return re.findall(r"```python\n(.*?)```", section, re.S)[index]


@pytest.fixture(scope="module")
def as_jax_namespace():
    first = README[README.index("```python\n") + len("```python\n"):]
    first = first[:first.index("for step in")]   # built and started, not trained
    namespace = {}
    with pd.scope_guard(pd.Scope()):
        exec(compile(first, "README.md", "exec"), namespace)  # noqa: S102
        exec(compile(_block("## With JAX and Flax"), "README.md", "exec"), namespace)  # noqa: S102
    return namespace


def _numpy_example_grad(params, x, y):
    """d/dW of (tanh(x W0 + b0) W1 + b1 - y)^2 for one example, by hand."""
    w0, b0 = params["fc_0.w_0"], params["fc_0.b_0"]
    w1, b1 = params["fc_1.w_0"], params["fc_1.b_0"]
    h = np.tanh(x @ w0 + b0)
    dp = 2 * (h @ w1 + b1 - y)
    dz = (dp @ w1.T) * (1 - h * h)
    return {"fc_0.w_0": np.outer(x, dz), "fc_0.b_0": dz, "fc_1.w_0": np.outer(h, dp),
            "fc_1.b_0": dp}


def test_readme_as_jax_example_runs_and_gives_per_example_gradients(as_jax_namespace):
    ns = as_jax_namespace
    params = {k: np.asarray(v, np.float64) for k, v in ns["params"].items()}
    xb, yb, per_example = ns["xb"], ns["yb"], ns["per_example"]
    assert per_example["fc_0.w_0"].shape == (64, 4, 16)
    for k in (0, 17, 63):
        expected = _numpy_example_grad(params, xb[k].astype(np.float64), yb[k])
        for name, grad in expected.items():
            np.testing.assert_allclose(per_example[name][k], grad, rtol=2e-4, atol=1e-6,
                                       err_msg=name)
    # the batch loss is the mean over examples, so its gradient is theirs averaged
    for name, grad in ns["grads"].items():
        np.testing.assert_allclose(np.mean(per_example[name], 0), grad, rtol=2e-4, atol=1e-6)


def test_one_example_returns_fetches_without_their_batch_dim(as_jax_namespace):
    ns = as_jax_namespace
    main, x, scope = ns["main"], ns["x"], ns["scope"]
    hidden = main.global_block().var("fc_0.out")    # the first layer's [-1, 16] output
    fn, params = pd.as_jax(main, feed=[x, ns["y"]], fetch=[ns["loss"], hidden], scope=scope)
    loss, h = fn(params, ns["xb"][5], ns["yb"][5])
    assert np.shape(loss) == () and np.shape(h) == (16,)
    p = {k: np.asarray(v) for k, v in params.items()}
    np.testing.assert_allclose(h, np.tanh(ns["xb"][5] @ p["fc_0.w_0"] + p["fc_0.b_0"]),
                               rtol=1e-5, atol=1e-6)


def test_mixing_one_example_and_a_batch_names_the_feeds(as_jax_namespace):
    ns = as_jax_namespace
    fn, params = pd.as_jax(ns["main"], feed=[ns["x"], ns["y"]], fetch=ns["loss"],
                           scope=ns["scope"])
    with pytest.raises(pd.FeedError, match=r"feeds x are one example .* but y a batch"):
        fn(params, ns["xb"][0], ns["yb"])


def test_readme_names_one_topic_per_notebook_make_test_runs():
    """The README lists what the notebooks `make test` runs are about, one topic each (it
    once said "four" when there were seven): the list must grow with the notebooks."""
    notebooks = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    text = " ".join(README.split())
    listed = re.search(r"notebooks in `notebooks/` \(([^)]*)\) run as part of `make test`", text)
    assert listed, "the README no longer lists the notebooks make test runs"
    topics = [t for t in re.split(r",\s*(?:and\s+)?", listed.group(1)) if t.strip()]
    assert len(topics) == len(notebooks), (topics, [n.name for n in notebooks])
    assert not re.search(r"\b(one|two|three|four|five|six|seven|eight|ten) notebooks\b", text,
                         re.I), "a count of notebooks in words: keep it out, or test it here"
