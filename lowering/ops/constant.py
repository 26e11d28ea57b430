"""A constant array written into the program: what a NumPy array mixed into ops becomes.

Its elements are an attribute of the op, so the program carries them when it
is saved, exported or sent elsewhere (a large array is better fed as data).
"""
import math

import jax.numpy as jnp
import numpy as np

from lowering import dtypes
from lowering.errors import ShapeError
from lowering.constraints import Dims
from lowering.registry import Attr, Out, op


@op("assign_value", inputs=[], outputs=[Out("Out")],
    attrs={"shape": Attr("shape", "ints", doc="dims of the result", where=Dims(),
                       lone_int=True),
           "dtype": Attr("dtype", "dtype", "float32", doc="element type of the result"),
           "values": Attr("values", "float64s", (), doc="the elements of a float result, "
                          "in row-major order"),
           "int_values": Attr("int_values", "int64s", (), doc="the elements of an integer "
                              "or bool result, in row-major order")},
    differentiable=False)
def assign_value(*, shape, dtype, values, int_values):
    """The array of `shape` and `dtype` whose elements are `values` (floats) or
    `int_values` (integers and bools)."""
    kind = dtypes.kind_of(dtype)
    given, other = (values, "values") if kind == "float" else (int_values, "int_values")
    if len(given) != math.prod(shape):
        which = "values" if kind == "float" else "int_values"
        raise ShapeError(f"a {dtype}{list(shape)} constant needs {math.prod(shape)} elements in "
                         f"'{which}', got {len(given)}")
    numpy_dtype = dtypes.to_numpy(dtype)
    source = np.float64 if kind == "float" else np.int64
    return jnp.asarray(np.asarray(given, dtype=source).astype(numpy_dtype).reshape(shape))


def constant_attrs(array):
    """The attributes of an `assign_value` op holding NumPy `array` exactly."""
    dtype = dtypes.name_of(array.dtype)
    flat = array.reshape(-1)
    if dtypes.kind_of(dtype) == "float":
        return {"shape": list(array.shape), "dtype": dtype,
                "values": flat.astype(np.float64).tolist()}
    return {"shape": list(array.shape), "dtype": dtype,
            "int_values": flat.astype(np.int64).tolist()}
