"""ONNX LSTM, GRU and RNN nodes imported by progdesc.onnx, against a reference written here
from ONNX's equations (NumPy for values, JAX for jax.vjp) and against onnxruntime, with
symbolic sequence and batch dims run at two sizes; gradients flow through the scans."""
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import progdesc as pd
from lowering.errors import UnsupportedOpError
from progdesc import onnx as ponnx

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
SIZES = ((3, 2), (5, 4))   # (sequence length, batch)
IN, HID = 3, 4


# --- the reference: ONNX's equations, one sequence at a time ---

def _act(xp, name, alpha, beta):
    name = name.lower()
    table = {
        "sigmoid": lambda x: 1 / (1 + xp.exp(-x)),
        "tanh": xp.tanh,
        "relu": lambda x: xp.maximum(x, 0),
        "affine": lambda x: alpha * x + beta,
        "leakyrelu": lambda x: xp.where(x >= 0, x, alpha * x),
        "thresholdedrelu": lambda x: xp.where(x > alpha, x, 0 * x),
        "scaledtanh": lambda x: alpha * xp.tanh(beta * x),
        "hardsigmoid": lambda x: xp.clip(alpha * x + beta, 0, 1),
        "elu": lambda x: xp.where(x >= 0, x, alpha * (xp.exp(xp.minimum(x, 0)) - 1)),
        "softsign": lambda x: x / (1 + xp.abs(x)),
        "softplus": lambda x: xp.log(1 + xp.exp(x)),
    }
    return table[name]


def _step(xp, kind, xt, h, c, w, r, wb, rb, p, f, cl, lbr, input_forget):
    """One step of ONNX's equations: (h, c) after reading xt ([I] or [B, I])."""
    if kind == "LSTM":
        g = xt @ w.T + h @ r.T + wb + rb
        gi, go, gf, gc = (g[..., k * HID:(k + 1) * HID] for k in range(4))
        pi, po, pf = (p[k * HID:(k + 1) * HID] for k in range(3)) if p is not None \
            else (0, 0, 0)
        i = f[0](cl(gi + pi * c))
        ff = 1 - i if input_forget else f[0](cl(gf + pf * c))
        c = ff * c + i * f[1](cl(gc))
        o = f[0](cl(go + po * c))
        return o * f[2](c), c
    if kind == "GRU":
        z = f[0](cl(xt @ w[:HID].T + h @ r[:HID].T + wb[:HID] + rb[:HID]))
        rr = f[0](cl(xt @ w[HID:2 * HID].T + h @ r[HID:2 * HID].T + wb[HID:2 * HID]
                     + rb[HID:2 * HID]))
        if lbr:
            hh = f[1](cl(xt @ w[2 * HID:].T + rr * (h @ r[2 * HID:].T + rb[2 * HID:])
                         + wb[2 * HID:]))
        else:
            hh = f[1](cl(xt @ w[2 * HID:].T + (rr * h) @ r[2 * HID:].T + rb[2 * HID:]
                         + wb[2 * HID:]))
        return (1 - z) * hh + z * h, c
    return f[0](cl(xt @ w.T + h @ r.T + wb + rb)), c


def _step_fn(xp, kind, w, r, b, p, acts, clip, lbr, input_forget):
    """step(xt, h, c) -> (h, c) of one direction."""
    f = [_act(xp, *a) for a in acts]
    cl = (lambda v: xp.clip(v, -clip, clip)) if clip is not None else (lambda v: v)
    n = GATES[kind] * HID
    wb, rb = (b[:n], b[n:]) if b is not None else (xp.zeros(n), xp.zeros(n))
    return lambda xt, h, c: _step(xp, kind, xt, h, c, w, r, wb, rb, p, f, cl, lbr,
                                  input_forget)


def _acts(kind, cfg, dirs):
    """[(name, alpha, beta)] per activation, alphas and betas taken in order."""
    names = cfg.get("activations") or {"LSTM": ["Sigmoid", "Tanh", "Tanh"],
                                       "GRU": ["Sigmoid", "Tanh"], "RNN": ["Tanh"]}[kind] * dirs
    alphas, betas = list(cfg.get("activation_alpha", [])), list(cfg.get("activation_beta", []))
    takes = {"affine": (1, 1), "leakyrelu": (1, 0), "thresholdedrelu": (1, 0),
             "scaledtanh": (1, 1), "hardsigmoid": (1, 1), "elu": (1, 0)}
    acts = []
    for name in names:
        na, nb = takes.get(name.lower(), (0, 0))
        acts.append((name, alphas.pop(0) if na else None, betas.pop(0) if nb else None))
    return acts


def reference(xp, kind, cfg, x, w, r, b=None, seq=None, h0=None, c0=None, p=None):
    """(Y, Y_h, Y_c) of an ONNX LSTM/GRU/RNN node (layout 0: x [T, B, I]), each sequence
    run on its own: read from its first to its last valid step, or backwards."""
    dirs = 2 if cfg.get("direction") == "bidirectional" else 1
    count = {"LSTM": 3, "GRU": 2, "RNN": 1}[kind]
    acts = _acts(kind, cfg, dirs)
    steps, batch = x.shape[0], x.shape[1]
    lengths = [steps] * batch if seq is None else [int(s) for s in seq]
    ys = [[[None] * batch for _ in range(dirs)] for _ in range(steps)]
    yh = [[None] * batch for _ in range(dirs)]
    yc = [[None] * batch for _ in range(dirs)]
    for d in range(dirs):
        backwards = d == 1 or cfg.get("direction") == "reverse"
        for k in range(batch):
            n = lengths[k]
            order = list(range(n))[::-1] if backwards else list(range(n))
            h = h0[d, k] if h0 is not None else xp.zeros(HID)
            c = c0[d, k] if c0 is not None else xp.zeros(HID)
            step = _step_fn(xp, kind, w[d], r[d], None if b is None else b[d],
                            None if p is None else p[d], acts[d * count:(d + 1) * count],
                            cfg.get("clip"), cfg.get("linear_before_reset", 0),
                            cfg.get("input_forget", 0))
            for t in order:
                h, c = step(x[t, k], h, c)
                ys[t][d][k] = h
            for t in range(n, steps):
                ys[t][d][k] = xp.zeros(HID)
            yh[d][k], yc[d][k] = h, c
    y = xp.stack([xp.stack([xp.stack(v) for v in per_d]) for per_d in ys])
    return y, xp.stack([xp.stack(v) for v in yh]), xp.stack([xp.stack(v) for v in yc])


def jax_reference(kind, cfg, x, w, r, b=None, seq=None, h0=None, c0=None, p=None):
    """`reference` written for jax.vjp: each direction a lax.scan over time of the whole
    batch, a step past a sequence's length holding the state and giving zeros."""
    dirs = 2 if cfg.get("direction") == "bidirectional" else 1
    count = {"LSTM": 3, "GRU": 2, "RNN": 1}[kind]
    acts = _acts(kind, cfg, dirs)
    steps, batch = x.shape[0], x.shape[1]
    lengths = np.full(batch, steps) if seq is None else np.asarray(seq)
    keep = jnp.asarray(np.arange(steps)[:, None, None] < lengths[None, :, None])
    ys, yh, yc = [], [], []
    for d in range(dirs):
        backwards = d == 1 or cfg.get("direction") == "reverse"
        step = _step_fn(jnp, kind, w[d], r[d], None if b is None else b[d],
                        None if p is None else p[d], acts[d * count:(d + 1) * count],
                        cfg.get("clip"), cfg.get("linear_before_reset", 0),
                        cfg.get("input_forget", 0))

        def body(carry, inp, step=step):
            h, c = carry
            xt, k = inp
            nh, nc = step(xt, h, c)
            return (jnp.where(k, nh, h), jnp.where(k, nc, c)), jnp.where(k, nh, 0.0)

        zeros = jnp.zeros((batch, HID))
        init = (zeros if h0 is None else h0[d], zeros if c0 is None else c0[d])
        (h, c), y = jax.lax.scan(body, init, (x, keep), reverse=backwards)
        ys.append(y)
        yh.append(h)
        yc.append(c)
    return jnp.stack(ys, 1), jnp.stack(yh), jnp.stack(yc)


# --- models ---

def _model(kind, cfg, with_seq, with_init, with_peep):
    """An ONNX model of one node: X, sequence_lens, initial states as graph inputs with
    symbolic dims T and N; W, R, B (and P) as initializers; Y, Y_h (and Y_c) outputs."""
    dirs = 2 if cfg.get("direction") == "bidirectional" else 1
    layout = cfg.get("layout", 0)
    rng = np.random.default_rng(len(kind) + dirs)
    n = GATES[kind] * HID
    params = {"W": rng.normal(scale=0.5, size=(dirs, n, IN)),
              "R": rng.normal(scale=0.5, size=(dirs, n, HID)),
              "B": rng.normal(scale=0.5, size=(dirs, 2 * n))}
    if with_peep:
        params["P"] = rng.normal(scale=0.5, size=(dirs, 3 * HID))
    x_dims = ["N", "T", IN] if layout else ["T", "N", IN]
    state_dims = ["N", dirs, HID] if layout else [dirs, "N", HID]
    inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, x_dims)]
    names = ["X", "W", "R", "B", "", "", ""]
    if with_seq:
        inputs.append(helper.make_tensor_value_info("seq", TensorProto.INT32, ["N"]))
        names[4] = "seq"
    states = ["h0", "c0"] if kind == "LSTM" else ["h0"]
    if with_init:
        for k, s in enumerate(states):
            inputs.append(helper.make_tensor_value_info(s, TensorProto.FLOAT, state_dims))
            names[5 + k] = s
    if with_peep:
        names.append("P")
    while names[-1] == "":
        names.pop()
    outs = ["Y", "Y_h", "Y_c"][:3 if kind == "LSTM" else 2]
    y_dims = ["N", "T", dirs, HID] if layout else ["T", dirs, "N", HID]
    outputs = [helper.make_tensor_value_info("Y", TensorProto.FLOAT, y_dims)] + [
        helper.make_tensor_value_info(o, TensorProto.FLOAT, state_dims) for o in outs[1:]]
    node = helper.make_node(kind, names, outs, name=f"the_{kind.lower()}", hidden_size=HID,
                            **cfg)
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in params.items()]
    graph = helper.make_graph([node], "g", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8)
    onnx.checker.check_model(model)
    return model, {k: v.astype(np.float32) for k, v in params.items()}


def _feed(kind, cfg, steps, batch, with_seq, with_init, seed=0):
    rng = np.random.default_rng(seed + steps)
    dirs = 2 if cfg.get("direction") == "bidirectional" else 1
    feed = {"X": rng.normal(size=(steps, batch, IN)).astype(np.float32)}
    if with_seq:
        feed["seq"] = rng.integers(1, steps + 1, size=batch).astype(np.int32)
        feed["seq"][0] = steps
    if with_init:
        for s in ["h0", "c0"] if kind == "LSTM" else ["h0"]:
            feed[s] = rng.normal(size=(dirs, batch, HID)).astype(np.float32)
    return feed


def _to_layout(feed, layout):
    """The feed of a layout-1 model: X [N, T, I], states [N, D, H]."""
    if not layout:
        return feed
    out = dict(feed)
    out["X"] = feed["X"].transpose(1, 0, 2)
    for s in ("h0", "c0"):
        if s in feed:
            out[s] = feed[s].transpose(1, 0, 2)
    return out


def _ref_outputs(kind, cfg, params, feed, ref=None):
    """The node's outputs by `reference` (NumPy; or `ref`), in the model's layout."""
    ref = ref or partial(reference, np)
    y, yh, yc = ref(kind, cfg, feed["X"], params["W"], params["R"], params["B"],
                    feed.get("seq"), feed.get("h0"), feed.get("c0"), params.get("P"))
    outs = [y, yh, yc][:3 if kind == "LSTM" else 2]
    if cfg.get("layout", 0):
        outs = [outs[0].transpose(2, 0, 1, 3)] + [o.transpose(1, 0, 2) for o in outs[1:]]
    return outs


CASES = [
    ("LSTM", {}, True, True, True),
    ("LSTM", {"direction": "bidirectional", "layout": 1}, False, False, False),
    ("LSTM", {"direction": "reverse", "clip": 0.7, "activations": ["HardSigmoid", "LeakyRelu",
              "Softsign"], "activation_alpha": [0.3, 0.05], "activation_beta": [0.4]},
     True, True, True),
    ("LSTM", {"input_forget": 1, "activations": ["Sigmoid", "Elu", "ScaledTanh"],
              "activation_alpha": [0.9, 1.1], "activation_beta": [0.8]}, False, True, False),
    ("GRU", {}, True, True, False),
    ("GRU", {"direction": "bidirectional", "linear_before_reset": 1}, True, False, False),
    ("GRU", {"direction": "reverse", "layout": 1, "activations": ["Sigmoid", "Affine"],
             "activation_alpha": [0.7], "activation_beta": [0.1]}, False, True, False),
    ("RNN", {}, False, False, False),
    ("RNN", {"direction": "bidirectional", "activations": ["Relu", "ThresholdedRelu"],
             "activation_alpha": [0.1], "clip": 2.0}, True, True, False),
    ("RNN", {"direction": "reverse", "activations": ["Softplus"]}, True, False, False),
]


@pytest.mark.parametrize("kind,cfg,with_seq,with_init,with_peep", CASES,
                         ids=[f"{c[0]}-{k}" for k, c in enumerate(CASES)])
def test_node_matches_reference_and_onnxruntime(kind, cfg, with_seq, with_init, with_peep):
    model, params = _model(kind, cfg, with_seq, with_init, with_peep)
    scope = pd.Scope()
    program, feeds, fetches = ponnx.load(model, scope)
    layout = cfg.get("layout", 0)
    session = None if layout else onnxruntime.InferenceSession(   # it refuses layout 1
        model.SerializeToString(), providers=["CPUExecutionProvider"])
    for steps, batch in SIZES:
        feed = _feed(kind, cfg, steps, batch, with_seq, with_init)
        fed = _to_layout(feed, layout)
        got = pd.Executor(precision="highest").run(program, feed=fed, fetch_list=fetches,
                                                   scope=scope)
        for out, ref in zip(got, _ref_outputs(kind, cfg, params, feed)):
            np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
        if session is not None:
            for out, ref in zip(got, session.run(None, fed)):
                np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)


GRAD_CASES = [
    ("LSTM", {"direction": "bidirectional"}, True, True, True),
    ("GRU", {"direction": "reverse", "linear_before_reset": 1, "clip": 1.5}, True, True, False),
    ("RNN", {"layout": 1}, False, True, False),
]


@pytest.mark.parametrize("kind,cfg,with_seq,with_init,with_peep", GRAD_CASES,
                         ids=[c[0] for c in GRAD_CASES])
def test_gradients_match_jax_vjp_of_the_reference(kind, cfg, with_seq, with_init, with_peep):
    """Gradients w.r.t. the weights, X and the initial states."""
    model, params = _model(kind, cfg, with_seq, with_init, with_peep)
    scope = pd.Scope()
    program, feeds, fetches = ponnx.load(model, scope)
    block = program.global_block()
    wrt = sorted(params) + [n for n in ("X", "h0", "c0") if n in feeds]
    with pd.program_guard(program):
        seeds = [pd.data(f"seed{k}", list(v.shape), "float32") for k, v in enumerate(fetches)]
        grads = pd.gradients(fetches, [block.var(n) for n in wrt], target_gradients=seeds)
    layout = cfg.get("layout", 0)
    for steps, batch in SIZES:
        feed = _feed(kind, cfg, steps, batch, with_seq, with_init, seed=7)
        fed = _to_layout(feed, layout)
        ref_outs = _ref_outputs(kind, cfg, params, feed)
        rng = np.random.default_rng(steps)
        cotangents = [rng.normal(size=o.shape).astype(np.float32) for o in ref_outs]
        fed.update({f"seed{k}": c for k, c in enumerate(cotangents)})
        got = pd.Executor(precision="highest").run(program, feed=fed, fetch_list=grads,
                                                   scope=scope)
        values = dict(params, **feed)

        def f(*diffed):
            both = dict(values, **dict(zip(wrt, diffed)))
            return _ref_outputs(kind, cfg, both, both, ref=jax_reference)

        @jax.jit   # one compilation of the reference and its pullback
        def pullback(diffed, cts):
            outs, vjp = jax.vjp(f, *diffed)
            return outs, vjp(cts)

        with jax.default_matmul_precision("highest"):
            outs, want = pullback([jnp.asarray(values[n]) for n in wrt],
                                  [jnp.asarray(c) for c in cotangents])
        for out, ref in zip(outs, ref_outs):   # the JAX reference agrees with NumPy's
            np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
        for name, g, ref in zip(wrt, got, want):
            if layout and name in ("X", "h0", "c0"):
                ref = np.asarray(ref).transpose(1, 0, 2)
            np.testing.assert_allclose(g, ref, rtol=1e-4, atol=1e-5, err_msg=name)


def test_unknown_activation_and_bad_weights_are_reported_with_the_node():
    model, _ = _model("GRU", {"activations": ["Sigmoid", "Swish"]}, False, False, False)
    with pytest.raises(UnsupportedOpError, match=r"the_gru.*activation 'Swish'"):
        ponnx.load(model, pd.Scope())
    model, _ = _model("LSTM", {}, False, False, False)
    model.graph.node[0].attribute[0].i = HID + 1   # hidden_size no longer fits R
    with pytest.raises(UnsupportedOpError, match=r"the_lstm.*W has shape"):
        ponnx.load(model, pd.Scope())
