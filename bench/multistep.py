"""Many steps per call: Executor.run(..., steps=K) over K stacked batches vs K separate runs.

MLP 784-512-512-10 with Adam at batch 32. Skipped when `Executor.run` has no `steps`
parameter. Throughput ratio = (time of K separate calls) / (time of one K-step call).
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
    res = interleaved({"separate": separate, "steps": one_call}, steps=rounds, warmup=2, block=2)
    ratio = res["separate"]["median_s"] / res["steps"]["median_s"]
    log(f"  steps={k}: one call {res['steps']['median_s'] * 1e3:.1f} ms vs {k} calls "
        f"{res['separate']['median_s'] * 1e3:.1f} ms (throughput x{ratio:.2f})")
    return {"k": k, "batch": batch, "separate_s": res["separate"]["median_s"],
            "steps_s": res["steps"]["median_s"], "ratio": ratio}
