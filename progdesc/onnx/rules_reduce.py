"""Reductions: ReduceSum / Mean / Max / Min / Prod / L1 / L2 / LogSum / LogSumExp /
SumSquare, ArgMax / ArgMin, CumSum. (Imported by `rules_math`, whose family they are.)

A reduction is an elementwise step before (|x|, x^2), our reduce op, and one after
(sqrt, log). Its axes are an attribute before opset 18 (13 for ReduceSum) and an input
from then on, known at import or refused. Reducing over an empty dim gives ONNX's
value for the empty set (0, 1, -inf, inf) as a constant.
"""
import numpy as np

from lowering import dtypes
from progdesc.onnx import model as onnx_model
from progdesc.onnx.table import RULES
from progdesc.translate import Unsupported

# ONNX op -> (step before, our reduce op, step after, the value over an empty set)
_REDUCTIONS = {
    "ReduceSum": (None, "reduce_sum", None, 0),
    "ReduceMean": (None, "reduce_mean", None, np.nan),
    "ReduceMax": (None, "reduce_max", None, -np.inf),
    "ReduceMin": (None, "reduce_min", None, np.inf),
    "ReduceProd": (None, "reduce_prod", None, 1),
    "ReduceL1": ("abs", "reduce_sum", None, 0),
    "ReduceL2": ("square", "reduce_sum", "sqrt", 0),
    "ReduceLogSum": (None, "reduce_sum", "log", -np.inf),
    "ReduceSumSquare": ("square", "reduce_sum", None, 0),
    "ReduceLogSumExp": (None, None, None, -np.inf),
}
_BOOL_REDUCE = {"reduce_max": "reduce_any", "reduce_min": "reduce_all"}
_FLOAT_ONLY = ("reduce_mean", "sqrt", "log")


def _normal_axes(t, x, axes):
    rank = len(t.var(x)[0])
    if any(not -rank <= int(a) < rank for a in axes):
        raise Unsupported(f"axes {list(axes)} are out of range for rank {rank}")
    return sorted({int(a) % rank for a in axes})


def _empty_set(t, x, axes, keepdims, value):
    """The constant result of reducing over an empty dim, or None if no reduced dim is
    empty."""
    dims, dtype = t.var(x)
    reduced = axes or range(len(dims))
    if not any(dims[a] == 0 for a in reduced):
        return None
    if any(d < 0 for d in dims):
        raise Unsupported("it reduces an empty dim of an input with symbolic dims")
    shape = [1 if a in reduced else d for a, d in enumerate(dims)
             if keepdims or a not in reduced]
    np_dtype = onnx_model.as_numpy_dtype(dtype)
    if np_dtype.kind in "iub" and not np.isfinite(value):
        info = np.iinfo(np_dtype) if np_dtype.kind != "b" else None
        value = (info.min if value < 0 else info.max) if info else value > 0
    return t.constant(np.full(shape, value, dtype=np_dtype))


def _log_sum_exp(t, x, axes, keepdims):
    """log(sum(exp(x))) over `axes`, less the maximum first (stable)."""
    every = axes or list(range(len(t.var(x)[0])))
    top = t.call("reduce_max", x, axis=every, keep_dim=True)
    total = t.call("reduce_sum", t.call("exp", t.call("sub", x, top)), axis=every,
                   keep_dim=bool(keepdims))
    if not keepdims:
        top = t.call("squeeze", top, axes=every)
    return t.call("add", t.call("log", total), top)


def _reduce(t, op_type, x, axes, keepdims, noop):
    """The rows' common part: `axes` a list of ints, or None (all, unless `noop`)."""
    before, reduce_op, after, empty = _REDUCTIONS[op_type]
    axes = _normal_axes(t, x, axes or [])
    if not axes and noop:
        if op_type == "ReduceLogSumExp":
            return x
        reduce_op = None   # the steps before and after only
    elif (const := _empty_set(t, x, axes, keepdims, empty)) is not None:
        return const
    dtype = t.var(x)[1]
    kind = dtypes.kind_of(dtype)
    if op_type == "ReduceLogSumExp":
        if kind == "float":
            return _log_sum_exp(t, x, axes, keepdims)
        x = t.call("cast", x, dtype="float32")   # integers (before opset 28)
        return t.call("cast", _log_sum_exp(t, x, axes, keepdims), dtype=dtype)
    if kind == "bool" and reduce_op is not None:
        if reduce_op not in _BOOL_REDUCE:
            raise Unsupported(f"{op_type} of bools")
        reduce_op = _BOOL_REDUCE[reduce_op]
    computed = kind == "int" and ({reduce_op, after} & set(_FLOAT_ONLY))
    if computed:   # in float32, truncated back as ONNX's reference does
        x = t.call("cast", x, dtype="float32")
    if before:
        x = t.call(before, x)
    if reduce_op:
        x = t.call(reduce_op, x, axis=axes, keep_dim=bool(keepdims))
    if after:
        x = t.call(after, x)
    return t.call("cast", x, dtype=dtype) if computed else x


def _axes_input(t, axes):
    if axes is None:
        return None
    value = t.value_of(axes)
    if value is None:
        raise Unsupported("its axes are computed at run time")
    return [int(a) for a in np.asarray(value).reshape(-1)]


def _attr_row(op_type):
    def rule(t, x, *, axes=None, keepdims=1, noop_with_empty_axes=0):
        return _reduce(t, op_type, x, axes, keepdims, noop_with_empty_axes)
    return rule


def _input_row(op_type):
    def rule(t, x, axes_input=None, *, keepdims=1, noop_with_empty_axes=0, axes=None):
        if axes is not None:   # the attribute of the op's older versions
            raise Unsupported(f"an 'axes' attribute, which {op_type} of this opset does not "
                              "have (its axes are an input)")
        return _reduce(t, op_type, x, _axes_input(t, axes_input), keepdims,
                       noop_with_empty_axes)
    return rule


for _op in _REDUCTIONS:
    if _op == "ReduceSum":
        RULES.rule(_op, since=13)(_input_row(_op))
    else:
        RULES.rule(_op, since=13)(_attr_row(_op))
        RULES.rule(_op, since=18)(_input_row(_op))


def _arg(t, op_type, x, axis, keepdims, select_last_index):
    dims = t.var(x)[0]
    if not -len(dims) <= axis < len(dims):
        raise Unsupported(f"axis {axis} is out of range for rank {len(dims)}")
    axis %= len(dims)
    if not select_last_index:
        return t.call(op_type, x, axis=axis, keep_dim=bool(keepdims), dtype="int64")
    first = t.call(op_type, t.call("rev", x, dimensions=[axis]), axis=axis,
                   keep_dim=bool(keepdims), dtype="int64")
    if dims[axis] >= 0:
        last = t.constant(np.asarray(dims[axis] - 1, np.int64))
    else:
        last = t.call("sub", t.call("dim_size", x, axis=axis, dtype="int64"),
                      t.constant(np.asarray(1, np.int64)))
    return t.call("sub", last, first)


@RULES.rule("ArgMax", since=13)
def argmax(t, x, *, axis=0, keepdims=1, select_last_index=0):
    return _arg(t, "argmax", x, axis, keepdims, select_last_index)


@RULES.rule("ArgMin", since=13)
def argmin(t, x, *, axis=0, keepdims=1, select_last_index=0):
    return _arg(t, "argmin", x, axis, keepdims, select_last_index)


@RULES.rule("CumSum", since=13)
def cumsum(t, x, axis, *, exclusive=0, reverse=0):
    value = t.value_of(axis)
    if value is None or value.size != 1:
        raise Unsupported("its axis is computed at run time")
    rank = len(t.var(x)[0])
    axis = int(value.reshape(-1)[0])
    if not -rank <= axis < rank:
        raise Unsupported(f"axis {axis} is out of range for rank {rank}")
    axis %= rank
    if exclusive:   # x shifted by one along the axis (a zero in, the last element out)
        config = [0] * (3 * rank)
        config[3 * axis:3 * axis + 2] = (-1, 1) if reverse else (1, -1)
        zero = t.constant(np.zeros((), onnx_model.as_numpy_dtype(t.var(x)[1])))
        x = t.call("pad", x, zero, padding_config=config)
    return t.call("cumsum", x, axis=axis, reverse=bool(reverse))
