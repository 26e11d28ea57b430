"""Comparisons, boolean logic and `where`, all broadcasting like NumPy, and `select_n`.

Comparisons and logical ops give bool results and have no gradient. `where`
sends the gradient of its result to the input each element was taken from,
summed back to that input's shape with `reduce_as`; `select_n` (no broadcasting)
does the same with a `select_n` of the gradient and zeros.
"""
import jax.numpy as jnp
from jax import lax

from lowering import checks
from lowering.errors import ShapeError
from lowering.registry import In, Out, op


def _comparison(op_type, fn, dtype_family, summary):
    def compare(X, Y):
        checks.broadcast(X=X, Y=Y)
        return fn(X, Y)
    compare.__doc__ = summary
    return op(op_type, inputs=[In("X", dtype_family), In("Y", dtype_family)],
              outputs=[Out("Out")], same_dtype=("X", "Y"), differentiable=False)(compare)


equal = _comparison("equal", jnp.equal, "any", "X == Y elementwise (bool), broadcasting.")
not_equal = _comparison("not_equal", jnp.not_equal, "any",
                        "X != Y elementwise (bool), broadcasting.")
less_than = _comparison("less_than", jnp.less, "number", "X < Y elementwise (bool), broadcasting.")
less_equal = _comparison("less_equal", jnp.less_equal, "number",
                         "X <= Y elementwise (bool), broadcasting.")
greater_than = _comparison("greater_than", jnp.greater, "number",
                           "X > Y elementwise (bool), broadcasting.")
greater_equal = _comparison("greater_equal", jnp.greater_equal, "number",
                            "X >= Y elementwise (bool), broadcasting.")


@op("logical_and", inputs=[In("X", "bool"), In("Y", "bool")], outputs=[Out("Out")],
    differentiable=False)
def logical_and(X, Y):
    """X and Y elementwise, broadcasting."""
    checks.broadcast(X=X, Y=Y)
    return jnp.logical_and(X, Y)


@op("logical_or", inputs=[In("X", "bool"), In("Y", "bool")], outputs=[Out("Out")],
    differentiable=False)
def logical_or(X, Y):
    """X or Y elementwise, broadcasting."""
    checks.broadcast(X=X, Y=Y)
    return jnp.logical_or(X, Y)


@op("logical_not", inputs=[In("X", "bool")], outputs=[Out("Out")], differentiable=False)
def logical_not(X):
    """not X elementwise."""
    return jnp.logical_not(X)


@op("where", inputs=[In("Condition", "bool"), In("X"), In("Y")], outputs=[Out("Out")],
    same_dtype=("X", "Y"))
def where(Condition, X, Y):
    """X where Condition holds, else Y; the three broadcast together."""
    checks.broadcast(Condition=Condition, X=X, Y=Y)
    return jnp.where(Condition, X, Y)


@where.gradient
def _(g):
    dout, cond = g.out_grad("Out"), g.input("Condition")
    zeros = g.call("fill_zeros_like", dout)
    for slot, picked in (("X", (dout, zeros)), ("Y", (zeros, dout))):
        if g.wants(slot):
            g.call("reduce_as", g.call("where", cond, *picked), g.input(slot),
                   out=g.in_grad(slot))


@op("select_n", inputs=[In("Which", differentiable=False,
                           doc="bool (two cases) or int32 index of the case to take, a scalar "
                               "or shaped like the cases"),
                        In("Cases", many=True)],
    outputs=[Out("Out")], same_dtype=("Cases",))
def select_n(Which, Cases):
    """Cases[Which] elementwise (`lax.select_n`): a bool Which picks Cases[1] where True."""
    if Which.dtype.kind not in "biu":
        raise ShapeError(f"Which must be bool or int, got {checks.typed(Which)}", slot="Which")
    for i, case in enumerate(Cases):
        checks.shape(f"Cases[{i}]", case, Cases[0].shape, f"the shape of Cases[0] "
                     f"{checks.typed(Cases[0])}")
    if Which.ndim:
        checks.shape("Which", Which, Cases[0].shape, "a scalar or the shape of the cases")
    return lax.select_n(Which if Which.dtype.kind == "b" else Which.astype("int32"), *Cases)


@select_n.gradient
def _(g):
    which, cases, dout = g.input("Which"), g.input_list("Cases"), g.out_grad("Out")
    zeros = g.call("fill_zeros_like", dout)
    for i, target in enumerate(g.in_grad_list("Cases")):
        if target:
            picked = [dout if k == i else zeros for k in range(len(cases))]
            g.op("select_n", {"Which": which, "Cases": picked}, {"Out": target})


@op("is_finite", inputs=[In("X", "float")], outputs=[Out("Out")], differentiable=False)
def is_finite(X):
    """Whether each element of X is neither infinite nor NaN (bool)."""
    return jnp.isfinite(X)
