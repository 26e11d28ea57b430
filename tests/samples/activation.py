"""Samples of lowering/ops/activation.py."""
import math

import numpy as np

from op_table import Sample, rand

_erf = np.vectorize(math.erf)
_C, _A = math.sqrt(2 / math.pi), 0.044715


def _f64(fn):
    """A reference computed in float64 and cast back to the input's dtype."""
    def ref(X, **attrs):
        return np.asarray(fn(X.astype(np.float64), **attrs)).astype(X.dtype)
    return ref


def _gelu(x, approximate):
    if approximate:
        return 0.5 * x * (1 + np.tanh(_C * (x + _A * x ** 3)))
    return 0.5 * x * (1 + _erf(x / math.sqrt(2)))


def _gelu_derivative(x, approximate, order):
    if approximate:
        t = np.tanh(_C * (x + _A * x ** 3))
        du, ddu = _C * (1 + 3 * _A * x ** 2), 6 * _C * _A * x
        if order == 1:
            return 0.5 * (1 + t) + 0.5 * x * (1 - t ** 2) * du
        return (1 - t ** 2) * (du + 0.5 * x * (ddu - 2 * t * du ** 2))
    pdf = np.exp(-x ** 2 / 2) / math.sqrt(2 * math.pi)
    if order == 1:
        return 0.5 * (1 + _erf(x / math.sqrt(2))) + x * pdf
    return pdf * (2 - x ** 2)


def _gelu_grad_ref(X, DOut, approximate, order):
    x = X.astype(np.float64)
    return (DOut * _gelu_derivative(x, approximate, order)).astype(X.dtype)


def _softplus(x, beta, threshold):
    return np.where(x * beta > threshold, x, np.log1p(np.exp(x * beta)) / beta)


def _softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _log_softmax(x, axis):
    shifted = x - x.max(axis=axis, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


def _hard_sigmoid(x, slope, offset):
    return np.minimum(np.maximum(slope * x + offset, 0), 1)


def _hard_swish(x, threshold, scale, offset):
    return x * np.minimum(np.maximum(x + offset, 0), threshold) / scale


def _mish(x, threshold):
    return x * np.tanh(_softplus(x, 1.0, threshold))


_X = rand(3, 4, low=-3.0, high=3.0)
_WIDE = rand(4, 5, low=-8.0, high=8.0)   # both flat sides of the hard activations

SAMPLES = [
    Sample("relu", {"X": _X}, lambda X: np.maximum(X, 0)),
    Sample("relu", {"X": rand(2, 3, 4, dtype="float64")}, lambda X: np.maximum(X, 0),
           name="float64"),
    Sample("sigmoid", {"X": _X}, _f64(lambda x: 1 / (1 + np.exp(-x)))),
    Sample("tanh", {"X": _X}, _f64(np.tanh)),
    Sample("gelu", {"X": _X}, _f64(_gelu), {"approximate": False}, name="erf"),
    Sample("gelu", {"X": _X}, _f64(_gelu), {"approximate": True}, name="tanh"),
    *[Sample("gelu_grad", {"X": _X, "DOut": rand(3, 4, seed=1)}, _gelu_grad_ref,
             {"approximate": approximate, "order": order},
             name=f"{'tanh' if approximate else 'erf'}_order{order}")
      for approximate in (False, True) for order in (1, 2)],
    Sample("leaky_relu", {"X": _X}, lambda X, alpha: np.where(X > 0, X, alpha * X),
           {"alpha": 0.02}),
    Sample("leaky_relu", {"X": _X}, lambda X, alpha: np.where(X > 0, X, alpha * X),
           {"alpha": 0.3}, name="alpha"),
    Sample("softplus", {"X": _X}, _f64(_softplus), {"beta": 1.0, "threshold": 20.0},
           name="defaults"),
    Sample("softplus", {"X": _X}, _f64(_softplus), {"beta": 2.0, "threshold": 1.5},
           name="linear_above_threshold"),
    Sample("silu", {"X": _X}, _f64(lambda x: x / (1 + np.exp(-x)))),
    Sample("relu6", {"X": _WIDE}, lambda X, threshold: np.clip(X, 0, threshold),
           {"threshold": 6.0}, name="default"),
    Sample("relu6", {"X": _X}, lambda X, threshold: np.clip(X, 0, threshold),
           {"threshold": 1.5}, name="threshold"),
    # PaddlePaddle's MobileNetV3 attributes
    Sample("hard_sigmoid", {"X": _WIDE}, _f64(_hard_sigmoid),
           {"slope": 0.16666670143604279, "offset": 0.5}, name="mobilenetv3"),
    Sample("hard_sigmoid", {"X": _X}, _f64(_hard_sigmoid), {"slope": 0.2, "offset": 0.3},
           name="slope_offset"),
    Sample("hard_swish", {"X": _WIDE}, _f64(_hard_swish),
           {"threshold": 6.0, "scale": 6.0, "offset": 3.0}, name="defaults"),
    Sample("hard_swish", {"X": _X}, _f64(_hard_swish),
           {"threshold": 2.0, "scale": 4.0, "offset": 1.0}, name="attrs"),
    Sample("hard_swish", {"X": rand(2, 3, dtype="float64", low=-5.0, high=5.0)},
           _f64(_hard_swish), {"threshold": 6.0, "scale": 6.0, "offset": 3.0}, name="float64"),
    Sample("mish", {"X": _WIDE}, _f64(_mish), {"threshold": 20.0}, name="defaults"),
    Sample("mish", {"X": _X}, _f64(_mish), {"threshold": 1.0}, name="linear_above_threshold"),
    Sample("softmax", {"X": _X}, _f64(_softmax), {"axis": -1}, name="last"),
    Sample("softmax", {"X": rand(2, 3, 4)}, _f64(_softmax), {"axis": 1}, name="middle"),
    Sample("softmax", {"X": rand(3, 2)}, _f64(_softmax), {"axis": 0}, name="batch_axis"),
    Sample("log_softmax", {"X": _X}, _f64(_log_softmax), {"axis": -1}, name="last"),
    Sample("log_softmax", {"X": rand(2, 3, 4)}, _f64(_log_softmax), {"axis": 1}, name="middle"),
    Sample("log_softmax", {"X": rand(3, 2)}, _f64(_log_softmax), {"axis": 0},
           name="batch_axis"),
]
