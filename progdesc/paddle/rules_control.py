"""Dygraph-to-static control flow in Paddle's translation table: legacy `while`,
`conditional_block` + `select_input` / `select_output`, and PIR's `if` / `while` regions,
as our `while` and `cond` ops (progdesc.control_flow builders), with Paddle's sub-blocks
translated into ours through the translator's `subgraph` and `sub_block`.

A legacy Paddle program is imperative: a block's ops overwrite variables of the
enclosing blocks by name. Our control flow is functional, so a loop carries the
variables its body overwrites and reads before writing them (or that are read after
it), and a branch returns the variables it writes. A `while` without a bound on its
trip count has no gradient (our `while` needs max_iters for one).
"""
import contextlib

import numpy as np

from lowering.errors import ProgramError
from progdesc import control_flow
from progdesc.paddle.rules import RULES
from progdesc.translate import FAILED, Unsupported


# --- legacy programs ---

def _nested_blocks(paddle, op):
    """The Paddle blocks an op holds: its `sub_block` (legacy) or its regions (PIR)."""
    blocks = list(op.regions)
    idx = op.attrs.get("sub_block")
    if isinstance(idx, int) and not isinstance(idx, bool) and 0 <= idx < len(paddle.blocks):
        blocks.append(paddle.blocks[idx])
    return blocks


def _reads(paddle, op, seen=frozenset()):
    """The names `op` reads, its nested blocks' reads included. A conditional_block also
    reads what it writes: where its condition is false they keep their values."""
    names = {n for ns in op.inputs.values() for n in ns}
    if op.type == "conditional_block":
        names |= {n for ns in op.outputs.values() for n in ns}
    for block in _nested_blocks(paddle, op):
        if block.idx not in seen:   # a block nested in itself is refused when walked
            for inner in block.ops:
                names |= _reads(paddle, inner, seen | {block.idx})
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


def _subtree(paddle, block, found=None):
    """The indices of `block` and of every block nested in its ops."""
    found = set() if found is None else found
    found.add(block.idx)
    for op in block.ops:
        for inner in _nested_blocks(paddle, op):
            if inner.idx not in found:
                _subtree(paddle, inner, found)
    return found


@contextlib.contextmanager
def _entered(t, block):
    """Translating the Paddle block `block` as a branch or loop body: refused if it is
    being translated already (a block that holds, or encloses, the op that runs it)."""
    active = getattr(t, "_control_blocks", None)
    if active is None:
        active = t._control_blocks = set()
    if block in active:
        raise Unsupported(f"block {block} runs itself (it holds the op that runs it)")
    active.add(block)
    try:
        yield
    finally:
        active.discard(block)


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
    if cond_name not in outs:
        raise Unsupported(f"its body never writes its condition '{cond_name}' (it would "
                          "not end)")
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
        with _entered(t, sub_block):
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
        with _entered(t, sub_block):
            result = control_flow.cond(pred, lambda: t.sub_block(branch, []), untaken)
    except ProgramError as e:
        raise Unsupported(f"its outputs change type: {e}") from None
    t.tag_last_op()
    result = result if isinstance(result, tuple) else (result,)
    return [v.name for v in result], None


@RULES.rule("increment")
def increment(t, x, *, step=1.0):
    """X + step (a loop counter)."""
    return t.call("increment", x, step=float(step))


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
SHAPE_OPS = ("shape", "shape64")


def single(op, slot):
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


def _range_readers(out, readers, users):
    """(shapes, element slices, loop ops listing it) of the readers of the range `out`
    when they are only those, and the shapes only have their length read; else None."""
    shapes = [u for u in readers if u.type in SHAPE_OPS]
    elements = [u for u in readers if u.type == "slice" and single(u, "Input") == out
                and _element_index(u) is not None]
    listed = [u for u in readers if u.type in ("while", "conditional_block")
              and all(n != out for slot, names in u.inputs.items()
                      if slot not in ("X", "Input") for n in names)]
    if not (shapes or elements) or len(shapes) + len(elements) + len(listed) != len(readers):
        return None
    for s in shapes:
        length = (s.outputs.get("Out") or [None])[0]
        if length is None or not all(_length_slice(v) for v in users.get(length, [])):
            return None
    return shapes, elements, listed


def rewrite_range_loops(paddle):
    """Rewrite, in place, each `range` of the PaddleProgram that only dygraph-to-static
    loops read (its length through `shape`, its elements through a decreasing slice at a
    loop index) into `dy2static.range_length` / `dy2static.range_element` ops, so no array
    of run-time length is made."""
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
            ends = {s: single(op, s) for s in ("Start", "End", "Step")}
            out = op.outputs["Out"][0]
            found = None if None in ends.values() else _range_readers(
                out, users.get(out, []), users)
            if found is None:
                continue
            shapes, elements, listed = found
            for s in shapes:
                s.type, s.inputs = RANGE_LENGTH, {k: [v] for k, v in ends.items()}
            for e in elements:
                e.inputs = {"Start": [ends["Start"]], "Step": [ends["Step"]],
                            "Index": [_element_index(e)]}
                e.type, e.attrs = RANGE_ELEMENT, {}
            for u in listed:
                for slot in ("X", "Input"):
                    if slot in u.inputs:
                        u.inputs[slot] = [n for n in u.inputs[slot] if n != out]
            block.ops.remove(op)


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



# --- PIR's structured control flow (as progdesc.paddle.pir hands it) ---

@RULES.rule("pir.if", inputs=("Cond",), outputs=("Out*",))
def pir_if(t, cond, *, then_block, else_block, then_outputs=(), else_outputs=()):
    """PIR's if: each region yields the op's results (`then_outputs`, `else_outputs`)."""
    if not then_outputs:
        return []
    branches = [t.subgraph(then_block, (), then_outputs),
                t.subgraph(else_block, (), else_outputs)]
    pred = t.block.var(_scalar(t, cond))
    try:
        with _entered(t, then_block), _entered(t, else_block):
            result = control_flow.cond(pred, lambda: t.sub_block(branches[0], []),
                                       lambda: t.sub_block(branches[1], []))
    except ProgramError as e:
        raise Unsupported(f"its branches yield different types: {e}") from None
    t.tag_last_op()
    result = result if isinstance(result, tuple) else (result,)
    return [v.name for v in result]


@RULES.rule("pir.while", inputs=("Cond", "X*"), outputs=("Out*",))
def pir_while(t, cond, xs, *, body_block, body_inputs=(), body_cond, body_outputs=()):
    """PIR's while: the body's arguments are bound to the loop values, and it yields the
    next condition and the next values."""
    body = t.subgraph(body_block, body_inputs, [body_cond, *body_outputs])

    def step(*carry):
        results = list(t.sub_block(body, [v.name for v in carry[1:]]))
        results[0] = t.block.var(_scalar(t, results[0].name))
        return results

    init = [t.block.var(_scalar(t, cond))] + [t.block.var(x) for x in xs]
    try:
        with _entered(t, body_block):
            final = control_flow.while_loop(lambda *carry: carry[0], step, init)
    except ProgramError as e:
        raise Unsupported(f"its body does not keep its loop values' types: {e}") from None
    t.tag_last_op()
    return [v.name for v in final[1:]]
