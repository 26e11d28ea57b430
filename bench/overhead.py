"""Executor.run on a trivial program against a raw jitted call of the same function.

The program is one `scale` op (y = 2x) on a fed float32 [1, 4] array, with y fetched.
The raw call is `jax.jit(lambda x: x * 2.0)` on the same NumPy array. Two pairings:

- host:   `exe.run(main, feed, fetch_list=[y])` (NumPy result, the default) against
          `np.asarray(jitted(x))`: what a user's loop pays per call; the target's figure;
- device: `exe.run(..., return_numpy=False)` then block_until_ready, against
          `jitted(x).block_until_ready()`.
"""
import numpy as np

from bench.common import interleaved


def trivial_program():
    """(main, executor, scope, y): y = 2 * x for a [1, 4] x, startup already run."""
    import progdesc as pd
    from progdesc import ops

    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [1, 4])
        y = ops.scale(x, scale=2.0)
    exe, scope = pd.Executor(), pd.Scope()
    exe.run(startup, scope=scope)
    return main, exe, scope, y


def run(steps=2000, block=100, log=print):
    import jax

    main, exe, scope, y = trivial_program()
    xs = np.arange(4, dtype=np.float32).reshape(1, 4)
    feed = {"x": xs}
    fetch = [y]
    jitted = jax.jit(lambda v: v * 2.0)

    def pd_host():
        exe.run(main, feed=feed, fetch_list=fetch, scope=scope)

    def raw_host():
        np.asarray(jitted(xs))

    def pd_device():
        exe.run(main, feed=feed, fetch_list=fetch, scope=scope,
                return_numpy=False)[0].block_until_ready()

    def raw_device():
        jitted(xs).block_until_ready()

    assert np.allclose(exe.run(main, feed=feed, fetch_list=fetch, scope=scope)[0],
                       np.asarray(jitted(xs)))
    res = interleaved({"progdesc_host": pd_host, "raw_host": raw_host,
                       "progdesc_device": pd_device, "raw_device": raw_device},
                      steps=steps, warmup=20, block=block)
    out = {k: {"median_s": v["median_s"], "min_s": v["min_s"], "n": v["n"]}
           for k, v in res.items()}
    out["ratio"] = res["progdesc_host"]["median_s"] / res["raw_host"]["median_s"]
    out["ratio_device"] = res["progdesc_device"]["median_s"] / res["raw_device"]["median_s"]
    log(f"  trivial program: Executor.run {res['progdesc_host']['median_s'] * 1e6:.0f} us vs "
        f"jitted {res['raw_host']['median_s'] * 1e6:.0f} us (x{out['ratio']:.2f}); "
        f"device results: {res['progdesc_device']['median_s'] * 1e6:.0f} us vs "
        f"{res['raw_device']['median_s'] * 1e6:.0f} us (x{out['ratio_device']:.2f})")
    return out
