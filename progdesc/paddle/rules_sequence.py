"""Paddle's sequence models in the translation table: the `rnn` op (LSTM, GRU, simple
RNN) as `scan`s over time (so its gradient comes from scan's gradient maker), and
`fill_constant_batch_size_like`. `prepare` rewrites dygraph-to-static's loops
(progdesc.paddle.rules_control) before the walk; importing this module registers both
modules' rows.

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
- dropout_prob drops the input of every layer after the first, in training only (with
  a mask drawn per layer here; Paddle draws one and reuses it).
"""
import numpy as np

from progdesc.paddle import rules_control
from progdesc.paddle.rule_args import dtype_name, numpy_dtype, parse_number
from progdesc.paddle.rules import RULES
from progdesc.translate import Unsupported, recurrent

_GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}


def _cell(t, mode, w_hh, b_hh):
    """The step of one direction of one layer: (state, gates_x) -> (new state, output),
    where gates_x is the step's input projection x W_ih^T + b_ih (+ b_hh but for a GRU)
    and the state is (h,), or (h, c) for an LSTM: names of ours."""
    def hidden(h):
        return t.call("matmul", h, w_hh, transpose_y=True)

    def lstm(state, gates_x):
        h, c = state
        i, f, g, o = t.call("split", t.call("add", gates_x, hidden(h)), num=4, axis=1)
        c = t.call("add", t.call("mul", t.call("sigmoid", f), c),
                   t.call("mul", t.call("sigmoid", i), t.call("tanh", g)))
        h = t.call("mul", t.call("sigmoid", o), t.call("tanh", c))
        return (h, c), h

    def gru(state, gates_x):
        h, = state
        xr, xz, xc = t.call("split", gates_x, num=3, axis=1)
        hr, hz, hc = t.call("split", t.call("add", hidden(h), b_hh), num=3, axis=1)
        r = t.call("sigmoid", t.call("add", xr, hr))
        z = t.call("sigmoid", t.call("add", xz, hz))
        c = t.call("tanh", t.call("add", xc, t.call("mul", r, hc)))
        h = t.call("add", c, t.call("mul", z, t.call("sub", h, c)))   # z h + (1 - z) c
        return (h,), h

    def simple(state, gates_x):
        h = t.call("tanh" if mode == "RNN_TANH" else "relu",
                   t.call("add", gates_x, hidden(state[0])))
        return (h,), h

    return {"LSTM": lstm, "GRU": gru}.get(mode, simple)


def _direction(t, x, mode, weights, init, mask, reverse):
    """One direction of one layer over the time-major x, a scan over time: (outputs
    [T, B, H], final state [h] or [h, c])."""
    w_ih, w_hh, b_ih, b_hh = weights
    gates_x = t.call("add", t.call("matmul", x, w_ih, transpose_y=True), b_ih)
    if mode != "GRU":
        gates_x = t.call("add", gates_x, b_hh)
    return recurrent.scan_time(t, _cell(t, mode, w_hh, b_hh), gates_x, init, mask,
                               reverse=reverse)


def rnn_layers(t, x, pre_state, weights, seq_len, *, mode, num_layers, is_bidirec,
               hidden_size, dropout_prob, is_test):
    """Append the ops computing Paddle's rnn op; returns (Out, [last h, last c])."""
    directions = 2 if is_bidirec else 1
    cells = num_layers * directions
    mask = None if seq_len is None else recurrent.time_mask(t, x, seq_len)
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
            init = [recurrent.index(t, s, k) for s in pre_state]
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
    """Paddle's rnn op (see the module's text); the weights' shapes are checked against
    mode, layers, directions and sizes. Dropout between layers runs in training imports
    only (`t.for_training`); DropoutState and Reserve, Paddle's workspaces, are not made."""
    if mode not in _GATES:
        raise Unsupported(f"mode={mode!r}")
    if num_layers < 1 or hidden_size < 1 or input_size < 1:
        raise Unsupported(f"num_layers={num_layers}, hidden_size={hidden_size}, "
                          f"input_size={input_size}")
    directions = 2 if is_bidirec else 1
    cells = num_layers * directions
    if len(weights) != 4 * cells:
        raise Unsupported(f"WeightList holds {len(weights)} tensors; {num_layers} layer(s) "
                          f"in {directions} direction(s) take {4 * cells}")
    want = 2 if mode == "LSTM" else 1
    if len(pre_state) != want:
        raise Unsupported(f"PreState holds {len(pre_state)} tensors; {mode} takes {want}")
    for state in pre_state:
        dims = list(t.var(state)[0])
        if len(dims) != 3 or dims[0] != cells or dims[2] != hidden_size:
            raise Unsupported(f"PreState {state!r} has shape {dims}, expected "
                              f"[{cells}, batch, {hidden_size}]")
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


# --- zeros shaped by a run-time dim (older programs' RNN initial states) ---

@RULES.rule("fill_constant_batch_size_like", inputs=("Input",))
def fill_constant_batch_size_like(t, like, *, shape, value=0.0, str_value="", dtype=5,
                                  input_dim_idx=0, output_dim_idx=0):
    """A tensor of `shape` filled with `value`, whose dim output_dim_idx is Input's dim
    input_dim_idx."""
    if str_value:
        value = parse_number(str_value)
    dims = [int(d) for d in shape]
    if not 0 <= output_dim_idx < len(dims) or not 0 <= input_dim_idx < t.rank(like):
        raise Unsupported(f"input_dim_idx={input_dim_idx}, output_dim_idx={output_dim_idx} "
                          f"for shape {dims} and an input of rank {t.rank(like)}")
    dims[output_dim_idx] = t.var(like)[0][input_dim_idx]
    if any(d < 0 for k, d in enumerate(dims) if k != output_dim_idx):
        raise Unsupported(f"shape {list(shape)} has an unknown dim")
    fill = t.constant(np.asarray(value, numpy_dtype(dtype_name(dtype))))
    return t.call("broadcast_in_dim", fill, like, shape=dims, broadcast_dimensions=[],
                  like_axis=input_dim_idx)


def prepare(paddle):
    """Rewrite the PaddleProgram in place before its walk, and return it: each
    dygraph-to-static loop over `range(tensor)` reads the range's length and elements
    without making it (`rules_control.rewrite_range_loops`)."""
    rules_control.rewrite_range_loops(paddle)
    return paddle
