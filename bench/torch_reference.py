"""PyTorch reference for the bench workloads: eager, torch.compile, torch.compile + bf16 autocast.

Times one training step (forward, backward, Adam lr 1e-3, loss read back) of the same
MLP, CNN and Transformer as bench/workloads.py: the shapes come from its SPECS; float32,
mean softmax cross entropy over integer labels, NCHW CNN, post-norm encoder with
separate q/k/v/out linear layers, exact GELU, dropout 0. Each step moves its batch from
host memory to the device, as the JAX benchmarks feed NumPy arrays each step.

Runs on the GPU when torch sees one, with TF32 matmuls and convolutions allowed (what JAX
does by default on NVIDIA GPUs), else on the CPU. Variants:

  eager         the model as written;
  compile       `torch.compile(model)`, the optimizer step eager;
  compile_bf16  the same under `torch.autocast(dtype=torch.bfloat16)` (float32 weights):
                the reference of the bench's bf16 workloads (progdesc.amp), e.g.
                transformer_large_bf16 against transformer_large's compile_bf16.

torch is not a dependency of progdesc. `python -m bench` runs this file in a subprocess
when torch can be imported (or with `--torch-python PATH`), or run it alone, e.g. from a
separate virtual environment:

    python bench/torch_reference.py [--steps 30] [--workloads cnn,transformer]
        [--variants eager,compile,compile_bf16] [--large] [--device cpu|cuda]

Without --workloads: the standard shapes, plus the large ones on a GPU or with --large.
It prints one line per workload and variant, then one JSON line.
"""
import argparse
import json
import math
import os
import platform
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# bench/profile.py would shadow the standard library's `profile` (torch imports cProfile)
# when this file is run as a script: drop the script's own folder from the path, and
# import the workload shapes from the repository root instead.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]
sys.path.insert(0, os.path.dirname(HERE))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bench.workloads import FLOAT32_OF, LARGE, SPECS, STANDARD  # noqa: E402

VARIANTS = ("eager", "compile", "compile_bf16")


class MLP(nn.Module):
    def __init__(self, classes):
        super().__init__()
        self.l1, self.l2 = nn.Linear(784, 512), nn.Linear(512, 512)
        self.l3 = nn.Linear(512, classes)

    def forward(self, x):
        return self.l3(F.relu(self.l2(F.relu(self.l1(x)))))


class CNN(nn.Module):
    def __init__(self, classes):
        super().__init__()
        self.c1 = nn.Conv2d(1, 32, 5, padding=2)
        self.c2 = nn.Conv2d(32, 64, 5, padding=2)
        self.f1 = nn.Linear(64 * 7 * 7, 1024)
        self.f2 = nn.Linear(1024, classes)

    def forward(self, x):                       # NCHW
        x = F.max_pool2d(F.relu(self.c1(x)), 2)
        x = F.max_pool2d(F.relu(self.c2(x)), 2)
        return self.f2(F.relu(self.f1(x.flatten(1))))


class Attention(nn.Module):
    # mirrors progdesc.layers.multi_head_attention and the Flax module: separate q/k/v/out
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x):
        b, t, d = x.shape
        hd = d // self.heads

        def split(h):
            return h.reshape(b, t, self.heads, hd).transpose(1, 2)

        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        w = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(hd)), dim=-1)
        ctx = torch.matmul(w, v).transpose(1, 2).reshape(b, t, d)
        return self.o(ctx)


class EncoderLayer(nn.Module):
    def __init__(self, d, heads, ffn):
        super().__init__()
        self.attn = Attention(d, heads)
        self.n1, self.n2 = nn.LayerNorm(d, eps=1e-5), nn.LayerNorm(d, eps=1e-5)
        self.f1, self.f2 = nn.Linear(d, ffn), nn.Linear(ffn, d)

    def forward(self, x):                       # post-norm, dropout 0
        x = self.n1(x + self.attn(x))
        return self.n2(x + self.f2(F.gelu(self.f1(x))))


class Transformer(nn.Module):
    def __init__(self, classes, d, heads, ffn, layers):
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(d, heads, ffn) for _ in range(layers))
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x.mean(dim=1))


def make_model(spec):
    if spec.name == "mlp":
        return MLP(spec.classes)
    if spec.name == "cnn":
        return CNN(spec.classes)
    return Transformer(spec.classes, spec.x_shape[-1], **spec.extra)


def bench(name, variant, device, steps, warmup, n_batches=4):
    """Median, min and first-step seconds of one variant's training step."""
    spec = SPECS[name]
    torch.manual_seed(0)
    model = make_model(spec).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    forward = model if variant == "eager" else torch.compile(model)
    autocast = variant.endswith("_bf16")
    g = torch.Generator().manual_seed(0)
    data = [(torch.randn((spec.batch,) + tuple(spec.x_shape), generator=g),
             torch.randint(0, spec.classes, (spec.batch,), generator=g))
            for _ in range(n_batches)]

    def step(i):
        x, y = (t.to(device) for t in data[i % n_batches])
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            loss = F.cross_entropy(forward(x), y)
        loss.backward()
        opt.step()
        return loss.item()                      # waits for the device

    t0 = time.perf_counter()
    step(0)
    first = time.perf_counter() - t0
    for i in range(1, warmup):
        step(i)
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        loss = step(i)
        times.append(time.perf_counter() - t0)
    return {"median_s": statistics.median(times), "min_s": min(times), "n": steps,
            "first_step_s": first, "final_loss": loss}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--workloads", default=None, help="comma-separated names from SPECS")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--large", action="store_true", help="add the large shapes on the CPU too")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")   # TF32 matmuls, as JAX's default
        torch.backends.cudnn.allow_tf32 = True
    if args.workloads:
        names = [n for n in args.workloads.split(",") if n]
        for n in names:
            if n in FLOAT32_OF:
                ap.error(f"{n}: its PyTorch reference is the compile_bf16 variant of "
                         f"{FLOAT32_OF[n]}")
            if n not in SPECS:
                known = ", ".join(n for n in SPECS if n not in FLOAT32_OF)
                ap.error(f"unknown workload {n!r} (known: {known})")
    else:
        names = list(STANDARD) + (list(LARGE) if args.large or device.type == "cuda" else [])
    variants = [v for v in args.variants.split(",") if v]
    for v in variants:
        if v not in VARIANTS:
            ap.error(f"unknown variant {v!r} (known: {', '.join(VARIANTS)})")
    info = {"torch": torch.__version__, "device": args.device,
            "device_name": (torch.cuda.get_device_name(device) if device.type == "cuda"
                            else platform.processor() or platform.machine()),
            "threads": torch.get_num_threads(), "cpu_cores": os.cpu_count(),
            "python": platform.python_version()}
    print(f"PyTorch {info['torch']} on {info['device']} ({info['device_name']}), "
          f"{info['threads']} threads", flush=True)
    out = {"machine": info, "workloads": {}}
    for name in names:
        out["workloads"][name] = {}
        for variant in variants:
            try:
                r = bench(name, variant, device, args.steps, args.warmup)
            except Exception as e:  # noqa: BLE001  (e.g. torch.compile without a C++ compiler)
                r = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                print(f"  {name} {variant}: failed: {r['error']}", flush=True)
            else:
                print(f"  {name} {variant}: {r['median_s'] * 1e3:.2f} ms per step (median of "
                      f"{r['n']}, min {r['min_s'] * 1e3:.2f} ms; first step "
                      f"{r['first_step_s']:.2f} s)", flush=True)
            out["workloads"][name][variant] = r
            if variant != "eager":
                torch._dynamo.reset()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
