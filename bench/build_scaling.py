"""Time to build, append_backward and lower synthetic programs of growing size.

The program is a chain of `fc(h, 8, act="tanh")` layers (matmul, add, tanh: three
forward ops and two parameters per layer) over a [None, 8] input, ending in `mean`;
N counts the forward ops of the main program. Phases:

- build:    Program + program_guard + the layers (shape inference, startup init ops);
- backward: progdesc.append_backward(loss);
- lower:    progdesc.feeding.with_feed_fetch + lowering.lower.lower_block (the Python
            pass that makes the function; no tracing, no XLA compile);
- trace (optional, not part of the total): jax.jit(fn).lower(...) of that function,
            i.e. tracing to StableHLO, still without the XLA compile.
"""
import gc
import math
import time

import numpy as np

WIDTH = 8
TOTAL_10K_FORWARD = 3334   # forward ops whose program holds 10k ops after append_backward


def build_chain(n_ops):
    import progdesc as pd
    from progdesc import layers, ops
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, WIDTH])
        h = x
        for _ in range(max(1, (n_ops - 1) // 3)):
            h = layers.fc(h, WIDTH, act="tanh")
        loss = ops.mean(h)
    return main, startup, loss


def measure(n_ops, trace=False):
    import progdesc as pd
    from lowering.lower import lower_block
    from progdesc.feeding import with_feed_fetch

    gc.collect()   # the previous measurement's programs are garbage: not this one's cost
    t0 = time.perf_counter()
    main, startup, loss = build_chain(n_ops)
    t1 = time.perf_counter()
    n_forward = len(main.global_block().desc.ops)
    pd.append_backward(loss)
    t2 = time.perf_counter()
    desc = with_feed_fetch(main, ("x",), (loss.name,))
    lowered = lower_block(desc, 0)
    t3 = time.perf_counter()
    row = {"n_forward_ops": n_forward, "n_ops_total": len(main.global_block().desc.ops),
           "build_s": t1 - t0, "backward_s": t2 - t1, "lower_s": t3 - t2,
           "total_s": t3 - t0}
    if trace:
        import jax
        feeds = (np.zeros((4, WIDTH), np.float32),)
        reads = {n: jax.ShapeDtypeStruct(tuple(main.global_block().var(n).shape), np.float32)
                 for n in lowered.reads}
        mut = {n: v for n, v in reads.items() if n in lowered.writes}
        ro = {n: v for n, v in reads.items() if n not in lowered.writes}
        t4 = time.perf_counter()
        with jax.enable_x64(True):
            jax.jit(lowered.fn).lower(feeds, mut, ro)
        row["trace_s"] = time.perf_counter() - t4
    return row


def fit_exponent(ns, ts):
    """Slope of log(t) against log(n) (least squares)."""
    if len(ns) < 2:
        return float("nan")
    return float(np.polyfit(np.log(ns), np.log(ts), 1)[0])


def run(sizes=(1000, 2000, 5000, 10000), repeats=1, trace=False, log=print):
    measure(200)  # warm the shape-inference cache and imports, as a user's second program would
    rows = []
    for n in sizes:
        best = None
        for _ in range(repeats):
            r = measure(n, trace=trace)
            if best is None or r["total_s"] < best["total_s"]:
                best = r
        best["n"] = n
        rows.append(best)
        log(f"  build+backward+lower N={n}: build {best['build_s']:.2f} s, backward "
            f"{best['backward_s']:.2f} s, lower {best['lower_s']:.2f} s, total "
            f"{best['total_s']:.2f} s ({best['n_ops_total']} ops after backward)"
            + (f", trace {best['trace_s']:.2f} s" if "trace_s" in best else ""))
    ns = [r["n"] for r in rows]
    result = {"rows": rows,
              "exponent": fit_exponent(ns, [r["total_s"] for r in rows]),
              "phase_exponents": {p: fit_exponent(ns, [max(r[f"{p}_s"], 1e-6) for r in rows])
                                  for p in ("build", "backward", "lower")},
              "largest_n": ns[-1] if ns else None,
              "largest_total_s": rows[-1]["total_s"] if rows else math.nan}
    if trace:
        result["phase_exponents"]["trace"] = fit_exponent(ns, [r["trace_s"] for r in rows])
    # the other reading of "a 10k-op program": 10k ops once the backward ops are appended
    total = measure(TOTAL_10K_FORWARD)
    result["total_10k"] = total
    log(f"  build+backward+lower, {total['n_ops_total']} ops after backward "
        f"({total['n_forward_ops']} forward): {total['total_s']:.2f} s")
    return result
