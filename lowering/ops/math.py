"""Elementwise binary arithmetic (with `rem`, `atan2` and the integer `trunc_div`) with
NumPy broadcasting, and the broadcast helpers.

Gradients of broadcasting ops sum the incoming gradient back to each input's
shape with `reduce_as`; its own gradient broadcasts with `expand_as`.
"""
import jax.numpy as jnp
from jax import lax

from lowering import checks
from lowering.constraints import one_of
from lowering.registry import Attr, In, Out, op

_BINARY = dict(inputs=[In("X", "number"), In("Y", "number")], outputs=[Out("Out")],
               same_dtype=("X", "Y"))


def _sum_axes(shape, target_shape):
    lead = len(shape) - len(target_shape)
    return tuple(range(lead)) + tuple(
        lead + i for i, d in enumerate(target_shape) if d == 1 and shape[lead + i] != 1)


@op("reduce_as", inputs=[In("X", "number"), In("Target", differentiable=False)],
    outputs=[Out("Out")])
def reduce_as(X, Target):
    """Sum `X` over the axes along which `Target`'s shape was broadcast to `X`'s."""
    return jnp.sum(X, axis=_sum_axes(X.shape, Target.shape)).reshape(Target.shape)


@op("expand_as", inputs=[In("X", "number"), In("Target", differentiable=False)],
    outputs=[Out("Out")])
def expand_as(X, Target):
    """Broadcast `X` to the shape of `Target`."""
    return jnp.broadcast_to(X, Target.shape)


@reduce_as.gradient
def _(g):
    g.call("expand_as", g.out_grad("Out"), g.input("X"), out=g.in_grad("X"))


@expand_as.gradient
def _(g):
    g.call("reduce_as", g.out_grad("Out"), g.input("X"), out=g.in_grad("X"))


def _broadcast_free(g, slot):
    """Whether input `slot` of a binary op has the result's shape whatever its unknown
    (-1) dims turn out to be, so that broadcasting never expands it."""
    dims = g.var(g.input(slot))[0]
    other = g.var(g.input("Y" if slot == "X" else "X"))[0]
    lead = len(dims) - len(other)
    return lead >= 0 and all(d > 1 or o == 1 for d, o in zip(dims[lead:], other))


def _to_input(g, grad, slot):
    """Sum `grad` (shaped like the result) back to input `slot`'s shape into its gradient,
    if wanted; an input that was not broadcast takes `grad` unchanged."""
    if not g.in_grad(slot):
        return
    if _broadcast_free(g, slot):
        g.pass_through(slot, grad)
    else:
        g.call("reduce_as", grad, g.input(slot), out=g.in_grad(slot))


@op("add", **_BINARY)
def add(X, Y):
    """X + Y, broadcasting."""
    checks.broadcast(X=X, Y=Y)
    return jnp.add(X, Y)


@add.gradient
def _(g):
    dout = g.out_grad("Out")
    _to_input(g, dout, "X")
    _to_input(g, dout, "Y")


@op("sub", **_BINARY)
def sub(X, Y):
    """X - Y, broadcasting."""
    checks.broadcast(X=X, Y=Y)
    return jnp.subtract(X, Y)


@sub.gradient
def _(g):
    dout = g.out_grad("Out")
    _to_input(g, dout, "X")
    if g.wants("Y"):
        _to_input(g, g.call("neg", dout), "Y")


@op("mul", **_BINARY)
def mul(X, Y):
    """X * Y elementwise, broadcasting."""
    checks.broadcast(X=X, Y=Y)
    return jnp.multiply(X, Y)


@mul.gradient
def _(g):
    dout, x, y = g.out_grad("Out"), g.input("X"), g.input("Y")
    if g.wants("X"):
        _to_input(g, g.call("mul", dout, y), "X")
    if g.wants("Y"):
        _to_input(g, g.call("mul", dout, x), "Y")


@op("div", **_BINARY)
def div(X, Y):
    """X / Y elementwise, broadcasting (true division)."""
    checks.broadcast(X=X, Y=Y)
    return jnp.true_divide(X, Y)


@div.gradient
def _(g):
    dout, y, out = g.out_grad("Out"), g.input("Y"), g.output("Out")
    if g.wants("X"):
        _to_input(g, g.call("div", dout, y), "X")
    if g.wants("Y"):  # d(x/y)/dy = -out / y
        _to_input(g, g.call("neg", g.call("mul", dout, g.call("div", out, y))), "Y")


@op("pow", inputs=[In("X", "float"), In("Y", "float")], outputs=[Out("Out")],
    same_dtype=("X", "Y"))
def pow_(X, Y):
    """X ** Y elementwise, broadcasting."""
    checks.broadcast(X=X, Y=Y)
    return jnp.power(X, Y)


@pow_.gradient
def _(g):
    dout, x, y, out = g.out_grad("Out"), g.input("X"), g.input("Y"), g.output("Out")
    if g.wants("X"):  # y * x ** (y - 1)
        dx = g.call("mul", y, g.call("pow", x, g.call("scale", y, bias=-1.0)))
        _to_input(g, g.call("mul", dout, dx), "X")
    if g.wants("Y"):  # out * log(x)
        _to_input(g, g.call("mul", dout, g.call("mul", out, g.call("log", x))), "Y")


_TIES = {"ties": Attr("ties", "string", "x", "which input a tie sends the gradient to: "
                     "x, y, or half to each (split, JAX's rule)",
                     where=one_of("x", "y", "split"))}


def _select_grad(g, wins, wins_or_ties):
    """Gradient of maximum/minimum: the input that was selected takes the gradient, a tie
    sends it where the `ties` attribute says."""
    dout, x, y = g.out_grad("Out"), g.input("X"), g.input("Y")
    ties = g.attr("ties")
    if ties == "split":
        dtype = g.var(dout)[1]
        x_share = g.call("add", g.call("cast", g.call(wins, x, y), dtype=dtype),
                         g.call("scale", g.call("cast", g.call("equal", x, y), dtype=dtype),
                                scale=0.5))
        dx = g.call("mul", dout, x_share)
        dy = g.call("sub", dout, dx)
    else:
        pick_x = g.call(wins_or_ties if ties == "x" else wins, x, y)
        zeros = g.call("fill_zeros_like", dout)
        dx = g.call("where", pick_x, dout, zeros)
        dy = g.call("where", pick_x, zeros, dout)
    if g.wants("X"):
        _to_input(g, dx, "X")
    if g.wants("Y"):
        _to_input(g, dy, "Y")


@op("maximum", **_BINARY, attrs=_TIES)
def maximum(X, Y, *, ties):
    """Elementwise maximum, broadcasting (a tie sends the gradient as `ties` says)."""
    checks.broadcast(X=X, Y=Y)
    return jnp.maximum(X, Y)


@maximum.gradient
def _(g):
    _select_grad(g, "greater_than", "greater_equal")


@op("minimum", **_BINARY, attrs=_TIES)
def minimum(X, Y, *, ties):
    """Elementwise minimum, broadcasting (a tie sends the gradient as `ties` says)."""
    checks.broadcast(X=X, Y=Y)
    return jnp.minimum(X, Y)


@minimum.gradient
def _(g):
    _select_grad(g, "less_than", "less_equal")


@op("rem", **_BINARY)
def rem(X, Y):
    """The remainder of X / Y rounded toward zero, with the sign of X (C's fmod; `lax.rem`),
    broadcasting."""
    checks.broadcast(X=X, Y=Y)
    return lax.rem(*jnp.broadcast_arrays(X, Y))


@rem.gradient
def _(g):  # x - trunc(x / y) * y: dx = dout, dy = -dout * trunc(x / y)
    dout, x, y = g.out_grad("Out"), g.input("X"), g.input("Y")
    if g.wants("X"):
        _to_input(g, dout, "X")
    if g.wants("Y"):
        ratio = g.call("div", x, y)
        whole = g.call("mul", g.call("sign", ratio), g.call("floor", g.call("abs", ratio)))
        _to_input(g, g.call("neg", g.call("mul", dout, whole)), "Y")


@op("atan2", inputs=[In("X", "float"), In("Y", "float")], outputs=[Out("Out")],
    same_dtype=("X", "Y"))
def atan2(X, Y):
    """The angle of the point (Y, X) from the positive Y axis: arctan(X / Y) in the
    quadrant of the signs of X and Y, in [-pi, pi] (`numpy.arctan2(X, Y)`), broadcasting."""
    checks.broadcast(X=X, Y=Y)
    return jnp.arctan2(X, Y)


@atan2.gradient
def _(g):  # dx = y / (x^2 + y^2), dy = -x / (x^2 + y^2)
    dout, x, y = g.out_grad("Out"), g.input("X"), g.input("Y")
    scaled = g.call("div", dout, g.call("add", g.call("square", x), g.call("square", y)))
    if g.wants("X"):
        _to_input(g, g.call("mul", scaled, y), "X")
    if g.wants("Y"):
        _to_input(g, g.call("neg", g.call("mul", scaled, x)), "Y")


@op("trunc_div", inputs=[In("X", "int"), In("Y", "int")], outputs=[Out("Out")],
    same_dtype=("X", "Y"), differentiable=False)
def trunc_div(X, Y):
    """X / Y of integers rounded toward zero (C's division; `lax.div`), broadcasting; the
    quotient of a division by zero is undefined."""
    checks.broadcast(X=X, Y=Y)
    return lax.div(*jnp.broadcast_arrays(X, Y))
