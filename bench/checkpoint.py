"""Checkpoints while training (issue 29): what training pays for a checkpoint written in the
background, against a blocking save of the same state, in the same run.

`python -m bench.checkpoint [--hidden 4096] [--layers 3] [--saves 5] [--dir DIR]`

The workload is an MLP trained by Adam whose state (parameters and two moments) is
large: hidden 4096 and 3 layers hold about 0.5 GB. Every save is
`progdesc.io.save_checkpoint` of the whole state; between saves the state is trained
for a few steps (so every save writes new values). For each save:

- blocking: the save's wall time is what the training loop waits;
- background: the call's time (it takes the values), then steps run while the file is
  written; "lost" is the call plus, over the steps run until the write finished, each
  step's excess over the median step without a save (the first step after the call copies
  the state it donates: progdesc.scope), and the write's own wall time is shown beside it.

Both are interleaved (blocking, background, blocking, ...) so a slow phase of a shared
machine hits both. On a CPU the writer thread (CRC-32, safetensors, the file write)
competes with the step for the same cores, so steps during a write are slower; on a GPU
only the host side does.
"""
import argparse
import os
import statistics
import tempfile
import time

import numpy as np


def build(hidden, layers, features=1024, classes=10, seed=0):
    """(main, startup, loss, feed) of the MLP."""
    import progdesc as pd
    from progdesc import layers as L
    from progdesc import ops

    main, startup = pd.Program(random_seed=seed), pd.Program(random_seed=seed)
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, features])
        y = pd.data("y", [None, 1], "int64")
        h = x
        for _ in range(layers):
            h = L.fc(h, hidden, act="relu")
        loss = ops.mean(L.softmax_with_cross_entropy(L.fc(h, classes), y))
        pd.optimizer.Adam(1e-4).minimize(loss)
    rng = np.random.default_rng(seed)
    feed = {"x": rng.standard_normal((64, features)).astype(np.float32),
            "y": rng.integers(0, classes, (64, 1)).astype(np.int64)}
    return main, startup, loss, feed


def measure(hidden, layers, saves, directory, between=5, log=print):
    """{"state_mb", "step_s", "blocking": [...], "background": [...]}: see the docstring."""
    import jax
    import progdesc as pd
    from progdesc import io

    main, startup, loss, feed = build(hidden, layers)
    exe, scope = pd.Executor(), pd.Scope()
    exe.run(startup, scope=scope)

    def step():
        t0 = time.perf_counter()
        out, = exe.run(main, feed=feed, fetch_list=[loss], scope=scope, return_numpy=False)
        out.block_until_ready()
        return time.perf_counter() - t0

    plain = [step() for _ in range(3 + 2 * between)][3:]
    step_s = statistics.median(plain)
    state = sum(np.asarray(scope.get(n)).nbytes for n in io.persistable_vars(main)
                if n in scope)
    log(f"state {state / 2**20:.0f} MiB, step {step_s * 1e3:.1f} ms on "
        f"{jax.devices()[0].device_kind}")
    path = os.path.join(directory, "bench-checkpoint.safetensors")
    rows = {"blocking": [], "background": []}
    for i in range(2 * saves):
        mode = ("blocking", "background")[i % 2]
        for _ in range(between):
            step()
        t0 = time.perf_counter()
        pending = io.save_checkpoint(path, main, scope, background=mode == "background")
        call = time.perf_counter() - t0
        if mode == "blocking":
            rows[mode].append({"save_s": call, "lost_s": call})
            continue
        during = []
        while not pending.done():
            during.append(step())
        pending.wait()
        write = time.perf_counter() - t0
        lost = call + sum(max(0.0, t - step_s) for t in during)
        rows[mode].append({"call_s": call, "write_s": write, "steps": len(during),
                           "first_step_s": during[0] if during else None,
                           "during_step_s": statistics.median(during) if during else None,
                           "lost_s": lost})
    os.unlink(path)
    return {"state_mb": state / 2**20, "step_s": step_s, **rows}


def report(result, log=print):
    """Print the medians of `measure`'s result."""
    def med(mode, key):
        values = [r[key] for r in result[mode] if r.get(key) is not None]
        return statistics.median(values) if values else float("nan")
    blocking, lost = med("blocking", "lost_s"), med("background", "lost_s")
    log(f"blocking save: the loop waits {blocking * 1e3:.0f} ms per checkpoint")
    log(f"background:    call {med('background', 'call_s') * 1e3:.1f} ms; write "
        f"{med('background', 'write_s') * 1e3:.0f} ms while {med('background', 'steps'):.0f} "
        f"steps ran (first {med('background', 'first_step_s') * 1e3:.1f} ms, median "
        f"{med('background', 'during_step_s') * 1e3:.1f} ms vs {result['step_s'] * 1e3:.1f} "
        "ms without a save)")
    log(f"training time lost per checkpoint: {lost * 1e3:.0f} ms in the background vs "
        f"{blocking * 1e3:.0f} ms blocking (x{blocking / lost:.1f} less)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--saves", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where to write (default: a temporary)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        result = measure(args.hidden, args.layers, args.saves, directory)
    report(result)
    return result


if __name__ == "__main__":
    main()
