"""Samples of lowering/ops/constant.py."""
import numpy as np

from op_table import Invalid, Sample


def _const(shape, dtype, values=(), int_values=()):
    source = values if np.dtype(dtype).kind == "f" else int_values
    return np.asarray(source, dtype=np.float64 if np.dtype(dtype).kind == "f"
                      else np.int64).astype(dtype).reshape(shape)


SAMPLES = [
    Sample("assign_value", {}, _const,
           attrs={"shape": [2, 3], "dtype": "float32", "values": [0.5, -1, 2, 3.25, 1e-3, 7]},
           name="float32"),
    Sample("assign_value", {}, _const,
           attrs={"shape": [], "dtype": "float64", "values": [0.1]}, name="scalar_float64"),
    Sample("assign_value", {}, _const,
           attrs={"shape": [3], "dtype": "int64", "int_values": [2**40, -5, 0]}, name="int64"),
    Sample("assign_value", {}, _const,
           attrs={"shape": [2, 2], "dtype": "bool", "int_values": [1, 0, 0, 1]}, name="bool"),
]

INVALID = [
    Invalid("assign_value", {}, attrs={"shape": [2, 2], "values": [1.0, 2.0]}, name="count",
            expect=["a float32[2, 2] constant needs 4 elements in 'values', got 2"]),
]
