"""Elementwise arithmetic, comparison, logic, activations, casts (the family's
reductions are in `rules_reduce`, Einsum and Det in `rules_linalg`).

Integer and bool inputs keep ONNX's meaning: Div of integers truncates toward zero, Mod
follows the divisor's sign unless `fmod=1`, Pow of integers is exact for whole results.
"""
import numpy as np

from lowering import dtypes
from lowering.errors import FormatError
from progdesc.onnx import model as onnx_model
from progdesc.onnx import rules_linalg, rules_reduce  # noqa: F401  (their rows)
from progdesc.onnx.table import RULES
from progdesc.translate import Unsupported

_UNARY = (("Neg", "neg"), ("Abs", "abs"), ("Sign", "sign"), ("Floor", "floor"),
          ("Ceil", "ceil"), ("Sqrt", "sqrt"), ("Exp", "exp"), ("Log", "log"),
          ("Erf", "erf"), ("Sin", "sin"), ("Cos", "cos"), ("Tan", "tan"), ("Asin", "asin"),
          ("Acos", "acos"), ("Atan", "atan"), ("Sinh", "sinh"), ("Cosh", "cosh"),
          ("Asinh", "asinh"), ("Acosh", "acosh"), ("Atanh", "atanh"), ("Tanh", "tanh"),
          ("Sigmoid", "sigmoid"), ("Not", "logical_not"))
_BINARY = (("Add", "add"), ("Sub", "sub"), ("Mul", "mul"), ("Equal", "equal"),
           ("Less", "less_than"), ("LessOrEqual", "less_equal"),
           ("Greater", "greater_than"), ("GreaterOrEqual", "greater_equal"),
           ("And", "logical_and"), ("Or", "logical_or"), ("Xor", "not_equal"),
           ("Where", "where"))
_BITWISE = (("BitwiseNot", "bitwise_not"), ("BitwiseAnd", "bitwise_and"),
            ("BitwiseOr", "bitwise_or"), ("BitwiseXor", "bitwise_xor"))   # opset 18 on
for _onnx, _ours in _UNARY + _BINARY:
    RULES.rename(_onnx, _ours, since=13)
for _onnx, _ours in _BITWISE:
    RULES.rename(_onnx, _ours, since=18)


def dtype_of(t, x):
    """Our dtype name of our variable `x`."""
    return t.var(x)[1]


def is_float(t, x):
    """Whether our variable `x` holds floating-point numbers."""
    return dtypes.kind_of(dtype_of(t, x)) == "float"


def full_like(t, x, value):
    """A 0-D constant `value` in the dtype of our variable `x`."""
    return t.constant(np.asarray(value, dtype=onnx_model.as_numpy_dtype(dtype_of(t, x))))


def _scalar(t, x):
    """The value of `x` if it is a 0-D (or one-element) constant known at import."""
    value = t.value_of(x)
    return value.reshape(-1)[0] if value is not None and value.size == 1 else None


def _where(t, cond, a, b):
    return t.call("where", cond, a, b)


# --- arithmetic ---
@RULES.rule("Div", since=13)
def div(t, x, y):
    return t.call("div" if is_float(t, x) else "trunc_div", x, y)


@RULES.rule("Mod", since=13)
def mod(t, x, y, *, fmod=0):
    rem = t.call("rem", x, y)   # the sign of x (C's fmod)
    if fmod:
        return rem
    zero = full_like(t, x, 0)   # the sign of y, as Python's %
    off = t.call("logical_and", t.call("not_equal", rem, zero),
                 t.call("not_equal", t.call("less_than", rem, zero),
                        t.call("less_than", y, zero)))
    return _where(t, off, t.call("add", rem, y), rem)


@RULES.rule("Pow", since=13)
def pow_(t, x, y):
    exponent = _scalar(t, y)
    whole = (exponent is not None and np.isfinite(exponent) and float(exponent).is_integer()
             and abs(exponent) <= 64)
    if whole and (is_float(t, x) or exponent >= 0):
        return t.call("integer_pow", x, y=int(exponent))
    if is_float(t, x):
        if dtype_of(t, y) != dtype_of(t, x):
            y = t.call("cast", y, dtype=dtype_of(t, x))
        return t.call("pow", x, y)
    out = t.call("pow", t.call("cast", x, dtype="float32"),
                 y if dtype_of(t, y) == "float32" else t.call("cast", y, dtype="float32"))
    if not is_float(t, y):   # a whole power of a whole number: exact, not truncated
        out = t.call("round", out)
    return t.call("cast", out, dtype=dtype_of(t, x))


@RULES.rule("Reciprocal", since=13)
def reciprocal(t, x):
    return t.call("div", full_like(t, x, 1), x)


@RULES.rule("Round", since=13)
def round_(t, x):
    return t.call("round", x, rounding_method="to_nearest_even")


@RULES.rule("IsNaN", since=13)
def isnan(t, x):
    return t.call("not_equal", x, x)


@RULES.rule("IsInf", since=13)
def isinf(t, x, *, detect_positive=1, detect_negative=1):
    if detect_positive and detect_negative:
        return t.call("equal", t.call("abs", x), full_like(t, x, np.inf))
    if detect_positive:
        return t.call("equal", x, full_like(t, x, np.inf))
    if detect_negative:
        return t.call("equal", x, full_like(t, x, -np.inf))
    return t.call("equal", x, full_like(t, x, np.nan))   # nothing is detected


@RULES.rule("BitShift", since=13)
def bitshift(t, x, y, *, direction):
    if direction == "LEFT":
        return t.call("shift_left", x, y)
    if direction == "RIGHT":   # signed (opset 28): the sign fills in
        signed = onnx_model.as_numpy_dtype(dtype_of(t, x)).kind == "i"
        return t.call("shift_right_arithmetic" if signed else "shift_right_logical", x, y)
    raise Unsupported(f"direction {direction!r} is neither 'LEFT' nor 'RIGHT'")


def _fold(t, op, xs):
    out = xs[0]
    for x in xs[1:]:
        out = t.call(op, out, x)
    return out


@RULES.rule("Min", since=13)
def min_(t, *xs):
    return _fold(t, "minimum", xs)


@RULES.rule("Max", since=13)
def max_(t, *xs):
    return _fold(t, "maximum", xs)


@RULES.rule("Sum", since=13)
def sum_(t, *xs):
    return _fold(t, "add", xs)


@RULES.rule("Mean", since=13)
def mean(t, *xs):
    total = _fold(t, "add", xs)
    return t.call("scale", total, scale=1.0 / len(xs)) if len(xs) > 1 else total


@RULES.rule("Clip", since=13)
def clip(t, x, lo=None, hi=None):
    lo_v, hi_v = _scalar(t, lo), _scalar(t, hi)
    if is_float(t, x) and (lo is None or lo_v is not None) and (hi is None or hi_v is not None):
        lo_f = -np.inf if lo is None else float(lo_v)
        hi_f = np.inf if hi is None else float(hi_v)
        if np.isfinite(lo_f) and np.isfinite(hi_f):
            return t.call("clip", x, min=lo_f, max=hi_f)
    if lo is not None:
        x = t.call("maximum", x, lo)
    if hi is not None:
        x = t.call("minimum", x, hi)
    return x


# --- casts ---
def _cast_to(t, x, dtype):
    return x if dtype_of(t, x) == dtype else t.call("cast", x, dtype=dtype)


@RULES.rule("Cast", since=13)
def cast(t, x, *, to):   # saturate, round_mode: for float8 targets, which are refused
    try:
        dtype = onnx_model.dtype_name(to)
    except FormatError as e:   # strings, float8, int4, uint16...
        raise Unsupported(f"cast to {e}") from None
    return _cast_to(t, x, dtype)


@RULES.rule("CastLike", since=15)
def castlike(t, x, like):
    dtype = dtype_of(t, like)
    return _cast_to(t, x, dtype)


# --- activations ---
@RULES.rule("Relu", since=13)
def relu(t, x):
    return t.call("relu", x) if is_float(t, x) else t.call("maximum", x, full_like(t, x, 0))


@RULES.rule("LeakyRelu", since=13)
def leaky_relu(t, x, *, alpha=0.01):
    return t.call("leaky_relu", x, alpha=float(alpha))


@RULES.rule("PRelu", since=13)
def prelu(t, x, slope):
    neg = t.call("less_than", x, full_like(t, x, 0))
    return _where(t, neg, t.call("mul", x, slope), x)


def _negative_part(t, x):
    """min(x, 0): what exp is taken of where x <= 0 (no overflow in the branch `where`
    drops, whose gradient would be 0 * inf)."""
    return t.call("minimum", x, full_like(t, x, 0))


def _elu(t, x, alpha):
    """x where x > 0, else alpha * (exp(x) - 1)."""
    pos = t.call("greater_than", x, full_like(t, x, 0))
    inner = t.call("expm1", _negative_part(t, x))
    return _where(t, pos, x, t.call("scale", inner, scale=float(alpha)))


@RULES.rule("Elu", since=13)
def elu(t, x, *, alpha=1.0):
    return _elu(t, x, alpha)


@RULES.rule("Selu", since=13)
def selu(t, x, *, alpha=1.67326319217681884765625, gamma=1.05070102214813232421875):
    return t.call("scale", _elu(t, x, alpha), scale=float(gamma))


@RULES.rule("Celu", since=13)
def celu(t, x, *, alpha=1.0):
    if alpha == 0:
        raise Unsupported("alpha 0 (Celu divides by it)")
    inner = t.call("scale", t.call("expm1", t.call("scale", _negative_part(t, x),
                                                    scale=1.0 / alpha)), scale=float(alpha))
    pos = t.call("greater_than", x, full_like(t, x, 0))
    return _where(t, pos, x, inner)


@RULES.rule("ThresholdedRelu", since=13)
def thresholded_relu(t, x, *, alpha=1.0):
    keep = t.call("greater_than", x, full_like(t, x, alpha))
    return _where(t, keep, x, full_like(t, x, 0))


@RULES.rule("HardSigmoid", since=13)
def hard_sigmoid(t, x, *, alpha=0.2, beta=0.5):
    return t.call("hard_sigmoid", x, slope=float(alpha), offset=float(beta))


@RULES.rule("HardSwish", since=14)
def hard_swish(t, x):
    return t.call("hard_swish", x, threshold=6.0, scale=6.0, offset=3.0)


@RULES.rule("Softplus", since=13)
def softplus(t, x):
    return t.call("softplus", x, beta=1.0, threshold=20.0)


@RULES.rule("Softsign", since=13)
def softsign(t, x):
    return t.call("div", x, t.call("scale", t.call("abs", x), bias=1.0))


@RULES.rule("Gelu", since=20)
def gelu(t, x, *, approximate="none"):
    if approximate not in ("none", "tanh"):
        raise Unsupported(f"approximate {approximate!r} is neither 'none' nor 'tanh'")
    return t.call("gelu", x, approximate=approximate == "tanh")


@RULES.rule("Mish", since=18)
def mish(t, x):
    return t.call("mish", x)


@RULES.rule("Shrink", since=13)
def shrink(t, x, *, bias=0.0, lambd=0.5):
    low = t.call("less_than", x, full_like(t, x, -lambd))
    high = t.call("greater_than", x, full_like(t, x, lambd))
    zero = full_like(t, x, 0)
    return _where(t, low, t.call("add", x, full_like(t, x, bias)),
                  _where(t, high, t.call("sub", x, full_like(t, x, bias)), zero))


@RULES.rule("Swish", since=24)
def swish(t, x, *, alpha=1.0):
    if alpha == 1.0:
        return t.call("silu", x)
    return t.call("mul", x, t.call("sigmoid", t.call("scale", x, scale=float(alpha))))


# --- rows kept from the skeleton ---
@RULES.rule("MatMul")
def matmul(t, a, b):
    return t.call("matmul", a, b)


@RULES.rule("Identity")
def identity(t, x):
    return x
