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
import numpy as np

from lowering.errors import ProgramError
from progdesc import control_flow
from progdesc.paddle.rules import RULES
from progdesc.translate import FAILED, Unsupported

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


# --- dygraph-to-static control flow (legacy programs) ---
#
# A legacy Paddle program is imperative: a block's ops overwrite variables of the
# enclosing blocks by name. Our control flow is functional, so a loop carries the
# variables its body overwrites and reads before writing them, and a branch returns the
# variables it writes.

def _nested_blocks(paddle, op):
    """The Paddle blocks an op holds: its `sub_block` (legacy) or its regions (PIR)."""
    blocks = list(op.regions)
    idx = op.attrs.get("sub_block")
    if isinstance(idx, int) and not isinstance(idx, bool) and 0 <= idx < len(paddle.blocks):
        blocks.append(paddle.blocks[idx])
    return blocks


def _reads(paddle, op):
    """The names `op` reads, its nested blocks' reads included. A conditional_block also
    reads what it writes: where its condition is false they keep their values."""
    names = {n for ns in op.inputs.values() for n in ns}
    if op.type == "conditional_block":
        names |= {n for ns in op.outputs.values() for n in ns}
    for block in _nested_blocks(paddle, op):
        for inner in block.ops:
            names |= _reads(paddle, inner)
    return names


def _definite_writes(op):
    """The names `op` surely writes (a conditional_block only may)."""
    if op.type == "conditional_block":
        return set()
    return {n for ns in op.outputs.values() for n in ns}


def _read_first(paddle, block):
    """The names the ops of `block` read before writing them."""
    written, first = set(), set()
    for op in block.ops:
        first |= _reads(paddle, op) - written
        written |= _definite_writes(op)
    return first


def _subtree(paddle, block):
    """The indices of `block` and of every block nested in its ops."""
    found = {block.idx}
    for op in block.ops:
        for inner in _nested_blocks(paddle, op):
            found |= _subtree(paddle, inner)
    return found


def _read_elsewhere(paddle, body, names):
    """Which of `names` an op outside the loop body `body` reads (the loop op itself,
    which lists them as its inputs, aside)."""
    inside = _subtree(paddle, body)
    found = set()
    for block in paddle.blocks:
        if block.idx in inside:
            continue
        for op in block.ops:
            if any(b is body for b in _nested_blocks(paddle, op)):
                continue
            found |= {n for ns in op.inputs.values() for n in ns} & names
    return found


def _scalar(t, name):
    """A bool/int [] or [1] variable as a scalar []."""
    dims = t.var(name)[0]
    return name if len(dims) == 0 else t.call("reshape", name, shape=[])


def _paddle_names(types, what):
    names = []
    for var in types:
        if var is None:
            raise Unsupported(f"{what} holds a variable no block declares")
        names.append(var.name)
    return names


@RULES.rule("while", inputs=("X*", "Condition"), outputs=("Out*", "StepScopes"))
def while_(t, xs, condition, *, sub_block, in_types, out_types):
    """Paddle's while: run the sub-block while Condition (which the sub-block recomputes)
    holds. Carried: the condition and the Out variables the body reads before writing
    them or that are read after the loop; the others (dygraph-to-static's placeholders of
    loop-local variables) are not."""
    body = t.subgraph(sub_block)
    paddle = t.paddle
    cond_name = in_types[1].name
    outs = _paddle_names(out_types[0], "Out")
    initial = dict(zip(_paddle_names(in_types[0], "X"), xs))
    initial[cond_name] = condition
    first = _read_first(paddle, body.block)
    after = _read_elsewhere(paddle, body.block, set(outs))
    carried = [cond_name] + [n for n in dict.fromkeys(outs)
                             if n != cond_name and (n in first or n in after)]
    missing = [n for n in carried if n not in initial]
    if missing:
        raise Unsupported(f"loop variable(s) {missing} have no value before the loop")
    body = t.subgraph(sub_block, carried, carried)

    def step(*carry):
        results = list(t.sub_block(body, [v.name for v in carry]))
        results[0] = t.block.var(_scalar(t, results[0].name))
        return results

    init = [t.block.var(_scalar(t, condition))] + [t.block.var(initial[n]) for n in carried[1:]]
    try:
        final = control_flow.while_loop(lambda *carry: carry[0], step, init)
    except ProgramError as e:
        raise Unsupported(f"its body does not keep its loop variables' types: {e}") from None
    t.tag_last_op()
    values = dict(zip(carried, (v.name for v in final)))
    return [values.get(n, FAILED) for n in outs], None


@RULES.rule("conditional_block", inputs=("Cond*", "Input*"), outputs=("Out*", "Scope"))
def conditional_block(t, cond, inputs, *, sub_block, is_scalar_condition=False, in_types,
                      out_types):
    """Paddle's conditional_block: run the sub-block if the bool scalar Cond holds. As our
    `cond`: the branch returns the Out variables; where the condition is false they keep
    the values they had if the block reads them, else they are zeros (dygraph-to-static
    then picks the branch that ran with select_input)."""
    if not is_scalar_condition:
        raise Unsupported("is_scalar_condition=False (a condition on tensors' emptiness)")
    if len(cond) != 1:
        raise Unsupported(f"{len(cond)} conditions")
    outs = _paddle_names(out_types[0], "Out")
    prior = dict(zip(_paddle_names(in_types[1], "Input"), inputs))
    branch = t.subgraph(sub_block, (), outs)
    if not outs:
        return [], None

    def untaken():
        ran = None
        values = []
        for k, name in enumerate(outs):
            if name in prior:
                values.append(t.block.var(t.call("assign", prior[name])))
            else:   # zeros of the branch's result: XLA computes none of the branch
                ran = ran or t.sub_block(branch, [])
                values.append(t.block.var(t.call("fill_zeros_like", ran[k].name)))
        return tuple(values)

    pred = t.block.var(_scalar(t, cond[0]))
    try:
        result = control_flow.cond(pred, lambda: t.sub_block(branch, []), untaken)
    except ProgramError as e:
        raise Unsupported(f"its outputs change type: {e}") from None
    t.tag_last_op()
    result = result if isinstance(result, tuple) else (result,)
    return [v.name for v in result], None


@RULES.rule("select_input", inputs=("X*", "Mask"))
def select_input(t, xs, mask):
    """X[Mask]: the value of the branch that ran."""
    which = _scalar(t, mask)
    dtype = t.var(which)[1]
    out = xs[0]
    for k, x in enumerate(xs[1:], 1):
        picked = t.call("equal", which, t.constant(np.array(k, dtype)))
        out = t.call("where", picked, x, out)
    return out


@RULES.rule("select_output", inputs=("X", "Mask"), outputs=("Out*",))
def select_output(t, x, mask, *, out_types):
    """X routed to Out[Mask]: every output holds X, since only the branch Mask picks
    reads its own."""
    return [t.call("assign", x) for _ in out_types[0]]


# --- dygraph-to-static's `for _ in range(n)` with a tensor n ---
#
# dygraph-to-static turns the loop into `r = range(0, n, 1)`, a while over
# `i < shape(r)[0]` whose body reads `r[i]`: an array of run-time length, which XLA cannot
# hold. `prepare` rewrites, before the walk, a range that only such a loop reads into its
# length and its i-th element, computed from start, end and step (two ops of ours below).

RANGE_LENGTH = "dy2static.range_length"
RANGE_ELEMENT = "dy2static.range_element"
_SHAPE_OPS = ("shape", "shape64")


def _single(op, slot):
    names = op.inputs.get(slot, [])
    return names[0] if len(names) == 1 else None


def _element_index(op):
    """The index variable of `slice(r, [i], [i + 1], decrease)` along axis 0, or None."""
    if list(op.attrs.get("axes", ())) != [0] or list(op.attrs.get("decrease_axis", ())) != [0]:
        return None
    for slot in ("StartsTensor", "StartsTensorList"):
        names = op.inputs.get(slot, [])
        if len(names) == 1:
            return names[0]
    return None


def _length_slice(op):
    """Whether `op` is `slice(shape, [0], [1])`: the first (only) entry of a shape."""
    return (op.type == "slice" and list(op.attrs.get("axes", ())) == [0]
            and list(op.attrs.get("starts", ())) == [0] and list(op.attrs.get("ends", ())) == [1]
            and not any(op.inputs.get(s) for s in ("StartsTensor", "EndsTensor",
                                                   "StartsTensorList", "EndsTensorList")))


def prepare(paddle):
    """Rewrite, in place, each `range` of the PaddleProgram that only dygraph-to-static
    loops read (its length through `shape`, its elements through a decreasing slice at a
    loop index) into `dy2static.range_length` / `dy2static.range_element` ops, so no array
    of run-time length is made, and each `fill_constant` whose shape tensors hold one dim
    of a variable (nn.LSTM's zero state [layers, batch, hidden]) into Paddle's
    `fill_constant_batch_size_like`. Returns the program."""
    _batch_sized_fills(paddle)
    users = {}
    for block in paddle.blocks:
        for op in block.ops:
            for names in op.inputs.values():
                for name in names:
                    users.setdefault(name, []).append(op)
    for block in paddle.blocks:
        for op in list(block.ops):
            if op.type not in ("range", "arange") or len(op.outputs.get("Out", [])) != 1:
                continue
            ends = {s: _single(op, s) for s in ("Start", "End", "Step")}
            if None in ends.values():
                continue
            out = op.outputs["Out"][0]
            readers = users.get(out, [])
            shapes = [u for u in readers if u.type in _SHAPE_OPS]
            elements = [u for u in readers if u.type == "slice" and _single(u, "Input") == out
                        and _element_index(u) is not None]
            listed = [u for u in readers if u.type in ("while", "conditional_block")
                      and all(n != out for s, ns in u.inputs.items()
                              if s not in ("X", "Input") for n in ns)]
            if not (shapes or elements) or len(shapes) + len(elements) + len(listed) != len(readers):
                continue
            if not all(all(_length_slice(v) for v in users.get(s.outputs["Out"][0], []))
                       for s in shapes if s.outputs.get("Out")):
                continue
            for s in shapes:
                s.type, s.inputs = RANGE_LENGTH, {k: [v] for k, v in ends.items()}
            for e in elements:
                e.type = RANGE_ELEMENT
                e.inputs = {"Start": [ends["Start"]], "Step": [ends["Step"]],
                            "Index": [_element_index(e)]}
                e.attrs = {}
            for u in listed:
                for slot in ("X", "Input"):
                    if slot in u.inputs:
                        u.inputs[slot] = [n for n in u.inputs[slot] if n != out]
            block.ops.remove(op)
    return paddle


def _out_dtype(out_types, default):
    var = out_types[0] if out_types else None
    return var.dtype if var is not None and var.dtype else default


@RULES.rule(RANGE_LENGTH, inputs=("Start", "End", "Step"))
def range_length(t, start, end, step, *, out_types=()):
    """[len(range(start, end, step))], as `shape` of that range gives it."""
    start, end, step = (t.call("cast", v, dtype="float32") for v in (start, end, step))
    steps = t.call("ceil", t.call("div", t.call("sub", end, start), step))
    steps = t.call("maximum", steps, t.constant(np.zeros((), "float32")))
    steps = t.call("reshape", steps, shape=[1])
    return t.call("cast", steps, dtype=_out_dtype(out_types, "int32"))


@RULES.rule(RANGE_ELEMENT, inputs=("Start", "Step", "Index"))
def range_element(t, start, step, index, *, out_types=()):
    """range(start, end, step)[index]: start + index * step."""
    dtype = t.var(start)[1]
    index = t.call("cast", index, dtype=dtype) if t.var(index)[1] != dtype else index
    value = t.call("add", start, t.call("mul", t.call("reshape", index, shape=[1]), step))
    value = t.call("reshape", value, shape=[])
    want = _out_dtype(out_types, dtype)
    return value if want == dtype else t.call("cast", value, dtype=want)



# --- zeros shaped by a run-time dim (nn.RNN's initial states) ---

def _producers(paddle):
    return {n: op for block in paddle.blocks for op in block.ops
            for names in op.outputs.values() for n in names}


def _constant_int(op):
    """The value of a fill_constant of one element with no tensor inputs, or None."""
    if op.type != "fill_constant" or any(op.inputs.values()):
        return None
    if list(op.attrs.get("shape", ())) not in ([], [1]):
        return None
    text = op.attrs.get("str_value", "")
    try:
        return int(float(text)) if text else int(op.attrs.get("value", 0.0))
    except ValueError:
        return None


def _dim_source(producers, name, depth=0):
    """Where the scalar `name` comes from: ('const', n), ('dim', variable, axis) for
    `slice(shape(variable))[axis]`, or None."""
    op = producers.get(name)
    if op is None or depth > 4:
        return None
    if op.type == "cast":
        return _dim_source(producers, _single(op, "X"), depth + 1)
    value = _constant_int(op)
    if value is not None:
        return ("const", value)
    if op.type != "slice" or list(op.attrs.get("axes", ())) != [0]:
        return None
    starts, ends = list(op.attrs.get("starts", ())), list(op.attrs.get("ends", ()))
    if len(starts) != 1 or ends != [starts[0] + 1] or starts[0] < 0 or any(
            op.inputs.get(s) for s in ("StartsTensor", "EndsTensor", "StartsTensorList",
                                       "EndsTensorList")):
        return None
    shape = producers.get(_single(op, "Input"))
    if shape is None or shape.type not in _SHAPE_OPS or _single(shape, "Input") is None:
        return None
    return ("dim", _single(shape, "Input"), starts[0])


def _batch_sized_fills(paddle):
    producers = _producers(paddle)
    for block in paddle.blocks:
        for op in block.ops:
            entries = op.inputs.get("ShapeTensorList", [])
            if op.type != "fill_constant" or not entries or op.inputs.get("ShapeTensor") \
                    or op.inputs.get("ValueTensor"):
                continue
            sources = [_dim_source(producers, n) for n in entries]
            dynamic = [k for k, src in enumerate(sources) if src and src[0] == "dim"]
            if None in sources or len(dynamic) != 1:
                continue
            _, like, axis = sources[dynamic[0]]
            op.type = "fill_constant_batch_size_like"
            op.inputs = {"Input": [like]}
            op.attrs = {**op.attrs, "input_dim_idx": axis, "output_dim_idx": dynamic[0],
                        "shape": [-1 if src[0] == "dim" else src[1] for src in sources]}


@RULES.rule("fill_constant_batch_size_like", inputs=("Input",))
def fill_constant_batch_size_like(t, like, *, shape, value=0.0, str_value="", dtype=5,
                                  input_dim_idx=0, output_dim_idx=0):
    """A tensor of `shape` filled with `value`, whose dim output_dim_idx is Input's dim
    input_dim_idx."""
    from progdesc.paddle.rules import _dtype, _np_dtype, _parse_number
    if str_value:
        value = _parse_number(str_value)
    dims = [int(d) for d in shape]
    if not 0 <= output_dim_idx < len(dims) or not 0 <= input_dim_idx < t.rank(like):
        raise Unsupported(f"input_dim_idx={input_dim_idx}, output_dim_idx={output_dim_idx} "
                          f"for shape {dims} and an input of rank {t.rank(like)}")
    dims[output_dim_idx] = t.var(like)[0][input_dim_idx]
    if any(d < 0 for k, d in enumerate(dims) if k != output_dim_idx):
        raise Unsupported(f"shape {list(shape)} has an unknown dim")
    fill = t.constant(np.asarray(value, _np_dtype(_dtype(dtype))))
    return t.call("broadcast_in_dim", fill, like, shape=dims, broadcast_dimensions=[],
                  like_axis=input_dim_idx)
