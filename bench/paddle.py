"""An imported PaddlePaddle ResNet-18 (issue 25): import time, and its compiled inference
step against a hand-written jax.jit forward here and against Paddle's own timings.

The model is the resnet18 fixture (tests/fixtures/paddle/, paddle.vision's ResNet-18 layout
at widths 8-64), in both of Paddle's formats (legacy `.pdmodel` and PIR `.json`). Per format:

- import: `progdesc.paddle.load_inference_model`, fresh Scope and Executor each time;
- step: `Executor.run` of the imported program with a NumPy feed and a NumPy result at
  Paddle's timing batch (8), against the same ResNet-18 written by hand in jax.numpy/lax
  from the parameters the Scope holds, passed as arguments of a jax.jit'ed function (as a
  JAX user writes it; checked to agree within 1e-5), timed interleaved with the warm-up
  and run count Paddle's timings used (median and min);
- ratio to Paddle: progdesc's median over Paddle's Executor and `paddle.inference`
  predictor medians, read from tests/fixtures/paddle/paddle_timings.json (written by
  `make_fixtures.py --part timings` in Paddle's own environment; its date and load average
  are printed with them). Paddle was timed with 1 and 2 threads; XLA's CPU backend uses
  every core it may run on. So each measurement runs in a subprocess on the CPU backend
  (JAX_PLATFORMS=cpu) twice: on all cores, compared with Paddle at that thread count, and
  pinned to one core (sched_setaffinity), compared with Paddle's 1-thread figures.
"""
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "paddle")
TIMINGS = os.path.join(FIXTURE, "paddle_timings.json")
MODEL = "resnet18"
FORMATS = ("legacy", "pir")
TOLERANCE = 1e-5


def paddle_timings(path=TIMINGS):
    """Paddle's own timings of the fixture (paddle_timings.json), or None if absent."""
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def resnet18_reference(scope):
    """(forward, params): a ResNet-18 forward written by hand in jax.numpy/lax under jax.jit,
    `forward(params, x)` (NCHW image -> logits), and its parameters taken from `scope`.

    Parameters are looked up by the names paddle.vision's ResNet gives them, in its creation
    order: the stem conv and batch norm, then per stage its blocks (a stride-2 stage makes
    its 1x1 downsample conv first, then conv1 and conv2 of its first block); then the
    linear layer. Batch norm uses the running statistics (eval mode). The parameters are
    arguments, as the Executor passes them, not constants closed over: with constants XLA
    folds batch norm into the weights at compile time, which no program with parameters in
    a Scope (or a Flax model) gets.
    """
    import jax
    import jax.numpy as jnp
    from jax import lax

    made = []   # conv2d_{i} is followed by batch_norm2d_{i}

    def conv_bn():
        i = len(made)
        made.append(i)
        return {"w": scope.get(f"conv2d_{i}.w_0"),
                "bn": tuple(scope.get(f"batch_norm2d_{i}.{s}")
                            for s in ("w_0", "b_0", "w_1", "w_2"))}

    # the stride of each block; a stride-2 one has a downsample (paddle.vision makes it first)
    blocks = [(2 if stage > 0 and b == 0 else 1) for stage in range(4) for b in range(2)]
    params = {"stem": conv_bn(), "blocks": [], "fc": (scope.get("linear_0.w_0"),
                                                      scope.get("linear_0.b_0"))}
    for stride in blocks:
        down = conv_bn() if stride == 2 else None
        params["blocks"].append({"down": down, "c1": conv_bn(), "c2": conv_bn()})

    def apply(p, x, stride, pad, relu=True):
        y = lax.conv_general_dilated(x, p["w"], (stride, stride), [(pad, pad)] * 2,
                                     dimension_numbers=("NCHW", "OIHW", "NCHW"))
        scale, bias, mean, var = (v[None, :, None, None] for v in p["bn"])
        y = (y - mean) * lax.rsqrt(var + 1e-5) * scale + bias
        return jax.nn.relu(y) if relu else y

    @jax.jit
    def forward(params, x):
        y = apply(params["stem"], x, 2, 3)
        y = lax.reduce_window(y, -jnp.inf, lax.max, (1, 1, 3, 3), (1, 1, 2, 2),
                              ((0, 0), (0, 0), (1, 1), (1, 1)))
        for stride, p in zip(blocks, params["blocks"]):
            skip = y if p["down"] is None else apply(p["down"], y, 2, 0, relu=False)
            y = jax.nn.relu(apply(p["c2"], apply(p["c1"], y, stride, 1), 1, 1, relu=False)
                            + skip)
        w, b = params["fc"]
        return jnp.mean(y, axis=(2, 3)) @ w + b
    return forward, params


def _load(fmt):
    import progdesc as pd
    from progdesc.paddle import load_inference_model
    scope, exe = pd.Scope(), pd.Executor()
    t0 = time.perf_counter()
    program, feeds, fetches = load_inference_model(os.path.join(FIXTURE, MODEL, fmt, "model"),
                                                   exe, scope)
    return time.perf_counter() - t0, (scope, exe, program, feeds, fetches)


def measure(fmt, batch, warmup, runs, imports=5):
    """One format, in this process: import times, output check, interleaved step times."""
    from bench.common import interleaved
    import_s = [_load(fmt)[0] for _ in range(imports)]
    _, (scope, exe, program, feeds, fetches) = _load(fmt)
    with open(os.path.join(FIXTURE, MODEL, "meta.json")) as f:
        shape = json.load(f)["input_shapes"]["2"][0][1:]
    x = np.random.default_rng(0).standard_normal((batch, *shape)).astype(np.float32)
    reference, params = resnet18_reference(scope)

    def progdesc_step():
        return exe.run(program, feed={feeds[0]: x}, fetch_list=fetches, scope=scope)[0]

    def jax_step():
        return np.asarray(reference(params, x))

    diff = float(np.max(np.abs(progdesc_step() - jax_step())))
    if not diff <= TOLERANCE:
        raise AssertionError(f"{fmt}: hand-written forward differs from the imported program "
                             f"by {diff:g} (> {TOLERANCE:g})")
    res = interleaved({"progdesc": progdesc_step, "jax": jax_step}, steps=runs,
                      warmup=warmup, block=10)
    out = {"import_s": statistics.median(import_s), "import_first_s": import_s[0],
           "import_all_s": import_s, "max_abs_diff": diff, "input": [batch, *shape]}
    for name, r in res.items():
        out[name] = {"median_s": r["median_s"], "min_s": r["min_s"], "n": r["n"]}
    out["ratio_jax"] = out["progdesc"]["median_s"] / out["jax"]["median_s"]
    return out


def _child(args):
    """Subprocess entry: pin to `--cores` CPUs, force the CPU backend, print one JSON line."""
    if args.cores:
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:args.cores])
    os.environ["JAX_PLATFORMS"] = "cpu"
    result = {"cores": len(os.sched_getaffinity(0)),
              "formats": {fmt: measure(fmt, args.batch, args.warmup, args.runs)
                          for fmt in FORMATS}}
    print("PADDLE_BENCH " + json.dumps(result), flush=True)


def _run_child(cores, batch, warmup, runs):
    cmd = [sys.executable, "-m", "bench.paddle", "--batch", str(batch), "--warmup",
           str(warmup), "--runs", str(runs), "--cores", str(cores)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("PADDLE_BENCH ")]
    if proc.returncode or not lines:
        raise RuntimeError(f"bench.paddle child failed (exit {proc.returncode}):\n"
                           f"{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("PADDLE_BENCH "):])


def _paddle_row(timings, fmt, threads):
    for r in (timings or {}).get("results", []):
        if r["format"] == fmt and r["threads"] == threads:
            return r
    return None


def run(log=print, quick=False):
    """The resnet18 fixture's import time and inference step in both formats, on all cores
    and on one core (a subprocess each), with ratios to the hand-written jax.jit forward and
    to Paddle's own timings at the same thread count: {"paddle_timings" (the file's header),
    "load_average_before"/"_after", "batch", "warmup", "runs", "runs_by_cores": {"2 cores":
    {"cores", "formats": {fmt: {...}}}, "1 core": ...}}. `quick`: 3 warm-up, 20 runs."""
    timings = paddle_timings()
    batch = timings["batch"] if timings else 8
    first = (timings or {}).get("results", [{}])[0].get("executor", {})
    warmup, runs = first.get("warmup", 30), first.get("runs", 200)
    if quick:
        warmup, runs = 3, 20
    if timings:
        log(f"  Paddle's figures: {os.path.relpath(TIMINGS, ROOT)} (paddle {timings['paddle']}, "
            f"{timings['date_utc']}, {timings['cpu_count']} cores {timings['cpu_model']}, load "
            f"{'/'.join(timings['load_average_1_5_15_before'])} before, "
            f"{'/'.join(timings['load_average_1_5_15_after'])} after: {timings['load_note']})")
    else:
        log(f"  {os.path.relpath(TIMINGS, ROOT)} missing: no comparison with Paddle")
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    log(f"  batch {batch}, median/min of {runs} runs after {warmup} warm-up, interleaved with "
        f"the hand-written jax.jit forward; load average now {'/'.join(load)}")
    all_cores = len(os.sched_getaffinity(0))
    out = {"paddle_timings": timings and {k: v for k, v in timings.items() if k != "results"},
           "load_average_before": load, "batch": batch, "warmup": warmup, "runs": runs,
           "runs_by_cores": {}}
    for cores in sorted({all_cores, 1}, reverse=True):
        child = _run_child(cores, batch, warmup, runs)
        label = f"{child['cores']} core{'s' if child['cores'] > 1 else ''}"
        for fmt, r in child["formats"].items():
            p = _paddle_row(timings, fmt, child["cores"])
            if p:   # Paddle with as many threads as XLA had cores: like with like
                r["paddle_threads"] = p["threads"]
                for what in ("executor", "predictor"):
                    r[f"paddle_{what}_s"] = p[what]["median_ms"] / 1e3
                    r[f"paddle_{what}_min_s"] = p[what]["min_ms"] / 1e3
                    r[f"ratio_{what}"] = r["progdesc"]["median_s"] / r[f"paddle_{what}_s"]
            ms = {k: r[k]["median_s"] * 1e3 for k in ("progdesc", "jax")}
            least = {k: r[k]["min_s"] * 1e3 for k in ("progdesc", "jax")}
            line = (f"  {fmt}, {label}: import {r['import_s'] * 1e3:.0f} ms (median of "
                    f"{len(r['import_all_s'])}, first {r['import_first_s'] * 1e3:.0f} ms); step progdesc {ms['progdesc']:.2f} ms (min "
                    f"{least['progdesc']:.2f}) vs hand-written jax.jit {ms['jax']:.2f} ms (min "
                    f"{least['jax']:.2f}), x{r['ratio_jax']:.3f}; max |diff| "
                    f"{r['max_abs_diff']:.1e}")
            if p:
                line += (f"; Paddle ({p['threads']} thread{'s' if p['threads'] > 1 else ''}) "
                         f"Executor {p['executor']['median_ms']:.2f} ms "
                         f"(x{r['ratio_executor']:.3f}), predictor "
                         f"{p['predictor']['median_ms']:.2f} ms (x{r['ratio_predictor']:.3f})")
            log(line)
        out["runs_by_cores"][label] = child
    with open("/proc/loadavg") as f:
        out["load_average_after"] = f.read().split()[:3]
    return out


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description=_child.__doc__)
    ap.add_argument("--cores", type=int, default=0, help="CPUs to run on (0: all allowed)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--runs", type=int, default=200)
    _child(ap.parse_args())
