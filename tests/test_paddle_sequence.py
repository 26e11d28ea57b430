"""Paddle's sequence models and control flow (progdesc.paddle.rules_sequence, rules_control).

- The `rnn` row against a JAX reference of Paddle's rnn op written here from Paddle's
  documented equations (weights in Paddle's order, gates i, f, c, o and r, z, c, the
  reverse direction, sequence-length masking), forward and gradients (jax.grad of the
  reference against our gradient makers).
- The fixtures Paddle saved (an LSTM and a GRU classifier, a dygraph-to-static model
  with a data-dependent `if` and a `for` loop) against Paddle's executor outputs, at
  both batch sizes, and the imported LSTM fine-tuned with Adam.
"""
import importlib.util
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import progdesc as pd
import progdesc.paddle
from lowering.errors import UnsupportedOpError
from progdesc.paddle.graph import Block, Op, PaddleProgram, Var
from progdesc.paddle.rules import RULES
from progdesc.paddle.translate import translate
from progdesc.translate import Translator

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "paddle")
HAS_PIR = importlib.util.find_spec("progdesc.paddle.pir") is not None
FORMATS = ["legacy", pytest.param("pir", marks=pytest.mark.skipif(
    not HAS_PIR, reason="the PIR reader (progdesc.paddle.pir) is not merged here"))]



@pytest.fixture(autouse=True)
def _x64():
    """The reference runs in float64: 64-bit JAX for each test here, and JAX's own setting
    again for the other test files (a module-level switch reached every test of the run)."""
    with jax.enable_x64(True):
        yield


GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}


# --- a reference of Paddle's rnn op, in JAX ---

def _cell(mode, w_ih, w_hh, b_ih, b_hh):
    def step(state, x):
        if mode == "LSTM":
            h, c = state
            g = x @ w_ih.T + b_ih + h @ w_hh.T + b_hh
            i, f, cand, o = jnp.split(g, 4, axis=-1)
            c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(cand)
            h = jax.nn.sigmoid(o) * jnp.tanh(c)
            return (h, c), h
        h, = state
        if mode == "GRU":
            xr, xz, xc = jnp.split(x @ w_ih.T + b_ih, 3, axis=-1)
            hr, hz, hc = jnp.split(h @ w_hh.T + b_hh, 3, axis=-1)
            r, z = jax.nn.sigmoid(xr + hr), jax.nn.sigmoid(xz + hz)
            cand = jnp.tanh(xc + r * hc)
            h = z * h + (1 - z) * cand
        else:
            pre = x @ w_ih.T + b_ih + h @ w_hh.T + b_hh
            h = jnp.tanh(pre) if mode == "RNN_TANH" else jax.nn.relu(pre)
        return (h,), h
    return step


def paddle_rnn(mode, x, states, weights, lengths, num_layers, bidirec):
    """Paddle's rnn op: x [T, B, I] time major, states [h0] or [h0, c0] each
    [layers * directions, B, H], weights in WeightList order; returns (out, states)."""
    dirs = 2 if bidirec else 1
    cells = num_layers * dirs
    steps = x.shape[0]
    finals = [[] for _ in states]
    for layer in range(num_layers):
        outs = []
        for d in range(dirs):
            k = layer * dirs + d
            step = _cell(mode, weights[2 * k], weights[2 * k + 1],
                         weights[2 * cells + 2 * k], weights[2 * cells + 2 * k + 1])
            live = (jnp.ones((steps, x.shape[1]), bool) if lengths is None else
                    jnp.arange(steps)[:, None] < jnp.asarray(lengths)[None, :])

            def masked(state, inputs, step=step):   # past a sequence's end: kept, zeros out
                x_t, live_t = inputs
                new, y = step(state, x_t)
                new = tuple(jnp.where(live_t[:, None], n, s) for n, s in zip(new, state))
                return new, jnp.where(live_t[:, None], y, 0.0)

            state, ys = jax.lax.scan(masked, tuple(s[k] for s in states), (x, live),
                                     reverse=d == 1)
            outs.append(ys)
            for acc, s in zip(finals, state):
                acc.append(s)
        x = jnp.concatenate(outs, axis=-1)
    return x, [jnp.stack(f) for f in finals]


def _weights(rng, mode, input_size, hidden, num_layers, bidirec):
    dirs = 2 if bidirec else 1
    g = GATES[mode] * hidden
    ws, bs = [], []
    for layer in range(num_layers):
        fed = input_size if layer == 0 else dirs * hidden
        for _ in range(dirs):
            ws += [rng.uniform(-0.5, 0.5, (g, fed)), rng.uniform(-0.5, 0.5, (g, hidden))]
            bs += [rng.uniform(-0.5, 0.5, (g,)), rng.uniform(-0.5, 0.5, (g,))]
    return [w.astype("float32") for w in ws + bs]


# --- the rnn row, applied by hand (no file) ---

def _rnn_program(mode, weights, *, steps, input_size, hidden, num_layers, bidirec, lengths):
    """(main, startup, translator, out, states, loss) of the rnn row on fed x, h0 (c0),
    with the weights as parameters of the program; loss = sum(out**2) + sum(states)."""
    dirs = 2 if bidirec else 1
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [steps, -1, input_size], "float32", stop_gradient=False)
        states = [pd.data(n, [num_layers * dirs, -1, hidden], "float32", stop_gradient=False)
                  for n in (["h0", "c0"] if mode == "LSTM" else ["h0"])]
        seq = pd.data("lengths", [-1], "int32") if lengths else None
        params = [main.global_block().create_parameter(f"w{k}", list(w.shape))
                  for k, w in enumerate(weights)]
        t = Translator(main, RULES)
        entry = RULES.lookup("rnn")
        out, _, finals, _ = entry.fn(
            t, x.name, [s.name for s in states], [p.name for p in params],
            seq.name if seq is not None else None, mode=mode, num_layers=num_layers,
            is_bidirec=bidirec, hidden_size=hidden, input_size=input_size)
        block = main.global_block()
        out, finals = block.var(out), [block.var(f) for f in finals]
        loss = pd.ops.reduce_sum(pd.ops.square(out))
        for f in finals:
            loss = pd.ops.add(loss, pd.ops.reduce_sum(f))
    return main, startup, params, x, states, out, finals, loss


CASES = [("LSTM", 1, False, False), ("LSTM", 2, True, True), ("GRU", 1, True, True),
         ("GRU", 2, False, False), ("RNN_TANH", 1, True, True), ("RNN_RELU", 2, False, True)]


@pytest.mark.parametrize("mode,num_layers,bidirec,lengths", CASES)
def test_rnn_row_matches_paddle_equations(mode, num_layers, bidirec, lengths):
    rng = np.random.default_rng(len(mode) + num_layers)
    steps, batch, input_size, hidden = 5, 3, 4, 6
    weights = _weights(rng, mode, input_size, hidden, num_layers, bidirec)
    main, startup, params, x, states, out, finals, loss = _rnn_program(
        mode, weights, steps=steps, input_size=input_size, hidden=hidden,
        num_layers=num_layers, bidirec=bidirec, lengths=lengths)
    dirs = 2 if bidirec else 1
    feed = {"x": rng.normal(size=(steps, batch, input_size)).astype("float32")}
    for s in states:
        feed[s.name] = rng.normal(size=(num_layers * dirs, batch, hidden)).astype("float32")
    lens = np.array([5, 2, 4], "int32") if lengths else None
    if lengths:
        feed["lengths"] = lens
    scope = pd.Scope()
    for p, w in zip(params, weights):
        scope.set(p.name, w)
    got = pd.Executor().run(main, feed=feed, fetch_list=[out, *finals], scope=scope)
    want_out, want_states = paddle_rnn(mode, feed["x"], [feed[s.name] for s in states],
                                       weights, lens, num_layers, bidirec)
    np.testing.assert_allclose(got[0], want_out, rtol=1e-5, atol=1e-5)
    for g, w in zip(got[1:], want_states):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    if lengths:   # past a sequence's end: zeros out
        assert not np.any(got[0][2:, 1])


@pytest.mark.parametrize("mode,num_layers", [
    ("GRU", 1), pytest.param("LSTM", 2, marks=pytest.mark.slow)])
def test_rnn_row_gradients_match_jax_grad_of_the_reference(mode, num_layers):
    """Gradients of the translated rnn (our gradient makers, through the scans) against
    jax.grad of the reference above, with respect to every weight, x and the states
    (both directions, sequence lengths)."""
    rng = np.random.default_rng(7)
    steps, batch, input_size, hidden = 4, 3, 3, 5
    weights = _weights(rng, mode, input_size, hidden, num_layers, True)
    main, startup, params, x, states, out, finals, loss = _rnn_program(
        mode, weights, steps=steps, input_size=input_size, hidden=hidden,
        num_layers=num_layers, bidirec=True, lengths=True)
    wrt = [*params, x, *states]
    with pd.program_guard(main, startup):
        grads = pd.gradients([loss], wrt)
    feed = {"x": rng.normal(size=(steps, batch, input_size)).astype("float32"),
            "lengths": np.array([4, 1, 3], "int32")}
    for s in states:
        feed[s.name] = rng.normal(size=(num_layers * 2, batch, hidden)).astype("float32")
    scope = pd.Scope()
    for p, w in zip(params, weights):
        scope.set(p.name, w)
    got = pd.Executor().run(main, feed=feed, fetch_list=grads, scope=scope)

    def reference_loss(ws, xv, *sv):
        out, fin = paddle_rnn(mode, xv, list(sv), ws, feed["lengths"], num_layers, True)
        return jnp.sum(out ** 2) + sum(jnp.sum(f) for f in fin)

    args = ([np.float64(w) for w in weights], np.float64(feed["x"]),
            *[np.float64(feed[s.name]) for s in states])
    argnums = tuple(range(2 + len(states)))
    g_w, g_x, *g_s = jax.jit(jax.grad(reference_loss, argnums=argnums))(*args)
    for g, w in zip(got, [*g_w, g_x, *g_s]):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


# --- the fixtures Paddle saved ---

def _load(model, fmt, **kwargs):
    scope = pd.Scope()
    exe = pd.Executor()
    program, feeds, fetches = progdesc.paddle.load_inference_model(
        os.path.join(FIXTURES, model, fmt, "model"), exe, scope, **kwargs)
    return exe, scope, program, feeds, fetches


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("model", ["lstm", "gru", "dy2static"])
def test_fixture_reproduces_paddles_executor(model, fmt):
    """Both batch sizes; dy2static takes the relu branch and 3 loop steps at batch 2, the
    tanh branch and 2 steps at batch 5."""
    reference = np.load(os.path.join(FIXTURES, model, "reference.npz"), allow_pickle=False)
    exe, scope, program, feeds, fetches = _load(model, fmt)
    for batch in (2, 5):
        got, = exe.run(program, feed={feeds[0]: reference[f"input_b{batch}"]},
                       fetch_list=fetches, scope=scope)
        np.testing.assert_allclose(got, reference[f"{fmt}_output_b{batch}"], rtol=0, atol=1e-5)


@pytest.mark.parametrize("fmt,conds", [
    ("legacy", 2), pytest.param("pir", 1, marks=FORMATS[1].marks)])
def test_dy2static_loop_and_branches_are_our_control_flow(fmt, conds):
    """The if becomes our cond (legacy: one per conditional_block, the branch that did
    not run giving zeros that select_input never picks), the for loop our while."""
    _, _, program, _, _ = _load("dy2static", fmt)
    types = [op.type for op in program.global_block().ops]
    assert types.count("cond") == conds and types.count("while") == 1


# --- control flow on hand-made programs ---

def _var(name, shape, dtype="float32"):
    return Var(name, tuple(shape), dtype)


def _paddle_program(blocks):
    return PaddleProgram([Block(i, parent, {v.name: v for v in vs}, ops)
                          for i, (parent, vs, ops) in enumerate(blocks)], "pdmodel")


def _feed_fetch(x, y):
    return (Op("feed", {"X": ["feed"]}, {"Out": [x]}, {"col": 0}),
            Op("fetch", {"X": [y]}, {"Out": ["fetch"]}, {"col": 0}))


def _run(paddle, feed):
    program, feeds, fetches, state = translate(paddle, {})
    scope = pd.Scope()
    for name, value in state.items():
        scope.set(name, value)
    return pd.Executor().run(program, feed=feed, fetch_list=fetches, scope=scope)[0]


def test_while_counts_and_drops_loop_local_placeholders():
    """x doubled while i < 4, i counted up; `tmp` is written before being read in the body
    and read nowhere else, with another type outside the loop: not carried."""
    feed, fetch = _feed_fetch("x", "x")
    outer = [_var("x", [-1, 3]), _var("i", [1], "int64"), _var("n", [1], "int64"),
             _var("c", [1], "bool"), _var("tmp", [1], "float32")]
    ops0 = [feed,
            Op("fill_constant", {}, {"Out": ["i"]}, {"shape": [1], "dtype": 3, "value": 0.0}),
            Op("fill_constant", {}, {"Out": ["n"]}, {"shape": [1], "dtype": 3, "value": 4.0}),
            Op("fill_constant", {}, {"Out": ["tmp"]}, {"shape": [1], "dtype": 5, "value": 9.0}),
            Op("less_than", {"X": ["i"], "Y": ["n"]}, {"Out": ["c"]}, {}),
            Op("while", {"X": ["x", "i", "n", "tmp"], "Condition": ["c"]},
               {"Out": ["x", "i", "c", "tmp"], "StepScopes": ["s"]}, {"sub_block": 1}),
            fetch]
    body = [_var("y", [-1, 3]), _var("j", [1], "int64")]
    ops1 = [Op("cast", {"X": ["i"]}, {"Out": ["tmp"]}, {"in_dtype": 3, "out_dtype": 3}),
            Op("scale", {"X": ["x"]}, {"Out": ["y"]}, {"scale": 2.0}),
            Op("increment", {"X": ["tmp"]}, {"Out": ["j"]}, {"step": 1.0}),
            Op("less_than", {"X": ["j"], "Y": ["n"]}, {"Out": ["c"]}, {}),
            Op("assign", {"X": ["y"]}, {"Out": ["x"]}, {}),
            Op("assign", {"X": ["j"]}, {"Out": ["i"]}, {})]
    x = np.arange(6, dtype="float32").reshape(2, 3)
    got = _run(_paddle_program([(-1, outer, ops0), (0, body, ops1)]), {"x": x})
    np.testing.assert_array_equal(got, x * 16)


def test_conditional_block_keeps_values_it_reads_where_not_run():
    """`if c: x = x + 1` without an else: where c is false, x keeps its value."""
    feed, fetch = _feed_fetch("x", "x")
    outer = [_var("x", [2]), _var("m", []), _var("zero", []), _var("c", [], "bool")]
    ops0 = [feed,
            Op("reduce_mean", {"X": ["x"]}, {"Out": ["m"]}, {"reduce_all": True}),
            Op("fill_constant", {}, {"Out": ["zero"]}, {"shape": [], "dtype": 5, "value": 0.0}),
            Op("greater_than", {"X": ["m"], "Y": ["zero"]}, {"Out": ["c"]}, {}),
            Op("conditional_block", {"Cond": ["c"], "Input": ["x"]},
               {"Out": ["x"], "Scope": ["s"]}, {"sub_block": 1, "is_scalar_condition": True}),
            fetch]
    ops1 = [Op("scale", {"X": ["x"]}, {"Out": ["x"]}, {"scale": 1.0, "bias": 1.0})]
    paddle = _paddle_program([(-1, outer, ops0), (0, [], ops1)])
    np.testing.assert_array_equal(_run(paddle, {"x": np.float32([1, 2])}), [2, 3])
    paddle = _paddle_program([(-1, outer, ops0), (0, [], ops1)])
    np.testing.assert_array_equal(_run(paddle, {"x": np.float32([-1, -2])}), [-1, -2])


def test_unsupported_control_flow_is_reported_with_its_place():
    feed, fetch = _feed_fetch("x", "x")
    outer = [_var("x", [2]), _var("c", [1], "bool")]
    ops0 = [feed,
            Op("cast", {"X": ["x"]}, {"Out": ["c"]}, {"in_dtype": 5, "out_dtype": 0}),
            Op("conditional_block", {"Cond": ["c"], "Input": ["x"]},
               {"Out": ["x"], "Scope": ["s"]},
               {"sub_block": 1, "is_scalar_condition": False}, block=0, index=2),
            fetch]
    ops1 = [Op("scale", {"X": ["x"]}, {"Out": ["x"]}, {"scale": 2.0})]
    with pytest.raises(UnsupportedOpError, match=r"conditional_block.*#2 in block 0.*"
                                                 r"is_scalar_condition"):
        translate(_paddle_program([(-1, outer, ops0), (0, [], ops1)]), {})


def _lstm_classifier_reference(values, weight_names, ids):
    """The fixture's LSTM classifier by hand: embedding, the reference rnn over time (zero
    initial states), the last step's output through the linear layer."""
    x = jnp.swapaxes(values["embedding_0.w_0"][ids], 0, 1)
    zeros = jnp.zeros((2, ids.shape[0], 32), x.dtype)
    out, _ = paddle_rnn("LSTM", x, [zeros, zeros], [values[n] for n in weight_names], None, 2,
                        False)
    return out[-1] @ values["linear_0.w_0"] + values["linear_0.b_0"]


@pytest.mark.slow   # about 10 s: XLA compiles the float64 reference's gradient
def test_imported_lstm_gradients_match_jax_grad_of_a_hand_written_lstm():
    """d sum(logits**2) / d every parameter of the imported classifier (our gradient makers
    through its scans) against jax.grad of the same classifier written by hand in JAX
    (float64), with the weights of the fixture's parameter file."""
    paddle = progdesc.paddle.read_program(
        os.path.join(FIXTURES, "lstm", "legacy", "model.pdmodel"))
    rnn_op, = [op for op in paddle.blocks[0].ops if op.type == "rnn"]
    weight_names = rnn_op.inputs["WeightList"]
    exe, scope, program, feeds, fetches = _load("lstm", "legacy")
    params = program.all_parameters()
    names = [p.name for p in params]
    assert set(weight_names) < set(names) and "embedding_0.w_0" in names
    with pd.program_guard(program):
        loss = pd.ops.reduce_sum(pd.ops.square(fetches[0]))
        grads = pd.gradients([loss], params)
    ids = np.load(os.path.join(FIXTURES, "lstm", "reference.npz"))["input_b2"]
    got = exe.run(program, feed={feeds[0]: ids}, fetch_list=grads, scope=scope)
    values = {n: np.float64(np.asarray(scope.get(n))) for n in names}

    def reference_loss(values):
        return jnp.sum(_lstm_classifier_reference(values, weight_names, ids) ** 2)

    want = jax.jit(jax.grad(reference_loss))(values)
    for name, g in zip(names, got):
        np.testing.assert_allclose(g, want[name], rtol=2e-4, atol=2e-6, err_msg=name)


def test_imported_lstm_fine_tunes_with_adam():
    """20 Adam steps on the imported LSTM classifier (gradients from our makers) bring its
    cross-entropy on a small labelled batch well down."""
    exe, scope, program, feeds, fetches = _load("lstm", "legacy", for_training=True)
    startup = pd.Program()
    with pd.program_guard(program, startup):
        label = pd.data("label", [-1, 1], "int64")
        loss = pd.ops.mean(pd.layers.softmax_with_cross_entropy(fetches[0], label))
        pd.optimizer.Adam(learning_rate=0.02).minimize(loss)
    exe.run(startup, scope=scope)
    ids = np.load(os.path.join(FIXTURES, "lstm", "reference.npz"))["input_b5"]
    labels = np.array([[0], [1], [2], [3], [4]], "int64")
    losses = [float(exe.run(program, feed={feeds[0]: ids, "label": labels}, fetch_list=[loss],
                            scope=scope)[0]) for _ in range(20)]
    assert losses[-1] < 0.5 * losses[0], losses


def test_select_output_routes_and_select_input_picks():
    """select_output sends x to the output its mask names; select_input takes it back."""
    feed, fetch = _feed_fetch("x", "y")
    outer = [_var("x", [-1, 2]), _var("m", [1], "int32"), _var("a", [-1, 2]),
             _var("b", [-1, 2]), _var("b2", [-1, 2]), _var("y", [-1, 2])]
    ops0 = [feed,
            Op("fill_constant", {}, {"Out": ["m"]}, {"shape": [1], "dtype": 2, "value": 1.0}),
            Op("select_output", {"X": ["x"], "Mask": ["m"]}, {"Out": ["a", "b"]}, {}),
            Op("scale", {"X": ["b"]}, {"Out": ["b2"]}, {"scale": 3.0}),
            Op("select_input", {"X": ["a", "b2"], "Mask": ["m"]}, {"Out": ["y"]}, {}),
            fetch]
    x = np.float32([[1, 2], [3, 4]])
    np.testing.assert_array_equal(_run(_paddle_program([(-1, outer, ops0)]), {"x": x}), 3 * x)


def test_fill_constant_batch_size_like_takes_the_run_time_dim():
    feed, fetch = _feed_fetch("x", "z")
    outer = [_var("x", [-1, 4]), _var("z", [2, -1, 3])]
    ops0 = [feed,
            Op("fill_constant_batch_size_like", {"Input": ["x"]}, {"Out": ["z"]},
               {"shape": [2, -1, 3], "value": 1.5, "dtype": 5, "input_dim_idx": 0,
                "output_dim_idx": 1}),
            fetch]
    got = _run(_paddle_program([(-1, outer, ops0)]), {"x": np.zeros((5, 4), "float32")})
    np.testing.assert_array_equal(got, np.full((2, 5, 3), 1.5, "float32"))


def test_rnn_with_weights_that_do_not_fit_is_reported():
    feed, fetch = _feed_fetch("x", "out")
    outer = [_var("x", [5, 2, 4]), _var("h", [1, 2, 6]), _var("c", [1, 2, 6]),
             _var("w", [24, 4], "float32"), _var("out", [5, 2, 6])]
    outer[3].persistable = True
    ops0 = [feed] + [
        Op("fill_constant", {}, {"Out": [n]}, {"shape": [1, 2, 6], "dtype": 5, "value": 0.0})
        for n in ("h", "c")] + [
            Op("rnn", {"Input": ["x"], "PreState": ["h", "c"], "WeightList": ["w"] * 3},
               {"Out": ["out"]}, {"mode": "LSTM", "hidden_size": 6, "input_size": 4},
               block=0, index=3),
            fetch]
    paddle = _paddle_program([(-1, outer, ops0)])
    with pytest.raises(UnsupportedOpError, match=r"'rnn' at #3 in block 0.*WeightList holds 3"):
        translate(paddle, {"w": np.zeros((24, 4), "float32")})


@pytest.mark.parametrize("op_type", ["while", "conditional_block"])
def test_a_block_that_runs_itself_is_refused_not_recursed(op_type):
    """A crafted program whose sub-block holds the op that runs that same sub-block."""
    feed, fetch = _feed_fetch("x", "x")
    outer = [_var("x", [2]), _var("c", [], "bool"), _var("m", []), _var("z", [])]
    if op_type == "while":
        slots = ({"X": ["x"], "Condition": ["c"]}, {"Out": ["x", "c"]}, {"sub_block": 1})
    else:
        slots = ({"Cond": ["c"], "Input": ["x"]}, {"Out": ["x"]},
                 {"sub_block": 1, "is_scalar_condition": True})
    ops0 = [feed,
            Op("reduce_mean", {"X": ["x"]}, {"Out": ["m"]}, {"reduce_all": True}),
            Op("fill_constant", {}, {"Out": ["z"]}, {"shape": [], "dtype": 5, "value": 0.0}),
            Op("greater_than", {"X": ["m"], "Y": ["z"]}, {"Out": ["c"]}, {}),
            Op(op_type, *slots), fetch]
    ops1 = [Op(op_type, *slots, block=1)]
    with pytest.raises(UnsupportedOpError, match=f"'{op_type}' at #0 in block 1.*runs itself"):
        translate(_paddle_program([(-1, outer, ops0), (0, [], ops1)]), {})


def test_a_while_that_never_updates_its_condition_is_refused():
    feed, fetch = _feed_fetch("x", "x")
    outer = [_var("x", [2]), _var("c", [], "bool"), _var("m", []), _var("z", [])]
    ops0 = [feed,
            Op("reduce_mean", {"X": ["x"]}, {"Out": ["m"]}, {"reduce_all": True}),
            Op("fill_constant", {}, {"Out": ["z"]}, {"shape": [], "dtype": 5, "value": 0.0}),
            Op("greater_than", {"X": ["m"], "Y": ["z"]}, {"Out": ["c"]}, {}),
            Op("while", {"X": ["x"], "Condition": ["c"]}, {"Out": ["x"]}, {"sub_block": 1},
               index=4),
            fetch]
    ops1 = [Op("scale", {"X": ["x"]}, {"Out": ["x"]}, {"scale": 2.0})]
    with pytest.raises(UnsupportedOpError, match=r"'while' at #4 in block 0.*never writes"):
        translate(_paddle_program([(-1, outer, ops0), (0, [], ops1)]), {})


def test_rnn_dropout_runs_in_training_imports_and_clone_for_test_removes_it():
    """A two-layer GRU with dropout_prob=0.5 imported for training drops the second layer's
    input; clone(for_test=True) gives the reference without dropout."""
    rng = np.random.default_rng(3)
    steps, batch, size, hidden = 4, 2, 3, 5
    weights = _weights(rng, "GRU", size, hidden, 2, False)
    names = [f"w{k}" for k in range(len(weights))]
    feed, fetch = _feed_fetch("x", "out")
    outer = [_var("x", [steps, batch, size]), _var("h", [2, batch, hidden]),
             _var("out", [steps, batch, hidden])]
    for name, w in zip(names, weights):
        outer.append(Var(name, w.shape, "float32", persistable=True))
    ops0 = [feed,
            Op("fill_constant", {}, {"Out": ["h"]},
               {"shape": [2, batch, hidden], "dtype": 5, "value": 0.0}),
            Op("rnn", {"Input": ["x"], "PreState": ["h"], "WeightList": names},
               {"Out": ["out"]}, {"mode": "GRU", "num_layers": 2, "hidden_size": hidden,
                                  "input_size": size, "dropout_prob": 0.5}),
            fetch]
    program, _, fetches, state = translate(_paddle_program([(-1, outer, ops0)]),
                                           dict(zip(names, weights)), for_training=True)
    scope = pd.Scope()
    for name, value in state.items():
        scope.set(name, value)
    x = rng.normal(size=(steps, batch, size)).astype("float32")
    want, _ = paddle_rnn("GRU", x, [np.zeros((2, batch, hidden), "float32")], weights, None,
                         2, False)
    exe = pd.Executor()
    trained = exe.run(program, feed={"x": x}, fetch_list=fetches, scope=scope)[0]
    assert np.abs(trained - want).max() > 1e-3
    evaluated = exe.run(program.clone(for_test=True), feed={"x": x}, fetch_list=fetches,
                        scope=scope)[0]
    np.testing.assert_allclose(evaluated, want, rtol=1e-5, atol=1e-5)


@pytest.mark.slow   # two XLA exports with a symbolic batch
@pytest.mark.parametrize("model", ["lstm", "dy2static"])
def test_imported_scans_and_control_flow_export_with_a_symbolic_batch(model, tmp_path):
    """The imported program exports to one compiled file that runs in plain JAX at both
    batch sizes of the fixture and gives Paddle's outputs."""
    from progdesc.export import export_compiled, load_compiled
    exe, scope, program, feeds, fetches = _load(model, "legacy")
    path = str(tmp_path / f"{model}.pdx")
    export_compiled(path, program, feeds, fetches, scope)
    run = load_compiled(path)
    reference = np.load(os.path.join(FIXTURES, model, "reference.npz"), allow_pickle=False)
    for batch in (2, 5):
        out = run(reference[f"input_b{batch}"])
        out = out[0] if isinstance(out, (list, tuple)) else out
        np.testing.assert_allclose(np.asarray(out), reference[f"legacy_output_b{batch}"],
                                   rtol=0, atol=1e-5)
