"""Neural-network ops: convolutions, pooling, normalizations, Gemm, Softmax, Resize, attention."""
from progdesc.onnx.table import RULES
from progdesc.translate import Unsupported  # noqa: F401


@RULES.rule("Gemm")
def gemm(t, a, b, c=None, *, alpha=1.0, beta=1.0, transA=0, transB=0):
    out = t.call("matmul", a, b, transpose_x=bool(transA), transpose_y=bool(transB),
                 alpha=float(alpha))
    if c is None:
        return out
    if beta != 1.0:
        c = t.call("scale", c, scale=float(beta))
    return t.call("add", out, c)
