"""Imported ONNX models (issue 26): import time of a 100-node model, and the inference step
of an imported ResNet-18 and GPT-2 block against onnxruntime on the same CPU.

Two sets of models. Built here with onnx.helper (seeded random weights), larger, in the
layouts and ops PyTorch's exporter writes for them:

- mlp100: 50 blocks of Gemm + Relu (width 64) with a symbolic batch dim: 100 nodes, to
  time `progdesc.onnx.load` from the serialized bytes (fresh Scope each time);
- resnet18: ResNet-18's layout (a 7x7 stem, max pool, 4 stages of 2 basic blocks with a
  1x1 downsample at each stride 2, global average pool, Gemm) at widths 16-128 on 3x64x64
  images, batch norm folded into the convolutions as `torch.onnx.export` does in eval
  mode; batch 8;
- gpt2_block: one GPT-2 decoder block (d=256, 4 heads, MLP 1024) with symbolic batch and
  sequence axes: LayerNormalization, Q/K/V MatMul + Add, Reshape/Transpose into heads,
  the causal mask made from the sequence length (Shape -> Gather -> Range -> Unsqueeze ->
  Greater -> Where, as torch.onnx.export writes `torch.arange`'s mask), Softmax,
  the output projection, GELU in Erf form, residual Adds; batch 4, sequence 128.

And the fixtures PyTorch itself exported (tests/fixtures/onnx/, both exporters: TorchScript
at opset 17, dynamo at opset 18), where present: `resnet18_*` (widths 8-64, 32x32 images,
batch norm unfolded in the dynamo file) at batch 8, `gpt2_block_*` (d=32, 4 heads, causal
mask from Range/Greater) at batch 4, sequence 64.

Per model: the imported program's `Executor.run` (NumPy feed, NumPy result) against an
onnxruntime InferenceSession (all graph optimizations, intra-op threads = the cores this
process may use) on the same input, checked to agree within 1e-4, timed interleaved
(median and min); and, to tell the Executor's per-call cost from XLA's computation, the
same program as a JAX function (`progdesc.as_jax`) under `jax.jit`, parameters as
arguments. Each runs in a subprocess on the CPU backend (JAX_PLATFORMS=cpu), on all
allowed cores.
"""
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPSET = 17
TOLERANCE = 1e-4


def _builder(seed):
    """(node, init, const, names): helpers that append nodes and initializers to lists."""
    from onnx import helper, numpy_helper
    rng = np.random.default_rng(seed)
    nodes, inits, counter = [], [], [0]

    def fresh(prefix):
        counter[0] += 1
        return f"{prefix}_{counter[0]}"

    def node(op, inputs, n_out=1, name=None, **attrs):
        name = name or fresh(op.lower())
        outs = [f"{name}_out{i}" if n_out > 1 else f"{name}_out" for i in range(n_out)]
        nodes.append(helper.make_node(op, inputs, outs, name=name, **attrs))
        return outs if n_out > 1 else outs[0]

    def init(shape, scale=None, name=None, value=None):
        name = name or fresh("w")
        if value is None:
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
            value = rng.standard_normal(shape) * (scale or np.sqrt(2.0 / max(fan_in, 1)))
            value = value.astype(np.float32)
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    return node, init, nodes, inits, rng


def _model(nodes, inits, inputs, outputs, name):
    from onnx import checker, helper
    graph = helper.make_graph(nodes, name, inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="progdesc bench/onnx.py")
    model.ir_version = 8
    checker.check_model(model)
    return model


def mlp100(width=64, blocks=50):
    """50 x (Gemm + Relu), a symbolic batch dim: a 100-node model."""
    from onnx import TensorProto, helper
    node, init, nodes, inits, _ = _builder(1)
    y = "x"
    for i in range(blocks):
        y = node("Gemm", [y, init((width, width)), init((width,), 0.01)], name=f"fc{i}")
        y = node("Relu", [y], name=f"relu{i}")
    nodes[-1].output[0] = "y"
    return _model(nodes, inits,
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width])],
                  "mlp100")


def resnet18(widths=(16, 32, 64, 128), classes=100, image=64):
    """ResNet-18's layout, batch norm folded into the convolutions (conv with bias)."""
    from onnx import TensorProto, helper
    node, init, nodes, inits, _ = _builder(2)

    def conv(x, cin, cout, k, stride, relu=True):
        y = node("Conv", [x, init((cout, cin, k, k)), init((cout,), 0.01)], kernel_shape=[k, k],
                 strides=[stride, stride], pads=[k // 2] * 4)
        return node("Relu", [y]) if relu else y

    y = conv("image", 3, widths[0], 7, 2)
    y = node("MaxPool", [y], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = widths[0]
    for stage, cout in enumerate(widths):
        for block in range(2):
            stride = 2 if stage > 0 and block == 0 else 1
            skip = conv(y, cin, cout, 1, stride, relu=False) if stride == 2 else y
            h = conv(conv(y, cin, cout, 3, stride), cout, cout, 3, 1, relu=False)
            y = node("Relu", [node("Add", [h, skip])])
            cin = cout
    y = node("Flatten", [node("GlobalAveragePool", [y])], axis=1)
    y = node("Gemm", [y, init((classes, cin)), init((classes,), 0.01)], transB=1)
    nodes[-1].output[0] = "logits"
    return _model(nodes, inits,
                  [helper.make_tensor_value_info("image", TensorProto.FLOAT,
                                                 ["batch", 3, image, image])],
                  [helper.make_tensor_value_info("logits", TensorProto.FLOAT,
                                                 ["batch", classes])], "resnet18")


def gpt2_block(d=256, heads=4, hidden=1024):
    """One GPT-2 decoder block with symbolic batch and sequence axes (see the module)."""
    from onnx import TensorProto, helper
    node, init, nodes, inits, _ = _builder(3)
    dh = d // heads

    def const(value, name=None):
        return init(None, name=name, value=np.asarray(value))

    def layer_norm(x):
        return node("LayerNormalization", [x, const(np.ones(d, np.float32)),
                                           const(np.zeros(d, np.float32))], axis=-1,
                    epsilon=1e-5)

    def linear(x, din, dout):
        return node("Add", [node("MatMul", [x, init((din, dout), 0.02)]), init((dout,), 0.01)])

    def split_heads(x):   # [b, s, d] -> [b, h, s, dh]
        return node("Transpose", [node("Reshape", [x, const(np.array([0, 0, heads, dh]))])],
                    perm=[0, 2, 1, 3])

    x = "hidden"
    h = layer_norm(x)
    q, k, v = (split_heads(linear(h, d, d)) for _ in range(3))
    kt = node("Transpose", [k], perm=[0, 1, 3, 2])
    scores = node("Div", [node("MatMul", [q, kt]), const(np.float32(np.sqrt(dh)))])
    seq = node("Gather", [node("Shape", [x]), const(np.int64(1))], axis=0)
    steps = node("Range", [const(np.int64(0)), seq, const(np.int64(1))])
    future = node("Greater", [node("Unsqueeze", [steps, const(np.array([0]))]),
                              node("Unsqueeze", [steps, const(np.array([1]))])])
    scores = node("Where", [future, const(np.float32(-1e4)), scores])
    att = node("MatMul", [node("Softmax", [scores], axis=-1), v])
    merged = node("Reshape", [node("Transpose", [att], perm=[0, 2, 1, 3]),
                              const(np.array([0, 0, d]))])
    x = node("Add", [x, linear(merged, d, d)])
    h = linear(layer_norm(x), d, hidden)
    gelu = node("Mul", [node("Mul", [h, node("Add", [node("Erf", [
        node("Div", [h, const(np.float32(np.sqrt(2.0)))])]), const(np.float32(1.0))])]),
        const(np.float32(0.5))])
    node("Add", [x, linear(gelu, hidden, d)], name="residual_out")
    nodes[-1].output[0] = "out"
    dims = ["batch", "sequence", d]
    return _model(nodes, inits,
                  [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, dims)],
                  [helper.make_tensor_value_info("out", TensorProto.FLOAT, dims)], "gpt2_block")


FIXTURES = os.path.join(ROOT, "tests", "fixtures", "onnx")


def fixture(name):
    """A model loader for the fixture file `name`.onnx."""
    def load():
        import onnx
        return onnx.load(os.path.join(FIXTURES, name + ".onnx"))
    return load


MODELS = {"resnet18": (resnet18, (8, 3, 64, 64)), "gpt2_block": (gpt2_block, (4, 128, 256))}
for _exporter in ("torchscript", "dynamo"):
    for _name, _shape in (("resnet18", (8, 3, 32, 32)), ("gpt2_block", (4, 64, 32))):
        if os.path.exists(os.path.join(FIXTURES, f"{_name}_{_exporter}.onnx")):
            MODELS[f"{_name}_{_exporter}"] = (fixture(f"{_name}_{_exporter}"), _shape)


def time_import(model, repeats=7):
    """Seconds of `progdesc.onnx.load` of the model's bytes into a fresh Scope: (median,
    first, all)."""
    import progdesc as pd
    from progdesc import onnx as pd_onnx
    data = model.SerializeToString()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        pd_onnx.load(data, pd.Scope())
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times[0], times


def measure(name, warmup, runs):
    """One model in this process: import time, output check against onnxruntime,
    interleaved step times of Executor.run and InferenceSession.run."""
    import onnxruntime as ort

    import progdesc as pd
    from bench.common import interleaved
    from progdesc import onnx as pd_onnx
    build, shape = MODELS[name]
    model = build()
    import_s, import_first_s, _ = time_import(model, repeats=3)
    scope, exe = pd.Scope(), pd.Executor()
    program, feeds, fetches = pd_onnx.load(model, scope)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    options = ort.SessionOptions()
    options.intra_op_num_threads = len(os.sched_getaffinity(0))
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    ort_feed = {session.get_inputs()[0].name: x}

    def progdesc_step():
        return exe.run(program, feed={feeds[0]: x}, fetch_list=fetches, scope=scope)[0]

    def ort_step():
        return session.run(None, ort_feed)[0]

    import jax
    fn, params = pd.as_jax(program, feed=feeds, fetch=fetches[0], scope=scope)
    jitted = jax.jit(fn)

    def xla_step():   # the same computation called from JAX: no Executor, no Scope
        return np.asarray(jitted(params, x))

    diff = float(np.max(np.abs(progdesc_step() - ort_step())))
    if not diff <= TOLERANCE:
        raise AssertionError(f"{name}: progdesc and onnxruntime differ by {diff:g} "
                             f"(> {TOLERANCE:g})")
    res = interleaved({"progdesc": progdesc_step, "onnxruntime": ort_step,
                       "jax_jit": xla_step}, steps=runs, warmup=warmup, block=10)
    out = {"nodes": len(model.graph.node), "input": list(shape), "import_s": import_s,
           "import_first_s": import_first_s, "max_abs_diff": diff}
    for k, r in res.items():
        out[k] = {"median_s": r["median_s"], "min_s": r["min_s"], "n": r["n"]}
    out["ratio"] = out["progdesc"]["median_s"] / out["onnxruntime"]["median_s"]
    out["ratio_min"] = out["progdesc"]["min_s"] / out["onnxruntime"]["min_s"]
    out["ratio_jax_jit"] = out["jax_jit"]["median_s"] / out["onnxruntime"]["median_s"]
    return out


def _child(args):
    """Subprocess entry: the CPU backend, every model; prints one JSON line."""
    if args.cores:
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:args.cores])
    os.environ["JAX_PLATFORMS"] = "cpu"
    import onnxruntime
    median, first, times = time_import(mlp100(), repeats=args.imports)
    result = {"cores": len(os.sched_getaffinity(0)), "onnxruntime": onnxruntime.__version__,
              "import": {"nodes": 100, "median_s": median, "first_s": first, "all_s": times},
              "models": {}}
    for name in args.models.split(","):
        try:
            result["models"][name] = measure(name, args.warmup, args.runs)
        except Exception as e:   # a model whose rows are missing: reported, the rest goes on
            result["models"][name] = {"error": f"{type(e).__name__}: {' '.join(str(e).split())}"}
    print("ONNX_BENCH " + json.dumps(result), flush=True)


def _run_child(cores, warmup, runs, models):
    cmd = [sys.executable, "-m", "bench.onnx", "--warmup", str(warmup), "--runs", str(runs),
           "--cores", str(cores), "--models", ",".join(models)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("ONNX_BENCH ")]
    if proc.returncode or not lines:
        raise RuntimeError(f"bench.onnx child failed (exit {proc.returncode}):\n"
                           f"{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("ONNX_BENCH "):])


def run(log=print, quick=False, cores=0):
    """Import time of the 100-node model and each model's inference step against
    onnxruntime, in a subprocess on the CPU backend: the child's result dict ("cores",
    "onnxruntime", "import", "models": {name: {..., "ratio"}}); None without onnx and
    onnxruntime. `quick`: 3 warm-up, 20 runs (else 20 and 200)."""
    import importlib.util
    missing = [m for m in ("onnx", "onnxruntime") if importlib.util.find_spec(m) is None]
    if missing:
        log(f"  skipped: {', '.join(missing)} not installed (pip install -e \".[test]\")")
        return None
    warmup, runs = (3, 20) if quick else (20, 200)
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    out = _run_child(cores, warmup, runs, list(MODELS))
    out.update(warmup=warmup, runs=runs, load_average_before=load)
    i = out["import"]
    log(f"  {out['cores']} core(s), onnxruntime {out['onnxruntime']}; load average "
        f"{'/'.join(load)} before")
    log(f"  import of the 100-node model (50 x Gemm + Relu): {i['median_s'] * 1e3:.0f} ms "
        f"(median of {len(i['all_s'])}, first {i['first_s'] * 1e3:.0f} ms)")
    for name, r in out["models"].items():
        if "error" in r:
            log(f"  {name}: not measured: {r['error'][:300]}")
            continue
        log(f"  {name} ({r['nodes']} nodes, input {r['input']}): import {r['import_s'] * 1e3:.0f}"
            f" ms; step progdesc {r['progdesc']['median_s'] * 1e3:.2f} ms (min "
            f"{r['progdesc']['min_s'] * 1e3:.2f}) vs onnxruntime "
            f"{r['onnxruntime']['median_s'] * 1e3:.2f} ms (min "
            f"{r['onnxruntime']['min_s'] * 1e3:.2f}), x{r['ratio']:.3f} (of the minima "
            f"x{r['ratio_min']:.3f}); as_jax under jax.jit {r['jax_jit']['median_s'] * 1e3:.2f}"
            f" ms (x{r['ratio_jax_jit']:.3f}); max |diff| {r['max_abs_diff']:.1e}")
    with open("/proc/loadavg") as f:
        out["load_average_after"] = f.read().split()[:3]
    return out


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description=_child.__doc__)
    ap.add_argument("--cores", type=int, default=0, help="CPUs to run on (0: all allowed)")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--imports", type=int, default=7)
    ap.add_argument("--models", default=",".join(MODELS))
    _child(ap.parse_args())
