"""The rows of the ONNX export table (`EXPORT`), one module per family of our ops; see
`progdesc.onnx.export_table` for how a row is written."""
from progdesc.onnx import export_math, export_nn, export_shape  # noqa: F401
from progdesc.onnx.export_table import EXPORT
from progdesc.translate import Unsupported

__all__ = ["EXPORT"]


@EXPORT.rule("scan", "while", "cond", "switch")
def control_flow(e, *args, **_):
    """Our control flow (sub-blocks) has no export yet: named, never dropped."""
    raise Unsupported("control flow with sub-blocks is not written as ONNX Loop/Scan/If yet")
