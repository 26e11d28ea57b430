"""Samples of lowering/ops/unary.py."""
import math

import numpy as np
import scipy.special

from op_table import Sample, positive, rand

_ints = np.array([[3, -2, 0], [7, 1, -5]], dtype=np.int32)


def _scale_ref(X, scale, bias, bias_after_scale):
    out = X * scale + bias if bias_after_scale else (X + bias) * scale
    return np.asarray(out).astype(X.dtype)


SAMPLES = [
    Sample("scale", {"X": rand(3, 4)}, _scale_ref,
           {"scale": 2.5, "bias": -0.5, "bias_after_scale": True}, name="bias_after"),
    Sample("scale", {"X": rand(2, 3, 2)}, _scale_ref,
           {"scale": -1.5, "bias": 0.25, "bias_after_scale": False}, name="bias_before"),
    Sample("scale", {"X": rand(4)}, _scale_ref, {"scale": 1.0, "bias": 0.0,
                                                  "bias_after_scale": True}, name="defaults"),
    Sample("scale", {"X": _ints}, _scale_ref, {"scale": 3.0, "bias": 1.0, "bias_after_scale": True},
           name="int_keeps_dtype"),
    Sample("neg", {"X": rand(3, 4)}, lambda X: -X),
    Sample("neg", {"X": _ints}, lambda X: -X, name="int"),
    Sample("abs", {"X": rand(3, 4)}, lambda X: np.abs(X)),
    Sample("abs", {"X": _ints}, lambda X: np.abs(X), name="int"),
    Sample("exp", {"X": rand(3, 4)}, lambda X: np.exp(X)),
    Sample("exp", {"X": rand(2, 5, dtype="float64")}, lambda X: np.exp(X), name="float64"),
    Sample("log", {"X": positive(3, 4)}, lambda X: np.log(X)),
    Sample("sqrt", {"X": positive(3, 4)}, lambda X: np.sqrt(X)),
    Sample("rsqrt", {"X": positive(3, 4)}, lambda X: (1 / np.sqrt(X)).astype(X.dtype)),
    Sample("square", {"X": rand(3, 4)}, lambda X: np.square(X)),
    Sample("square", {"X": _ints}, lambda X: np.square(X), name="int"),
    Sample("clip", {"X": rand(4, 5)}, lambda X, min, max: np.clip(X, min, max),
           {"min": -0.5, "max": 0.25}),
    Sample("clip", {"X": rand(3, 4)}, lambda X, min, max: np.clip(X, min, max),
           {"min": -2.0, "max": 2.0}, name="nothing_clipped"),
    Sample("clip", {"X": _ints}, lambda X, min, max: np.clip(X, -1, 2).astype(X.dtype),
           {"min": -1.0, "max": 2.0}, name="int"),
    Sample("sum", {"X": [rand(3, 4), rand(3, 4, seed=1), rand(3, 4, seed=2)]},
           lambda X: X[0] + X[1] + X[2], name="three"),
    Sample("sum", {"X": [rand(2, 3)]}, lambda X: X[0], name="one"),
    Sample("sum", {"X": [_ints, _ints * 2]}, lambda X: X[0] + X[1], name="int"),
    Sample("cast", {"X": rand(3, 4)}, lambda X, dtype: X.astype(np.float64),
           {"dtype": "float64"}, name="to_float64"),
    Sample("cast", {"X": rand(3, 4, dtype="float64")}, lambda X, dtype: X.astype(np.float32),
           {"dtype": "float32"}, name="to_float32_too_coarse_for_finite_differences", grad=False),
    Sample("cast", {"X": rand(3, 4) * 4}, lambda X, dtype: X.astype(np.int32),
           {"dtype": "int32"}, name="to_int_zero_grad"),
    Sample("cast", {"X": _ints}, lambda X, dtype: X.astype(np.float32),
           {"dtype": "float32"}, name="int_to_float"),
    Sample("cast", {"X": np.array([True, False, True])}, lambda X, dtype: X.astype(np.int64),
           {"dtype": "int64"}, name="bool_to_int64"),
    Sample("assign", {"X": rand(3, 4)}, lambda X: X.copy()),
    Sample("assign", {"X": _ints}, lambda X: X.copy(), name="int"),
]

_erf = np.vectorize(math.erf)
_erfc = np.vectorize(math.erfc)

SAMPLES += [
    Sample("integer_pow", {"X": rand(3, 4)}, lambda X, y: X ** y, {"y": 3}, name="cube"),
    Sample("integer_pow", {"X": rand(3, 4)}, lambda X, y: X ** y, {"y": 2}, name="square"),
    Sample("integer_pow", {"X": positive(3, 4)}, lambda X, y: (1.0 / X ** 2).astype(X.dtype),
           {"y": -2}, name="negative"),
    Sample("integer_pow", {"X": _ints}, lambda X, y: X ** y, {"y": 3}, name="int"),
    Sample("erf", {"X": rand(3, 4, low=-3, high=3)}, lambda X: _erf(X).astype(X.dtype)),
    Sample("erf", {"X": rand(2, 3, dtype="float64")}, lambda X: _erf(X), name="float64"),
    Sample("erfc", {"X": rand(3, 4, low=-3, high=3)}, lambda X: _erfc(X).astype(X.dtype)),
    Sample("erfc", {"X": np.array([4.0, 6.0, 9.0], np.float32)},
           lambda X: _erfc(X).astype(X.dtype), name="tail_keeps_precision", rtol=1e-4,
           atol=0.0),
    Sample("erf_inv", {"X": rand(3, 4, low=-0.95, high=0.95)},
           lambda X: scipy.special.erfinv(X).astype(X.dtype), rtol=1e-5),
    Sample("erf_inv", {"X": rand(2, 3, dtype="float64", low=-0.9, high=0.9)},
           lambda X: scipy.special.erfinv(X), name="float64"),
]

SAMPLES += [
    Sample("sin", {"X": rand(3, 4, low=-3, high=3)}, lambda X: np.sin(X)),
    Sample("cos", {"X": rand(3, 4, low=-3, high=3)}, lambda X: np.cos(X)),
    Sample("log1p", {"X": rand(3, 4, low=-0.5, high=2)}, lambda X: np.log1p(X)),
    Sample("log1p", {"X": np.array([1e-10, -1e-9], np.float32)}, lambda X: np.log1p(X),
           name="tiny_keeps_precision", rtol=1e-6, atol=0.0),
    Sample("expm1", {"X": rand(3, 4)}, lambda X: np.expm1(X)),
    Sample("expm1", {"X": np.array([1e-10, -1e-9], np.float32)}, lambda X: np.expm1(X),
           name="tiny_keeps_precision", rtol=1e-6, atol=0.0),
    Sample("sign", {"X": rand(3, 4)}, lambda X: np.sign(X)),
    Sample("sign", {"X": np.array([[-2.0, 0.0, 3.5]], np.float32)}, lambda X: np.sign(X),
           name="zero_no_grad_jump_at_0", grad=False),
    Sample("sign", {"X": _ints}, lambda X: np.sign(X), name="int"),
]

SAMPLES += [
    Sample("floor", {"X": rand(3, 4, low=-3, high=3)}, lambda X: np.floor(X)),
]

SAMPLES += [
    Sample("tan", {"X": rand(3, 4, low=-1.2, high=1.2)}, lambda X: np.tan(X)),
    Sample("tan", {"X": rand(2, 3, low=-1.2, high=1.2, dtype="float64")}, lambda X: np.tan(X),
           name="float64"),
    Sample("exp2", {"X": rand(3, 4, low=-3, high=3)}, lambda X: np.exp2(X)),
    Sample("exp2", {"X": np.array([-100.0, 0.5, 10.0, 100.0], np.float32)}, lambda X: np.exp2(X),
           name="wide_range_no_finite_differences", rtol=1e-5, atol=0.0, grad=False),
]


def _round_away(X):
    return (np.sign(X) * np.floor(np.abs(X) + 0.5)).astype(X.dtype)


_HALVES = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.4, -0.6], np.float32)

SAMPLES += [
    Sample("asin", {"X": rand(3, 4, low=-0.9, high=0.9)}, lambda X: np.arcsin(X)),
    Sample("acos", {"X": rand(3, 4, low=-0.9, high=0.9)}, lambda X: np.arccos(X)),
    Sample("atan", {"X": rand(3, 4, low=-3, high=3)}, lambda X: np.arctan(X)),
    Sample("sinh", {"X": rand(3, 4, low=-2, high=2)}, lambda X: np.sinh(X)),
    Sample("cosh", {"X": rand(3, 4, low=-2, high=2)}, lambda X: np.cosh(X)),
    Sample("asinh", {"X": rand(3, 4, low=-3, high=3)}, lambda X: np.arcsinh(X)),
    Sample("acosh", {"X": rand(3, 4, low=1.2, high=3)}, lambda X: np.arccosh(X)),
    Sample("atanh", {"X": rand(3, 4, low=-0.9, high=0.9)}, lambda X: np.arctanh(X)),
    Sample("cbrt", {"X": positive(3, 4)}, lambda X: np.cbrt(X)),
    Sample("cbrt", {"X": -positive(2, 3, dtype="float64")}, lambda X: np.cbrt(X),
           name="negative_float64"),
    Sample("ceil", {"X": rand(3, 4, low=-3, high=3)}, lambda X: np.ceil(X)),
    Sample("round", {"X": rand(3, 4, low=-3, high=3)}, lambda X, **_: np.round(X)),
    Sample("round", {"X": _HALVES}, lambda X, **_: np.round(X), name="halves_to_even",
           grad=False),
    Sample("round", {"X": _HALVES}, lambda X, **_: _round_away(X),
           {"rounding_method": "away_from_zero"}, name="halves_away_from_zero", grad=False),
]


SAMPLES += [
    Sample("lgamma", {"X": rand(3, 4, low=0.2, high=6)}, lambda X: scipy.special.gammaln(X)
           .astype(X.dtype), rtol=1e-5),
    Sample("lgamma", {"X": np.array([-2.5, -0.5, 0.5], np.float64)},
           lambda X: scipy.special.gammaln(X), name="negative_float64"),
    Sample("digamma", {"X": rand(3, 4, low=0.3, high=6)}, lambda X: scipy.special.digamma(X)
           .astype(X.dtype), rtol=1e-5),
    Sample("polygamma", {"X": rand(3, 4, low=0.5, high=4)},
           lambda X, order: scipy.special.polygamma(order, X).astype(X.dtype), {"order": 1},
           name="trigamma", rtol=1e-4, grad_rtol=1e-3),
    Sample("polygamma", {"X": rand(2, 3, low=0.5, high=4, dtype="float64")},
           lambda X, order: scipy.special.polygamma(order, X), {"order": 2}, name="order2"),
]
