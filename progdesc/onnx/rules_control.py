"""Control flow: If, Loop and Scan, their sub-graphs translated into the sub-blocks of our
`cond`, `while` and `scan` ops (`progdesc.control_flow`), so that gradients flow through
the gradient makers of those ops. A sub-graph reads the values of the graphs around it by
name (the translator's environments); what it reads becomes the op's captured input.

- If: `cond`; with a condition known at import, the taken branch is inlined.
- Loop: a `scan` of M steps when M is known at import and the condition cannot stop it
  (no condition, or a true one the body passes on unchanged): its scan outputs are
  stacked. Otherwise a `while` carrying the iteration number and the condition: bounded
  by M when M is known at import (differentiable, as a scan of M masked steps), unbounded
  when M is a run-time value or INT64_MAX, as exporters write a while loop's (our while
  then has no gradient). Scan outputs of a loop whose number of iterations is known only
  at run time have no static shape: refused.
- Scan (opset 9 form): a `scan` over axis 0 of the scan inputs, each moved there from its
  scan_input_axes and reversed where its direction is 1; scan outputs are reversed and
  moved to their scan_output_axes likewise.
"""
import numpy as np

from lowering.errors import ProgramError
from progdesc import control_flow
from progdesc.onnx.table import RULES
from progdesc.translate import Unsupported


def _scalar(t, name):
    """A one-element condition or count ([], [1], [1, 1]) as a scalar []."""
    dims = t.var(name)[0]
    if len(dims) == 0:
        return name
    if any(d != 1 for d in dims):
        raise Unsupported(f"a condition or count of shape {list(dims)}; one element is "
                          "expected")
    return t.call("reshape", name, shape=[])


def _names(result):
    """Our names of a builder's result (a Variable or a tuple of them)."""
    return [v.name for v in (result if isinstance(result, (tuple, list)) else (result,))]


def _known_scalar(t, name):
    """The int value of a one-element int or bool variable known at import (a constant,
    a folded computation), else None."""
    if name is None:
        return None
    value = t.value_of(name)
    if value is not None:
        return int(np.asarray(value).reshape(-1)[0]) if np.size(value) == 1 else None
    sizes = t.sizes_of(name)
    if sizes and len(sizes) == 1 and isinstance(sizes[0], (int, np.integer)):
        return int(sizes[0])
    return None


@RULES.rule("If")
def if_(t, cond, *, then_branch, else_branch):
    """ONNX If: `cond` of the two branches (both sub-graphs without inputs)."""
    branches = [t.graph_of(then_branch), t.graph_of(else_branch)]
    if len(branches[0].output) != len(branches[1].output):
        raise Unsupported(f"its branches have {len(branches[0].output)} and "
                          f"{len(branches[1].output)} outputs")
    known = _known_scalar(t, cond)
    if known is not None:
        return t.inline(branches[0] if known else branches[1], [])
    pred = t.block.var(_scalar(t, cond))
    try:
        result = control_flow.cond(pred, lambda: t.sub_block(branches[0], []),
                                   lambda: t.sub_block(branches[1], []))
    except ProgramError as e:
        raise Unsupported(f"its branches give outputs of different shapes or dtypes: "
                          f"{e.detail}") from None
    t.tag_last_op()
    return _names(result)


def _passes_condition_on(body):
    """Whether the Loop body's condition output is its condition input, unchanged
    (directly or through Identity nodes)."""
    if len(body.input) < 2 or not body.output:
        return False
    name, cond_in = body.output[0].name, body.input[1].name
    made_by = {out: node for node in body.node for out in node.output}
    while name != cond_in:
        node = made_by.get(name)
        if node is None or node.op_type != "Identity" or node.domain not in ("", "ai.onnx"):
            return False
        name = node.input[0]
    return True


_UNBOUNDED = 2 ** 31 - 1
"""A trip count from here up (INT64_MAX, as exporters write a while loop's) bounds nothing:
the loop runs while its condition holds (the iteration number computes as int32)."""


@RULES.rule("Loop")
def loop(t, trip_count, cond, *initial, body):
    """ONNX Loop (see the module's text): the final loop-carried values, then the scan
    outputs stacked along a new axis 0."""
    body = t.graph_of(body)
    carried = len(initial)
    scanned = len(body.output) - 1 - carried
    if len(body.input) != 2 + carried or scanned < 0:
        raise Unsupported(f"its body takes {len(body.input)} inputs and gives "
                          f"{len(body.output)} outputs for {carried} loop-carried values")
    trips, start = _known_scalar(t, trip_count), _known_scalar(t, cond)
    if trips is not None and trips >= _UNBOUNDED:   # exporters' "no trip count"
        trip_count = trips = None
    runs_out = cond is None or (start is not None and bool(start)
                                and _passes_condition_on(body))
    init = [t.block.var(t.constant(np.asarray(0, np.int64)))] + [t.block.var(v)
                                                                 for v in initial]
    try:
        if trips is not None and runs_out:
            return _loop_as_scan(t, body, init, max(trips, 0), carried)
        if scanned:
            raise Unsupported("it has scan outputs and its number of iterations is known "
                              "only at run time (a trip count or condition computed at run "
                              "time): their shape is not static")
        if trip_count is None and cond is None:
            raise Unsupported("neither a trip count nor a condition (or a trip count of "
                              f"{_UNBOUNDED} or more): it never ends")
        return _loop_as_while(t, body, init, trip_count, trips, cond)
    except ProgramError as e:
        raise Unsupported(f"its body does not keep its loop-carried values' shapes and "
                          f"dtypes: {e.detail}") from None


def _loop_as_scan(t, body, init, trips, carried):
    """A Loop of a known number of iterations that its condition cannot stop."""
    def step(carry, _):
        i = carry[0].name
        true = t.constant(np.asarray(True))
        results = t.sub_block(body, [i, true] + [v.name for v in carry[1:]])
        nxt = t.block.var(t.call("increment", i, step=1.0))
        ys = tuple(results[1 + carried:])
        return (nxt,) + tuple(results[1:1 + carried]), (ys or None)

    final, ys = control_flow.scan(step, tuple(init), None, length=trips)
    t.tag_last_op()
    return [v.name for v in final[1:]] + ([] if ys is None else _names(ys))


def _loop_as_while(t, body, init, trip_count, trips, cond):
    """A Loop as our while: carried (iteration, condition, values...)."""
    limit = None if trip_count is None else _scalar(t, trip_count)
    holds = t.constant(np.asarray(True)) if cond is None else _scalar(t, cond)
    ignore_cond = cond is None   # a for loop: the body's condition output is ignored

    def keep_going(i, c, *_):
        go = c.name
        if limit is not None:
            below = t.call("less_than", i.name, t.call("cast", limit, dtype=t.var(i.name)[1]))
            go = below if ignore_cond else t.call("logical_and", go, below)
        return t.block.var(go)

    def step(i, c, *values):
        results = t.sub_block(body, [i.name, c.name] + [v.name for v in values])
        nxt = t.call("increment", i.name, step=1.0)
        c_next = c.name if ignore_cond else _scalar(t, results[0].name)
        if t.var(c_next)[1] != "bool":
            c_next = t.call("cast", c_next, dtype="bool")
        return (t.block.var(nxt), t.block.var(c_next)) + tuple(results[1:])

    loop_vars = [init[0], t.block.var(holds)] + init[1:]
    final = control_flow.while_loop(keep_going, step, loop_vars, max_iters=trips)
    t.tag_last_op()
    return [v.name for v in final[2:]]


def _axis(axis, rank, what):
    """A non-negative axis of a tensor of `rank`."""
    if not -rank <= axis < rank:
        raise Unsupported(f"{what} {axis} for rank {rank}")
    return axis % rank


@RULES.rule("Scan", since=9)
def scan(t, *ins, body, num_scan_inputs, scan_input_axes=None, scan_input_directions=None,
         scan_output_axes=None, scan_output_directions=None):
    """ONNX Scan (see the module's text): the final states, then the scan outputs."""
    body = t.graph_of(body)
    states = len(ins) - num_scan_inputs
    outputs = len(body.output) - states
    if num_scan_inputs < 1 or states < 0 or outputs < 0 or len(body.input) != len(ins):
        raise Unsupported(f"num_scan_inputs={num_scan_inputs} for {len(ins)} inputs and a "
                          f"body of {len(body.input)} inputs, {len(body.output)} outputs")
    in_axes = list(scan_input_axes or [0] * num_scan_inputs)
    in_dirs = list(scan_input_directions or [0] * num_scan_inputs)
    out_axes = list(scan_output_axes or [0] * outputs)
    out_dirs = list(scan_output_directions or [0] * outputs)
    if len(in_axes) != num_scan_inputs or len(in_dirs) != num_scan_inputs \
            or len(out_axes) != outputs or len(out_dirs) != outputs:
        raise Unsupported("scan_input_/scan_output_axes or directions of another length "
                          "than the scan inputs / outputs")
    xs = []
    for x, axis, reverse in zip(ins[states:], in_axes, in_dirs):
        rank = len(t.var(x)[0])
        axis = _axis(axis, rank, "scan_input_axes")
        if axis:
            x = t.call("transpose", x, perm=[axis] + [k for k in range(rank) if k != axis])
        if reverse:
            x = t.call("rev", x, dimensions=[0])
        xs.append(t.block.var(x))

    def step(carry, slices):
        results = t.sub_block(body, [v.name for v in carry or ()]
                              + [v.name for v in slices])
        return tuple(results[:states]), (tuple(results[states:]) or None)

    try:
        final, ys = control_flow.scan(step, tuple(t.block.var(v) for v in ins[:states]) or None,
                                      tuple(xs))
    except ProgramError as e:
        raise Unsupported(f"its body does not keep its states' shapes and dtypes: "
                          f"{e.detail}") from None
    t.tag_last_op()
    outs = []
    for y, axis, reverse in zip([] if ys is None else _names(ys), out_axes, out_dirs):
        if reverse:
            y = t.call("rev", y, dimensions=[0])
        rank = len(t.var(y)[0])
        axis = _axis(axis, rank, "scan_output_axes")
        if axis:
            y = t.call("transpose", y, perm=list(range(1, axis + 1)) + [0]
                       + list(range(axis + 1, rank)))
        outs.append(y)
    return ([] if final is None else _names(final)) + outs
