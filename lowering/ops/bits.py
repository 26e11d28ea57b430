"""Bit operations on integers: shifts, bitwise and/or/xor/not, `bitcast` (the same
bits read as another type of the same width), all broadcasting like NumPy, and
`nextafter` (the neighbouring float).

They are what JAX's random functions use to turn random bits into floats
(`shift_right_logical`, `bitwise_or` with the exponent of 1.0, `bitcast` to float32).
None has a gradient: their integer results are not differentiable, and `bitcast`'s float
result does not vary smoothly with its input.
"""
import jax.numpy as jnp
from jax import lax

from lowering import checks, dtypes
from lowering.errors import ShapeError
from lowering.registry import Attr, In, Out, op


def _binary(op_type, fn, family, summary):
    def compute(X, Y):
        checks.broadcast(X=X, Y=Y)
        X, Y = jnp.broadcast_arrays(X, Y)
        return fn(X, Y)
    compute.__doc__ = summary
    return op(op_type, inputs=[In("X", family), In("Y", family)], outputs=[Out("Out")],
              same_dtype=("X", "Y"), differentiable=False)(compute)


shift_left = _binary("shift_left", lax.shift_left, "int",
                     "X << Y elementwise, broadcasting (0 where Y is at least X's bit width).")
shift_right_logical = _binary(
    "shift_right_logical", lax.shift_right_logical, "int",
    "X >> Y elementwise filling with zeros, broadcasting (0 where Y is at least X's bit "
    "width).")
shift_right_arithmetic = _binary(
    "shift_right_arithmetic", lax.shift_right_arithmetic, "int",
    "X >> Y elementwise filling with the sign bit, broadcasting.")
bitwise_and = _binary("bitwise_and", jnp.bitwise_and, "int",
                      "The bits of X and Y, and-ed elementwise, broadcasting.")
bitwise_or = _binary("bitwise_or", jnp.bitwise_or, "int",
                     "The bits of X and Y, or-ed elementwise, broadcasting.")
bitwise_xor = _binary("bitwise_xor", jnp.bitwise_xor, "int",
                      "The bits of X and Y, xor-ed elementwise, broadcasting.")


@op("bitwise_not", inputs=[In("X", "int")], outputs=[Out("Out")], differentiable=False)
def bitwise_not(X):
    """The bits of X inverted elementwise."""
    return jnp.bitwise_not(X)


@op("bitcast", inputs=[In("X", "number")], outputs=[Out("Out")],
    attrs={"dtype": Attr("dtype", "dtype", doc="element type the bits are read as; of the "
                         "same width as X's")},
    differentiable=False)
def bitcast(X, *, dtype):
    """The bits of each element of X read as `dtype`, a type of the same width (uint32 bits
    as float32: `lax.bitcast_convert_type`)."""
    want = dtypes.to_numpy(dtype)
    if want.itemsize != X.dtype.itemsize or dtypes.kind_of(want) == "bool":
        raise ShapeError(f"attribute dtype={dtypes.name_of(want)!r} must be a number type of "
                         f"X's width ({X.dtype.itemsize * 8} bits), got {checks.typed(X)}",
                         slot="X")
    return lax.bitcast_convert_type(X, want)


@op("nextafter", inputs=[In("X", "float"), In("Y", "float")], outputs=[Out("Out")],
    same_dtype=("X", "Y"), differentiable=False)
def nextafter(X, Y):
    """The float next to X in the direction of Y elementwise (Y where they are equal),
    broadcasting; JAX's truncated normal draws use it to keep samples inside the bounds."""
    checks.broadcast(X=X, Y=Y)
    return lax.nextafter(*jnp.broadcast_arrays(X, Y))
