"""One process of the two-process runs of test_multihost.py, and the model both sides build.

`python tests/multihost_worker.py PORT PROCESS_ID OUT_DIR`, with 2 forced CPU
devices: joins a run of 2 processes coordinated at 127.0.0.1:PORT, then trains
the MLP for STEPS Adam steps on a mesh over the 4 devices of both processes,
twice: data parallel, and FSDP (every parameter split along the data axis).
Each process feeds only its own half of every global batch, and fetches
device values (`return_numpy=False`) that it gathers itself. It writes what the
test compares to OUT_DIR: `process-<id>-<mode>.npz` (parameters, losses, the
last step's per-example logits), and, written together by both processes, a
checkpoint file (process 0 writes it) and a directory of per-process shards.
Before that, it runs the README's example as written (one data-parallel step on
the first batch, then `ckpt.safetensors`); that example joins the run.
"""
import os
import sys

import numpy as np

SEED, STEPS, GLOBAL_BATCH, PROCESSES = 7, 4, 16, 2


def mlp_program(mode=None):
    """The MLP trained by Adam: (main, startup, loss, logits). `mode` None: a plain
    program; "dp": data parallel; "fsdp": every parameter (and so its Adam state) split
    along its first dim over mesh axis 'data'."""
    import progdesc as pd
    from progdesc import layers, ops

    def split(rank):
        return pd.ParamAttr(sharding=("data",) + (None,) * (rank - 1)) if mode == "fsdp" else None

    main, startup = pd.Program(random_seed=SEED), pd.Program(random_seed=SEED)
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 8])
        y = pd.data("y", [None, 1], dtype="int64")
        h = layers.fc(x, 16, act="tanh", param_attr=split(2), bias_attr=split(1))
        logits = layers.fc(h, 4, param_attr=split(2), bias_attr=split(1))
        loss = ops.mean(layers.softmax_with_cross_entropy(logits, y))
        pd.optimizer.Adam(0.05).minimize(loss, data_parallel=mode == "dp")
    return main, startup, loss, logits


def global_batches():
    """STEPS (x, y) global batches of GLOBAL_BATCH rows."""
    rng = np.random.default_rng(SEED)
    return [(rng.standard_normal((GLOBAL_BATCH, 8)).astype(np.float32),
             rng.integers(0, 4, (GLOBAL_BATCH, 1)).astype(np.int64)) for _ in range(STEPS)]


def readme_example():
    """The code of the README's "Across hosts" section."""
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir,
                           "README.md")) as f:
        section = f.read().split("### Across hosts", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def main(port, process_id, out_dir):
    import jax
    import progdesc as pd
    from progdesc import distributed as dist
    os.chdir(out_dir)
    rows = slice(process_id * GLOBAL_BATCH // PROCESSES,
                 (process_id + 1) * GLOBAL_BATCH // PROCESSES)
    # the README's example first (it joins the run): one data-parallel step and a checkpoint
    main_program, startup, loss, _ = mlp_program("dp")
    x, y = global_batches()[0]
    names = dict(jax=jax, pd=pd, RANK=process_id, main=main_program, startup=startup,
                 scope=pd.Scope(), loss=loss, my_x=x[rows], my_y=y[rows])
    exec(readme_example().replace('"10.0.0.1:1234"', f'"127.0.0.1:{port}"'), names)  # noqa: S102
    np.savez(f"process-{process_id}-readme.npz", loss=names["loss_value"])
    assert jax.process_count() == PROCESSES and len(jax.devices()) == 4
    mesh = dist.Mesh({"data": 4})
    for mode in ("dp", "fsdp"):
        main_program, startup, loss, logits = mlp_program(mode)
        exe, scope = pd.Executor(mesh=mesh), pd.Scope()
        exe.run(startup, scope=scope)
        losses = []
        for x, y in global_batches():
            feed = {"x": dist.global_batch(x[rows], mesh), "y": dist.global_batch(y[rows], mesh)}
            lost, out = exe.run(main_program, feed=feed, fetch_list=[loss, logits], scope=scope,
                                return_numpy=False)
            losses.append(dist.to_host(lost))
        out = dist.to_host(out)
        params = {p.name: dist.to_host(scope.get(p.name)) for p in main_program.all_parameters()}
        np.savez(f"process-{process_id}-{mode}.npz", losses=losses, logits=out, **params)
        dist.save_checkpoint(f"{mode}.safetensors", main_program, scope)
        dist.save_checkpoint_shards(f"{mode}-shards", main_program, scope)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
