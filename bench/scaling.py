"""Scaling table (issue 18): training throughput on 1, 2 and 4 devices, data parallel and FSDP.

`python -m bench.scaling [--devices 1,2,4] [--workloads mlp,transformer] [--steps N]`

Each device count k runs in a fresh subprocess on `Mesh({"data": k})`: on a CPU
with XLA_FLAGS=--xla_force_host_platform_device_count=k, on GPUs over the first
k of them. Every workload (bench/workloads.py, Adam) trains in two modes:

- dp:   `minimize(loss, data_parallel=True)`: one replica per device, each
        gradient all-reduced (`c_allreduce`, lowered to `lax.pmean` in `shard_map`);
- fsdp: every parameter split over the data axis along its first dim that k
        divides (replicated if none does), the batch split too; `jax.jit` with
        `NamedSharding`s, XLA's partitioner inserts the all-gathers and reduce-scatters.
- pipe:  (k > 1, workload mlp4x512: four equal 512-wide layers) k pipeline stages
        (GPipe, 4 micro-batches) on `Mesh({"pipe": k})`; "jaxpp" is a hand-written JAX
        shard_map pipeline of the same model and micro-batches, timed with it
        (bench/pipeline_reference.py); "whole" is the same program on one device, no
        mesh. Their "state/device" is the most one device holds. "ideal" is the whole
        step over k: k stages with no bubble and no transfer cost.

Weak scaling: each device keeps the workload's batch (mlp 128, transformer 16),
so the global batch is k times that. Throughput is examples per second over the
median step (interleaved timing, bench/common.py); "vs 1 device" is throughput at
k devices over the same mode's at 1 device, and efficiency that over k (the
target on GPUs: >= 90% for data parallel at 4 devices on the transformer).
"state/device" is the bytes of parameters and optimizer state one device holds.

On 4 devices two more rows per workload use a 2-D mesh {"data": 2, "model": 2}: "2d" is
progdesc data and tensor parallel at once (`build_progdesc(tensor_parallel=True,
data_parallel=True)`: the transformer's attention and feed-forward fcs, the mlp's first
two fcs, split in Megatron's layout, run under `shard_map`), "jax2d" the same Flax model
as hand-written JAX, `jax.jit` with `NamedSharding`s laying its Dense kernels out alike
(XLA inserts the collectives); both with the batch of 2 devices. The line after the
table gives progdesc's step time over JAX's.
The 1-device rows of a mode run on a mesh of one device; "plain" is the Executor
without a mesh.

Gradient accumulation (`--accumulate K`, default 4, 0 to skip): in each device count's
process, one update of K micro-batches against hand-written JAX (bench/accumulation.py).

On a CPU the forced devices share the same cores, so k devices do k times the
work with the same cores: the best "vs 1 device" there is x1.00 (efficiency 1/k),
and what falls short of it is the cost of the collectives and the partitioning.
The table shows the mechanics, not scaling.
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WORKLOADS = ("mlp", "transformer")
MODES = ("dp", "fsdp")


def build(spec, mode, k):
    """(main, startup, loss) of workload `spec` for `mode` ("plain", "dp" or "fsdp") on k
    devices."""
    import progdesc as pd
    from bench import workloads as W
    from progdesc import distributed as dist
    main, startup, _, _, loss = W.build_progdesc(spec)
    if mode == "dp":
        dist.data_parallel(main)
    if mode == "fsdp":   # each parameter and its Adam moments ('<param>.moment1', ...)
        block = main.global_block()
        with pd.program_guard(main, startup):
            for param in main.all_parameters():
                split = next((d for d, n in enumerate(param.shape) if n % k == 0), None)
                if split is None:
                    continue
                spec = tuple("data" if d == split else None for d in range(len(param.shape)))
                for var in block.vars.values():
                    if var.name == param.name or (var.persistable and var.shape == param.shape
                                                  and var.name.startswith(param.name + ".")):
                        dist.shard(var, spec)
    return main, startup, loss


def state_bytes_per_device(program, scope):
    """Bytes of `program`'s persistables held by one device (the first shard of each)."""
    from progdesc import io
    total = 0
    for name in io.persistable_vars(program):
        if name in scope:
            value = scope.get(name)
            shards = getattr(value, "addressable_shards", None)
            total += shards[0].data.nbytes if shards else value.nbytes
    return total


def measure(k, names, steps):
    """Rows for k devices: per workload and mode, step time, throughput and state bytes."""
    import progdesc as pd
    from bench import workloads as W
    from bench.common import interleaved
    from progdesc import distributed as dist
    mesh = dist.Mesh({"data": k})
    rows = []
    for name in names:
        spec = W.SPECS[name]
        batch = W.make_batches(spec, 1, batch=spec.batch * k)[0]
        feed = {"x": batch[0], "label": batch[1]}
        fns, sizes = {}, {}
        for mode in ("plain",) * (k == 1) + MODES:
            main, startup, loss = build(spec, mode, k)
            exe = pd.Executor() if mode == "plain" else pd.Executor(mesh=mesh)
            scope = pd.Scope()
            exe.run(startup, scope=scope)

            def step(exe=exe, main=main, loss=loss, scope=scope):
                return exe.run(main, feed=feed, fetch_list=[loss], scope=scope)[0]
            step()   # compile
            fns[mode], sizes[mode] = step, state_bytes_per_device(main, scope)
        timed = interleaved(fns, steps=steps, warmup=2, block=3)
        for mode, r in timed.items():
            rows.append({"workload": name, "mode": mode, "devices": k,
                         "global_batch": spec.batch * k, "step_s": r["median_s"],
                         "examples_per_s": spec.batch * k / r["median_s"],
                         "state_bytes_per_device": sizes[mode]})
    if k == 4:
        rows.extend(measure_2d(names, steps))
    if k > 1:
        rows.extend(_pipeline_rows(k, steps))
    return rows


MESH_2D = {"data": 2, "model": 2}


def _megatron_spec(path, leaf):
    """The PartitionSpec of a Flax parameter (or its Adam moment) of bench/workloads.py's
    mlp or transformer in the layout progdesc's tensor_parallel layers give it."""
    from jax.sharding import PartitionSpec as P
    names = [str(getattr(k, "key", getattr(k, "name", k))) for k in path]
    dense = next((n for n in reversed(names) if n.startswith("Dense_")), None)
    split = None
    if any(n.startswith("Attention") for n in names):
        split = "row" if dense == "Dense_3" else "column"
    elif dense in ("Dense_0", "Dense_1") and (any(n.startswith("EncoderLayer") for n in names)
                                              or not any(n.startswith("Transformer")
                                                         for n in names)):
        split = "column" if dense == "Dense_0" else "row"
    if split is None or getattr(leaf, "ndim", 0) == 0:
        return P()
    if names[-1] == "kernel":
        return P(None, "model") if split == "column" else P("model", None)
    return P("model") if split == "column" else P()


def _jax_2d_step(spec, batch):
    """(a zero-argument training step of the Flax model, jit with NamedShardings on the 2x2
    mesh: the hand-written baseline of the "2d" rows; the bytes of state one device holds)."""
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from bench import workloads as W
    trainer = W.FlaxTrainer(spec)
    trainer.define(batch)
    mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), tuple(MESH_2D))

    def lay(tree):
        return jax.tree_util.tree_map_with_path(
            lambda path, leaf: NamedSharding(mesh, _megatron_spec(path, leaf)), tree)
    p_sh, s_sh = lay(trainer.params), lay(trainer.opt_state)
    data = NamedSharding(mesh, P("data"))
    step = jax.jit(trainer._raw_step, in_shardings=(p_sh, s_sh, data, data),
                   out_shardings=(p_sh, s_sh, NamedSharding(mesh, P())), donate_argnums=(0, 1))
    x, y = (jax.device_put(v, data) for v in W.flax_batch(spec, batch))
    state = [jax.device_put(trainer.params, p_sh), jax.device_put(trainer.opt_state, s_sh)]

    nbytes = sum(leaf.addressable_shards[0].data.nbytes
                 for leaf in jax.tree_util.tree_leaves(state))

    def run():
        state[0], state[1], loss = step(state[0], state[1], x, y)
        return np.asarray(loss)
    return run, nbytes


def measure_2d(names, steps):
    """Rows "2d" (progdesc data + tensor parallel) and "jax2d" (hand-written JAX) per
    workload on the 2x2 mesh, timed interleaved in this process."""
    import progdesc as pd
    from bench import workloads as W
    from bench.common import interleaved
    from progdesc import distributed as dist
    rows = []
    for name in names:
        spec = W.SPECS[name]
        batch = W.make_batches(spec, 1, batch=spec.batch * MESH_2D["data"])[0]
        main, startup, _, _, loss = W.build_progdesc(spec, tensor_parallel=True,
                                                     data_parallel=True)
        exe, scope = pd.Executor(mesh=dist.Mesh(MESH_2D)), pd.Scope()
        exe.run(startup, scope=scope)
        feed = {"x": batch[0], "label": batch[1]}

        def step(exe=exe, main=main, loss=loss, scope=scope, feed=feed):
            return exe.run(main, feed=feed, fetch_list=[loss], scope=scope)[0]
        step()   # compile
        jax_step, jax_bytes = _jax_2d_step(spec, batch)
        jax_step()   # compile
        fns = {"2d": step, "jax2d": jax_step}
        sizes = {"2d": state_bytes_per_device(main, scope), "jax2d": jax_bytes}
        for mode, r in interleaved(fns, steps=steps, warmup=2, block=3).items():
            rows.append({"workload": name, "mode": mode, "devices": 4,
                         "global_batch": len(batch[0]), "step_s": r["median_s"],
                         "examples_per_s": len(batch[0]) / r["median_s"],
                         "state_bytes_per_device": sizes[mode]})
    return rows


def ratios_2d(rows):
    """Lines: progdesc's 2-D mesh step time over hand-written JAX's, per workload."""
    step = {(r["workload"], r["mode"]): r["step_s"] for r in rows
            if r.get("mode") in ("2d", "jax2d")}
    return [f"2-D mesh {MESH_2D}: {w} progdesc step / hand-written JAX step = "
            f"x{step[(w, '2d')] / step[(w, 'jax2d')]:.2f}"
            for w in dict.fromkeys(r["workload"] for r in rows) if (w, "2d") in step]


def _pipeline_rows(k, steps):
    """Rows of "pipe" (progdesc, k GPipe stages) and "jaxpp" (a hand-written JAX shard_map
    pipeline) on workload "mlp4x512" (bench/pipeline_reference.py), timed together."""
    import jax

    import progdesc as pd
    from bench import pipeline_reference as PR
    from bench.common import interleaved
    from progdesc import distributed as dist
    main, startup, x, label, loss = PR.progdesc_pipeline(k)
    exe, scope = pd.Executor(mesh=dist.Mesh({"pipe": k})), pd.Scope()
    pd.Executor().run(startup, scope=scope)
    data = PR.batch(k)
    feed = {x: data[0], label: data[1]}

    def step():
        return exe.run(main, feed=feed, fetch_list=[loss], scope=scope)[0]
    step()
    one, one_scope = pd.Executor(), pd.Scope()   # the same program whole on one device
    one.run(startup, scope=one_scope)

    def whole():
        return one.run(main, feed=feed, fetch_list=[loss], scope=one_scope)[0]
    whole()
    jax_step, jax_state = PR.jax_pipeline(k, data)
    jax_step()
    sizes = {"pipe": PR.most_state_on_one_device(main, scope),
             "jaxpp": sum(s.data.nbytes for leaf in jax.tree_util.tree_leaves(jax_state)
                          for s in leaf.addressable_shards[:1])}
    sizes["whole"] = PR.most_state_on_one_device(main, one_scope)
    timed = interleaved({"pipe": step, "jaxpp": jax_step, "whole": whole}, steps=steps,
                        warmup=2, block=3)
    n = len(data[0])
    return [{"workload": PR.NAME, "mode": mode, "devices": 1 if mode == "whole" else k,
             "stages": k, "global_batch": n, "step_s": r["median_s"],
             "examples_per_s": n / r["median_s"], "state_bytes_per_device": sizes[mode]}
            for mode, r in timed.items()]


def run_all(device_counts, names, steps, log=print, accumulate=0):
    """Rows of every device count, each measured in a fresh subprocess."""
    rows, gpu = [], _has_gpu()
    for k in device_counts:
        env = dict(os.environ, PYTHONPATH=ROOT)
        if not gpu:
            env["JAX_PLATFORMS"] = "cpu"
            env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                                f" --xla_force_host_platform_device_count={k}").strip()
        done = subprocess.run([sys.executable, "-m", "bench.scaling", "--one", str(k),
                               "--workloads", ",".join(names), "--steps", str(steps),
                               "--accumulate", str(accumulate)],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            raise RuntimeError(f"{k} devices: the measuring process failed:\n{done.stderr}")
        rows.extend(json.loads(done.stdout.strip().splitlines()[-1]))
        log(f"  {k} device(s) measured")
    return rows


def _has_gpu():
    done = subprocess.run([sys.executable, "-c", "import jax; print(jax.default_backend())"],
                          capture_output=True, text=True, timeout=300)
    return done.stdout.strip() == "gpu"


def table(rows):
    """The scaling table as text, with efficiency against the same mode on 1 device."""
    rows = [r for r in rows if "micro_batches" not in r]
    base = {(r["workload"], r["mode"]): r["examples_per_s"] for r in rows if r["devices"] == 1}
    lines = ["workload     | mode  | devices | global batch | step      | examples/s | "
             "vs 1 device | efficiency | state/device",
             "-------------+-------+---------+--------------+-----------+------------+-"
             "------------+------------+-------------"]
    for r in rows:
        one = base.get((r["workload"], r["mode"]))
        speedup = f"x{r['examples_per_s'] / one:.2f}" if one else "-"
        eff = f"{r['examples_per_s'] / (r['devices'] * one):.0%}" if one else "-"
        lines.append(f"{r['workload']:<12} | {r['mode']:<5} | {r['devices']:>7} | "
                     f"{r['global_batch']:>12} | {r['step_s'] * 1e3:>6.1f} ms | "
                     f"{r['examples_per_s']:>10.0f} | {speedup:>11} | {eff:>10} | "
                     f"{r['state_bytes_per_device'] / 2**20:>8.2f} MB")
    for r in rows:
        if r["mode"] != "pipe":
            continue
        jax_row = next(j for j in rows if j["mode"] == "jaxpp" and j["devices"] == r["devices"]
                       and j["workload"] == r["workload"])
        whole = next(j for j in rows if j["mode"] == "whole" and j.get("stages") == r["devices"])
        from bench.pipeline_reference import MICRO_BATCHES, bubble
        k, m = r["devices"], MICRO_BATCHES
        lines.append(f"pipeline {r['workload']} on {k} stages ({m} micro-batches, GPipe): "
                     f"progdesc step / JAX shard_map pipeline step = "
                     f"x{r['step_s'] / jax_row['step_s']:.2f}; bubble {bubble(k):.0%} of "
                     f"stage-ticks; step / ideal (one device's step / {k}) = "
                     f"x{r['step_s'] * k / whole['step_s']:.2f}, GPipe's ticks predict "
                     f"x{(m + k - 1) / m:.2f}")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", default="1,2,4")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--json", default=os.path.join(HERE, "scaling.json"))
    parser.add_argument("--accumulate", type=int, default=4,
                        help="micro-batches per update of the accumulation rows (0: none)")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)   # the subprocess' part
    args = parser.parse_args(argv)
    names = args.workloads.split(",")
    if args.one:
        rows = measure(args.one, names, args.steps)
        if args.accumulate > 1:
            from bench import accumulation
            rows += accumulation.measure(args.one, names, args.steps, args.accumulate)
        print(json.dumps(rows))
        return
    import platform
    print(f"scaling: {platform.processor() or platform.machine()}, {os.cpu_count()} cores")
    rows = run_all([int(k) for k in args.devices.split(",")], names, args.steps,
                   accumulate=args.accumulate)
    print(table(rows))
    for line in ratios_2d(rows):
        print(line)
    accumulated = [r for r in rows if "micro_batches" in r]
    if accumulated:
        from bench import accumulation
        print(f"\ngradient accumulation, one update of {args.accumulate} micro-batches:")
        print(accumulation.table(accumulated))
    with open(args.json, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
