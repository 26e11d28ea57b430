"""Comparisons, boolean logic and `where`, all broadcasting like NumPy.

Comparisons and logical ops give bool results and have no gradient. `where`
sends the gradient of its result to the input each element was taken from,
summed back to that input's shape with `reduce_as`.
"""
import jax.numpy as jnp

from lowering import checks
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
