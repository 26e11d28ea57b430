"""Quantization and integer products: QuantizeLinear, DequantizeLinear (int8, uint8, int16;
per tensor, per axis, blocked), DynamicQuantizeLinear, MatMulInteger, ConvInteger,
QLinearMatMul, QLinearConv. Rounding is half to even, saturation to the quantized type's
range, as ONNX defines them. (Imported by `rules_misc`, whose family they are.)
"""
import numpy as np

from progdesc.onnx import model as onnx_model
from progdesc.onnx.table import RULES
from progdesc.translate import Unsupported

_QUANTIZED = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767)}


def onnx_dtype(elem_type, what):
    """Our dtype name of the ONNX element type `elem_type`; Unsupported if we lack it."""
    try:
        return onnx_model.dtype_name(int(elem_type))
    except Exception:   # noqa: BLE001 - FormatError, or an enum value ONNX lacks
        raise Unsupported(f"{what} has element type {elem_type}, which progdesc has no "
                          "dtype for") from None


def _per_axis(t, v, x, axis, block_size, what):
    """`v` (a scale or zero point) shaped to broadcast against `x`: a scalar as it is, a
    1-D one along `axis`; a blocked one (block_size > 0) repeated along `axis`."""
    dims = t.var(v)[0]
    rank = len(t.var(x)[0])
    if len(dims) == 0 or (len(dims) == 1 and dims[0] == 1 and not block_size):
        return v
    axis = int(axis) % rank
    if block_size:
        size = t.var(x)[0][axis]
        if size < 0 or len(dims) != rank:
            raise Unsupported(f"blocked quantization needs {what} of rank {rank} and a "
                              "known size along the axis")
        index = t.constant(np.arange(size, dtype=np.int32) // int(block_size))
        return t.call("gather", v, index, axis=axis)
    if len(dims) != 1:
        raise Unsupported(f"{what} of dims {list(dims)}: a scalar or a 1-D array along the "
                          "axis")
    shape = [1] * rank
    shape[axis] = -1
    return t.call("reshape", v, shape=shape)


def _as_float32(t, v):
    return v if t.var(v)[1] == "float32" else t.call("cast", v, dtype="float32")


def _quantize(t, x, scale, zero_point, dtype):
    """saturate(round(x / scale) + zero_point) as `dtype` (scale, zero point broadcast)."""
    low, high = _QUANTIZED[dtype]
    q = t.call("round", t.call("div", _as_float32(t, x), _as_float32(t, scale)))
    if zero_point is not None:
        q = t.call("add", q, _as_float32(t, zero_point))
    return t.call("cast", t.call("clip", q, min=float(low), max=float(high)), dtype=dtype)


def _quantized_dtype(dtype, what):
    if dtype not in _QUANTIZED:
        raise Unsupported(f"{what} is {dtype}: int8, uint8 and int16 are quantized to")
    return dtype


@RULES.rule("QuantizeLinear")
def quantize_linear(t, x, y_scale, y_zero_point=None, *, axis=1, saturate=1, block_size=0,
                    output_dtype=0, precision=0):
    if precision:
        raise Unsupported(f"precision {precision}: the division is computed in float32")
    if y_zero_point is not None:
        dtype = t.var(y_zero_point)[1]
    else:
        dtype = onnx_dtype(output_dtype, "output_dtype") if output_dtype else "uint8"
    dtype = _quantized_dtype(dtype, "the quantized type")
    scale = _per_axis(t, y_scale, x, axis, block_size, "y_scale")
    zero = None if y_zero_point is None else _per_axis(t, y_zero_point, x, axis, block_size,
                                                       "y_zero_point")
    return _quantize(t, x, scale, zero, dtype)


@RULES.rule("DequantizeLinear")
def dequantize_linear(t, x, x_scale, x_zero_point=None, *, axis=1, block_size=0,
                      output_dtype=0):
    kind = t.var(x)[1]
    if kind not in _QUANTIZED and kind != "int32":
        raise Unsupported(f"x is {kind}: int8, uint8, int16 and int32 are dequantized")
    out_dtype = onnx_dtype(output_dtype, "output_dtype") if output_dtype else t.var(x_scale)[1]
    y = _as_float32(t, x)
    if x_zero_point is not None:
        y = t.call("sub", y, _as_float32(t, _per_axis(t, x_zero_point, x, axis, block_size,
                                                     "x_zero_point")))
    y = t.call("mul", y, _as_float32(t, _per_axis(t, x_scale, x, axis, block_size,
                                                  "x_scale")))
    return y if out_dtype == "float32" else t.call("cast", y, dtype=out_dtype)


@RULES.rule("DynamicQuantizeLinear")
def dynamic_quantize_linear(t, x):
    x = _as_float32(t, x)
    zero = t.constant(np.float32(0))
    low = t.call("minimum", t.call("reduce_min", x, axis=[], keep_dim=False), zero)
    high = t.call("maximum", t.call("reduce_max", x, axis=[], keep_dim=False), zero)
    scale = t.call("div", t.call("sub", high, low), t.constant(np.float32(255)))
    point = t.call("round", t.call("clip", t.call("neg", t.call("div", low, scale)),
                                   min=0.0, max=255.0))
    y = _quantize(t, x, scale, point, "uint8")
    return y, scale, t.call("cast", point, dtype="uint8")


def _centered(t, v, zero_point, row_axis=None):
    """int32 `v` minus its zero point (a scalar, or 1-D along `row_axis` of a matrix)."""
    v = t.call("cast", v, dtype="int32")
    if zero_point is None:
        return v
    zero_point = t.call("cast", zero_point, dtype="int32")
    if row_axis is not None and len(t.var(zero_point)[0]) == 1:
        zero_point = t.call("unsqueeze", zero_point, axes=[row_axis])
    return t.call("sub", v, zero_point)


@RULES.rule("MatMulInteger")
def matmul_integer(t, a, b, a_zero_point=None, b_zero_point=None):
    # a's zero point runs along its rows (a column vector), b's along its columns
    return t.call("matmul", _centered(t, a, a_zero_point, row_axis=-1),
                  _centered(t, b, b_zero_point))


def _requantized(t, accumulated, scales, y_scale, y_zero_point):
    """The int32 `accumulated` times the product of `scales` over `y_scale`, rounded,
    shifted by `y_zero_point` and saturated to its type (uint8 without one)."""
    dtype = _quantized_dtype(t.var(y_zero_point)[1] if y_zero_point is not None else "uint8",
                             "the quantized type")
    factor = _as_float32(t, scales[0])
    for other in scales[1:]:
        factor = t.call("mul", factor, _as_float32(t, other))
    factor = t.call("div", factor, _as_float32(t, y_scale))
    low, high = _QUANTIZED[dtype]
    q = t.call("round", t.call("mul", _as_float32(t, accumulated), factor))
    if y_zero_point is not None:
        q = t.call("add", q, _as_float32(t, y_zero_point))
    return t.call("cast", t.call("clip", q, min=float(low), max=float(high)), dtype=dtype)


@RULES.rule("QLinearMatMul")
def qlinear_matmul(t, a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale,
                   y_zero_point=None):
    # a's scale and zero point run along its rows, b's along its columns
    rows = len(t.var(a_scale)[0]) == 1 and len(t.var(a)[0]) >= 2
    a_scale = t.call("unsqueeze", a_scale, axes=[-1]) if rows else a_scale
    accumulated = t.call("matmul", _centered(t, a, a_zero_point, row_axis=-1),
                         _centered(t, b, b_zero_point))
    return _requantized(t, accumulated, (a_scale, b_scale), y_scale, y_zero_point)


_EXACT_FAN_IN = (1 << 24) // (255 * 255)
"""The most products of two zero-centered 8-bit values (each within [-255, 255]) whose sum
float32 holds exactly."""


def _integer_conv(t, x, w, x_zero_point, w_zero_point):
    """The Conv row applied to the zero-centered operands, with the node's attributes (w's
    zero point runs along its output channels), as int32. Our convolution is of floats:
    it runs in float32, exact where each output sums at most `_EXACT_FAN_IN` products."""
    conv = RULES.lookup("Conv", t.version)
    if conv is None:
        raise Unsupported("it is translated through the Conv row, which the table lacks")
    dims = t.var(w)[0]
    fan_in = int(np.prod(dims[1:]))
    if any(d < 0 for d in dims) or fan_in > _EXACT_FAN_IN:
        raise Unsupported(f"each output sums {fan_in} products: float32 (our convolution's "
                          f"type) sums at most {_EXACT_FAN_IN} 8-bit ones exactly")
    if w_zero_point is not None and len(t.var(w_zero_point)[0]) == 1:
        w_zero_point = t.call("reshape", w_zero_point, shape=[-1] + [1] * (len(dims) - 1))
    x = _as_float32(t, _centered(t, x, x_zero_point))
    w = _as_float32(t, _centered(t, w, w_zero_point))
    attrs = {a.name: onnx_model.attribute_value(a) for a in t.node_proto.attribute}
    y = conv.fn(t, x, w, None, **conv.arguments(attrs))
    return t.call("cast", t.call("round", y), dtype="int32")


@RULES.rule("ConvInteger")
def conv_integer(t, x, w, x_zero_point=None, w_zero_point=None):
    return _integer_conv(t, x, w, x_zero_point, w_zero_point)


@RULES.rule("QLinearConv")
def qlinear_conv(t, x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale,
                 y_zero_point=None, b=None):
    accumulated = _integer_conv(t, x, w, x_zero_point, w_zero_point)
    if b is not None:   # int32, one per output channel
        rank = len(t.var(w)[0])
        accumulated = t.call("add", accumulated,
                             t.call("reshape", b, shape=[-1] + [1] * (rank - 2)))
    if len(t.var(w_scale)[0]) == 1:   # per output channel: dim 1 of the result
        w_scale = t.call("reshape", w_scale, shape=[-1] + [1] * (len(t.var(w)[0]) - 2))
    return _requantized(t, accumulated, (x_scale, w_scale), y_scale, y_zero_point)
