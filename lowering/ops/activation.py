"""Activation functions, softmax and log_softmax.

Gradients are compositions that reuse the forward output where natural;
PaddlePaddle's piecewise ones (relu6, hard_sigmoid, hard_swish) take its one-sided
derivatives at their corners, so that training steps match its own;
gelu has a dedicated `gelu_grad` op (its derivative needs erf), whose own
gradient is `gelu_grad` again with a higher `order`.
"""
import jax
import jax.numpy as jnp

from lowering.ops.unary import full_like
from lowering.registry import In, Out, op

_FLOAT = dict(inputs=[In("X", "float")], outputs=[Out("Out")])


@op("relu", **_FLOAT)
def relu(X):
    """max(X, 0) elementwise."""
    return jax.nn.relu(X)


@relu.gradient
def _(g):
    dout, out = g.out_grad("Out"), g.output("Out")
    zeros = g.call("fill_zeros_like", out)
    g.call("where", g.call("greater_than", out, zeros), dout, zeros, out=g.in_grad("X"))


@op("sigmoid", **_FLOAT)
def sigmoid(X):
    """1 / (1 + exp(-X)) elementwise."""
    return jax.nn.sigmoid(X)


@sigmoid.gradient
def _(g):  # dout * out * (1 - out)
    dout, out = g.out_grad("Out"), g.output("Out")
    slope = g.call("mul", out, g.call("scale", out, scale=-1.0, bias=1.0))
    g.call("mul", dout, slope, out=g.in_grad("X"))


@op("tanh", **_FLOAT)
def tanh(X):
    """Hyperbolic tangent elementwise."""
    return jnp.tanh(X)


@tanh.gradient
def _(g):  # dout * (1 - out ** 2)
    dout, out = g.out_grad("Out"), g.output("Out")
    slope = g.call("scale", g.call("square", out), scale=-1.0, bias=1.0)
    g.call("mul", dout, slope, out=g.in_grad("X"))


@op("gelu", **_FLOAT, attrs={"approximate": False})
def gelu(X, *, approximate):
    """Gaussian error linear unit: X * Phi(X) (erf form), or its tanh approximation."""
    return jax.nn.gelu(X, approximate=approximate)


@gelu.gradient
def _(g):
    g.call("gelu_grad", g.input("X"), g.out_grad("Out"), approximate=g.attr("approximate"),
           out=g.in_grad("X"))


def _derivative(f):
    """The derivative of an elementwise function."""
    return lambda x: jax.jvp(f, (x,), (jnp.ones_like(x),))[1]


@op("gelu_grad", inputs=[In("X", "float"), In("DOut", "float")], outputs=[Out("Out")],
    attrs={"approximate": False, "order": 1}, same_dtype=("X", "DOut"))
def gelu_grad(X, DOut, *, approximate, order):
    """DOut times the `order`-th derivative of gelu at X (order 1: gelu's input gradient)."""
    f = lambda x: jax.nn.gelu(x, approximate=approximate)  # noqa: E731
    for _ in range(order):
        f = _derivative(f)
    return DOut * f(X)


@gelu_grad.gradient
def _(g):
    x, dout, ddx = g.input("X"), g.input("DOut"), g.out_grad("Out")
    approximate, order = g.attr("approximate"), g.attr("order")
    if g.wants("X"):
        g.call("gelu_grad", x, g.call("mul", dout, ddx), approximate=approximate,
               order=order + 1, out=g.in_grad("X"))
    if g.wants("DOut"):
        g.call("gelu_grad", x, ddx, approximate=approximate, order=order, out=g.in_grad("DOut"))


@op("leaky_relu", **_FLOAT, attrs={"alpha": 0.02})
def leaky_relu(X, *, alpha):
    """X where X > 0, else alpha * X."""
    return jnp.where(X > 0, X, X * alpha)


@leaky_relu.gradient
def _(g):
    dout, x = g.out_grad("Out"), g.input("X")
    positive = g.call("greater_than", x, g.call("fill_zeros_like", x))
    g.call("where", positive, dout, g.call("scale", dout, scale=g.attr("alpha")),
           out=g.in_grad("X"))


@op("softplus", **_FLOAT, attrs={"beta": 1.0, "threshold": 20.0})
def softplus(X, *, beta, threshold):
    """log(1 + exp(beta * X)) / beta, or X itself where beta * X > threshold."""
    xb = X * beta
    return jnp.where(xb > threshold, X, jax.nn.softplus(xb) / beta)


@softplus.gradient
def _(g):  # dout where linear, else dout * sigmoid(beta * x)
    dout = g.out_grad("Out")
    xb = g.call("scale", g.input("X"), scale=g.attr("beta"))
    linear = g.call("greater_than", xb, full_like(g, xb, g.attr("threshold")))
    smooth = g.call("mul", dout, g.call("sigmoid", xb))
    g.call("where", linear, dout, smooth, out=g.in_grad("X"))


@op("silu", **_FLOAT)
def silu(X):
    """X * sigmoid(X) elementwise."""
    return jax.nn.silu(X)


@silu.gradient
def _(g):  # dout * (s + out * (1 - s)), s = sigmoid(x)
    dout, out = g.out_grad("Out"), g.output("Out")
    s = g.call("sigmoid", g.input("X"))
    slope = g.call("add", s, g.call("mul", out, g.call("scale", s, scale=-1.0, bias=1.0)))
    g.call("mul", dout, slope, out=g.in_grad("X"))


@op("softmax", **_FLOAT, attrs={"axis": -1})
def softmax(X, *, axis):
    """exp(X) normalized to sum 1 along `axis`."""
    return jax.nn.softmax(X, axis=axis)


def softmax_grad(g, out, dout, axis, target=None):
    """Emit out * (dout - sum(dout * out, axis, keepdim)) into `target`; returns its name."""
    dot = g.call("reduce_sum", g.call("mul", dout, out), axis=[axis], keep_dim=True)
    return g.call("mul", out, g.call("sub", dout, dot), out=target)


@softmax.gradient
def _(g):
    softmax_grad(g, g.output("Out"), g.out_grad("Out"), g.attr("axis"), g.in_grad("X"))


@op("log_softmax", **_FLOAT, attrs={"axis": -1})
def log_softmax(X, *, axis):
    """log(softmax(X)) along `axis`, computed stably."""
    return jax.nn.log_softmax(X, axis=axis)


@log_softmax.gradient
def _(g):  # dout - exp(out) * sum(dout, axis, keepdim)
    dout, axis = g.out_grad("Out"), g.attr("axis")
    total = g.call("reduce_sum", dout, axis=[axis], keep_dim=True)
    spread = g.call("mul", g.call("exp", g.output("Out")), total)
    g.call("sub", dout, spread, out=g.in_grad("X"))


# --- PaddlePaddle's hard activations (MobileNetV2 and V3) and mish ---

def _strictly_between(g, x, low, high):
    """Emit the mask low < x < high; returns its name."""
    return g.call("logical_and", g.call("greater_than", x, full_like(g, x, low)),
                  g.call("less_than", x, full_like(g, x, high)))


@op("relu6", **_FLOAT, attrs={"threshold": 6.0})
def relu6(X, *, threshold):
    """clip(X, 0, threshold) elementwise."""
    return jnp.clip(X, 0, threshold).astype(X.dtype)


@relu6.gradient
def _(g):  # dout where 0 < out < threshold (0 at both corners, as PaddlePaddle's)
    dout, out = g.out_grad("Out"), g.output("Out")
    inside = _strictly_between(g, out, 0.0, g.attr("threshold"))
    g.call("where", inside, dout, g.call("fill_zeros_like", dout), out=g.in_grad("X"))


@op("hard_sigmoid", **_FLOAT, attrs={"slope": 0.1666667, "offset": 0.5})
def hard_sigmoid(X, *, slope, offset):
    """clip(slope * X + offset, 0, 1) elementwise."""
    return jnp.clip(X * slope + offset, 0, 1).astype(X.dtype)


@hard_sigmoid.gradient
def _(g):  # dout * slope where 0 < out < 1, else 0
    dout, out = g.out_grad("Out"), g.output("Out")
    inside = _strictly_between(g, out, 0.0, 1.0)
    g.call("where", inside, g.call("scale", dout, scale=g.attr("slope")),
           g.call("fill_zeros_like", dout), out=g.in_grad("X"))


@op("hard_swish", **_FLOAT, attrs={"threshold": 6.0, "scale": 6.0, "offset": 3.0})
def hard_swish(X, *, threshold, scale, offset):
    """X * clip(X + offset, 0, threshold) / scale elementwise."""
    return (X * jnp.clip(X + offset, 0, threshold) / scale).astype(X.dtype)


@hard_swish.gradient
def _(g):  # dout * (clip(x + offset, 0, threshold) + x * [0 < x + offset < threshold]) / scale
    dout, x = g.out_grad("Out"), g.input("X")
    threshold = g.attr("threshold")
    shifted = g.call("scale", x, bias=g.attr("offset"))
    ramp = g.call("where", _strictly_between(g, shifted, 0.0, threshold), x,
                  g.call("fill_zeros_like", x))
    slope = g.call("add", g.call("clip", shifted, min=0.0, max=threshold), ramp)
    g.call("mul", dout, g.call("scale", slope, scale=1.0 / g.attr("scale")), out=g.in_grad("X"))


@op("mish", **_FLOAT, attrs={"threshold": 20.0})
def mish(X, *, threshold):
    """X * tanh(softplus(X)), softplus(X) taken as X where X > threshold."""
    return X * jnp.tanh(jnp.where(X > threshold, X, jax.nn.softplus(X)))


@mish.gradient
def _(g):  # dout * (t + x * (1 - t ** 2) * s'), t = tanh(softplus(x)), s' = sigmoid or 1
    dout, x = g.out_grad("Out"), g.input("X")
    threshold = g.attr("threshold")
    t = g.call("tanh", g.call("softplus", x, beta=1.0, threshold=threshold))
    linear = g.call("greater_than", x, full_like(g, x, threshold))
    softplus_slope = g.call("where", linear, full_like(g, x, 1.0), g.call("sigmoid", x))
    sech2 = g.call("scale", g.call("square", t), scale=-1.0, bias=1.0)
    slope = g.call("add", t, g.call("mul", x, g.call("mul", sech2, softplus_slope)))
    g.call("mul", dout, slope, out=g.in_grad("X"))
