"""Recurrent layers for the front ends' rules (Paddle's rnn op, ONNX's LSTM/GRU/RNN): one
direction of a layer as a `scan` over time, so its gradient is the scan's.

A rule computes the step's input projection for every step at once (time major
[T, B, gates]), writes the cell as a function of our names, `cell(state, gates_x) ->
(new state, output)`, and hands both to `scan_time`; with sequence lengths, `time_mask`
gives the steps within each sequence, and a step past a sequence's end keeps the state
and outputs zeros (read in reverse, a sequence starts at its own last step).
"""
from progdesc import control_flow


def index(t, x, k):
    """x[k] of a stacked [N, ...] variable (our name)."""
    return t.call("squeeze", t.call("slice", x, axes=[0], starts=[k], ends=[k + 1]), axes=[0])


def time_mask(t, x, seq_len):
    """Bool [T, B, 1]: whether step t of the time-major x [T, B, ...] lies within sequence
    b's length (`seq_len` [B], any int or float dtype)."""
    first = t.call("slice", x, axes=[2], starts=[0], ends=[1])
    ones = t.call("scale", t.call("fill_zeros_like", first), scale=1.0, bias=1.0)
    steps = t.call("cumsum", ones, axis=0)   # 1, 2, ..., T along time
    dtype = t.var(x)[1]
    lengths = t.call("reshape", t.call("cast", seq_len, dtype=dtype), shape=[1, -1, 1])
    return t.call("less_equal", steps, lengths)


def scan_time(t, cell, gates_x, init, mask=None, reverse=False):
    """Run `cell` over the time-major `gates_x` [T, B, ...] from the state `init` (a list
    of our names), from the last step to the first if `reverse`; `mask` (`time_mask`)
    holds the state and zeros the output past each sequence's end. Returns (the outputs
    stacked over time [T, B, ...], [the final state]) as our names."""
    def step(state, xs):
        state = tuple(v.name for v in state)
        new, out = cell(state, xs[0].name)
        if mask is not None:
            keep = xs[1].name
            new = tuple(t.call("where", keep, n, s) for n, s in zip(new, state))
            out = t.call("where", keep, out, t.call("fill_zeros_like", out))
        return tuple(t.block.var(n) for n in new), t.block.var(out)

    seqs = (t.block.var(gates_x),) + (() if mask is None else (t.block.var(mask),))
    carry, ys = control_flow.scan(step, tuple(t.block.var(n) for n in init), seqs,
                                  reverse=reverse)
    return ys.name, [v.name for v in carry]
