"""`python -m bench` (`make bench`): progdesc against hand-written Flax + optax (issue 6).

Workloads: mlp, cnn, transformer, lstm (bench/workloads.py), plus their large shapes
(mlp_large, cnn_large, transformer_large) on a GPU or with --large, and the bfloat16
mixed-precision variant of each (mlp_bf16, ..., transformer_large_bf16: progdesc.amp
against Flax with dtype=bfloat16) on a GPU or with --bf16. On a CPU the bf16 variants are
left out by default: XLA's CPU backend emulates bfloat16 (slowly), so their times say
nothing about a GPU.

Sections (all by default; pick with --only):
  torch      when torch can be imported (or with --torch-python): bench/torch_reference.py
             in a subprocess: PyTorch eager, torch.compile and torch.compile with bf16
             autocast (the reference of the bf16 workloads);
  steps      per workload, median step time of progdesc's Executor.run vs a jitted Flax
             step with donated state, interleaved A/B in this process; plus XLA's cost and
             memory analysis of both compiled steps, and the TFLOP/s achieved (XLA's
             flop count over the step time) with the fraction of the device's peak
             (bf16 peak for the bf16 workloads, TF32 or fp32 for the others);
  first      per workload and implementation, in a fresh subprocess: model definition to
             first finished step (compile included), and peak RSS; then again in a second
             process that finds the first one's compilation cache;
  overhead   Executor.run vs a raw jitted call: a one-op program, training steps;
  model      pd.Model's graph-mode train_one_batch vs Executor.run of its recorded program
             (bench/model_step.py: the README's MLP and a 784-256-256-10 classifier);
  build      build + append_backward + lowering of 1k..10k-op programs, growth exponent;
  multistep  Executor.run(..., steps=K) vs K calls (skipped without a `steps` argument);
  imported   models of Flax's examples imported with their loss (bench/imported.py: mnist,
             imagenet's ResNet-18, lm1b, wmt) trained by progdesc vs the original's jax.jit step;
  paddle     the imported Paddle ResNet-18 fixture, both formats (bench/paddle.py, subprocesses
             on the CPU backend, all cores and one core): import time; inference step vs a
             hand-written jax.jit forward, and vs Paddle's Executor and predictor as timed by
             tests/fixtures/paddle/paddle_timings.json at the same thread count;
  onnx       imported ONNX models (bench/onnx.py, a subprocess on the CPU backend): import
             time of a 100-node model; ResNet-18 and a GPT-2 block built with onnx.helper,
             inference step vs onnxruntime on the same cores;
  viewer     the notebook viewer's page in headless Chromium (bench/viewer.py): open and
             expand-all times at 1k and 10k ops (skipped without Playwright or Chromium);
  concurrency  plain JAX code (an un-jitted jax.hessian, a jitted MLP step) compiled by 4
             processes at once, with progdesc imported against without (bench/concurrency.py);
  import     `import progdesc` against `import jax`, fresh processes (bench/import_time.py);
  eager      eager mode's per-op cost against jax.numpy op by op (bench/eager.py), and whether
             another dispatch order pays on a wide graph (bench/eager_schedule.py).

The sections that run in subprocesses (torch, first, concurrency, paddle, onnx, import) run before this
process starts its JAX backend, which on a GPU holds most of the device's memory from then on.

Prints a table with every ratio next to its target (PASS/FAIL) and writes JSON to
bench/results.json (--json to change). --quick is a smoke run (a minute or two).
"""
import argparse
import datetime
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

from bench import build_scaling, concurrency, import_time, imported, multistep, overhead, peaks
from bench import model_step
from bench import eager as eager_bench
from bench import eager_schedule
from bench import onnx as onnx_bench
from bench import viewer as viewer_bench
from bench import paddle as paddle_bench
from bench import workloads as W
from bench.common import fmt_s, hlo_summary, interleaved

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SECTIONS = ("torch", "steps", "first", "overhead", "model", "build", "multistep", "imported",
            "paddle", "onnx", "concurrency", "viewer", "import", "eager")
TARGETS = {
    "step": ("<=", 1.05), "first": ("<=", 1.0), "memory": ("<=", 1.2),
    "overhead": ("<=", 1.5), "exponent": ("<=", 1.1), "build10k": ("<", 2.0),
    "multistep": (">=", 1.5), "concurrency": ("<=", 1.1), "imported": ("<=", 1.05),
    "paddle_import": ("<", 1.0), "onnx_import": ("<", 0.5),
    "torch_f32": ("<=", 1.0), "torch_bf16": ("<=", 0.8), "viewer": ("<", 1.0),
    "eager": ("<=", eager_bench.TARGET),
}
# issue 14's targets against PyTorch: the large transformer's float32 step against
# torch.compile (TF32 on a GPU), its bf16 step against torch.compile with bf16 autocast
TORCH_TARGETS = {"transformer_large": "torch_f32", "transformer_large_bf16": "torch_bf16"}


def log(msg=""):
    print(msg, flush=True)


def verdict(kind, value):
    op, target = TARGETS[kind]
    if value is None or value != value:
        return "n/a"
    ok = value <= target if op == "<=" else value < target if op == "<" else value >= target
    return "PASS" if ok else "FAIL"


def machine():
    import jax
    import flax
    import optax
    dev = jax.devices()[0]
    return {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "host": platform.node(), "cpu_cores": os.cpu_count(),
            "cpu": _cpu_model(), "python": platform.python_version(),
            "backend": jax.default_backend(), "device": str(dev.device_kind),
            "jax": jax.__version__, "jaxlib": getattr(jax.lib, "__version__", None) or
            __import__("jaxlib").__version__, "flax": flax.__version__,
            "optax": optax.__version__, "command": " ".join(["python -m bench"] + sys.argv[1:])}


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


# --- sections ---

def run_steps(names, steps, warmup, block, analyze):
    import jax
    device_kind, float32_math = jax.devices()[0].device_kind, peaks.float32_math()
    results = {}
    for name in names:
        spec = W.SPECS[name]
        math = "bf16" if spec.amp == "bfloat16" else float32_math
        batches = W.make_batches(spec, 4)
        trainers = {impl: W.trainer(impl, name) for impl in ("progdesc", "flax")}
        fns, losses = {}, {}
        for impl, tr in trainers.items():
            tr.define(batches[0])
            prepared = [tr.prepare(b) for b in batches]
            counter = iter(range(10**9))

            def fn(tr=tr, prepared=prepared, counter=counter, impl=impl):
                losses[impl] = tr.step(prepared[next(counter) % len(prepared)])
            fns[impl] = fn
        t0 = time.perf_counter()
        res = interleaved(fns, steps=steps, warmup=warmup, block=block)
        row = {impl: {"median_s": r["median_s"], "min_s": r["min_s"], "n": r["n"]}
               for impl, r in res.items()}
        row["ratio"] = res["progdesc"]["median_s"] / res["flax"]["median_s"]
        row["final_loss"] = {k: float(v) for k, v in losses.items()}
        log(f"  {name}: progdesc {fmt_s(res['progdesc']['median_s'])}, flax "
            f"{fmt_s(res['flax']['median_s'])} per step (x{row['ratio']:.3f}, "
            f"{res['flax']['n']} steps each, {time.perf_counter() - t0:.0f} s)")
        if analyze:
            for impl, tr in trainers.items():
                try:
                    row[impl]["hlo"] = hlo_summary(tr.compiled_step(batches[0]))
                except Exception as e:  # noqa: BLE001
                    row[impl]["hlo"] = {"error": repr(e)}
            hp, hf = row["progdesc"]["hlo"], row["flax"]["hlo"]
            if "peak_mb" in hp and "peak_mb" in hf:
                row["xla_memory_ratio"] = hp["peak_mb"] / hf["peak_mb"]
                log(f"    XLA memory (args + outputs - aliased + temp): progdesc "
                    f"{hp['peak_mb']:.1f} MB, flax {hf['peak_mb']:.1f} MB "
                    f"(temp {hp['temp_mb']:.1f} vs {hf['temp_mb']:.1f} MB)")
            if "flops" in hp and "flops" in hf:
                log(f"    XLA cost: flops {hp['flops'] / 1e9:.2f} vs {hf['flops'] / 1e9:.2f} G, "
                    f"bytes accessed {hp['bytes_accessed'] / 2**20:.0f} vs "
                    f"{hf['bytes_accessed'] / 2**20:.0f} MB, top-level HLO ops "
                    f"{hp.get('n_entry_ops')} vs {hf.get('n_entry_ops')}")
                for impl, h in (("progdesc", hp), ("flax", hf)):
                    row[impl]["achieved"] = peaks.achieved(
                        h["flops"], row[impl]["median_s"], device_kind, math)
                log(f"    achieved: progdesc {peaks.describe(row['progdesc']['achieved'])}, "
                    f"flax {peaks.describe(row['flax']['achieved'])}")
        results[name] = row
        del trainers, fns
    return results


def run_first(names, repeats, timeout=300):
    """First step of each implementation in fresh subprocesses, a first and a second process.

    Each repeat gives each implementation an empty compilation cache directory and runs
    bench.firststep twice on it: the first process compiles (and writes the cache, as
    progdesc does by default), the second finds the executables there.
    """
    results = {}
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")

    def first_step(name, impl, cache):
        proc = subprocess.run(
            [sys.executable, "-m", "bench.firststep", name, impl, "--cache", cache], cwd=ROOT,
            env=env, capture_output=True, text=True, timeout=timeout)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if proc.returncode or not lines:
            log(f"  {name}/{impl}: first-step subprocess failed:\n{proc.stderr[-2000:]}")
            return None
        return json.loads(lines[-1])

    for name in names:
        runs = {"progdesc": [], "flax": []}
        second = {"progdesc": [], "flax": []}
        for r in range(repeats):
            for impl in (("progdesc", "flax") if r % 2 == 0 else ("flax", "progdesc")):
                with tempfile.TemporaryDirectory(prefix="bench-xla-cache-") as cache:
                    cold = first_step(name, impl, cache)
                    warm = cold and first_step(name, impl, cache)
                if cold and warm:
                    runs[impl].append(cold)
                    second[impl].append(warm)
        if not runs["progdesc"] or not runs["flax"]:
            results[name] = {"error": "subprocess failed", "runs": runs}
            continue
        best = {impl: min(rs, key=lambda d: d["first_step_s"]) for impl, rs in runs.items()}
        row = {"runs": runs, "second_runs": second}
        for impl in ("progdesc", "flax"):
            warm = min(second[impl], key=lambda d: d["first_step_s"])
            row[impl] = {
                "first_step_s": best[impl]["first_step_s"],
                "define_s": best[impl]["define_s"], "first_run_s": best[impl]["first_run_s"],
                "peak_rss_mb": max(d["peak_rss_mb"] for d in runs[impl]),
                "peak_rss_delta_mb": max(d["peak_rss_delta_mb"] for d in runs[impl]),
                "second_process_s": warm["first_step_s"],
                "second_process_hits": warm["cache_hits"],
                "second_process_misses": warm["cache_misses"]}
        row["ratio"] = row["progdesc"]["first_step_s"] / row["flax"]["first_step_s"]
        row["rss_delta_ratio"] = (row["progdesc"]["peak_rss_delta_mb"]
                                  / row["flax"]["peak_rss_delta_mb"])
        row["second_ratio"] = row["progdesc"]["second_process_s"] / row["progdesc"]["first_step_s"]
        p, f = row["progdesc"], row["flax"]
        log(f"  {name}: first step progdesc {p['first_step_s']:.2f} s (define "
            f"{p['define_s']:.2f} + run {p['first_run_s']:.2f}), flax {f['first_step_s']:.2f} s "
            f"(define {f['define_s']:.2f} + run {f['first_run_s']:.2f}) x{row['ratio']:.2f}; "
            f"peak RSS +{p['peak_rss_delta_mb']:.0f} vs +{f['peak_rss_delta_mb']:.0f} MB")
        log(f"    second process (compilation cache): progdesc {p['second_process_s']:.2f} s "
            f"({p['second_process_hits']} hits, {p['second_process_misses']} misses), flax "
            f"{f['second_process_s']:.2f} s ({f['second_process_hits']} hits, "
            f"{f['second_process_misses']} misses)")
        results[name] = row
    return results


def _backend_in_subprocess():
    """JAX's default backend, asked of a subprocess that does not preallocate GPU memory."""
    proc = subprocess.run([sys.executable, "-c", "import jax; print(jax.default_backend())"],
                          env=dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false"),
                          capture_output=True, text=True, timeout=300)
    return proc.stdout.strip() if proc.returncode == 0 else None


def run_torch(workloads, steps, warmup, python=None):
    """bench/torch_reference.py in a subprocess; its JSON, or None where torch is missing."""
    if python is None:
        if importlib.util.find_spec("torch") is None:
            log("  skipped: torch cannot be imported here (--torch-python names a Python with it)")
            return None
        python = sys.executable
    # a bf16 workload's reference is the compile_bf16 variant of its float32 workload
    names = list(dict.fromkeys(W.FLOAT32_OF.get(n, n) for n in workloads
                               if n not in W.RECURRENT))
    cmd = [python, os.path.join(HERE, "torch_reference.py"), "--steps", str(steps),
           "--warmup", str(warmup), "--workloads", ",".join(names)]
    found = None
    with subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as proc:
        for line in proc.stdout:
            if line.startswith("{"):
                found = json.loads(line)
            else:
                log("  " + line.rstrip())
    if proc.returncode or found is None:
        log(f"  PyTorch reference failed (exit status {proc.returncode})")
        return {"error": f"exit status {proc.returncode}"}
    return found


# --- the table ---

def table(res):
    rows = []

    def add(what, measured, kind, value, fmt="x{:.3f}"):
        op, target = TARGETS[kind]
        shown = "n/a" if value is None or value != value else fmt.format(value)
        rows.append((what, measured, shown, f"{op} {target:g}", verdict(kind, value)))

    for name, r in res.get("steps", {}).items():
        add(f"{name}: step time progdesc/flax",
            f"{fmt_s(r['progdesc']['median_s'])} / {fmt_s(r['flax']['median_s'])}",
            "step", r["ratio"])
        a, f = r["progdesc"].get("achieved"), r["flax"].get("achieved")
        if a and f:
            share = (f"{a['fraction']:.1%} of {a['math']} peak" if a["fraction"] is not None
                     else "peak unknown")
            rows.append(("  (TFLOP/s from XLA's flops)", f"{a['tflops']:.3g} / {f['tflops']:.3g}",
                         share, "reference", ""))
        torch_rows(name, r, res.get("torch"), add, rows)
        f32 = res["steps"].get(W.FLOAT32_OF.get(name))
        if f32:
            rows.append(("  (progdesc float32 / bf16)", f"{fmt_s(f32['progdesc']['median_s'])} / "
                         f"{fmt_s(r['progdesc']['median_s'])}",
                         f"x{f32['progdesc']['median_s'] / r['progdesc']['median_s']:.2f}",
                         "reference", ""))
    for name, r in res.get("first", {}).items():
        if "ratio" in r:
            add(f"{name}: first step progdesc/flax",
                f"{r['progdesc']['first_step_s']:.2f} s / {r['flax']['first_step_s']:.2f} s",
                "first", r["ratio"])
            rows.append(("  (progdesc, second process / first)",
                         f"{r['progdesc']['second_process_s']:.2f} s / "
                         f"{r['progdesc']['first_step_s']:.2f} s", f"x{r['second_ratio']:.3f}",
                         "reference", ""))
    for name in W.SPECS:
        s = res.get("steps", {}).get(name, {})
        if "xla_memory_ratio" in s:
            add(f"{name}: peak memory (XLA buffers)",
                f"{s['progdesc']['hlo']['peak_mb']:.1f} / {s['flax']['hlo']['peak_mb']:.1f} MB",
                "memory", s["xla_memory_ratio"])
        f = res.get("first", {}).get(name, {})
        if "rss_delta_ratio" in f:
            add(f"{name}: peak RSS growth (subprocess)",
                f"{f['progdesc']['peak_rss_delta_mb']:.0f} / "
                f"{f['flax']['peak_rss_delta_mb']:.0f} MB", "memory", f["rss_delta_ratio"])
    o = res.get("overhead")
    if o:
        add("Executor.run overhead, trivial program",
            f"{o['progdesc_host']['median_s'] * 1e6:.0f} us / "
            f"{o['raw_host']['median_s'] * 1e6:.0f} us", "overhead", o["ratio"], "x{:.2f}")
        add("  (device results, no NumPy copy)",
            f"{o['progdesc_device']['median_s'] * 1e6:.0f} us / "
            f"{o['raw_device']['median_s'] * 1e6:.0f} us", "overhead", o["ratio_device"],
            "x{:.2f}")
        add("  (device feeds and results)",
            f"{o['progdesc_on_device']['median_s'] * 1e6:.0f} us / "
            f"{o['raw_on_device']['median_s'] * 1e6:.0f} us", "overhead", o["ratio_on_device"],
            "x{:.2f}")
        for pair, label in (("train", "tiny Adam step vs raw jit, device feeds"),
                            ("mlp", "MLP b128 step vs raw jit, same program")):
            add(f"  ({label})", f"{fmt_s(o[f'progdesc_{pair}']['median_s'])} / "
                f"{fmt_s(o[f'raw_{pair}']['median_s'])}", "step", o[f"ratio_{pair}"], "x{:.2f}")
    for name, r in res.get("model", {}).items():
        add(f"pd.Model step vs Executor.run, {name}",
            f"{fmt_s(r['model'])} / {fmt_s(r['executor'])}", "step", r["ratio"], "x{:.3f}")
        add("  (Executor.run + the Model's own cost)",
            f"+{r['added'] * 1e6:.1f} us", "step", r["ratio_added"], "x{:.3f}")
    b = res.get("build")
    if b:
        pe = b["phase_exponents"]
        add("build+backward+lower growth exponent",
            " ".join(f"{p} {v:.2f}" for p, v in pe.items()), "exponent", b["exponent"],
            "{:.2f}")
        add(f"build+backward+lower at {b['largest_n']} ops",
            " + ".join(f"{b['rows'][-1][p + '_s']:.2f}" for p in ("build", "backward", "lower"))
            + " s", "build10k", b["largest_total_s"], "{:.2f} s")
        t = b.get("total_10k")
        if t:
            add(f"  ({t['n_ops_total']} ops after backward, {t['n_forward_ops']} forward)",
                " + ".join(f"{t[p + '_s']:.2f}" for p in ("build", "backward", "lower")) + " s",
                "build10k", t["total_s"], "{:.2f} s")
    for r in res.get("viewer", {}).get("rows", []):
        add(f"viewer at {r['ops']} ops: expand all (open)",
            f"{r['expand_all_s']:.2f} s ({r['open_s']:.2f} s)", "viewer", r["expand_all_s"],
            "{:.2f} s")
    m = res.get("multistep")
    if m:
        if "ratio" in m:
            add(f"steps={m['k']} throughput vs {m['k']} calls (MLP b{m['batch']})",
                f"{m['separate_s'] * 1e3:.1f} / {m['steps_s'] * 1e3:.1f} ms", "multistep",
                m["ratio"], "x{:.2f}")
            rows.append(("  (Flax + optax: lax.scan vs jitted calls)",
                         f"{m['flax_separate_s'] * 1e3:.1f} / {m['flax_scan_s'] * 1e3:.1f} ms",
                         f"x{m['flax_ratio']:.2f}", "reference", ""))
        else:
            rows.append(("steps=K throughput (MLP b32)", "skipped", "n/a", ">= 1.5", "SKIP"))
    for name, r in res.get("imported", {}).items():
        add(f"{name} imported from Flax: step progdesc/jax.jit",
            f"{fmt_s(r['progdesc_s'])} / {fmt_s(r['original_s'])}", "imported", r["ratio"])
    paddle_rows(res.get("paddle"), add, rows)
    onnx_rows(res.get("onnx"), add, rows)
    c = res.get("concurrency")
    if c:
        for w, what in (("hessian", "un-jitted jax.hessian"), ("mlp", "jitted MLP step")):
            add(f"{c['processes']} processes compiling at once, {what}: with/without progdesc",
                f"{c[w]['with_s']:.2f} s / {c[w]['without_s']:.2f} s", "concurrency",
                c[w]["ratio"], "x{:.2f}")
    i = res.get("import")
    if i:
        rows.append(("import progdesc / import jax (fresh processes)",
                     f"{i['progdesc_s']:.2f} s / {i['jax_s']:.2f} s", f"x{i['ratio']:.2f}",
                     "reference", ""))
    e = res.get("eager")
    if e:
        add("eager: small op / jax.numpy op (per op)",
            f"{e['progdesc eager'] * 1e6:.1f} us / {e['jax.numpy'] * 1e6:.1f} us", "eager",
            e["progdesc eager"] / e["jax.numpy"], "x{:.2f}")
    head = ("measure", "progdesc / reference", "value", "target", "")
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(5)]
    lines = [" | ".join(str(c).ljust(w) for c, w in zip(head, widths)),
             "-+-".join("-" * w for w in widths)]
    lines += [" | ".join(str(c).ljust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(lines), rows


def paddle_rows(p, add, rows):
    """Rows of the imported Paddle ResNet-18: import time (target), step against the
    hand-written jax.jit forward (target), against Paddle's Executor and predictor at the
    same thread count (reference rows: the issue asks for the ratio, it sets no target)."""
    for label, child in (p or {}).get("runs_by_cores", {}).items():
        for fmt, r in child["formats"].items():
            name = f"Paddle resnet18 ({fmt}, {label})"
            if label == next(iter(p["runs_by_cores"])):
                add(f"{name}: import (median)", f"{r['import_s'] * 1e3:.0f} ms",
                    "paddle_import", r["import_s"], "{:.3f} s")
            add(f"{name}: step progdesc/hand-written jax.jit",
                f"{fmt_s(r['progdesc']['median_s'])} / {fmt_s(r['jax']['median_s'])}",
                "imported", r["ratio_jax"])
            for what in ("executor", "predictor"):
                if f"ratio_{what}" in r:
                    rows.append((f"  (progdesc / Paddle {what}, {r['paddle_threads']} thread"
                                 f"{'s' if r['paddle_threads'] > 1 else ''}, from file)",
                                 f"{fmt_s(r['progdesc']['median_s'])} / "
                                 f"{fmt_s(r[f'paddle_{what}_s'])}",
                                 f"x{r[f'ratio_{what}']:.3f}", "reference", ""))


def onnx_rows(o, add, rows):
    """Rows of the imported ONNX models: the 100-node import (target), each model's step
    against onnxruntime on the same cores (reference rows: the issue asks for the ratio)."""
    if not o:
        return
    add("ONNX 100-node model: import (median)", f"{o['import']['median_s'] * 1e3:.0f} ms",
        "onnx_import", o["import"]["median_s"], "{:.3f} s")
    for name, r in o["models"].items():
        label = f"ONNX {name} ({o['cores']} cores): step progdesc/onnxruntime"
        if "error" in r:
            rows.append((label, "not measured", "n/a", "reference", "SKIP"))
            continue
        rows.append((label, f"{fmt_s(r['progdesc']['median_s'])} / "
                     f"{fmt_s(r['onnxruntime']['median_s'])}", f"x{r['ratio']:.3f}",
                     "reference", ""))


def torch_rows(name, r, torch_res, add, rows):
    """The PyTorch rows under a step row: progdesc over torch.compile, with bf16 autocast for
    a bf16 workload; a target row where TORCH_TARGETS sets one, else a reference row."""
    bf16 = name in W.FLOAT32_OF
    t = (torch_res or {}).get("workloads", {}).get(W.FLOAT32_OF.get(name, name), {})
    variant = "compile_bf16" if bf16 else "compile"
    ref = t.get(variant, {}).get("median_s")
    if not ref:
        return
    mine = r["progdesc"]["median_s"]
    if not bf16:
        times = " / ".join(fmt_s(t[v]["median_s"]) if "median_s" in t.get(v, {}) else "n/a"
                           for v in ("eager", "compile", "compile_bf16"))
        rows.append(("  (PyTorch eager / compile / compile+bf16)", times,
                     f"x{mine / ref:.3f} of compile", "reference", ""))
    what = "torch.compile+bf16" if bf16 else "torch.compile"      # bf16: autocast
    if name in TORCH_TARGETS:
        add(f"{name}: progdesc/{what}", f"{fmt_s(mine)} / {fmt_s(ref)}",
            TORCH_TARGETS[name], mine / ref)
    elif bf16:
        rows.append((f"  (progdesc / {what})", f"{fmt_s(mine)} / {fmt_s(ref)}",
                     f"x{mine / ref:.3f}", "reference", ""))


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=",".join(SECTIONS),
                    help=f"comma-separated sections ({', '.join(SECTIONS)})")
    ap.add_argument("--workloads", default=None,
                    help=f"comma-separated workloads ({', '.join(W.SPECS)}); default: "
                         f"{', '.join(W.STANDARD)}, the large ones on a GPU or with --large, "
                         "the bf16 variants of those on a GPU or with --bf16, and "
                         f"{', '.join(W.RECURRENT)}")
    ap.add_argument("--large", action="store_true",
                    help="add the large shapes on the CPU too, for trying (slow: on a CPU, "
                         "pick e.g. --only steps --workloads mlp_large,cnn_large)")
    ap.add_argument("--bf16", action="store_true",
                    help="add the bf16 mixed-precision variants of the shapes on the CPU too "
                         "(a GPU gets them by default; on a CPU bfloat16 is emulated and slow)")
    ap.add_argument("--torch-python", default=None,
                    help="the Python that runs the PyTorch reference (default: this one, "
                         "where it can import torch)")
    ap.add_argument("--steps", type=int, default=30, help="timed steps per implementation")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--block", type=int, default=5, help="steps per A/B block")
    ap.add_argument("--first-repeats", type=int, default=2,
                    help="fresh subprocesses per implementation for the first step")
    ap.add_argument("--sizes", default="1000,2000,5000,10000", help="op counts for 'build'")
    ap.add_argument("--trace", action="store_true",
                    help="also time tracing of the lowered function in 'build' (not in total)")
    ap.add_argument("--k", type=int, default=16, help="steps per call for 'multistep'")
    ap.add_argument("--no-analysis", action="store_true",
                    help="skip XLA cost/memory analysis of the compiled steps")
    ap.add_argument("--quick", action="store_true", help="smoke run: few steps, small sizes")
    ap.add_argument("--json", default=os.path.join(HERE, "results.json"))
    args = ap.parse_args(argv)
    only = [s for s in args.only.split(",") if s]
    names = [n for n in (args.workloads or "").split(",") if n]
    for n in names:
        if n not in W.SPECS:
            ap.error(f"unknown workload {n!r}")
    sizes = [int(s) for s in args.sizes.split(",")]
    overhead_calls, ms_rounds = 2000, 12
    if args.quick:
        args.steps, args.warmup, args.block = min(args.steps, 6), 2, 3
        args.first_repeats = 1
        sizes = [s for s in sizes if s <= 1000] or [500]
        sizes = sorted({250, 500, *sizes})
        overhead_calls, ms_rounds = 300, 4

    results = {"args": vars(args)}
    t_start = time.perf_counter()
    log(f"progdesc benchmark: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}"
        f", {os.cpu_count()} cores ({_cpu_model()})")
    # The sections that run in subprocesses come first: once this process's JAX backend
    # starts, it holds most of a GPU's memory (JAX preallocates it).
    if not names:
        gpu = _backend_in_subprocess() == "gpu"
        names = list(W.STANDARD) + (list(W.LARGE) if args.large or gpu else [])
        if args.bf16 or gpu:
            names += [n + "_bf16" for n in names]
        names += list(W.RECURRENT)
    log("workloads: " + "; ".join(f"{n} ({W.SPECS[n].describe()})" for n in names))
    if "torch" in only:
        log("PyTorch reference (subprocess; separate in time from the JAX steps below):")
        results["torch"] = run_torch(names, args.steps, args.warmup, args.torch_python)
    if "first" in only:
        log("first step and peak RSS (fresh subprocess each):")
        results["first"] = run_first(names, args.first_repeats)
    if "concurrency" in only:
        log("plain JAX code compiled by 4 processes at once, progdesc imported or not:")
        results["concurrency"] = concurrency.run(rounds=1 if args.quick else 3, log=log)
    if "import" in only:
        log("import progdesc against import jax (fresh processes):")
        results["import"] = import_time.run(rounds=3 if args.quick else 9, log=log)
    if "paddle" in only:
        log("imported Paddle ResNet-18 (CPU backend, subprocesses), against Paddle's own timings:")
        results["paddle"] = paddle_bench.run(log=log, quick=args.quick)
    if "onnx" in only:
        log("imported ONNX models (CPU backend, a subprocess), against onnxruntime:")
        results["onnx"] = onnx_bench.run(log=log, quick=args.quick)
    import jax
    info = results["machine"] = machine()
    log(f"backend {info['backend']} ({info['device']}), jax {info['jax']}, flax {info['flax']}")
    jax.numpy.zeros(1).block_until_ready()
    if "build" in only:
        log("build + append_backward + lower (synthetic fc/tanh chains):")
        results["build"] = build_scaling.run(sizes, trace=args.trace, log=log)
    if "viewer" in only:
        log("the notebook viewer in headless Chromium (1000x800):")
        results["viewer"] = viewer_bench.run((1000, 10000), log=log)
    if "overhead" in only:
        log("Executor.run overhead:")
        results["overhead"] = overhead.run(steps=overhead_calls, log=log)
    if "model" in only:
        log("pd.Model's recorded step against Executor.run of the same program:")
        results["model"] = model_step.run(steps=100 if args.quick else 400, log=log)
    if "steps" in only:
        log(f"step time (median of {args.steps} after {args.warmup} warm-up, blocks of "
            f"{args.block}, interleaved):")
        results["steps"] = run_steps(names, args.steps, args.warmup, args.block,
                                     not args.no_analysis)
    if "multistep" in only:
        log("many steps per call:")
        results["multistep"] = multistep.run(k=args.k, rounds=ms_rounds, log=log)
    if "eager" in only:
        log("eager mode, op by op, against jax.numpy:")
        results["eager"] = eager_bench.run(n=300 if args.quick else 1000,
                                           repeats=5 if args.quick else 15, log=log)
        results["eager_schedule"] = eager_schedule.run(repeats=5 if args.quick else 15, log=log)
    if "imported" in only:
        log("models imported from Flax, a training step against the original's jax.jit step:")
        results["imported"] = imported.run(steps=10 if args.quick else 30, log=log)
    results["seconds"] = time.perf_counter() - t_start
    text, rows = table(results)
    results["table"] = [dict(zip(("measure", "measured", "value", "target", "verdict"), r))
                        for r in rows]
    log()
    log(text)
    fails = [r[0] for r in rows if r[4] == "FAIL"]
    log(f"\n{len(fails)} target(s) failing; {results['seconds']:.0f} s in all. "
        f"JSON: {os.path.relpath(args.json)}")
    with open(args.json, "w") as f:
        json.dump(results, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
