"""Samples of lowering/ops/math.py."""
import numpy as np

from lowering.errors import ProgramError
from op_table import Invalid, Sample, positive, rand, spec


def _binary(op, ref):
    return [
        Sample(op, {"X": rand(3, 4), "Y": rand(3, 4, seed=1)}, ref, name="same"),
        Sample(op, {"X": rand(2, 3, 4), "Y": rand(4, seed=1)}, ref, name="bcast_y"),
        Sample(op, {"X": rand(3, 1), "Y": rand(2, 1, 4, seed=1)}, ref, name="bcast_both"),
    ]


SAMPLES = [
    *_binary("add", lambda X, Y: X + Y),
    *_binary("sub", lambda X, Y: X - Y),
    *_binary("mul", lambda X, Y: X * Y),
    Sample("div", {"X": rand(3, 4), "Y": positive(3, 4, seed=1)}, lambda X, Y: X / Y),
    Sample("div", {"X": rand(2, 3, 4), "Y": positive(3, 1, seed=1)}, lambda X, Y: X / Y,
           name="bcast"),
    Sample("div", {"X": np.array([7, -7, 6]), "Y": np.array([2, 2, 3])},
           lambda X, Y: X / Y, name="int_true_division", grad=False),
    Sample("pow", {"X": positive(3, 4), "Y": rand(3, 4, seed=1)}, lambda X, Y: np.power(X, Y)),
    Sample("pow", {"X": positive(2, 3), "Y": rand(3, seed=1)}, lambda X, Y: np.power(X, Y), name="bcast"),
    *_binary("maximum", lambda X, Y: np.maximum(X, Y)),
    *_binary("minimum", lambda X, Y: np.minimum(X, Y)),
    Sample("maximum", {"X": rand(3, 4), "Y": rand(4, seed=1)}, lambda X, Y, ties: np.maximum(X, Y),
           attrs={"ties": "split"}, name="ties_split"),
    Sample("minimum", {"X": rand(3, 4), "Y": rand(3, 4, seed=1)},
           lambda X, Y, ties: np.minimum(X, Y), attrs={"ties": "y"}, name="ties_y"),
    Sample("reduce_as", {"X": rand(2, 3, 4), "Target": rand(3, 1, seed=1)},
           lambda X, Target: X.sum(axis=(0, 2)).reshape(3, 1)),
    Sample("expand_as", {"X": rand(3, 1), "Target": rand(2, 3, 4, seed=1)},
           lambda X, Target: np.broadcast_to(X, (2, 3, 4))),
]

INVALID = [
    Invalid("add", {"X": spec(4, 5), "Y": spec(4, 3)}, name="no_broadcast",
            expect=["X float32[4, 5] and Y float32[4, 3] do not broadcast",
                    "dim 1 of X is 5 and dim 1 of Y is 3"]),
    Invalid("sub", {"X": spec(-1, 5), "Y": spec(2, 1, 3)}, name="unknown_batch",
            expect=["X float32[-1, 5] and Y float32[2, 1, 3] do not broadcast",
                    "dim 1 of X is 5 and dim 2 of Y is 3"]),
    Invalid("mul", {"X": spec(4), "Y": spec(4, dtype="int64")}, name="dtypes_differ",
            error=ProgramError, expect=["slot 'X' is float32 but slot 'Y' is int64"]),
    Invalid("div", {"X": spec(4, dtype="bool"), "Y": spec(4, dtype="bool")}, name="bool",
            error=ProgramError, expect=["input slot 'X' expects a number dtype, got bool"]),
    Invalid("pow", {"X": spec(3), "Y": spec(2)}, name="no_broadcast",
            expect=["X float32[3] and Y float32[2] do not broadcast"]),
    Invalid("maximum", {"X": spec(2, 3), "Y": spec(3, 2)}, name="no_broadcast",
            expect=["X float32[2, 3] and Y float32[3, 2] do not broadcast"]),
]

SAMPLES += [
    Sample("rem", {"X": rand(3, 4, low=-3, high=3), "Y": positive(3, 4, seed=1)},
           lambda X, Y: np.fmod(X, Y)),
    Sample("rem", {"X": rand(2, 3, low=-3, high=3), "Y": -positive(3, seed=1)},
           lambda X, Y: np.fmod(X, Y), name="bcast_negative_divisor"),
    Sample("rem", {"X": np.array([7, -7, 6], np.int32), "Y": np.array([2, 2, -4], np.int32)},
           lambda X, Y: np.fmod(X, Y), name="int"),
]


def _trunc_div_ref(X, Y):
    return (np.sign(X) * np.sign(Y) * (np.abs(X) // np.abs(Y))).astype(np.result_type(X, Y))


SAMPLES += [
    Sample("atan2", {"X": rand(3, 4), "Y": rand(3, 4, seed=1)}, lambda X, Y: np.arctan2(X, Y)),
    Sample("atan2", {"X": rand(2, 3, 4), "Y": rand(4, seed=1)},
           lambda X, Y: np.arctan2(X, Y), name="bcast_y"),
    Sample("atan2", {"X": np.array([1.0, -1.0, 0.0, 0.0], np.float32),
                     "Y": np.array([-1.0, -1.0, 1.0, -1.0], np.float32)},
           lambda X, Y: np.arctan2(X, Y), name="quadrants_and_axes", grad=False),
    Sample("trunc_div", {"X": np.array([7, -7, 6, -6, 0], np.int32),
                         "Y": np.array([2, 2, -4, -4, 3], np.int32)}, _trunc_div_ref),
    Sample("trunc_div", {"X": np.arange(-6, 6, dtype=np.int64).reshape(3, 4),
                         "Y": np.array([5, -3, 2, 1], np.int64)}, _trunc_div_ref,
           name="bcast_int64"),
]

INVALID += [
    Invalid("trunc_div", {"X": spec(4), "Y": spec(4)}, name="float",
            error=ProgramError, expect=["input slot 'X' expects a int dtype, got float32"]),
]
