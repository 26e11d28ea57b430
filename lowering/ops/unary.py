"""Elementwise unary math (with the `lax` primitives integer_pow, erf, erfc, sin, cos, tan,
their inverses and hyperbolic kin, log1p, expm1, exp2, cbrt, lgamma, digamma, polygamma, sign,
floor, ceil, round), n-ary `sum`, `cast` and `assign`.

Gradients reuse the forward output where it is at hand (exp, sqrt, rsqrt) and
write nothing for integer or bool inputs. `full_like` is the helper other
families use to build constants of a variable's shape in gradient makers.
"""
import functools
import math

import jax.numpy as jnp
from jax import lax

from lowering import dtypes
from lowering.constraints import non_negative, one_of
from lowering.registry import REQUIRED, Attr, In, Out, op

_FLOAT = dict(inputs=[In("X", "float")], outputs=[Out("Out")])
_NUMBER = dict(inputs=[In("X", "number")], outputs=[Out("Out")])


def full_like(g, like, value):
    """Emit ops filling an array of `like`'s shape and dtype with `value`; returns its name."""
    return g.call("scale", g.call("fill_zeros_like", like), bias=float(value))


def is_float(g, name):
    """Whether variable `name` has a floating-point dtype."""
    return dtypes.kind_of(g.var(name)[1]) == "float"


@op("scale", **_NUMBER, attrs={"scale": 1.0, "bias": 0.0, "bias_after_scale": True})
def scale(X, *, scale, bias, bias_after_scale):
    """scale * X + bias, or scale * (X + bias) when bias_after_scale is False; keeps X's dtype."""
    out = X * scale + bias if bias_after_scale else (X + bias) * scale
    return out.astype(X.dtype)


@scale.gradient
def _(g):
    g.call("scale", g.out_grad("Out"), scale=g.attr("scale"), out=g.in_grad("X"))


@op("neg", **_NUMBER)
def neg(X):
    """-X elementwise."""
    return jnp.negative(X)


@neg.gradient
def _(g):
    g.call("neg", g.out_grad("Out"), out=g.in_grad("X"))


@op("abs", **_NUMBER)
def abs_(X):
    """|X| elementwise."""
    return jnp.abs(X)


@abs_.gradient
def _(g):  # sign(x) * dout, with x == 0 counted as positive (as jax does)
    dout, x = g.out_grad("Out"), g.input("X")
    nonneg = g.call("greater_equal", x, g.call("fill_zeros_like", x))
    g.call("where", nonneg, dout, g.call("neg", dout), out=g.in_grad("X"))


@op("exp", **_FLOAT)
def exp(X):
    """e ** X elementwise."""
    return jnp.exp(X)


@exp.gradient
def _(g):
    g.call("mul", g.out_grad("Out"), g.output("Out"), out=g.in_grad("X"))


@op("log", **_FLOAT)
def log(X):
    """Natural logarithm elementwise."""
    return jnp.log(X)


@log.gradient
def _(g):
    g.call("div", g.out_grad("Out"), g.input("X"), out=g.in_grad("X"))


@op("sqrt", **_FLOAT)
def sqrt(X):
    """Square root elementwise."""
    return jnp.sqrt(X)


@sqrt.gradient
def _(g):  # 0.5 / out
    g.call("div", g.call("scale", g.out_grad("Out"), scale=0.5), g.output("Out"),
           out=g.in_grad("X"))


@op("rsqrt", **_FLOAT)
def rsqrt(X):
    """1 / sqrt(X) elementwise."""
    return lax.rsqrt(X)


@rsqrt.gradient
def _(g):  # -0.5 * x ** -1.5 = -0.5 * out / x
    ratio = g.call("div", g.output("Out"), g.input("X"))
    g.call("scale", g.call("mul", g.out_grad("Out"), ratio), scale=-0.5, out=g.in_grad("X"))


@op("square", **_NUMBER)
def square(X):
    """X * X elementwise."""
    return jnp.square(X)


@square.gradient
def _(g):
    g.call("scale", g.call("mul", g.out_grad("Out"), g.input("X")), scale=2.0,
           out=g.in_grad("X"))


@op("clip", **_NUMBER, attrs={"min": Attr("min", "float"), "max": Attr("max", "float")})
def clip(X, *, min, max):  # noqa: A002  (the attributes' names)
    """X limited to [min, max] elementwise; keeps X's dtype."""
    return jnp.clip(X, min, max).astype(X.dtype)


@clip.gradient
def _(g):  # the gradient passes where min <= x <= max, i.e. where clipping left x unchanged
    dout, x = g.out_grad("Out"), g.input("X")
    inside = g.call("equal", g.output("Out"), x)
    g.call("where", inside, dout, g.call("fill_zeros_like", dout), out=g.in_grad("X"))


@op("sum", inputs=[In("X", "number", many=True)], outputs=[Out("Out")], same_dtype=("X",))
def sum_(X):
    """Elementwise sum of all arrays in X (same shape and dtype, no broadcasting)."""
    return functools.reduce(lax.add, X)


@sum_.gradient
def _(g):
    dout = g.out_grad("Out")
    for i in range(len(g.input_list("X"))):
        g.pass_through("X", dout, i)


@op("cast", inputs=[In("X")], outputs=[Out("Out")],
    attrs={"dtype": Attr("dtype", "dtype", doc="element type of the result")})
def cast(X, *, dtype):
    """X converted to `dtype`."""
    return X.astype(dtypes.to_numpy(dtype))


@cast.gradient
def _(g):
    x, target = g.input("X"), g.in_grad("X")
    if not target or not is_float(g, x):
        return
    if is_float(g, g.output("Out")):
        g.call("cast", g.out_grad("Out"), dtype=g.var(x)[1], out=target)
    else:  # a float cast to int or bool: nothing flows back
        g.call("fill_zeros_like", x, out=target)


@op("assign", inputs=[In("X")], outputs=[Out("Out")])
def assign(X):
    """A copy of X."""
    return X


@assign.gradient
def _(g):
    if g.in_grad("X") and is_float(g, g.input("X")):
        g.pass_through("X", g.out_grad("Out"))


@op("integer_pow", **_NUMBER, attrs={"y": Attr("y", "int", REQUIRED)})
def integer_pow(X, *, y):
    """X ** y elementwise for a whole (possibly negative) exponent `y`; keeps X's dtype."""
    return lax.integer_pow(X, y)


@integer_pow.gradient
def _(g):  # y * x ** (y - 1)
    x, y = g.input("X"), g.attr("y")
    slope = g.call("scale", g.call("integer_pow", x, y=y - 1), scale=float(y))
    g.call("mul", g.out_grad("Out"), slope, out=g.in_grad("X"))


@op("erf", **_FLOAT)
def erf(X):
    """The error function elementwise."""
    return lax.erf(X)


@op("erfc", **_FLOAT)
def erfc(X):
    """The complementary error function 1 - erf(X) elementwise, accurate for large X."""
    return lax.erfc(X)


@op("erf_inv", **_FLOAT)
def erf_inv(X):
    """The inverse error function elementwise (X in (-1, 1)), as JAX's normal draws use it."""
    return lax.erf_inv(X)


@erf_inv.gradient
def _(g):  # sqrt(pi) / 2 * exp(y ** 2), y = erf_inv(x)
    bell = g.call("exp", g.call("square", g.output("Out")))
    g.call("mul", g.out_grad("Out"), g.call("scale", bell, scale=math.sqrt(math.pi) / 2.0),
           out=g.in_grad("X"))


@erf.gradient
@erfc.gradient
def _(g):  # +-2 / sqrt(pi) * exp(-x ** 2)
    sign = 1.0 if g.opdef.type == "erf" else -1.0
    bell = g.call("exp", g.call("scale", g.call("square", g.input("X")), scale=-1.0))
    g.call("mul", g.out_grad("Out"), g.call("scale", bell, scale=sign * 2.0 / math.sqrt(math.pi)),
           out=g.in_grad("X"))


@op("sin", **_FLOAT)
def sin(X):
    """Sine elementwise."""
    return jnp.sin(X)


@sin.gradient
def _(g):
    g.call("mul", g.out_grad("Out"), g.call("cos", g.input("X")), out=g.in_grad("X"))


@op("cos", **_FLOAT)
def cos(X):
    """Cosine elementwise."""
    return jnp.cos(X)


@cos.gradient
def _(g):
    g.call("mul", g.out_grad("Out"), g.call("neg", g.call("sin", g.input("X"))),
           out=g.in_grad("X"))


@op("log1p", **_FLOAT)
def log1p(X):
    """log(1 + X) elementwise, accurate for small X."""
    return jnp.log1p(X)


@log1p.gradient
def _(g):
    g.call("div", g.out_grad("Out"), g.call("scale", g.input("X"), bias=1.0), out=g.in_grad("X"))


@op("expm1", **_FLOAT)
def expm1(X):
    """exp(X) - 1 elementwise, accurate for small X."""
    return jnp.expm1(X)


@expm1.gradient
def _(g):  # exp(x) = out + 1
    g.call("mul", g.out_grad("Out"), g.call("scale", g.output("Out"), bias=1.0),
           out=g.in_grad("X"))


@op("sign", **_NUMBER)
def sign(X):
    """-1, 0 or 1 elementwise, as X is negative, zero or positive; keeps X's dtype."""
    return jnp.sign(X)


@sign.gradient
def _(g):  # zero almost everywhere, as in JAX
    if g.in_grad("X") and is_float(g, g.input("X")):
        g.call("fill_zeros_like", g.input("X"), out=g.in_grad("X"))


@op("floor", **_FLOAT)
def floor(X):
    """The largest whole number <= X elementwise."""
    return jnp.floor(X)


@floor.gradient
def _(g):  # zero almost everywhere, as in JAX
    g.call("fill_zeros_like", g.input("X"), out=g.in_grad("X"))


@op("tan", **_FLOAT)
def tan(X):
    """Tangent elementwise."""
    return jnp.tan(X)


@tan.gradient
def _(g):  # 1 + tan(x) ** 2
    slope = g.call("scale", g.call("square", g.output("Out")), bias=1.0)
    g.call("mul", g.out_grad("Out"), slope, out=g.in_grad("X"))


@op("exp2", **_FLOAT)
def exp2(X):
    """2 ** X elementwise."""
    return jnp.exp2(X)


@exp2.gradient
def _(g):  # log(2) * out
    g.call("mul", g.out_grad("Out"), g.call("scale", g.output("Out"), scale=math.log(2.0)),
           out=g.in_grad("X"))


# --- inverse and hyperbolic trigonometry, cube roots ---

def _one_minus_square(g, x):
    return g.call("scale", g.call("square", x), scale=-1.0, bias=1.0)


@op("asin", **_FLOAT)
def asin(X):
    """Arcsine elementwise, in [-pi/2, pi/2]."""
    return jnp.arcsin(X)


@op("acos", **_FLOAT)
def acos(X):
    """Arccosine elementwise, in [0, pi]."""
    return jnp.arccos(X)


@asin.gradient
@acos.gradient
def _(g):  # +-1 / sqrt(1 - x ** 2)
    slope = g.call("rsqrt", _one_minus_square(g, g.input("X")))
    if g.opdef.type == "acos":
        slope = g.call("neg", slope)
    g.call("mul", g.out_grad("Out"), slope, out=g.in_grad("X"))


@op("atan", **_FLOAT)
def atan(X):
    """Arctangent elementwise, in (-pi/2, pi/2)."""
    return jnp.arctan(X)


@atan.gradient
def _(g):  # 1 / (1 + x ** 2)
    g.call("div", g.out_grad("Out"), g.call("scale", g.call("square", g.input("X")), bias=1.0),
           out=g.in_grad("X"))


@op("sinh", **_FLOAT)
def sinh(X):
    """Hyperbolic sine elementwise."""
    return jnp.sinh(X)


@op("cosh", **_FLOAT)
def cosh(X):
    """Hyperbolic cosine elementwise."""
    return jnp.cosh(X)


@sinh.gradient
@cosh.gradient
def _(g):  # sinh' = cosh, cosh' = sinh
    other = "cosh" if g.opdef.type == "sinh" else "sinh"
    g.call("mul", g.out_grad("Out"), g.call(other, g.input("X")), out=g.in_grad("X"))


@op("asinh", **_FLOAT)
def asinh(X):
    """Inverse hyperbolic sine elementwise."""
    return jnp.arcsinh(X)


@op("acosh", **_FLOAT)
def acosh(X):
    """Inverse hyperbolic cosine elementwise (X >= 1)."""
    return jnp.arccosh(X)


@asinh.gradient
@acosh.gradient
def _(g):  # 1 / sqrt(x ** 2 +- 1)
    bias = 1.0 if g.opdef.type == "asinh" else -1.0
    slope = g.call("rsqrt", g.call("scale", g.call("square", g.input("X")), bias=bias))
    g.call("mul", g.out_grad("Out"), slope, out=g.in_grad("X"))


@op("atanh", **_FLOAT)
def atanh(X):
    """Inverse hyperbolic tangent elementwise (-1 < X < 1)."""
    return jnp.arctanh(X)


@atanh.gradient
def _(g):  # 1 / (1 - x ** 2)
    g.call("div", g.out_grad("Out"), _one_minus_square(g, g.input("X")), out=g.in_grad("X"))


@op("cbrt", **_FLOAT)
def cbrt(X):
    """The real cube root elementwise (negative for negative X)."""
    return jnp.cbrt(X)


@cbrt.gradient
def _(g):  # 1 / (3 * out ** 2)
    slope = g.call("scale", g.call("integer_pow", g.output("Out"), y=-2), scale=1.0 / 3.0)
    g.call("mul", g.out_grad("Out"), slope, out=g.in_grad("X"))


# --- rounding ---

@op("ceil", **_FLOAT)
def ceil(X):
    """The smallest whole number >= X elementwise."""
    return jnp.ceil(X)


_ROUNDING = {"away_from_zero": lax.RoundingMethod.AWAY_FROM_ZERO,
             "to_nearest_even": lax.RoundingMethod.TO_NEAREST_EVEN}


@op("round", **_FLOAT, attrs={"rounding_method": Attr(
    "rounding_method", "string", "to_nearest_even", "how halves round: to_nearest_even "
    "(numpy.round, jnp.round) or away_from_zero (lax.round's default)",
    where=one_of(*_ROUNDING))})
def round_(X, *, rounding_method):
    """X rounded to whole numbers elementwise."""
    return lax.round(X, _ROUNDING[rounding_method])


@ceil.gradient
@round_.gradient
def _(g):  # zero almost everywhere, as in JAX
    g.call("fill_zeros_like", g.input("X"), out=g.in_grad("X"))


# --- the gamma function's logarithm and its derivatives ---

@op("lgamma", **_FLOAT)
def lgamma(X):
    """log |Gamma(X)| elementwise."""
    return lax.lgamma(X)


@lgamma.gradient
def _(g):
    g.call("mul", g.out_grad("Out"), g.call("digamma", g.input("X")), out=g.in_grad("X"))


@op("digamma", **_FLOAT)
def digamma(X):
    """The derivative of lgamma elementwise."""
    return lax.digamma(X)


@digamma.gradient
def _(g):
    g.call("mul", g.out_grad("Out"), g.call("polygamma", g.input("X"), order=1),
           out=g.in_grad("X"))


@op("polygamma", **_FLOAT, attrs={"order": Attr(
    "order", "int", REQUIRED, "the derivative of digamma taken (0: digamma)", where=non_negative)})
def polygamma(X, *, order):
    """The `order`-th derivative of digamma elementwise."""
    return lax.polygamma(jnp.asarray(order, X.dtype), X)


@polygamma.gradient
def _(g):
    g.call("mul", g.out_grad("Out"),
           g.call("polygamma", g.input("X"), order=g.attr("order") + 1), out=g.in_grad("X"))
