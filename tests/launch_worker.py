"""A training script for `progdesc launch` (tests/test_launch.py): the README's example of
"Launching, and restarting after a failure" as written, which resumes from its last
checkpoint.

`progdesc launch --nprocs 2 tests/launch_worker.py OUT_DIR [--kill-rank R --kill-step S]`:
in OUT_DIR, every process runs the README's code: it joins the run with
`dist.initialize()` (no arguments: the launcher's environment), trains multihost_worker's
data-parallel MLP for STEPS Adam steps on a mesh over every process's devices, each process
feeding its rows of every global batch (`batch(step)`), and saves a checkpoint every EVERY
steps under OUT_DIR/ckpt. With --kill-rank, process R kills itself with SIGKILL before
step S, on its first start only.

It writes to OUT_DIR: `start-<restart>-<rank>.txt`, the step that start began at (after
loading the latest checkpoint), and at the end `final-<rank>.npz`, the parameters.
"""
import argparse
import os
import signal

import numpy as np

from multihost_worker import SEED, mlp_program

STEPS, EVERY, GLOBAL_BATCH = 6, 2, 16


def batch(step):
    """The global batch of `step`: (x, y) of GLOBAL_BATCH rows, the same on every start."""
    rng = np.random.default_rng([SEED, step])
    return (rng.standard_normal((GLOBAL_BATCH, 8)).astype(np.float32),
            rng.integers(0, 4, (GLOBAL_BATCH, 1)).astype(np.int64))


def readme_example():
    """The code of the README's "Launching, and restarting after a failure" section, with a
    checkpoint every EVERY steps."""
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir,
                           "README.md")) as f:
        section = f.read().split("### Launching, and restarting after a failure", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert "% 100 == 0" in code
    return code.replace("% 100 == 0", f"% {EVERY} == 0")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--kill-rank", type=int)
    parser.add_argument("--kill-step", type=int)
    args = parser.parse_args()

    import jax
    import progdesc as pd
    from progdesc import distributed as dist
    os.chdir(args.out_dir)
    main_program, startup, _, _ = mlp_program("dp")
    names = dict(jax=jax, pd=pd, main=main_program, startup=startup, scope=pd.Scope(),
                 STEPS=STEPS)
    started = []

    def feed_of(step):
        rank, count = jax.process_index(), jax.process_count()
        if not started:      # the step this start resumed at
            started.append(step)
            with open(f"start-{dist.restart_count()}-{rank}.txt", "w") as f:
                f.write(str(step))
        else:
            print(f"step {step - 1} done", flush=True)
        if dist.restart_count() == 0 and rank == args.kill_rank and step == args.kill_step:
            os.kill(os.getpid(), signal.SIGKILL)
        rows = slice(rank * GLOBAL_BATCH // count, (rank + 1) * GLOBAL_BATCH // count)
        x, y = batch(step)
        mesh = names["mesh"]
        return {"x": dist.global_batch(x[rows], mesh), "y": dist.global_batch(y[rows], mesh)}

    names["feed_of"] = feed_of
    exec(readme_example(), names)  # noqa: S102  (the README's own code)
    print(f"step {STEPS - 1} done", flush=True)
    scope = names["scope"]
    params = {p.name: dist.to_host(scope.get(p.name)) for p in main_program.all_parameters()}
    np.savez(f"final-{jax.process_index()}.npz", **params)


if __name__ == "__main__":
    main()
