"""Matrix products: numpy-style `matmul` and the general `dot_general` of `lax`.

`matmul` follows numpy.matmul: 1-D operands are a row (X) or a column (Y)
vector whose added axis is dropped from the result, and batch dims broadcast.
Its gradient is made of matmuls with transpose flags. A 1-D operand is first
reshaped to a [1, k] row (Y's is then used transposed), so the rule for
matrices applies; `reduce_as` sums gradients back to each operand's shape,
which both undoes batch broadcasting and drops the added axis.

`dot_general` mirrors the `lax` primitive (what `from_jax` translates `@`, einsum and
Flax's Dense into); its gradient is JAX's transpose rule: a dot_general of the result's
gradient with the other operand, then a transpose.
"""
import jax.numpy as jnp
import numpy as np
from jax import lax

from lowering import checks
from lowering.errors import ShapeError
from lowering.registry import Attr, In, Out, op


def _maybe_t(a, flag):
    return jnp.swapaxes(a, -1, -2) if flag and a.ndim >= 2 else a


def _check_operands(X, Y, transpose_x, transpose_y):
    """Operands of rank 1 or more whose contracted dims agree."""
    checks.min_rank("X", X, 1)
    checks.min_rank("Y", Y, 1)
    kx = X.ndim - (2 if transpose_x and X.ndim >= 2 else 1)
    ky = Y.ndim - (1 if transpose_y or Y.ndim == 1 else 2)
    checks.dim("Y", Y, ky, X.shape[kx], f"matmul contracts it with dim {kx} of X {checks.typed(X)}")


@op("matmul", inputs=[In("X", "number"), In("Y", "number")], outputs=[Out("Out")],
    attrs={"transpose_x": False, "transpose_y": False, "alpha": 1.0}, same_dtype=("X", "Y"))
def matmul(X, Y, *, transpose_x, transpose_y, alpha):
    """alpha * op(X) @ op(Y), batched and broadcasting like numpy.matmul.

    op() swaps the last two axes of an operand whose transpose flag is set;
    the flag of a 1-D operand is ignored.
    """
    _check_operands(X, Y, transpose_x, transpose_y)
    out = jnp.matmul(_maybe_t(X, transpose_x), _maybe_t(Y, transpose_y))
    return out if alpha == 1.0 else (out * alpha).astype(out.dtype)


# (transpose_x, transpose_y) -> products (a, b, transpose_a, transpose_b) giving dX and dY
_GRAD_PRODUCTS = {
    (False, False): (("dout", "Y", False, True), ("X", "dout", True, False)),
    (False, True): (("dout", "Y", False, False), ("dout", "X", True, False)),
    (True, False): (("Y", "dout", False, True), ("X", "dout", False, False)),
    (True, True): (("Y", "dout", True, True), ("dout", "X", True, True)),
}


@matmul.gradient
def _(g):
    x, y, dout = g.input("X"), g.input("Y"), g.out_grad("Out")
    tx, ty, alpha = g.attr("transpose_x"), g.attr("transpose_y"), g.attr("alpha")
    xd, yd, od = g.var(x)[0], g.var(y)[0], g.var(g.output("Out"))[0]
    if len(xd) == 1:  # a [1, k] row
        x, tx = g.call("reshape", x, shape=[1, -1]), False
    if len(yd) == 1:  # a [1, k] row, used transposed
        y, ty = g.call("reshape", y, shape=[1, -1]), True
    if len(xd) == 1 or len(yd) == 1:  # give dout the axes numpy.matmul dropped from Out
        if len(xd) == len(yd):  # both vectors: Out is a scalar
            shape = [1, 1]
        elif len(xd) == 1:  # [..., n] -> [..., 1, n]
            shape = [0] * (len(od) - 1) + [1, -1]
        else:  # [..., m] -> [..., m, 1]
            shape = [0] * len(od) + [1]
        dout = g.call("reshape", dout, shape=shape)
    names = {"X": x, "Y": y, "dout": dout}
    flat_dy = (g.wants("Y") and len(yd) == 2 and len(xd) >= 3 and not tx
               and xd[-1] >= 0 and od[-1] >= 0)
    if flat_dy:  # one 2-D product over all leading dims: XLA runs a batched product + sum slower
        # [-1, the last dim at run time]: a tensor-parallel layer's devices hold a slice of it
        xf = g.call("reshape_dims", x, [x], shape=[-1, 0], dims=[1, 1, 1, 0, len(xd) - 1])
        df = g.call("reshape_dims", dout, [dout], shape=[-1, 0], dims=[1, 1, 1, 0, len(od) - 1])
        g.call("matmul", *((df, xf) if ty else (xf, df)), transpose_x=True, alpha=alpha,
               out=g.in_grad("Y"))
    for slot, dims, other, (a, b, ta, tb) in zip(
            ("X", "Y"), (xd, yd), (yd, xd), _GRAD_PRODUCTS[(tx, ty)]):
        if not g.wants(slot) or (slot == "Y" and flat_dy):
            continue
        reduce = len(dims) == 1 or (len(other) > 1 and tuple(dims[:-2]) != tuple(od[:-2]))
        grad = g.call("matmul", names[a], names[b], transpose_x=ta, transpose_y=tb,
                      alpha=alpha, out=None if reduce else g.in_grad(slot))
        if reduce:
            g.call("reduce_as", grad, g.input(slot), out=g.in_grad(slot))


_DOT_ATTRS = {
    "lhs_contracting": Attr("lhs_contracting", "ints", (), "axes of X summed over"),
    "rhs_contracting": Attr("rhs_contracting", "ints", (), "axes of Y paired with them"),
    "lhs_batch": Attr("lhs_batch", "ints", (), "batch axes of X"),
    "rhs_batch": Attr("rhs_batch", "ints", (), "batch axes of Y paired with them"),
}


def _check_dot_general(X, Y, lhs_contracting, rhs_contracting, lhs_batch, rhs_batch):
    """Paired axes exist, are as many on both sides, and agree in size."""
    for what, lhs, rhs in (("contracting", lhs_contracting, rhs_contracting),
                           ("batch", lhs_batch, rhs_batch)):
        if len(lhs) != len(rhs):
            raise ShapeError(f"{len(lhs)} lhs_{what} axes but {len(rhs)} rhs_{what} axes",
                             slot="Y")
        for a, b in zip(lhs, rhs):
            checks.axis("X", X, a, f"lhs_{what}")
            checks.axis("Y", Y, b, f"rhs_{what}")
            checks.dim("Y", Y, b, X.shape[a], f"dot_general pairs it with dim {a} of X "
                       f"{checks.typed(X)}")


@op("dot_general", inputs=[In("X", "number"), In("Y", "number")], outputs=[Out("Out")],
    attrs=_DOT_ATTRS, same_dtype=("X", "Y"))
def dot_general(X, Y, *, lhs_contracting, rhs_contracting, lhs_batch, rhs_batch):
    """The general tensor product of `lax.dot_general`: X's contracting axes are summed
    against Y's, batch axes pair up; the result's dims are the batch dims, then X's
    remaining dims, then Y's."""
    _check_dot_general(X, Y, lhs_contracting, rhs_contracting, lhs_batch, rhs_batch)
    return lax.dot_general(X, Y, ((tuple(lhs_contracting), tuple(rhs_contracting)),
                                  (tuple(lhs_batch), tuple(rhs_batch))),
                           preferred_element_type=X.dtype)


def _dot_general_transpose(g, dout, other, rank, contracting, other_contracting, batch,
                           other_batch, swap, target):
    """Emit the gradient of one operand (of `rank`) of a dot_general, as JAX's transpose
    rule does: a dot_general of the result's gradient with the other operand, then a
    transpose into the operand's axis order. `swap` when the operand is Y."""
    other_rank = len(g.var(other)[0])
    kept = [i for i in range(rank) if i not in contracting and i not in batch]
    other_kept = [i for i in range(other_rank) if i not in other_contracting and i not in other_batch]
    nb = len(batch)
    if swap:   # Out's dims: batch, other's kept, this operand's kept
        ans_other = list(range(nb, nb + len(other_kept)))
    else:      # batch, this operand's kept, other's kept
        ans_other = list(range(nb + len(kept), nb + len(kept) + len(other_kept)))
    ans_batch = list(range(nb))
    product = g.call("dot_general", dout, other, lhs_contracting=ans_other,
                     rhs_contracting=other_kept, lhs_batch=ans_batch, rhs_batch=list(other_batch))
    contracting_by_other = [contracting[i] for i in np.argsort(other_contracting)]
    perm = [int(i) for i in np.argsort(list(batch) + kept + contracting_by_other)]
    if perm == list(range(rank)):
        g.call("assign", product, out=target)
    else:
        g.call("transpose", product, perm=perm, out=target)


@dot_general.gradient
def _(g):
    x, y, dout = g.input("X"), g.input("Y"), g.out_grad("Out")
    rx, ry = len(g.var(x)[0]), len(g.var(y)[0])
    xc = [a % rx for a in g.attr("lhs_contracting")]
    yc = [a % ry for a in g.attr("rhs_contracting")]
    xb = [a % rx for a in g.attr("lhs_batch")]
    yb = [a % ry for a in g.attr("rhs_batch")]
    if g.wants("X"):
        _dot_general_transpose(g, dout, y, rx, xc, yc, xb, yb, False, g.in_grad("X"))
    if g.wants("Y"):
        _dot_general_transpose(g, dout, x, ry, yc, xc, yb, xb, True, g.in_grad("Y"))
