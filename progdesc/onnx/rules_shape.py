"""Shape ops (Reshape, Slice, Gather, Concat, Expand, ...) and the folding of shapes at import."""
from progdesc.onnx.table import RULES
from progdesc.translate import Unsupported  # noqa: F401


@RULES.rule("Constant")
def constant(t, *, value=None, value_float=None, value_floats=None, value_int=None,
             value_ints=None, sparse_value=None, value_string=None, value_strings=None):
    if value is not None:
        return t.constant(value)
    for v, dtype in ((value_float, "float32"), (value_floats, "float32"),
                     (value_int, "int64"), (value_ints, "int64")):
        if v is not None:
            return t.constant(__import__("numpy").asarray(v, dtype=dtype))
    raise Unsupported("a sparse or string constant")
