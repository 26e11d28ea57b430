"""The rows of the ONNX export table (`EXPORT`), one module per family of our ops; see
`progdesc.onnx.export_table` for how a row is written."""
import numpy as np
from onnx import helper

from progdesc.onnx import export_math, export_nn, export_shape  # noqa: F401
from progdesc.onnx.export_table import EXPORT
from progdesc.translate import Unsupported

__all__ = ["EXPORT"]


@EXPORT.rule("scan")
def scan(e, Init, X, Input, *, block, carry_in, x_in, carry_out, y_out, reverse):
    """ONNX Scan: the carry as its state, the sequences scanned along axis 0 (from the end
    when `reverse`, the outputs stacked in the sequences' order); the step block is its
    body. StepCarry and Saved (for the gradient) are not written."""
    if not X:
        raise Unsupported("a scan with no sequence (ONNX Scan scans one at least)")
    body = e.subgraph(block, list(carry_in) + list(x_in), list(carry_out) + list(y_out))
    n_carry, n_y = len(carry_out), len(y_out)
    outs = e.node("Scan", list(Init) + list(X), outputs=n_carry + n_y, body=body,
                  num_scan_inputs=len(X), scan_input_directions=[int(reverse)] * len(X),
                  scan_output_directions=[int(reverse)] * n_y)
    outs = [outs] if n_carry + n_y == 1 else outs
    return (outs[:n_carry], outs[n_carry:], None, None)


@EXPORT.rule("cond")
def cond(e, Cond, Input, *, true_block, false_block, true_outputs, false_outputs):
    """ONNX If, each branch a sub-graph with no inputs."""
    branches = [e.subgraph(true_block, [], list(true_outputs)),
                e.subgraph(false_block, [], list(false_outputs))]
    holds = e.node("Reshape", [Cond, e.ints([])])
    out = e.node("If", [holds], outputs=len(true_outputs), then_branch=branches[0],
                 else_branch=branches[1])
    return [out] if len(true_outputs) == 1 else out


@EXPORT.rule("while")
def while_(e, Init, Input, *, block, carry_in, carry_out, cond, max_iters, in_types):
    """ONNX Loop (at most `max_iters` trips where given). Each trip computes the condition
    from the loop variables and replaces them only where it holds; the trip where it
    first fails changes nothing and ends the loop."""
    types = in_types[0]

    def finish(values):
        holds = e.node("Reshape", [values[0], e.ints([])])
        kept = [e.node("Where", [holds, new, old]) for new, old in
                zip(values[1:1 + len(carry_in)], values[1 + len(carry_in):])]
        return [(holds, ((), "bool"))] + list(zip(kept, types))

    body = e.subgraph(block, [((), "int64"), ((), "bool")] + list(carry_in),
                      [cond] + list(carry_out) + list(carry_in), finish)
    trips = e.const(np.int64(max_iters)) if max_iters >= 0 else None
    out = e.node("Loop", [trips, e.const(np.bool_(True))] + list(Init),
                 outputs=len(carry_in), body=body)
    return ([out] if len(carry_in) == 1 else out, None)


@EXPORT.rule("switch")
def switch(e, Index, Input, *, blocks, branch_outputs, in_types, out_types):
    """A chain of ONNX If: branch k where Index <= k, the last one else (an index out of
    range is clamped, as ours)."""
    per = len(branch_outputs) // len(blocks)
    graphs = [e.subgraph(b, [], list(branch_outputs[k * per:(k + 1) * per]))
              for k, b in enumerate(blocks)]
    index = e.node("Reshape", [Index, e.ints([])])
    dtype = in_types[0][1]
    if len(graphs) == 1:
        graphs.append(graphs[0])
    below = [e.node("LessOrEqual", [index, e.scalar(k, dtype)]) for k in range(len(graphs) - 1)]
    rest = graphs[-1]
    for k in range(len(graphs) - 2, 0, -1):   # the else branch of k - 1 chooses k or later
        outs = [e.fresh("switch") for _ in range(per)]
        node = helper.make_node("If", [below[k]], outs, then_branch=graphs[k],
                                else_branch=rest)
        rest = e.graph([node], list(zip(outs, out_types[0])))
    out = e.node("If", [below[0]], outputs=per, then_branch=graphs[0], else_branch=rest)
    return [out] if per == 1 else out
