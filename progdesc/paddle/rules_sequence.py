"""Paddle's sequence models and control flow in the translation table: the `rnn` op
(LSTM, GRU, simple RNN) as `scan`s over time, and dygraph-to-static control flow
(`while`, `conditional_block` + `select_input`, PIR `if`/`while`) as our `while` and
`cond` ops, with Paddle's sub-blocks translated into ours.

The rnn op's meaning, as Paddle's CPU kernel computes it (read, not copied):
- Input is time major [T, B, input_size]; PreState is [h0] or [h0, c0] (LSTM), each
  [num_layers * directions, B, hidden]; Out is [T, B, directions * hidden].
- WeightList is [w_ih, w_hh] for each (layer, direction), then [b_ih, b_hh] for each,
  with w_ih [gates * hidden, in], w_hh [gates * hidden, hidden].
- Gates, in the order the weights stack them: LSTM i, f, c, o; GRU r, z, c with the
  reset gate applied after the hidden projection (c = tanh(x_c + r * (h W_hc + b_hc)))
  and h' = z * h + (1 - z) * c; RNN_TANH / RNN_RELU one gate.
- The reverse direction runs from the last step to the first; with SequenceLength, a
  step past a sequence's length keeps the state and outputs zeros.
- dropout_prob drops the input of every layer after the first, in training only.
"""
from progdesc import control_flow
from progdesc.paddle.rules import RULES
from progdesc.translate import Unsupported

_GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}


def _index(t, x, k):
    """x[k] of a stacked [N, ...] variable."""
    return t.call("squeeze", t.call("slice", x, axes=[0], starts=[k], ends=[k + 1]), axes=[0])


def _time_mask(t, x, seq_len):
    """Bool [T, B, 1]: whether step t lies within sequence b's length."""
    first = t.call("slice", x, axes=[2], starts=[0], ends=[1])
    ones = t.call("scale", t.call("fill_zeros_like", first), scale=1.0, bias=1.0)
    steps = t.call("cumsum", ones, axis=0)   # 1, 2, ..., T along time
    dtype = t.var(x)[1]
    lengths = t.call("reshape", t.call("cast", seq_len, dtype=dtype), shape=[1, -1, 1])
    return t.call("less_equal", steps, lengths)


def _cell(t, mode, w_hh, b_hh):
    """The step function of one direction of one layer: (state, xs) -> (state, h), where
    xs holds the input projection x W_ih^T + b_ih (+ b_hh but for GRU) of the step and
    state is h, or (h, c) for an LSTM."""
    def hidden(h):
        return t.call("matmul", h, w_hh, transpose_y=True)

    if mode == "LSTM":
        def lstm(state, gates_x):
            h, c = state
            i, f, g, o = t.call("split", t.call("add", gates_x, hidden(h)), num=4, axis=1)
            c = t.call("add", t.call("mul", t.call("sigmoid", f), c),
                       t.call("mul", t.call("sigmoid", i), t.call("tanh", g)))
            h = t.call("mul", t.call("sigmoid", o), t.call("tanh", c))
            return (h, c), h
        return lstm
    if mode == "GRU":
        def gru(h, gates_x):
            xr, xz, xc = t.call("split", gates_x, num=3, axis=1)
            hr, hz, hc = t.call("split", t.call("add", hidden(h), b_hh), num=3, axis=1)
            r = t.call("sigmoid", t.call("add", xr, hr))
            z = t.call("sigmoid", t.call("add", xz, hz))
            c = t.call("tanh", t.call("add", xc, t.call("mul", r, hc)))
            h = t.call("add", c, t.call("mul", z, t.call("sub", h, c)))
            return h, h
        return gru
    act = "tanh" if mode == "RNN_TANH" else "relu"

    def simple(h, gates_x):
        h = t.call(act, t.call("add", gates_x, hidden(h)))
        return h, h
    return simple


def _direction(t, x, mode, weights, init, mask, reverse):
    """One direction of one layer over the time-major x: (outputs [T, B, H], final
    state: [h] or [h, c])."""
    w_ih, w_hh, b_ih, b_hh = weights
    gates_x = t.call("add", t.call("matmul", x, w_ih, transpose_y=True), b_ih)
    if mode != "GRU":
        gates_x = t.call("add", gates_x, b_hh)
    cell = _cell(t, mode, w_hh, b_hh)

    def step(state, xs):
        names = tuple(v.name for v in state) if len(state) > 1 else state[0].name
        new, h = cell(names, xs[0].name)
        if mask is not None:   # past a sequence's end: keep the state, output zeros
            keep = xs[1].name
            new = tuple(t.call("where", keep, n, s) for n, s in
                        zip(new if isinstance(new, tuple) else (new,),
                            names if isinstance(names, tuple) else (names,)))
            h = t.call("where", keep, h, t.call("fill_zeros_like", h))
        new = new if isinstance(new, tuple) else (new,)
        return tuple(t.block.var(n) for n in new), t.block.var(h)

    seqs = (t.block.var(gates_x),) + (() if mask is None else (t.block.var(mask),))
    carry, ys = control_flow.scan(step, tuple(t.block.var(n) for n in init), seqs,
                                  reverse=reverse)
    return ys.name, [v.name for v in carry]


def rnn_layers(t, x, pre_state, weights, seq_len, *, mode, num_layers, is_bidirec,
               hidden_size, dropout_prob, is_test):
    """Append the ops computing Paddle's rnn op; returns (Out, [last h, last c])."""
    directions = 2 if is_bidirec else 1
    cells = num_layers * directions
    mask = None if seq_len is None else _time_mask(t, x, seq_len)
    finals = [[] for _ in pre_state]
    for layer in range(num_layers):
        if layer > 0 and dropout_prob > 0:
            x = t.call("dropout", x, dropout_prob=dropout_prob, is_test=is_test,
                       dropout_implementation="upscale_in_train")[0]
        outs = []
        for d in range(directions):
            k = layer * directions + d
            cell_weights = (weights[2 * k], weights[2 * k + 1],
                            weights[2 * cells + 2 * k], weights[2 * cells + 2 * k + 1])
            init = [_index(t, s, k) for s in pre_state]
            out, final = _direction(t, x, mode, cell_weights, init, mask, reverse=d == 1)
            outs.append(out)
            for acc, f in zip(finals, final):
                acc.append(f)
        x = outs[0] if directions == 1 else t.call("concat", outs, axis=2)
    states = [t.call("stack", f, axis=0) for f in finals]
    return x, states


@RULES.rule("rnn", inputs=("Input", "PreState*", "WeightList*", "SequenceLength"),
            outputs=("Out", "DropoutState", "State*", "Reserve"))
def rnn(t, x, pre_state, weights, seq_len, *, mode="LSTM", num_layers=1, is_bidirec=False,
        hidden_size=100, input_size=10, dropout_prob=0.0):
    if mode not in _GATES:
        raise Unsupported(f"mode={mode!r}")
    directions = 2 if is_bidirec else 1
    cells = num_layers * directions
    if len(weights) != 4 * cells:
        raise Unsupported(f"WeightList holds {len(weights)} tensors; {num_layers} layer(s) "
                          f"in {directions} direction(s) take {4 * cells}")
    want = 2 if mode == "LSTM" else 1
    if len(pre_state) != want:
        raise Unsupported(f"PreState holds {len(pre_state)} tensors; {mode} takes {want}")
    gates = _GATES[mode] * hidden_size
    for k in range(cells):
        fed = input_size if k < directions else directions * hidden_size
        for w, dims in ((weights[2 * k], (gates, fed)), (weights[2 * k + 1], (gates, hidden_size)),
                        (weights[2 * cells + 2 * k], (gates,)),
                        (weights[2 * cells + 2 * k + 1], (gates,))):
            if tuple(t.var(w)[0]) != dims:
                raise Unsupported(f"weight {w!r} has shape {list(t.var(w)[0])}, expected "
                                  f"{list(dims)} for {mode} with hidden_size={hidden_size}")
    training = bool(getattr(t, "for_training", False))
    out, states = rnn_layers(t, x, pre_state, weights, seq_len, mode=mode,
                             num_layers=num_layers, is_bidirec=is_bidirec,
                             hidden_size=hidden_size, dropout_prob=dropout_prob,
                             is_test=not training)
    return out, None, states, None
