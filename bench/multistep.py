"""Many steps per call: Executor.run(..., steps=K) over K stacked batches vs K separate runs.

MLP 784-512-512-10 with Adam at batch 32. Skipped when `Executor.run` has no `steps`
parameter. Throughput ratio = (time of K separate calls) / (time of one K-step call).
The same ratio for hand-written Flax + optax (K jitted steps against one `lax.scan` of
the same step) runs interleaved with it: what fusing K steps can give on this backend.
"""
import inspect

import numpy as np

from bench import workloads as W
from bench.common import interleaved


def supported():
    import progdesc as pd
    return "steps" in inspect.signature(pd.Executor.run).parameters


def run(k=16, rounds=12, batch=32, log=print):
    if not supported():
        log("  steps=K: skipped (Executor.run has no `steps` argument)")
        return {"skipped": "Executor.run has no steps argument"}
    import progdesc as pd
    spec = W.SPECS["mlp"]
    main, startup, x, label, loss = W.build_progdesc(spec)
    exe, scope = pd.Executor(), pd.Scope()
    exe.run(startup, scope=scope)
    batches = W.make_batches(spec, k, batch=batch)
    feeds = [{"x": bx, "label": by} for bx, by in batches]
    stacked = {"x": np.stack([b[0] for b in batches]), "label": np.stack([b[1] for b in batches])}

    def separate():
        for f in feeds:
            exe.run(main, feed=f, fetch_list=[loss], scope=scope)

    def one_call():
        out = exe.run(main, feed=stacked, fetch_list=[loss], scope=scope, steps=k)
        np.asarray(out[0])

    first = exe.run(main, feed=stacked, fetch_list=[loss], scope=scope, steps=k)[0]
    if np.shape(first)[:1] != (k,):
        log(f"  steps=K: fetched loss has shape {np.shape(first)}, expected ({k}, ...)")
    flax_separate, flax_scan = _flax_reference(spec, batches)
    res = interleaved({"separate": separate, "steps": one_call, "flax_separate": flax_separate,
                       "flax_scan": flax_scan}, steps=rounds, warmup=2, block=2)
    median = {name: r["median_s"] for name, r in res.items()}
    ratio = median["separate"] / median["steps"]
    flax_ratio = median["flax_separate"] / median["flax_scan"]
    log(f"  steps={k}: one call {median['steps'] * 1e3:.1f} ms vs {k} calls "
        f"{median['separate'] * 1e3:.1f} ms (throughput x{ratio:.2f}); Flax + optax: lax.scan "
        f"{median['flax_scan'] * 1e3:.1f} ms vs {k} jitted calls "
        f"{median['flax_separate'] * 1e3:.1f} ms (x{flax_ratio:.2f})")
    return {"k": k, "batch": batch, "separate_s": median["separate"],
            "steps_s": median["steps"], "ratio": ratio,
            "flax_separate_s": median["flax_separate"], "flax_scan_s": median["flax_scan"],
            "flax_ratio": flax_ratio}


def _flax_reference(spec, batches):
    """(K jitted Flax steps, one jitted lax.scan of the same step over the K batches)."""
    import jax

    trainer = W.FlaxTrainer(spec)
    trainer.define(batches[0])
    prepared = [trainer.prepare(b) for b in batches]
    xs, ys = np.stack([x for x, _ in prepared]), np.stack([y for _, y in prepared])

    def body(state, batch):
        params, opt_state, loss = trainer._raw_step(*state, *batch)
        return (params, opt_state), loss

    scan = jax.jit(lambda p, s, xs, ys: jax.lax.scan(body, (p, s), (xs, ys)),
                   donate_argnums=(0, 1))

    def separate():
        for batch in prepared:
            np.asarray(trainer.step(batch))     # the loss of every step, as a user reads it

    def one_call():
        (trainer.params, trainer.opt_state), losses = scan(trainer.params, trainer.opt_state,
                                                           xs, ys)
        np.asarray(losses)
    return separate, one_call
