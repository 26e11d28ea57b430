"""Recurrent layers: LSTM, GRU and RNN, each direction a `scan` over time
(`progdesc.translate.recurrent`, shared with Paddle's rnn op), so gradients come from
scan's gradient maker.

ONNX's equations (the operators' text), per direction d, with gates stacked in W [D,
gates*H, I], R [D, gates*H, H], B [D, 2*gates*H] (W's biases, then R's):
- LSTM, gates i, o, f, c: i = f(x Wi + h Ri + Pi*c + Wbi + Rbi), f likewise with Pf,
  c~ = g(x Wc + h Rc + Wbc + Rbc), C = f*c + i*c~, o = f(x Wo + h Ro + Po*C + Wbo + Rbo),
  H = o * h(C); P [D, 3H] holds Pi, Po, Pf; input_forget couples f = 1 - i.
- GRU, gates z, r, h: z = f(x Wz + h Rz + Wbz + Rbz), r likewise, then
  h~ = g(x Wh + (r*h) Rh + Rbh + Wbh), or with linear_before_reset
  h~ = g(x Wh + r*(h Rh + Rbh) + Wbh); H = (1 - z) h~ + z h.
- RNN: H = f(x Wi + h Ri + Wbi + Rbi).
`clip` bounds the input of the gates' activations. Past a sequence's length
(sequence_lens) Y is zero and the state holds; layout 1 (opset 14) is batch major.
"""
import numpy as np

from progdesc.onnx.model import as_numpy_dtype
from progdesc.onnx.table import RULES
from progdesc.translate import Unsupported, recurrent

_DEFAULTS = {"LSTM": ("Sigmoid", "Tanh", "Tanh"), "GRU": ("Sigmoid", "Tanh"), "RNN": ("Tanh",)}
_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}

# activation (lower case) -> (number of alphas, of betas it reads), (default alpha, beta)
_PARAMS = {"relu": (0, 0), "tanh": (0, 0), "sigmoid": (0, 0), "softsign": (0, 0),
           "softplus": (0, 0), "affine": (1, 1), "leakyrelu": (1, 0),
           "thresholdedrelu": (1, 0), "scaledtanh": (1, 1), "hardsigmoid": (1, 1),
           "elu": (1, 0)}
_PARAM_DEFAULTS = {"leakyrelu": (0.01, None), "thresholdedrelu": (1.0, None),
                   "hardsigmoid": (0.2, 0.5), "elu": (1.0, None)}


def _activations(kind, directions, names, alphas, betas):
    """[(name, alpha, beta)] for each activation of each direction, alphas and betas
    consumed in order by the activations that take them (ONNX's rule)."""
    count = len(_DEFAULTS[kind])
    names = list(names) if names else list(_DEFAULTS[kind]) * directions
    if len(names) == count and directions == 2:
        names = names * 2
    if len(names) != count * directions:
        raise Unsupported(f"activations={names}: {kind} takes {count} per direction")
    alphas, betas = list(alphas or ()), list(betas or ())
    out = []
    for name in names:
        low = name.lower()
        if low not in _PARAMS:
            raise Unsupported(f"activation {name!r}")
        n_alpha, n_beta = _PARAMS[low]
        default = _PARAM_DEFAULTS.get(low, (None, None))
        alpha = alphas.pop(0) if n_alpha and alphas else default[0]
        beta = betas.pop(0) if n_beta and betas else default[1]
        if (n_alpha and alpha is None) or (n_beta and beta is None):
            raise Unsupported(f"activation {name!r} without activation_alpha/beta")
        out.append((low, alpha, beta))
    return out


def _activate(t, x, activation):
    """Append the ops of one RNN activation function (see `_activations`) applied to x."""
    name, alpha, beta = activation
    if name in ("relu", "tanh", "sigmoid", "softplus"):
        return t.call(name, x)
    if name == "affine":
        return t.call("scale", x, scale=alpha, bias=beta)
    if name == "leakyrelu":
        return t.call("leaky_relu", x, alpha=alpha)
    if name == "hardsigmoid":
        return t.call("hard_sigmoid", x, slope=alpha, offset=beta)
    if name == "scaledtanh":
        return t.call("scale", t.call("tanh", t.call("scale", x, scale=beta)), scale=alpha)
    if name == "softsign":
        return t.call("div", x, t.call("scale", t.call("abs", x), bias=1.0))
    dtype = as_numpy_dtype(t.var(x)[1])
    zeros = t.call("fill_zeros_like", x)
    if name == "thresholdedrelu":
        return t.call("where", t.call("greater_than", x, t.constant(np.asarray(alpha, dtype))),
                      x, zeros)
    # elu: expm1 of min(x, 0), so that the branch not taken has a finite gradient
    negative = t.call("scale", t.call("expm1", t.call("minimum", x, zeros)), scale=alpha)
    return t.call("where", t.call("greater_than", x, zeros), x, negative)


def _rows(t, w, start, stop):
    """Rows start:stop of a 2-D weight, or elements of a 1-D bias."""
    return t.call("slice", w, axes=[0], starts=[start], ends=[stop])


def _cell(t, kind, hidden, r, p, rb_h, acts, clip, *, input_forget=0,
          linear_before_reset=0):
    """The step of one direction: (state, gates_x) -> (new state, output), our names;
    gates_x is x W^T + the biases the step does not need apart."""
    if kind == "GRU":   # the recurrence weights of z and r, and of h~, sliced once
        r_zr, r_h = _rows(t, r, 0, 2 * hidden), _rows(t, r, 2 * hidden, 3 * hidden)

    def act(x, k):
        if clip is not None:
            x = t.call("clip", x, min=-float(clip), max=float(clip))
        return _activate(t, x, acts[k])

    def lstm(state, gates_x):
        h, c = state
        i, o, f, cc = t.call("split", t.call("add", gates_x, t.call(
            "matmul", h, r, transpose_y=True)), num=4, axis=1)
        if p is not None:
            i = t.call("add", i, t.call("mul", p[0], c))
            f = t.call("add", f, t.call("mul", p[2], c))
        i = act(i, 0)
        f = t.call("scale", i, scale=-1.0, bias=1.0) if input_forget else act(f, 0)
        c = t.call("add", t.call("mul", f, c), t.call("mul", i, act(cc, 1)))
        if p is not None:
            o = t.call("add", o, t.call("mul", p[1], c))
        h = t.call("mul", act(o, 0), _activate(t, c, acts[2]))
        return (h, c), h

    def gru(state, gates_x):
        h, = state
        xz, xr, xh = t.call("split", gates_x, num=3, axis=1)
        hz, hr = t.call("split", t.call("matmul", h, r_zr, transpose_y=True), num=2, axis=1)
        z = act(t.call("add", xz, hz), 0)
        rg = act(t.call("add", xr, hr), 0)
        if linear_before_reset:
            hh = t.call("matmul", h, r_h, transpose_y=True)
            if rb_h is not None:
                hh = t.call("add", hh, rb_h)
            hh = t.call("mul", rg, hh)
        else:
            hh = t.call("matmul", t.call("mul", rg, h), r_h, transpose_y=True)
        hh = act(t.call("add", xh, hh), 1)
        h = t.call("add", hh, t.call("mul", z, t.call("sub", h, hh)))   # (1-z) h~ + z h
        return (h,), h

    def simple(state, gates_x):
        h = act(t.call("add", gates_x, t.call("matmul", state[0], r, transpose_y=True)), 0)
        return (h,), h

    return {"LSTM": lstm, "GRU": gru, "RNN": simple}[kind]


def _check_dims(t, kind, w, r, b, p, directions, hidden):
    """Unsupported unless the weights have ONNX's shapes for `kind`; returns input_size."""
    gates = _GATES[kind] * hidden
    w_dims, r_dims = list(t.var(w)[0]), list(t.var(r)[0])
    if len(w_dims) != 3 or w_dims[:2] != [directions, gates]:
        raise Unsupported(f"W has shape {w_dims}, expected [{directions}, {gates}, input]")
    if r_dims != [directions, gates, hidden]:
        raise Unsupported(f"R has shape {r_dims}, expected [{directions}, {gates}, {hidden}]")
    if b is not None and list(t.var(b)[0]) != [directions, 2 * gates]:
        raise Unsupported(f"B has shape {list(t.var(b)[0])}, expected "
                          f"[{directions}, {2 * gates}]")
    if p is not None and list(t.var(p)[0]) != [directions, 3 * hidden]:
        raise Unsupported(f"P has shape {list(t.var(p)[0])}, expected "
                          f"[{directions}, {3 * hidden}]")
    return w_dims[2]


def _input_gates(t, kind, x, w, b, d, hidden, linear_before_reset):
    """(x W^T + the biases outside the recurrence [T, B, gates], and GRU's Rbh where
    linear_before_reset puts it inside the reset gate, else None) of direction d."""
    gates_x = t.call("matmul", x, recurrent.index(t, w, d), transpose_y=True)
    if b is None:
        return gates_x, None
    gates = _GATES[kind] * hidden
    bias = recurrent.index(t, b, d)
    wb, rb = _rows(t, bias, 0, gates), _rows(t, bias, gates, 2 * gates)
    rb_h = None
    if kind == "GRU" and linear_before_reset:
        rb_h = _rows(t, rb, 2 * hidden, gates)
        rb = t.call("concat", [_rows(t, rb, 0, 2 * hidden), t.call("fill_zeros_like", rb_h)],
                    axis=0)
    return t.call("add", gates_x, t.call("add", wb, rb)), rb_h


def _recurrent(t, kind, x, w, r, b, seq_lens, init_h, init_c=None, p=None, *,
               hidden_size=None, direction="forward", layout=0, activations=None,
               activation_alpha=None, activation_beta=None, clip=None, input_forget=0,
               linear_before_reset=0):
    """Append the ops of one LSTM / GRU / RNN node; returns (Y, Y_h[, Y_c])."""
    if direction not in ("forward", "reverse", "bidirectional"):
        raise Unsupported(f"direction={direction!r}")
    if layout not in (0, 1):
        raise Unsupported(f"layout={layout}")
    directions = 2 if direction == "bidirectional" else 1
    r_dims = t.var(r)[0]
    hidden = int(hidden_size) if hidden_size is not None else r_dims[-1]
    _check_dims(t, kind, w, r, b, p, directions, hidden)
    if len(t.var(x)[0]) != 3:
        raise Unsupported(f"X has rank {len(t.var(x)[0])}, expected 3")
    acts = _activations(kind, directions, activations, activation_alpha, activation_beta)
    if layout == 1:   # batch major in and out
        x = t.call("transpose", x, perm=[1, 0, 2])
        init_h, init_c = (None if s is None else t.call("transpose", s, perm=[1, 0, 2])
                          for s in (init_h, init_c))
    mask = None if seq_lens is None else recurrent.time_mask(t, x, seq_lens)
    count = len(_DEFAULTS[kind])
    ys, finals = [], []
    for d in range(directions):
        gates_x, rb_h = _input_gates(t, kind, x, w, b, d, hidden, linear_before_reset)
        peep = None
        if p is not None:
            p_d = recurrent.index(t, p, d)
            peep = [_rows(t, p_d, k * hidden, (k + 1) * hidden) for k in range(3)]
        zeros = t.call("fill_zeros_like", t.call("squeeze", t.call(
            "slice", gates_x, axes=[0, 2], starts=[0, 0], ends=[1, hidden]), axes=[0]))
        state = [zeros if s is None else recurrent.index(t, s, d)
                 for s in ((init_h, init_c) if kind == "LSTM" else (init_h,))]
        cell = _cell(t, kind, hidden, recurrent.index(t, r, d), peep, rb_h,
                     acts[d * count:(d + 1) * count], clip, input_forget=input_forget,
                     linear_before_reset=linear_before_reset)
        y, final = recurrent.scan_time(t, cell, gates_x, state, mask, reverse=d == 1
                                       or direction == "reverse")
        ys.append(y)
        finals.append(final)
    y = t.call("stack", ys, axis=1)                    # [T, D, B, H]
    states = [t.call("stack", list(f), axis=layout) for f in zip(*finals)]
    if layout == 1:
        y = t.call("transpose", y, perm=[2, 0, 1, 3])  # [B, T, D, H]
    return [y] + states


@RULES.rule("LSTM")
def lstm(t, x, w, r, b=None, sequence_lens=None, initial_h=None, initial_c=None, p=None, *,
         hidden_size=None, direction="forward", layout=0, activations=None,
         activation_alpha=None, activation_beta=None, clip=None, input_forget=0):
    """ONNX LSTM (see the module's text): Y, Y_h, Y_c."""
    return _recurrent(t, "LSTM", x, w, r, b, sequence_lens, initial_h, initial_c, p,
                      hidden_size=hidden_size, direction=direction, layout=layout,
                      activations=activations, activation_alpha=activation_alpha,
                      activation_beta=activation_beta, clip=clip, input_forget=input_forget)


@RULES.rule("GRU")
def gru(t, x, w, r, b=None, sequence_lens=None, initial_h=None, *, hidden_size=None,
        direction="forward", layout=0, activations=None, activation_alpha=None,
        activation_beta=None, clip=None, linear_before_reset=0):
    """ONNX GRU (see the module's text): Y, Y_h."""
    return _recurrent(t, "GRU", x, w, r, b, sequence_lens, initial_h,
                      hidden_size=hidden_size, direction=direction, layout=layout,
                      activations=activations, activation_alpha=activation_alpha,
                      activation_beta=activation_beta, clip=clip,
                      linear_before_reset=linear_before_reset)


@RULES.rule("RNN")
def rnn(t, x, w, r, b=None, sequence_lens=None, initial_h=None, *, hidden_size=None,
        direction="forward", layout=0, activations=None, activation_alpha=None,
        activation_beta=None, clip=None):
    """ONNX RNN (see the module's text): Y, Y_h."""
    return _recurrent(t, "RNN", x, w, r, b, sequence_lens, initial_h,
                      hidden_size=hidden_size, direction=direction, layout=layout,
                      activations=activations, activation_alpha=activation_alpha,
                      activation_beta=activation_beta, clip=clip)
