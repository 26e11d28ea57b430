"""Plain JAX code compiled by several processes at once, with and without progdesc imported.

    python -m bench.concurrency [--processes 4] [--rounds 3]

Importing progdesc must not change how long other JAX code takes (issue 22): progdesc's
compilation cache serves only progdesc's own compiles. Each round starts 2 x `--processes`
fresh processes at once: half import only JAX, half import progdesc too (its cache on, in
one directory shared by all of them, as for one user); both halves share the machine's
load alike. They start together (each waits until a common start time after its imports),
and each times, from then on:

- `hessian`: the first call of an un-jitted `jax.hessian` of a small jnp function (eager
  mode: JAX compiles every primitive it meets, a few hundred small programs);
- `mlp`: the first call of a jitted 3-layer MLP's training step (one larger program).

The shared cache directory starts with `--entries` entries (default 2000, of 20 KB each,
as a cache in use for a while holds): a cache that every compile of the process locked and
scanned for eviction is what made plain JAX code slow (issue 22). A row's figure is the
slowest process's time in each half, median over the rounds; the ratio (median of the
rounds' ratios) is with progdesc over without (target <= 1.1). `--progdesc-root` imports another checkout's progdesc (e.g. an older
commit, to compare). Prints one JSON line last.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WORKLOADS = ("hessian", "mlp")


def _worker(with_progdesc, start_at):
    import jax
    import jax.numpy as jnp
    import numpy as np
    if with_progdesc:
        import progdesc  # noqa: F401
    jax.numpy.zeros(1).block_until_ready()       # backend up before the clock
    time.sleep(max(0.0, start_at - time.time()))
    out = {}

    def f(x):
        return jnp.sum(jnp.tanh(x) * jnp.sin(x) ** 2)

    t0 = time.perf_counter()
    jax.hessian(f)(jnp.linspace(-1.0, 1.0, 8)).block_until_ready()
    out["hessian"] = time.perf_counter() - t0

    rng = np.random.default_rng(0)
    params = [(rng.standard_normal((a, b)).astype(np.float32) * 0.1, np.zeros(b, np.float32))
              for a, b in ((64, 256), (256, 256), (256, 10))]
    xs = rng.standard_normal((128, 64)).astype(np.float32)
    ys = rng.integers(0, 10, 128)

    def loss(params, x, y):
        for i, (w, b) in enumerate(params):
            x = x @ w + b
            x = jax.nn.relu(x) if i < len(params) - 1 else x
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(x), y[:, None], 1))

    @jax.jit
    def step(params, x, y):
        value, grads = jax.value_and_grad(loss)(params, x, y)
        return value, jax.tree.map(lambda p, g: p - 0.01 * g, params, grads)

    t0 = time.perf_counter()
    jax.block_until_ready(step(params, xs, ys))
    out["mlp"] = time.perf_counter() - t0
    print(json.dumps(out), flush=True)


def _group(flags, cache_root, progdesc_root=ROOT):
    """Start one worker per flag (True: importing progdesc from `progdesc_root`) together;
    their results."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PROGDESC_COMPILATION_CACHE", "JAX_COMPILATION_CACHE_DIR")}
    env.update(PYTHONPATH=os.pathsep.join([progdesc_root, env.get("PYTHONPATH", "")]),
               PROGDESC_CACHE_DIR=cache_root, JAX_PLATFORMS=env.get("JAX_PLATFORMS", "cpu"))
    start_at = time.time() + 4.0 + 2.0 * len(flags)      # after every worker's imports
    cmd = [sys.executable, os.path.join(HERE, "concurrency.py"), "--worker", str(start_at)]
    procs = [subprocess.Popen(cmd + (["--progdesc"] if flag else []), cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for flag in flags]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=1800)
        if p.returncode:
            raise RuntimeError(f"worker failed (exit status {p.returncode}): {err[-2000:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def _fill(cache_dir, entries, size=20_000):
    """`entries` entries in JAX's cache layout (`<key>-cache`, `<key>-atime`), as a cache
    in use for a while holds; no key a real program has."""
    os.makedirs(cache_dir, exist_ok=True)
    payload = os.urandom(size)
    for i in range(entries):
        with open(os.path.join(cache_dir, f"jit_filler-{i:064x}-cache"), "wb") as f:
            f.write(payload)
        with open(os.path.join(cache_dir, f"jit_filler-{i:064x}-atime"), "wb") as f:
            f.write(time.time_ns().to_bytes(8, "little"))


def run(processes=4, rounds=3, log=print, progdesc_root=ROOT, entries=2000):
    """{workload: {"without_s", "with_s", "ratio"}, ...}: per round, `processes` processes
    importing progdesc and `processes` not, all at once (so both see the same load), the
    slowest of each; the median of the rounds' times and of their ratios.
    `progdesc_root`: the checkout whose progdesc is imported (e.g. an older commit)."""
    rows = {w: [] for w in WORKLOADS}
    with tempfile.TemporaryDirectory(prefix="progdesc-bench-conc-") as cache_root:
        _fill(os.path.join(cache_root, "xla"), entries)
        for r in range(rounds):
            flags = [i % 2 == 1 for i in range(2 * processes)]     # interleaved starts
            got = _group(flags, cache_root, progdesc_root)
            for w in WORKLOADS:
                without = max(g[w] for g, f in zip(got, flags) if not f)
                with_ = max(g[w] for g, f in zip(got, flags) if f)
                rows[w].append((without, with_, with_ / without))
            log(f"  round {r + 1}: " + "; ".join(
                f"{w} without {rows[w][-1][0]:.2f} s, with {rows[w][-1][1]:.2f} s "
                f"(x{rows[w][-1][2]:.2f})" for w in WORKLOADS))
    res = {"processes": processes, "rounds": rounds, "entries": entries}
    for w in WORKLOADS:
        without, with_, ratio = (statistics.median(col) for col in zip(*rows[w]))
        res[w] = {"without_s": without, "with_s": with_, "ratio": ratio, "rounds": rows[w]}
        log(f"  {w}: {processes} + {processes} processes at once, slowest {with_:.2f} s with "
            f"progdesc imported vs {without:.2f} s without: x{ratio:.2f} (median of rounds)")
    return res


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--processes", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--entries", type=int, default=2000,
                    help="entries in the shared cache directory at the start")
    ap.add_argument("--progdesc-root", default=ROOT,
                    help="the checkout whose progdesc the workers import (default: this one)")
    ap.add_argument("--worker", type=float, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--progdesc", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker is not None:
        _worker(args.progdesc, args.worker)
        return
    print(json.dumps(run(args.processes, args.rounds, progdesc_root=args.progdesc_root,
                         entries=args.entries)))


if __name__ == "__main__":
    main()
