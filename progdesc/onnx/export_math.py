"""Export rows: elementwise arithmetic, comparisons, logic, activations, reductions, casts."""
import math

import numpy as np

from lowering import dtypes
from progdesc.onnx.export_table import EXPORT
from progdesc.translate import Unsupported


def _same(onnx_type):
    def rule(e, *ins):
        return e.node(onnx_type, list(ins))
    rule.__name__ = rule.__qualname__ = onnx_type
    return rule


for _ours, _onnx in (("add", "Add"), ("sub", "Sub"), ("mul", "Mul"), ("div", "Div"),
                     ("pow", "Pow"), ("equal", "Equal"), ("greater_than", "Greater"),
                     ("greater_equal", "GreaterOrEqual"), ("less_than", "Less"),
                     ("less_equal", "LessOrEqual"), ("logical_and", "And"),
                     ("logical_or", "Or"), ("logical_not", "Not"), ("relu", "Relu"),
                     ("sigmoid", "Sigmoid"), ("tanh", "Tanh"), ("exp", "Exp"), ("log", "Log"),
                     ("sqrt", "Sqrt"), ("abs", "Abs"), ("neg", "Neg"), ("floor", "Floor"),
                     ("ceil", "Ceil"), ("sin", "Sin"), ("cos", "Cos"), ("tan", "Tan"),
                     ("asin", "Asin"), ("acos", "Acos"), ("atan", "Atan"), ("sinh", "Sinh"),
                     ("cosh", "Cosh"), ("asinh", "Asinh"), ("acosh", "Acosh"),
                     ("atanh", "Atanh"), ("erf", "Erf"), ("sign", "Sign"), ("assign", "Identity"),
                     ("where", "Where")):
    EXPORT.rule(_ours)(_same(_onnx))


@EXPORT.rule("sum")
def sum_(e, X):
    return e.node("Sum", list(X))


@EXPORT.rule("maximum")
def maximum(e, X, Y, *, ties="x"):
    return e.node("Max", [X, Y])


@EXPORT.rule("minimum")
def minimum(e, X, Y, *, ties="x"):
    return e.node("Min", [X, Y])


@EXPORT.rule("not_equal")
def not_equal(e, X, Y):
    return e.node("Not", [e.node("Equal", [X, Y])])


@EXPORT.rule("rem")
def rem(e, X, Y):
    return e.node("Mod", [X, Y], fmod=1)


@EXPORT.rule("rsqrt")
def rsqrt(e, X):
    return e.node("Reciprocal", [e.node("Sqrt", [X])])


@EXPORT.rule("square")
def square(e, X):
    return e.node("Mul", [X, X])


@EXPORT.rule("log1p")
def log1p(e, X, *, in_types):
    return e.node("Log", [e.node("Add", [X, e.scalar(1, in_types[0][1])])])


@EXPORT.rule("expm1")
def expm1(e, X, *, in_types):
    return e.node("Sub", [e.node("Exp", [X]), e.scalar(1, in_types[0][1])])


@EXPORT.rule("exp2")
def exp2(e, X, *, in_types):
    return e.node("Pow", [e.scalar(2, in_types[0][1]), X])


@EXPORT.rule("round")
def round_(e, X, *, rounding_method):
    if rounding_method != "to_nearest_even":
        raise Unsupported(f"rounding_method '{rounding_method}' (ONNX Round is half to even)")
    return e.node("Round", [X])


@EXPORT.rule("is_finite")
def is_finite(e, X):
    return e.node("Not", [e.node("Or", [e.node("IsInf", [X]), e.node("IsNaN", [X])])])


@EXPORT.rule("fill_zeros_like")
def fill_zeros_like(e, X, *, in_types):
    return e.node("Mul", [X, e.scalar(0, in_types[0][1])]) \
        if in_types[0][1] != "bool" else e.node("And", [X, e.scalar(False, "bool")])


@EXPORT.rule("increment")
def increment(e, X, *, step, in_types):
    return e.node("Add", [X, e.scalar(step, in_types[0][1])])


def _affine(e, x, factor, bias, bias_after_scale, dtype):
    """factor * x + bias (or factor * (x + bias)) in `dtype`, skipping the no-ops."""
    out = x
    if not bias_after_scale and bias:
        out = e.node("Add", [out, e.scalar(bias, dtype)])
    if factor != 1.0:
        out = e.node("Mul", [out, e.scalar(factor, dtype)])
    if bias_after_scale and bias:
        out = e.node("Add", [out, e.scalar(bias, dtype)])
    return out if out != x else e.node("Identity", [x])


@EXPORT.rule("scale")
def scale(e, X, *, scale, bias, bias_after_scale, in_types):
    dtype = in_types[0][1]
    if dtypes.kind_of(dtype) == "float" or all(float(v).is_integer() for v in (scale, bias)):
        return _affine(e, X, scale, bias, bias_after_scale, dtype)
    # fractions of integers: ours computes in float32 and casts back (toward zero), as Cast
    out = _affine(e, e.cast(X, "float32"), scale, bias, bias_after_scale, "float32")
    return e.cast(out, dtype)


@EXPORT.rule("cast")
def cast(e, X, *, dtype):
    return e.cast(X, dtype)


@EXPORT.rule("clip")
def clip(e, X, *, min, max, in_types):  # noqa: A002  (the attributes' names)
    dtype = in_types[0][1]
    return e.node("Clip", [X, e.scalar(min, dtype), e.scalar(max, dtype)])


@EXPORT.rule("integer_pow")
def integer_pow(e, X, *, y, in_types):
    if y == 2:
        return e.node("Mul", [X, X])
    return e.node("Pow", [X, e.scalar(y, in_types[0][1])])


@EXPORT.rule("select_n")
def select_n(e, Which, Cases, *, in_types):
    which_dtype = in_types[0][1]
    if which_dtype == "bool":
        if len(Cases) != 2:
            raise Unsupported("a bool Which with other than two cases")
        return e.node("Where", [Which, Cases[1], Cases[0]])
    out = Cases[-1]
    for i in range(len(Cases) - 2, -1, -1):
        out = e.node("Where", [e.node("Equal", [Which, e.scalar(i, which_dtype)]), Cases[i], out])
    return out


# --- activations ---

@EXPORT.rule("gelu")
def gelu(e, X, *, approximate, in_types):
    if e.opset >= 20:
        return e.node("Gelu", [X], approximate="tanh" if approximate else "none")
    dtype = in_types[0][1]
    half = e.node("Mul", [X, e.scalar(0.5, dtype)])
    if approximate:   # 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
        cube = e.node("Mul", [e.node("Mul", [X, X]), X])
        inner = e.node("Add", [X, e.node("Mul", [cube, e.scalar(0.044715, dtype)])])
        t = e.node("Tanh", [e.node("Mul", [inner, e.scalar(math.sqrt(2 / math.pi), dtype)])])
    else:             # 0.5 x (1 + erf(x / sqrt(2)))
        t = e.node("Erf", [e.node("Mul", [X, e.scalar(1 / math.sqrt(2), dtype)])])
    return e.node("Mul", [half, e.node("Add", [t, e.scalar(1, dtype)])])


@EXPORT.rule("silu")
def silu(e, X):
    return e.node("Mul", [X, e.node("Sigmoid", [X])])


@EXPORT.rule("leaky_relu")
def leaky_relu(e, X, *, alpha):
    return e.node("LeakyRelu", [X], alpha=float(alpha))


@EXPORT.rule("relu6")
def relu6(e, X, *, threshold, in_types):
    dtype = in_types[0][1]
    return e.node("Clip", [X, e.scalar(0, dtype), e.scalar(threshold, dtype)])


@EXPORT.rule("hard_sigmoid")
def hard_sigmoid(e, X, *, slope, offset):
    return e.node("HardSigmoid", [X], alpha=float(slope), beta=float(offset))


@EXPORT.rule("hard_swish")
def hard_swish(e, X, *, threshold, scale, offset, in_types):
    dtype = in_types[0][1]
    gate = e.node("Clip", [e.node("Add", [X, e.scalar(offset, dtype)]), e.scalar(0, dtype),
                           e.scalar(threshold, dtype)])
    return e.node("Div", [e.node("Mul", [X, gate]), e.scalar(scale, dtype)])


def _softplus(e, X, beta, threshold, dtype):
    """where(beta x > threshold, x, softplus(beta x) / beta)."""
    xb = X if beta == 1.0 else e.node("Mul", [X, e.scalar(beta, dtype)])
    soft = e.node("Softplus", [xb])
    if beta != 1.0:
        soft = e.node("Div", [soft, e.scalar(beta, dtype)])
    return e.node("Where", [e.node("Greater", [xb, e.scalar(threshold, dtype)]), X, soft])


@EXPORT.rule("softplus")
def softplus(e, X, *, beta, threshold, in_types):
    return _softplus(e, X, beta, threshold, in_types[0][1])


@EXPORT.rule("mish")
def mish(e, X, *, threshold, in_types):
    return e.node("Mul", [X, e.node("Tanh", [_softplus(e, X, 1.0, threshold, in_types[0][1])])])


@EXPORT.rule("softmax")
def softmax(e, X, *, axis):
    return e.node("Softmax", [X], axis=axis)


@EXPORT.rule("log_softmax")
def log_softmax(e, X, *, axis):
    return e.node("LogSoftmax", [X], axis=axis)


# --- reductions ---

def _reduction(onnx_type):
    def rule(e, X, *, axis, keep_dim):
        return e.reduce(onnx_type, X, axis, keep_dim)
    rule.__name__ = rule.__qualname__ = onnx_type
    return rule


for _ours, _onnx in (("reduce_sum", "ReduceSum"), ("reduce_mean", "ReduceMean"),
                     ("mean", "ReduceMean"),
                     ("reduce_max", "ReduceMax"), ("reduce_min", "ReduceMin"),
                     ("reduce_prod", "ReduceProd")):
    EXPORT.rule(_ours)(_reduction(_onnx))


def _bool_reduction(onnx_type):
    def rule(e, X, *, axis, keep_dim):   # over 0/1 integers: min is all, max is any
        out = e.reduce(onnx_type, e.cast(X, "int32"), axis, keep_dim)
        return e.cast(out, "bool")
    rule.__name__ = rule.__qualname__ = onnx_type
    return rule


EXPORT.rule("reduce_all")(_bool_reduction("ReduceMin"))
EXPORT.rule("reduce_any")(_bool_reduction("ReduceMax"))


def _arg_rule(onnx_type):
    def rule(e, X, *, axis, keep_dim, dtype):
        out = e.node(onnx_type, [X], axis=axis, keepdims=int(bool(keep_dim)))
        return out if dtype == "int64" else e.cast(out, dtype)
    rule.__name__ = rule.__qualname__ = onnx_type
    return rule


EXPORT.rule("argmax")(_arg_rule("ArgMax"))
EXPORT.rule("argmin")(_arg_rule("ArgMin"))


@EXPORT.rule("cumsum")
def cumsum(e, X, *, axis, reverse):
    return e.node("CumSum", [X, e.const(np.int64(axis))], reverse=int(bool(reverse)))


def _bitwise(onnx_type):
    def rule(e, *ins):
        if e.opset < 18:
            raise Unsupported(f"{onnx_type} needs opset 18")
        return e.node(onnx_type, list(ins))
    rule.__name__ = rule.__qualname__ = onnx_type
    return rule


for _ours, _onnx in (("bitwise_and", "BitwiseAnd"), ("bitwise_or", "BitwiseOr"),
                     ("bitwise_xor", "BitwiseXor"), ("bitwise_not", "BitwiseNot")):
    EXPORT.rule(_ours)(_bitwise(_onnx))


@EXPORT.rule("cbrt")
def cbrt(e, X, *, in_types):
    third = e.scalar(1 / 3, in_types[0][1])
    return e.node("Mul", [e.node("Sign", [X]), e.node("Pow", [e.node("Abs", [X]), third])])


@EXPORT.rule("dot_general")
def dot_general(e, X, Y, *, lhs_contracting, rhs_contracting, lhs_batch, rhs_batch,
                in_types):
    """Einsum: batch dims, then X's free dims, then Y's, as lax.dot_general orders them."""
    (x_dims, _), (y_dims, _) = in_types
    letters = iter("abcdefghijklmnopqrstuvwxyz")
    x_sub, y_sub = [None] * len(x_dims), [None] * len(y_dims)
    for i, j in list(zip(lhs_batch, rhs_batch)) + list(zip(lhs_contracting, rhs_contracting)):
        x_sub[i] = y_sub[j] = next(letters)
    for sub in (x_sub, y_sub):
        for i, s in enumerate(sub):
            sub[i] = s or next(letters)
    out = ([x_sub[i] for i in lhs_batch]
           + [s for i, s in enumerate(x_sub) if i not in lhs_batch and i not in lhs_contracting]
           + [s for i, s in enumerate(y_sub) if i not in rhs_batch and i not in rhs_contracting])
    equation = f"{''.join(x_sub)},{''.join(y_sub)}->{''.join(out)}"
    return e.node("Einsum", [X, Y], equation=equation)


@EXPORT.rule("reduce_as")
def reduce_as(e, X, Target, *, in_types):
    (x_dims, _), (t_dims, _) = in_types
    lead = len(x_dims) - len(t_dims)
    inner = [lead + i for i, (x, t) in enumerate(zip(x_dims[lead:], t_dims)) if t == 1 and x != 1]
    if any(t == -1 and x != -1 for x, t in zip(x_dims[lead:], t_dims)):
        raise Unsupported("reduce_as to a shape with dims of unknown size")
    out = e.reduce("ReduceSum", X, inner, True) if inner else X
    out = e.reduce("ReduceSum", out, list(range(lead)), False) if lead else out
    return out if out != X else e.node("Identity", [X])


@EXPORT.rule("trunc_div")
def trunc_div(e, X, Y):   # integers: ONNX Div truncates toward zero, as ours
    return e.node("Div", [X, Y])
