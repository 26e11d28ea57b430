"""Eager mode's per-op cost (issue 16): `python -m bench.eager`.

A chain of N small elementwise ops on a float32 [4, 4] array (tanh, scale, add of a
constant, in turn), run op by op:

- progdesc eager: each op appended to a fresh program under `pd.eager()` and run at once
  (append: validation, shape inference, the OpDesc; run: the op's cached executable);
- progdesc append only: the same chain built without eager mode (what recording costs);
- jax.numpy: `jnp.tanh(x)`, `x * s`, `x + c`, op by op;
- jax.jit: the same three as jitted functions (a compiled call's floor);
- torch eager: `torch.tanh`, `*`, `+` where torch can be imported.

Each chain ends by waiting for its result. The chains take turns (bench.common.interleaved),
so a slow phase of a shared machine hits every row alike; ratios, not absolute times, are
what to compare across machines. Also timed: one eager training step of a small MLP
(forward, `append_backward`, Adam), per op it appended. The last row is issue 28's target:
a small eager op costs at most 2x a `jax.numpy` op. `bench/eager_schedule.py` measures
whether dispatching independent ops in another order pays.
"""
import argparse
import contextlib
import importlib.util

import numpy as np

from bench.common import interleaved


def progdesc_chain(n, eager=True):
    """A zero-argument callable: build and (in eager mode) run a chain of `n` ops."""
    import progdesc as pd
    from progdesc import ops

    start = np.linspace(-1, 1, 16, dtype=np.float32).reshape(4, 4)

    def chain():
        main, startup = pd.Program(), pd.Program()
        with pd.scope_guard(pd.Scope()), pd.program_guard(main, startup), \
                (pd.eager() if eager else contextlib.nullcontext()):
            y = pd.data("x", [4, 4], value=start)
            c = ops.fill_constant(shape=[4, 4], value=0.01)
            for i in range(n):
                kind = i % 3
                y = (ops.tanh(y) if kind == 0 else ops.scale(y, scale=1.0001) if kind == 1
                     else ops.add(y, c))
            if eager:
                y.numpy()
    return chain


def jax_chains(n):
    """(jax.numpy chain, jax.jit chain), zero-argument callables."""
    import jax
    import jax.numpy as jnp

    start = jnp.asarray(np.linspace(-1, 1, 16, dtype=np.float32).reshape(4, 4))
    c = jnp.full((4, 4), 0.01, jnp.float32)
    tanh, scale, add = jax.jit(jnp.tanh), jax.jit(lambda x: x * 1.0001), jax.jit(jnp.add)

    def numpy_chain():
        y = start
        for i in range(n):
            kind = i % 3
            y = jnp.tanh(y) if kind == 0 else y * 1.0001 if kind == 1 else y + c
        y.block_until_ready()

    def jit_chain():
        y = start
        for i in range(n):
            kind = i % 3
            y = tanh(y) if kind == 0 else scale(y) if kind == 1 else add(y, c)
        y.block_until_ready()
    return numpy_chain, jit_chain


def torch_chain(n):
    """The chain in PyTorch eager, or None when torch cannot be imported."""
    if importlib.util.find_spec("torch") is None:
        return None
    import torch

    start = torch.linspace(-1, 1, 16).reshape(4, 4)
    c = torch.full((4, 4), 0.01)

    def chain():
        y = start
        for i in range(n):
            kind = i % 3
            y = torch.tanh(y) if kind == 0 else y * 1.0001 if kind == 1 else y + c
        return y
    return chain


def eager_mlp_step():
    """(zero-argument callable, ops it appends): one eager MLP training step, recorded."""
    import progdesc as pd
    from progdesc import layers

    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 16)).astype(np.float32)
    y = x[:, :1] * 2

    def step():
        main, startup = pd.Program(), pd.Program()
        with pd.scope_guard(pd.Scope()), pd.program_guard(main, startup), pd.eager():
            xv = pd.data("x", [None, 16], value=x)
            yv = pd.data("y", [None, 1], value=y)
            h = layers.fc(layers.fc(xv, 32, act="relu"), 32, act="relu")
            loss = layers.mse_loss(layers.fc(h, 1), yv)
            pd.optimizer.Adam(1e-3).minimize(loss)
            loss.numpy()
        step.ops = len(main.global_block().desc.ops) + len(startup.global_block().desc.ops)
    step()
    return step, step.ops


TARGET = 2.0
"""issue 28's target: a small eager op costs at most this many times a `jax.numpy` op."""


def run(n=1000, repeats=15, log=print):
    """Time every chain; returns {row: seconds per op} and logs a table, ending with the
    target row ('small op <= 2x jax.numpy: PASS' or FAIL)."""
    numpy_chain, jit_chain = jax_chains(n)
    fns = {"progdesc eager": progdesc_chain(n), "progdesc append only":
           progdesc_chain(n, eager=False), "jax.numpy": numpy_chain, "jax.jit": jit_chain}
    torch = torch_chain(n)
    if torch is not None:
        fns["torch eager"] = torch
    stats = interleaved(fns, repeats, warmup=2, block=1)
    per_op = {name: s["median_s"] / n for name, s in stats.items()}
    mlp, mlp_ops = eager_mlp_step()
    mlp_stats = interleaved({"mlp": mlp}, max(3, repeats // 3), warmup=1, block=1)
    per_op["eager MLP step (per op)"] = mlp_stats["mlp"]["median_s"] / mlp_ops
    log(f"chain of {n} elementwise ops on float32[4, 4], median of {repeats}")
    log(f"{'row':28} | {'us/op':>7} | {'ops/s':>9} | vs jax.numpy")
    for name, s in per_op.items():
        log(f"{name:28} | {s * 1e6:7.1f} | {1 / s:9.0f} | x{s / per_op['jax.numpy']:.2f}")
    if torch is not None:
        ratio = per_op["progdesc eager"] / per_op["torch eager"]
        log(f"progdesc eager / torch eager: x{ratio:.2f}")
    else:
        log("torch is not importable here: no torch row")
    ratio = per_op["progdesc eager"] / per_op["jax.numpy"]
    log(f"small op <= {TARGET:g}x jax.numpy: {'PASS' if ratio <= TARGET else 'FAIL'} "
        f"(x{ratio:.2f})")
    return per_op


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    run(args.ops, args.repeats)


if __name__ == "__main__":
    main()
