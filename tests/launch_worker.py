"""A training script for `progdesc launch` (tests/test_launch.py), written as the README's
pattern says: it resumes from its last checkpoint.

`progdesc launch --nprocs 2 tests/launch_worker.py OUT_DIR [--kill-rank R --kill-step S]`:
every process joins the run with `dist.initialize()` (no arguments: the launcher's
environment), trains multihost_worker's data-parallel MLP for STEPS Adam steps on a mesh
over every process's devices, each process feeding its rows of every global batch
(`batch(step)`), and saves a checkpoint every EVERY steps under OUT_DIR/ckpt. With
--kill-rank, process R kills itself with SIGKILL before step S, on its first start only.

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


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--kill-rank", type=int)
    parser.add_argument("--kill-step", type=int)
    args = parser.parse_args()

    import jax
    import progdesc as pd
    from progdesc import distributed as dist
    dist.initialize()
    rank, count = jax.process_index(), jax.process_count()
    rows = slice(rank * GLOBAL_BATCH // count, (rank + 1) * GLOBAL_BATCH // count)
    mesh = dist.Mesh({"data": len(jax.devices())})
    main_program, startup, _, _ = mlp_program("dp")
    exe, scope = pd.Executor(mesh=mesh), pd.Scope()
    exe.run(startup, scope=scope)

    checkpoints = os.path.join(args.out_dir, "ckpt")
    os.makedirs(checkpoints, exist_ok=True)
    start, path = dist.latest_checkpoint(checkpoints)
    if path:
        pd.io.load_checkpoint(path, main_program, scope)
    with open(os.path.join(args.out_dir, f"start-{dist.restart_count()}-{rank}.txt"), "w") as f:
        f.write(str(start))
    for step in range(start, STEPS):
        if (dist.restart_count() == 0 and rank == args.kill_rank
                and step == args.kill_step):
            os.kill(os.getpid(), signal.SIGKILL)
        x, y = batch(step)
        feed = {"x": dist.global_batch(x[rows], mesh), "y": dist.global_batch(y[rows], mesh)}
        exe.run(main_program, feed=feed, scope=scope)
        if (step + 1) % EVERY == 0:
            dist.save_checkpoint(dist.checkpoint_path(checkpoints, step + 1), main_program,
                                 scope)
        print(f"step {step} done", flush=True)
    params = {p.name: dist.to_host(scope.get(p.name)) for p in main_program.all_parameters()}
    np.savez(os.path.join(args.out_dir, f"final-{rank}.npz"), **params)


if __name__ == "__main__":
    main()
