"""First-step time and peak memory of one implementation of one workload, in a fresh process.

    python -m bench.firststep WORKLOAD IMPL [--steps N] [--cache DIR]

prints one JSON line. The clock starts after the imports and after the JAX CPU backend
is up (both implementations pay those equally, and a user pays them once per process),
so the first-step time is: model definition -> initial state -> first finished step,
compilation included. For progdesc that is building the programs (layers + Adam's
minimize), running the startup program, and the first Executor.run; for Flax it is the
module definition, `model.init` (eager, as users write it), `optax.adam(...).init`,
`jax.jit` and the first step.

Compilation cache: with `--cache DIR`, the compiled programs are kept at DIR: progdesc's
through `progdesc.set_compilation_cache` (it serves progdesc's compiles only), Flax's
through JAX's own setting (`jax_compilation_cache_dir`, every program written, as
progdesc writes them); without it, the cache is off. Run twice with the
same empty DIR, the first process compiles and writes, the second reads the executables
back: the pair is a first and a second process. The JSON counts the cache's hits and
misses (JAX's monitoring events) from the clock's start.

Memory: the process's resident-set high-water mark (VmHWM, reset just before the clock
starts) after the first step and N more, and the RSS at the start, whose difference is
what defining, compiling and training the model added (compiler memory included). On CPU the JAX device has no
`memory_stats()`; where it has (GPU), its peak_bytes_in_use is reported too.
"""
import argparse
import json
import resource
import time


def _rss_now_mb():
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * resource.getpagesize() / 2**20
    except OSError:
        return float("nan")


def _maxrss_mb():
    """VmHWM (this address space's RSS high-water mark). Not ru_maxrss: on Linux that
    keeps the parent's high-water mark across fork + exec."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _reset_hwm():
    """Reset VmHWM to the current RSS (Linux >= 4.0), so the peak excludes the imports."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("workload")
    ap.add_argument("impl")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--cache", default=None, help="compilation cache directory (default: off)")
    args = ap.parse_args(argv)

    import jax
    import flax.linen  # noqa: F401
    import optax  # noqa: F401
    import progdesc
    from bench import workloads as W
    import lowering.registry as registry

    progdesc.set_compilation_cache(args.cache)
    if args.cache and args.impl != "progdesc":
        jax.config.update("jax_compilation_cache_dir", args.cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    registry.all_ops()   # the built-in ops registered
    jax.devices()
    jax.numpy.zeros(1).block_until_ready()  # backend up
    spec = W.SPECS[args.workload]
    batches = W.make_batches(spec, 2)
    trainer = W.trainer(args.impl, args.workload)
    events = []
    jax.monitoring.register_event_listener(lambda name, **kw: events.append(name))
    _reset_hwm()
    base_rss = _rss_now_mb()

    t0 = time.perf_counter()
    trainer.define(batches[0])
    t1 = time.perf_counter()
    loss = trainer.step(trainer.prepare(batches[0]))
    t2 = time.perf_counter()
    for i in range(args.steps):
        loss = trainer.step(trainer.prepare(batches[(i + 1) % 2]))
    out = {"workload": args.workload, "impl": args.impl,
           "first_step_s": t2 - t0, "define_s": t1 - t0, "first_run_s": t2 - t1,
           "loss": float(loss), "base_rss_mb": base_rss, "peak_rss_mb": _maxrss_mb(),
           "cache_hits": events.count("/jax/compilation_cache/cache_hits"),
           "cache_misses": events.count("/jax/compilation_cache/cache_misses")}
    out["peak_rss_delta_mb"] = out["peak_rss_mb"] - base_rss
    stats = jax.devices()[0].memory_stats()
    if stats:
        out["device_peak_mb"] = stats.get("peak_bytes_in_use", 0) / 2**20
    print(json.dumps(out))


if __name__ == "__main__":
    main()
