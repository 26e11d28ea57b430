"""Samples of lowering/ops/reduce.py."""
import numpy as np

from op_table import Invalid, Sample, positive, rand, spec


def _reduce_ref(fn):
    def ref(X, axis=(), keep_dim=False):
        return np.asarray(fn(X, axis=tuple(axis) or None, keepdims=keep_dim)).astype(X.dtype)
    return ref


def _reductions(op, fn, x):
    ref = _reduce_ref(fn)
    return [
        Sample(op, {"X": x}, ref, name="all"),
        Sample(op, {"X": x}, ref, {"axis": [1]}, name="axis1"),
        Sample(op, {"X": x}, ref, {"axis": [0, -1], "keep_dim": True}, name="neg_axes_keep_dim"),
        Sample(op, {"X": x}, ref, {"keep_dim": True}, name="all_keep_dim"),
    ]


_TIES = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, -5.0, 1.0, -5.0]], np.float32)


def _argmax_ref(X, axis=-1, keep_dim=False, dtype="int64"):
    return np.argmax(X, axis=axis, keepdims=keep_dim).astype(dtype)


def _top_k_ref(X, k, axis=-1, largest=True):
    x = np.moveaxis(X, axis, -1)
    index = np.argsort(-x if largest else x, axis=-1, kind="stable")[..., :k]
    values = np.take_along_axis(x, index, axis=-1)
    return np.moveaxis(values, -1, axis), np.moveaxis(index, -1, axis).astype(np.int64)


# nonzero and not too small: the reduce_prod gradient divides by the input
_NONZERO = positive(2, 3, 4) * np.sign(rand(2, 3, 4, seed=1))

SAMPLES = [
    Sample("mean", {"X": rand(3, 4)}, lambda X: np.mean(X)),
    Sample("mean", {"X": rand(2, 3, 4)}, lambda X: np.mean(X), name="3d"),
    *_reductions("reduce_sum", np.sum, rand(2, 3, 4)),
    Sample("reduce_sum", {"X": np.arange(12, dtype=np.int32).reshape(3, 4)},
           _reduce_ref(np.sum), {"axis": [0]}, name="int32"),
    *_reductions("reduce_mean", np.mean, rand(2, 3, 4)),
    *_reductions("reduce_max", np.max, rand(2, 3, 4)),
    Sample("reduce_max", {"X": _TIES}, _reduce_ref(np.max), {"axis": [1]}, name="ties"),
    Sample("reduce_max", {"X": np.array([[3, 7], [9, 1]], np.int64)}, _reduce_ref(np.max),
           {"axis": [-1]}, name="int64"),
    *_reductions("reduce_min", np.min, rand(2, 3, 4)),
    Sample("reduce_min", {"X": _TIES}, _reduce_ref(np.min), {"axis": [1]}, name="ties"),
    *_reductions("reduce_prod", np.prod, _NONZERO),
    Sample("reduce_prod", {"X": np.array([[1, 2, 3], [4, 5, 6]], np.int32)},
           _reduce_ref(np.prod), {"axis": [1]}, name="int32"),
    Sample("argmax", {"X": rand(3, 4)}, _argmax_ref),
    Sample("argmax", {"X": _TIES}, _argmax_ref, {"axis": 0, "keep_dim": True, "dtype": "int32"},
           name="ties_axis0_keep_dim_int32"),
    Sample("top_k", {"X": rand(3, 5)}, _top_k_ref, {"k": 2}),
    Sample("top_k", {"X": rand(3, 5)}, _top_k_ref, {"k": 3, "largest": False}, name="smallest"),
    Sample("top_k", {"X": _TIES}, _top_k_ref, {"k": 2}, name="ties_not_differentiable",
           grad=False),
    Sample("top_k", {"X": rand(4, 2, 3)}, _top_k_ref, {"k": 2, "axis": 0},
           name="batch_axis_needs_static_size", symbolic=False),
    Sample("top_k", {"X": rand(2, 4, 3)}, _top_k_ref, {"k": 2, "axis": 1, "largest": False},
           name="middle_axis_smallest"),
    Sample("top_k", {"X": np.array([[3, 1, 3, 2]], np.int32)}, _top_k_ref, {"k": 3},
           name="int32_ties"),
]

INVALID = [
    Invalid("argmax", {"X": spec(4, 3)}, attrs={"axis": 2}, name="axis",
            expect=["attribute axis=2 is out of range for X float32[4, 3] (valid: -2 to 1)"]),
]
