"""`pd.Model`'s graph-mode step against `Executor.run` of the same program (issue 28):
`python -m bench.model_step`, and the `model` section of `python -m bench`.

Two models, each a `pd.Model` whose `train_one_batch` is forward, loss and Adam's update:

- readme: the README's MLP (4-16-1, batch 64): next to no arithmetic, so the row shows
  what the Model adds per call (the signature, the feed dict, the result's shape);
- mlp: a 784-256-256-10 classifier, batch 128, softmax cross-entropy, int64 labels.

For each, after the first call recorded the step: `model.train_one_batch(x, y)` against
`exe.run(model.train_program, feed={"x": x, "y": y}, fetch_list, scope=model.scope)` (the
recorded program, on the model's own Scope, by the same Executor; the feed dict written
in the call, as a training loop writes it), NumPy feeds and the loss read back as NumPy
on both sides, interleaved (bench.common.interleaved). Target: ratio <= 1.05. On a busy
machine the two medians of the same compiled call differ by more than the Model adds, so
that cost is also measured alone (the step with an Executor that runs nothing, less the
bare call) and given as a ratio: (Executor.run + it) / Executor.run. Also shown, not
targeted: one eager step (`model.graph(False)`), op by op.
"""
import argparse

import numpy as np

from bench.common import interleaved


def models():
    """{name: (model, x, y)}: the two models, compiled, their step recorded."""
    import progdesc as pd
    from progdesc import layers, ops

    class ReadmeMLP(pd.Model):
        def __init__(self):
            super().__init__(seed=0)
            self.optimizer = pd.optimizer.Adam(0.01)

        def forward(self, x):
            return layers.fc(layers.fc(x, 16, act="tanh"), 1)

        def train_one_batch(self, x, y):
            loss = layers.mse_loss(self.forward(x), y)
            self.optimizer.minimize(loss)
            return loss

    class Classifier(pd.Model):
        def __init__(self):
            super().__init__(seed=0)
            self.optimizer = pd.optimizer.Adam(1e-3)

        def forward(self, x):
            h = layers.fc(layers.fc(x, 256, act="relu"), 256, act="relu")
            return layers.fc(h, 10)

        def train_one_batch(self, x, label):
            loss = ops.mean(layers.softmax_with_cross_entropy(self.forward(x), label))
            self.optimizer.minimize(loss)
            return loss

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype(np.float32)
    found = {"readme": (ReadmeMLP(), x, x.sum(1, keepdims=True))}
    x = rng.normal(size=(128, 784)).astype(np.float32)
    found["mlp"] = (Classifier(), x, rng.integers(0, 10, size=(128, 1)).astype(np.int64))
    for model, x, y in found.values():
        model.compile([x, y])
        model.train_one_batch(x, y)
    return found


class _NoRun:
    """An Executor that runs nothing: what the Model costs around `Executor.run`."""

    def run(self, program, feed=None, fetch_list=None, scope=None):
        return [0.0]


def added_cost(model, rec, x, y, calls):
    """Seconds per call the Model adds to `Executor.run`: its step with an Executor that
    runs nothing, less that Executor's call made as the Executor side makes it (the
    machine's noise is far above this difference when timing whole steps)."""
    import timeit
    fx, fy = rec.feed_names
    real, model.executor = model.executor, _NoRun()
    try:
        stub = model.executor
        costs = []
        for _ in range(5):
            step = timeit.timeit(lambda: model.train_one_batch(x, y), number=calls)
            bare = timeit.timeit(lambda: stub.run(rec.program, feed={fx: x, fy: y},
                                                  fetch_list=rec.fetch_names,
                                                  scope=model.scope), number=calls)
            costs.append((step - bare) / calls)
    finally:
        model.executor = real
    return sorted(costs)[len(costs) // 2]


def run(steps=400, block=20, log=print):
    """{name: {"model", "executor", "eager" (median seconds per step), "ratio" (of the
    medians), "ratio_min" (of the fastest calls), "calls"}}."""
    results = {}
    for name, (model, x, y) in models().items():
        rec, = model.recordings.values()   # the step's one recording
        program, exe, scope = rec.program, model.executor, model.scope
        fx, fy = rec.feed_names

        def eager_step():
            model.graph(False)
            try:
                model.train_one_batch(x, y).numpy()
            finally:
                model.graph(True)

        timed = interleaved({
            "model": lambda: model.train_one_batch(x, y),
            "executor": lambda: exe.run(program, feed={fx: x, fy: y},
                                        fetch_list=rec.fetch_names, scope=scope)[0],
        }, steps, warmup=5, block=block)
        calls = model.calls["train_one_batch"]
        added = added_cost(model, rec, x, y, steps * 20)
        eager = interleaved({"eager": eager_step}, max(steps // 20, 5), warmup=2, block=5)
        r = results[name] = {k: v["median_s"] for k, v in timed.items()}
        r["eager"] = eager["eager"]["median_s"]
        r["ratio"] = r["model"] / r["executor"]
        r["ratio_min"] = timed["model"]["min_s"] / timed["executor"]["min_s"]
        r["added"] = added
        r["ratio_added"] = (r["executor"] + added) / r["executor"]
        r["calls"] = calls
        log(f"  {name}: Model step {r['model'] * 1e6:.0f} us, Executor.run "
            f"{r['executor'] * 1e6:.0f} us (x{r['ratio']:.3f}, fastest calls "
            f"x{r['ratio_min']:.3f}); the Model's own cost {added * 1e6:.1f} us per call: "
            f"x{r['ratio_added']:.3f} of Executor.run; eager step "
            f"{r['eager'] * 1e3:.1f} ms; in graph mode the body ran {r['calls']} time(s)")
    return results


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=400)
    args = ap.parse_args(argv)
    run(args.steps)


if __name__ == "__main__":
    main()
