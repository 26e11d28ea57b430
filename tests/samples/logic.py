"""Samples of lowering/ops/logic.py."""
import numpy as np

from op_table import Invalid, Sample, rand, spec


def _ints(*shape, seed=0):
    """Small whole numbers as float32, so that comparisons see ties."""
    return np.round(rand(*shape, seed=seed) * 2).astype(np.float32)


def _bools(*shape, seed=0):
    return rand(*shape, seed=seed) > 0


def _binary(fn):
    """A reference taking X and Y by keyword."""
    return lambda X, Y: fn(X, Y)


def _where(Condition, X, Y):
    return np.where(Condition, X, Y)


def _comparison(op, fn):
    ref = _binary(fn)
    return [
        Sample(op, {"X": _ints(3, 4), "Y": _ints(3, 4, seed=1)}, ref, name="same"),
        Sample(op, {"X": _ints(2, 3, 4), "Y": _ints(4, seed=1)}, ref, name="bcast_y"),
        Sample(op, {"X": _ints(3, 1), "Y": _ints(2, 1, 4, seed=1)}, ref, name="bcast_both"),
        Sample(op, {"X": np.array([1, 2, 3], np.int32), "Y": np.array([3, 2, 1], np.int32)},
               ref, name="int32"),
    ]


SAMPLES = [
    *_comparison("equal", np.equal),
    *_comparison("not_equal", np.not_equal),
    *_comparison("less_than", np.less),
    *_comparison("less_equal", np.less_equal),
    *_comparison("greater_than", np.greater),
    *_comparison("greater_equal", np.greater_equal),
    Sample("equal", {"X": np.array([True, False]), "Y": np.array([True, True])},
           _binary(np.equal), name="bool"),
    Sample("logical_and", {"X": _bools(3, 4), "Y": _bools(3, 4, seed=1)},
           _binary(np.logical_and)),
    Sample("logical_and", {"X": _bools(2, 3, 4), "Y": _bools(4, seed=1)},
           _binary(np.logical_and), name="bcast"),
    Sample("logical_or", {"X": _bools(3, 4), "Y": _bools(3, 4, seed=1)}, _binary(np.logical_or)),
    Sample("logical_or", {"X": _bools(3, 1), "Y": _bools(2, 1, 4, seed=1)},
           _binary(np.logical_or), name="bcast"),
    Sample("logical_not", {"X": _bools(3, 4)}, lambda X: np.logical_not(X)),
    Sample("where", {"Condition": _bools(3, 4, seed=2), "X": rand(3, 4), "Y": rand(3, 4, seed=1)},
           _where, name="same"),
    Sample("where", {"Condition": _bools(3, 1, seed=2), "X": rand(2, 3, 4),
                     "Y": rand(4, seed=1)}, _where, name="bcast_all"),
    Sample("where", {"Condition": _bools(2, 3, 4, seed=2), "X": rand(3, 1),
                     "Y": rand(1, 4, seed=1)}, _where, name="bcast_cond_widest"),
    Sample("where", {"Condition": _bools(2, 3, seed=2), "X": np.arange(6).reshape(2, 3),
                     "Y": -np.ones(3, np.int64)}, _where, name="int64"),
]

INVALID = [
    Invalid("equal", {"X": spec(4), "Y": spec(3)}, name="no_broadcast",
            expect=["X float32[4] and Y float32[3] do not broadcast"]),
    Invalid("where", {"Condition": spec(4, dtype="bool"), "X": spec(3), "Y": spec(3)},
            name="condition_shape",
            expect=["Condition bool[4] and X float32[3] do not broadcast",
                    "dim 0 of Condition is 4 and dim 0 of X is 3"]),
]

_which = np.array([[0, 2, 1, 1], [2, 0, 0, 1], [1, 1, 2, 0]], np.int32)

SAMPLES += [
    Sample("select_n", {"Which": _bools(3, 4, seed=2), "Cases": [rand(3, 4), rand(3, 4, seed=1)]},
           lambda Which, Cases: np.where(Which, Cases[1], Cases[0]), name="bool"),
    Sample("select_n", {"Which": _which, "Cases": [rand(3, 4), rand(3, 4, seed=1),
                                                   rand(3, 4, seed=2)]},
           lambda Which, Cases: np.choose(Which, Cases), name="int_three_cases"),
    Sample("select_n", {"Which": np.array(True), "Cases": [rand(2, 3), rand(2, 3, seed=1)]},
           lambda Which, Cases: Cases[1], name="scalar_which"),
]
INVALID += [
    Invalid("select_n", {"Which": spec(3, dtype="bool"), "Cases": [spec(3), spec(4)]},
            name="cases_differ", expect=["Cases[1] must have shape [3]", "got float32[4]"]),
]

SAMPLES += [
    Sample("is_finite", {"X": np.array([[1.0, np.inf, -np.inf], [np.nan, -0.0, 3e38]],
                                       np.float32)}, lambda X: np.isfinite(X)),
]
