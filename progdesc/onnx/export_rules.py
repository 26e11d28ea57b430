"""The rows of the ONNX export table (`EXPORT`), one module per family of our ops; see
`progdesc.onnx.export_table` for how a row is written."""
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


@EXPORT.rule("while", "cond", "switch")
def control_flow(e, *args, **_):
    """Our control flow (sub-blocks) has no export yet: named, never dropped."""
    raise Unsupported("control flow with sub-blocks is not written as ONNX Loop/Scan/If yet")
