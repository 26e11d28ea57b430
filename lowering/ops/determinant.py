"""Square matrices: `det` (the determinant) and `matrix_inverse`, over the last two axes
(leading axes are a batch). Their gradients are each other's and matmuls:
d det(X) = det(X) * inv(X)^T, d inv(X) = -inv(X)^T @ dOut @ inv(X)^T, so they close
the loop for higher orders; both are undefined at singular matrices (inf or NaN)."""
import jax.numpy as jnp

from lowering import checks
from lowering.registry import In, Out, op


def _square(X):
    checks.min_rank("X", X, 2)
    checks.dim("X", X, -1, X.shape[-2], "a square matrix in the last two axes")


def _swap_last(g, name, rank):
    """`name` with its last two axes swapped."""
    return g.call("transpose", name, perm=list(range(rank - 2)) + [rank - 1, rank - 2])


@op("det", inputs=[In("X", "float")], outputs=[Out("Out")])
def det(X):
    """The determinant of each square matrix in the last two axes of X (shape X[:-2])."""
    _square(X)
    return jnp.linalg.det(X)


@det.gradient
def _(g):
    x, out, dout = g.input("X"), g.output("Out"), g.out_grad("Out")
    rank = len(g.var(x)[0])
    scale = g.call("unsqueeze", g.call("mul", dout, out), axes=[rank - 2, rank - 1])
    inv_t = _swap_last(g, g.call("matrix_inverse", x), rank)
    g.call("mul", scale, inv_t, out=g.in_grad("X"))


@op("matrix_inverse", inputs=[In("X", "float")], outputs=[Out("Out")])
def matrix_inverse(X):
    """The inverse of each square matrix in the last two axes of X."""
    _square(X)
    return jnp.linalg.inv(X)


@matrix_inverse.gradient
def _(g):
    out, dout = g.output("Out"), g.out_grad("Out")
    left = g.call("matmul", out, dout, transpose_x=True)
    g.call("neg", g.call("matmul", left, out, transpose_y=True), out=g.in_grad("X"))
