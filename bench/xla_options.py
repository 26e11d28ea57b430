"""Lowering and compiler choices against the defaults: `python -m bench.xla_options`.

The search behind RESULTS.md's "beyond hand-written JAX" section. For each workload,
every variant below trains progdesc (an `Executor(compiler_options=...)`) and Flax (its
jitted step compiled with the same options) side by side, interleaved in this process,
and prints the median step time of each against progdesc's default.

Variants: XLA CPU debug options passed per compilation (oneDNN, XNNPACK, fast math,
no multi-threaded Eigen) and `nhwc`, progdesc's conv2d lowered through NHWC/HWIO
(transposes around an NHWC convolution, the layout Flax uses) instead of NCHW/OIHW.
An option this jaxlib does not know is reported as failed, not hidden.

    --workloads cnn,transformer   which workloads (default cnn,transformer)
    --steps N                     timed steps per variant (default 10)
"""
import argparse
import contextlib

from bench import workloads as W
from bench.common import interleaved

OPTION_SETS = {
    "default": {},
    "onednn": {"xla_cpu_use_onednn": True},
    "onednn+custom_call": {"xla_cpu_use_onednn": True,
                           "xla_cpu_experimental_onednn_custom_call": True},
    "xnnpack": {"xla_cpu_use_xnnpack": True},
    "fast_math": {"xla_cpu_enable_fast_math": True},
    "no_eigen_threads": {"xla_cpu_multi_thread_eigen": False},
}


@contextlib.contextmanager
def nhwc_conv():
    """Lower conv2d as transpose -> NHWC/HWIO convolution -> transpose back (inside the block)."""
    from jax import lax
    from lowering import registry
    from lowering.ops import nn

    conv = registry.get("conv2d")
    original = conv.lower

    def lower(Input, Filter, *, strides, paddings, dilations, groups, padding_algorithm):
        pads, dilation = nn._conv_geometry(Input.shape[2:], Filter.shape[2:], strides, paddings,
                                           dilations, padding_algorithm)
        out = lax.conv_general_dilated(
            Input.transpose(0, 2, 3, 1), Filter.transpose(2, 3, 1, 0), tuple(strides), pads,
            rhs_dilation=dilation, dimension_numbers=("NHWC", "HWIO", "NHWC"),
            feature_group_count=groups)
        return out.transpose(0, 3, 1, 2)

    conv.lower = lower
    try:
        yield
    finally:
        conv.lower = original


def _progdesc(spec, batches, options):
    import progdesc as pd
    tr = W.trainer("progdesc", spec.name)
    tr.define(batches[0])
    tr.exe = pd.Executor(compiler_options=options)
    feed = tr.prepare(batches[0])
    tr.step(feed)                      # compile now, inside any lowering context
    return lambda: tr.step(feed)


def _flax(spec, batches, options):
    import jax
    tr = W.trainer("flax", spec.name)
    tr.define(batches[0])
    x, y = tr.prepare(batches[0])
    tr._step = jax.jit(tr._raw_step, donate_argnums=(0, 1)).lower(
        tr.params, tr.opt_state, x, y).compile(options or None)
    return lambda: tr.step((x, y))


def run(workloads=("cnn", "transformer"), steps=10, log=print):
    results = {}
    for name in workloads:
        spec = W.SPECS[name]
        batches = W.make_batches(spec, 1)
        fns, failed = {}, {}
        for label, options in OPTION_SETS.items():
            for impl, make in (("progdesc", _progdesc), ("flax", _flax)):
                try:
                    fns[f"{impl}:{label}"] = make(spec, batches, options)
                except Exception as e:  # noqa: BLE001  (an option this jaxlib rejects)
                    failed[f"{impl}:{label}"] = f"{type(e).__name__}: {str(e)[:120]}"
        if name == "cnn":
            with nhwc_conv():
                fns["progdesc:nhwc"] = _progdesc(spec, batches, {})
        res = interleaved(fns, steps=steps, warmup=2, block=2)
        base = res["progdesc:default"]["median_s"]
        log(f"{name}: median step time, ratio to progdesc:default ({base * 1e3:.1f} ms)")
        for key, r in sorted(res.items(), key=lambda kv: kv[1]["median_s"]):
            log(f"  {key:28s} {r['median_s'] * 1e3:8.1f} ms  x{r['median_s'] / base:.3f}")
        for key, why in failed.items():
            log(f"  {key:28s} failed: {why}")
        results[name] = {"median_s": {k: r["median_s"] for k, r in res.items()},
                         "failed": failed}
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="cnn,transformer")
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    run(tuple(args.workloads.split(",")), args.steps)
