"""Samples of lowering/ops/control.py: ops with sub-blocks, built through their builders.

Each `build` receives the input Variables by slot name and builds the op with
`progdesc.control_flow`; each `ref` is a NumPy loop over the same arrays.
"""
import numpy as np

from op_table import Sample, positive, rand
from progdesc import control_flow as cf
from progdesc import ops


# --- cond: X and W are outer variables both branches capture ---

def _cond(X, W, P):
    return cf.cond(P, lambda: (ops.tanh(X * W) * 2.0, X * 3.0),
                   lambda: (X * X + W, ops.exp(X)))


def _cond_ref(X, W, P):
    return (np.tanh(X * W) * 2.0, X * 3.0) if P else (X * X + W, np.exp(X))


def _cond_sample(taken):
    inputs = {"X": rand(4, 3), "W": rand(3, seed=1), "P": np.array(taken)}
    return Sample("cond", inputs, _cond_ref, build=_cond, name=f"{str(taken).lower()}_branch")


# --- switch: lax.switch clamps an index out of range to the last (or first) branch ---

def _switch(X, Index):
    return cf.switch(Index, [lambda: X * 2.0, lambda: ops.exp(X), lambda: X * X])


def _switch_ref(X, Index):
    branch = int(np.clip(Index, 0, 2))
    return [X * 2.0, np.exp(X), X * X][branch]


def _switch_sample(index, name):
    inputs = {"X": rand(3, 2), "Index": np.array(index, np.int32)}
    return Sample("switch", inputs, _switch_ref, build=_switch, name=name)


# --- scan: an RNN over XS (time first), and a scan of `length` steps without sequences ---

def _rnn(reverse):
    def build(XS, H0, W, U):
        def step(h, x):
            h = ops.tanh(ops.matmul(h, W) + ops.matmul(x, U))
            return h, ops.reduce_sum(h * h, axis=[1])
        return cf.scan(step, H0, XS, reverse=reverse)
    return build


def _rnn_ref(reverse):
    def ref(XS, H0, W, U):
        h, ys = H0, [None] * len(XS)
        for t in (reversed(range(len(XS))) if reverse else range(len(XS))):
            h = np.tanh(h @ W + XS[t] @ U)
            ys[t] = (h * h).sum(axis=1)
        return h, np.stack(ys)
    return ref


def _rnn_sample(reverse):
    inputs = {"XS": rand(5, 2, 3), "H0": rand(2, 4, seed=1), "W": rand(4, 4, seed=2) * 0.5,
              "U": rand(3, 4, seed=3)}
    return Sample("scan", inputs, _rnn_ref(reverse), build=_rnn(reverse),
                  name="rnn_reverse" if reverse else "rnn")


def _power(A, V0):
    return cf.scan(lambda v, _: (ops.tanh(ops.matmul(A, v)),) * 2, V0, length=4)


def _power_ref(A, V0):
    v, vs = V0, []
    for _ in range(4):
        v = np.tanh(A @ v)
        vs.append(v)
    return v, np.stack(vs)


# --- while: bounded (a masked scan, differentiable) and unbounded (lax.while_loop) ---

def _bounded(max_iters):
    """x <- tanh(x * W) + x until sum(x * x) reaches 3 or after `max_iters` iterations."""
    def build(X0, W):
        limit = ops.fill_constant(shape=[], dtype=X0.dtype, value=3.0)
        return cf.while_loop(lambda x: ops.less_than(ops.reduce_sum(x * x), limit),
                             lambda x: ops.tanh(x * W) + x, X0, max_iters=max_iters)

    def ref(X0, W):
        x = X0
        for _ in range(max_iters):
            if (x * x).sum() >= 3.0:
                break
            x = np.tanh(x * W) + x
        return x
    return build, ref


def _bounded_sample(max_iters, name):
    build, ref = _bounded(max_iters)
    # from these values the condition fails after 4 iterations (sum(x * x) = 4.6 > 3 > 2.6)
    return Sample("while", {"X0": positive(3) * 0.5, "W": rand(3, seed=1)}, ref, build=build,
                  name=name)


def _doubling(X0, N):
    i0 = ops.fill_constant(shape=[], dtype="int32", value=0)
    one = ops.fill_constant(shape=[], dtype="int32", value=1)
    return cf.while_loop(lambda i, x: ops.less_than(i, N),
                         lambda i, x: (i + one, x * 2.0 + 1.0), (i0, X0))


def _doubling_ref(X0, N):
    i, x = 0, X0
    while i < N:
        i, x = i + 1, x * 2.0 + 1.0
    return np.array(i, np.int32), x


SAMPLES = [
    _cond_sample(True),
    _cond_sample(False),
    _switch_sample(0, "first"),
    _switch_sample(1, "middle"),
    _switch_sample(2, "last"),
    _switch_sample(7, "out_of_range"),
    _rnn_sample(reverse=False),
    _rnn_sample(reverse=True),
    Sample("scan", {"A": rand(3, 3), "V0": rand(3, seed=1)}, _power_ref, build=_power,
           name="length_only"),
    _bounded_sample(6, "max_iters_stops_on_its_condition"),
    _bounded_sample(3, "max_iters_cuts_it_off"),
    Sample("while", {"X0": rand(3, 2), "N": np.array(5, np.int32)}, _doubling_ref,
           build=_doubling, grad=False, name="unbounded_has_no_gradient"),
]
