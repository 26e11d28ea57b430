"""PyTorch eager reference for the bench workloads (standalone; NOT imported by the suite).

Times one training step (forward, backward, Adam lr 1e-3) of the same MLP, CNN and
Transformer as bench/workloads.py (same shapes, float32, mean softmax cross entropy over
integer labels, NCHW CNN, post-norm encoder with separate q/k/v/out linear layers, exact
GELU, dropout 0) in PyTorch eager mode on the CPU. torch is not a dependency of
progdesc: run this from a separate virtual environment, e.g.

    python3 -m venv /tmp/torchvenv && /tmp/torchvenv/bin/pip install torch==2.13.0
    /tmp/torchvenv/bin/python bench/torch_reference.py [--steps 30] [--workloads cnn,transformer]

It prints one line per workload (median and min seconds per step after warm-up) and a
JSON line at the end. Figures are comparable to `python -m bench` only when both run on
the same otherwise idle machine (not at the same time).
"""
import argparse
import json
import math
import os
import platform
import statistics
import sys
import time

# bench/profile.py would shadow the standard library's `profile` (torch imports cProfile)
# when this file is run as a script: drop the script's own folder from the path.
sys.path[:] = [p for p in sys.path
               if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

SHAPES = {  # batch, per-example input shape (as in bench/workloads.py SPECS)
    "mlp": (128, (784,)),
    "cnn": (64, (1, 28, 28)),
    "transformer": (16, (128, 256)),
}
CLASSES = 10


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.l2, self.l3 = nn.Linear(784, 512), nn.Linear(512, 512), nn.Linear(512, 10)

    def forward(self, x):
        return self.l3(F.relu(self.l2(F.relu(self.l1(x)))))


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(1, 32, 5, padding=2)
        self.c2 = nn.Conv2d(32, 64, 5, padding=2)
        self.f1 = nn.Linear(64 * 7 * 7, 1024)
        self.f2 = nn.Linear(1024, CLASSES)

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
    def __init__(self, d=256, heads=4, ffn=1024, layers=2):
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(d, heads, ffn) for _ in range(layers))
        self.head = nn.Linear(d, CLASSES)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x.mean(dim=1))


MODELS = {"mlp": MLP, "cnn": CNN, "transformer": Transformer}


def bench(name, steps, warmup, n_batches=4):
    torch.manual_seed(0)
    batch, shape = SHAPES[name]
    model = MODELS[name]()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    data = [(torch.randn((batch,) + shape, generator=g),
             torch.randint(0, CLASSES, (batch,), generator=g)) for _ in range(n_batches)]

    def step(i):
        x, y = data[i % n_batches]
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()                      # eager CPU is synchronous; item() to be sure

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


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--workloads", default="mlp,cnn,transformer")
    args = ap.parse_args()
    info = {"torch": torch.__version__, "threads": torch.get_num_threads(),
            "cpu_cores": os.cpu_count(), "python": platform.python_version(),
            "mkldnn": torch.backends.mkldnn.is_available()}
    print(f"PyTorch eager {info['torch']}, {info['threads']} threads, {info['cpu_cores']} cores",
          flush=True)
    out = {"machine": info, "workloads": {}}
    for name in [n for n in args.workloads.split(",") if n]:
        r = bench(name, args.steps, args.warmup)
        out["workloads"][name] = r
        print(f"  {name}: {r['median_s'] * 1e3:.1f} ms per step (median of {r['n']}, "
              f"min {r['min_s'] * 1e3:.1f} ms; first step {r['first_step_s'] * 1e3:.0f} ms)",
              flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
