"""Does a dependency-aware order pay in eager mode? `python -m bench.eager_schedule`.

A wide graph: `branches` independent chains, each `depth` times tanh(h @ W_b) on float32
[n, n], summed at the end (`program.schedule()` puts the branches' ops side by side: one
level per depth step, `branches` ops wide). Built and run in eager mode four ways, the
same ops each time:

- FIFO, asynchronous: branch after branch, as a user writes it; each op is dispatched as
  it is appended and Python goes on without waiting (what eager mode does);
- level order, asynchronous: the same ops appended level by level (op k of every branch,
  then op k + 1), the order a dependency-aware scheduler would dispatch them in;
- FIFO, each op waited for: a listener blocks on every op's outputs, what eager mode would
  cost if an op waited for its result;
- compiled: `Executor.run` of the recorded program (XLA schedules the whole graph).

Each run ends by reading the result. Medians of interleaved runs (bench.common).
"""
import argparse

import numpy as np

from bench.common import interleaved


def _build(n, branches, depth, order, weights, start):
    """Append the wide graph in eager mode, `order` 'fifo' or 'levels'; returns the sum."""
    import progdesc as pd
    from progdesc import ops
    h = [pd.data(f"x{b}", [n, n], value=start) for b in range(branches)]
    w = [pd.data(f"w{b}", [n, n], value=weights[b]) for b in range(branches)]
    steps = [(b, k) for b in range(branches) for k in range(depth)]
    if order == "levels":
        steps.sort(key=lambda bk: (bk[1], bk[0]))
    for b, _ in steps:
        h[b] = ops.tanh(ops.matmul(h[b], w[b]))
    total = h[0]
    for b in range(1, branches):
        total = total + h[b]
    return total


class _Waiter:
    """A program listener that waits for every eager op's outputs (registered after eager
    mode's own listener, so the values are there)."""

    def __init__(self):
        from progdesc import framework

        class Listener(framework.ProgramListener):
            def op_appended(self, block, index, opdef, in_map, out_map, attrs):
                from progdesc.recording.runner import values_of
                values = values_of(block.program)
                for names in out_map.values():
                    for name in names:
                        if name in values:
                            values[name].block_until_ready()
        self.listener = Listener()
        self.stop = None

    def __enter__(self):
        from progdesc import framework
        self.stop = framework.add_listener(self.listener)

    def __exit__(self, *exc):
        self.stop()


def run(n=256, branches=8, depth=4, repeats=15, log=print):
    """Time the four ways; returns {row: seconds per run}."""
    import progdesc as pd

    rng = np.random.default_rng(0)
    weights = [(rng.normal(size=(n, n)) / np.sqrt(n)).astype(np.float32)
               for _ in range(branches)]
    start = rng.normal(size=(n, n)).astype(np.float32)
    waiter = _Waiter()

    def eager(order, wait=False):
        def fn():
            with pd.scope_guard(pd.Scope()), pd.program_guard(pd.Program(), pd.Program()), \
                    pd.eager():
                if wait:
                    with waiter:
                        return _build(n, branches, depth, order, weights, start).numpy()
                return _build(n, branches, depth, order, weights, start).numpy()
        return fn

    main, startup = pd.Program(), pd.Program()
    with pd.scope_guard(pd.Scope()), pd.program_guard(main, startup), pd.eager():
        total = _build(n, branches, depth, "fifo", weights, start)
    schedule = main.schedule()
    feed = {f"x{b}": start for b in range(branches)}
    feed.update({f"w{b}": weights[b] for b in range(branches)})
    exe = pd.Executor()

    def compiled():
        exe.run(main, feed=feed, fetch_list=[total])

    fns = {"eager, FIFO, asynchronous (as is)": eager("fifo"),
           "eager, level order, asynchronous": eager("levels"),
           "eager, FIFO, each op waited for": eager("fifo", wait=True),
           "compiled (Executor.run, XLA schedules)": compiled}
    stats = interleaved(fns, repeats, warmup=2, block=1)
    res = {name: s["median_s"] for name, s in stats.items()}
    levels = schedule.levels
    log(f"wide graph: {branches} branches x {depth} x tanh(h @ W) on float32[{n}, {n}], "
        f"{len(schedule.ops)} ops in {len(levels)} levels (at most "
        f"{max(map(len, levels))} independent ops at once); median of {repeats}")
    base = res["eager, FIFO, asynchronous (as is)"]
    for name, s in res.items():
        log(f"  {name:40} {s * 1e3:8.2f} ms  x{s / base:.2f}")
    return res


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="*", default=[32, 256])
    parser.add_argument("--branches", type=int, default=8)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    for n in args.n:
        run(n, args.branches, args.depth, args.repeats)


if __name__ == "__main__":
    main()
