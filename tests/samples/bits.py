"""Samples of lowering/ops/bits.py (NumPy's bit operations as the reference)."""
import numpy as np

from op_table import Invalid, Sample, spec

_U = np.array([[0, 1, 0x80000000], [0xFFFFFFFF, 12345, 0x3F800000]], dtype=np.uint32)
_I = np.array([[-8, 7, -1], [2**31 - 1, -2**31, 100]], dtype=np.int32)
_SHIFT = np.array([0, 9, 31], dtype=np.uint32)


def _logical_right(X, Y):
    unsigned = X.view(np.uint32) if X.dtype == np.int32 else X
    return (unsigned >> Y.astype(unsigned.dtype)).view(X.dtype)


SAMPLES = [
    Sample("shift_left", {"X": _U, "Y": _SHIFT}, lambda X, Y: X << Y, name="uint32"),
    Sample("shift_left", {"X": _I, "Y": np.int32(3)}, lambda X, Y: (X << Y).astype(np.int32),
           name="int32_scalar"),
    Sample("shift_right_logical", {"X": _U, "Y": np.uint32(9)}, _logical_right,
           name="uint32_scalar"),
    Sample("shift_right_logical", {"X": _I, "Y": _SHIFT.astype(np.int32)}, _logical_right,
           name="int32_fills_zeros"),
    Sample("shift_right_arithmetic", {"X": _I, "Y": _SHIFT.astype(np.int32)},
           lambda X, Y: X >> Y, name="int32_fills_sign"),
    Sample("bitwise_and", {"X": _U, "Y": np.uint32(0xFF)}, lambda X, Y: X & Y),
    Sample("bitwise_or", {"X": _U >> np.uint32(9), "Y": np.uint32(0x3F800000)},
           lambda X, Y: X | Y, name="exponent_of_one"),
    Sample("bitwise_xor", {"X": _I, "Y": _I[::-1]}, lambda X, Y: X ^ Y),
    Sample("bitwise_not", {"X": _I}, lambda X: ~X),
    Sample("bitcast", {"X": (_U >> np.uint32(9)) | np.uint32(0x3F800000)},
           lambda X, dtype: X.view(np.float32), {"dtype": "float32"}, name="uint32_to_float32"),
    Sample("bitcast", {"X": np.array([1.0, -2.5, 0.0], np.float32)},
           lambda X, dtype: X.view(np.int32), {"dtype": "int32"}, name="float32_to_int32"),
    Sample("nextafter", {"X": np.array([1.0, -2.5, 0.0, 3.0], np.float32),
                         "Y": np.array([2.0, -3.0, -1.0, 3.0], np.float32)},
           lambda X, Y: np.nextafter(X, Y), rtol=0, atol=0),
    Sample("nextafter", {"X": np.array([[1.0], [0.0]]), "Y": np.float64(np.inf)},
           lambda X, Y: np.nextafter(X, Y), rtol=0, atol=0, name="float64_scalar"),
]

INVALID = [
    Invalid("bitcast", {"X": spec(3, dtype="uint32")}, attrs={"dtype": "float64"},
            name="other_width", expect=["dtype='float64'", "X's width (32 bits)"]),
    Invalid("shift_left", {"X": spec(2, 3, dtype="int32"), "Y": spec(4, dtype="int32")},
            name="no_broadcast", expect=["X int32[2, 3]", "Y int32[4]"]),
]
