"""Ops that create arrays: constants, `iota`, zeros shaped like an input, the size of an
input's dim as a value (`dim_size`), and random draws.

None of them is differentiable. The random ones are declared `random=True`
and receive `key`, the PRNG key the lowering pass derives for their position
from the program's RNG state (seeded by `Program.random_seed`).
"""
import jax
import jax.numpy as jnp
from jax import lax

from lowering import checks, dtypes
from lowering.constraints import Dims, non_negative
from lowering.registry import Attr, In, Out, op

_SHAPE = Attr("shape", "ints", doc="dims of the result", where=Dims(), lone_int=True)
_DTYPE = Attr("dtype", "dtype", "float32", doc="element type of the result")


@op("fill_constant", inputs=[], outputs=[Out("Out")],
    attrs={"shape": _SHAPE, "dtype": _DTYPE, "value": 0.0}, differentiable=False)
def fill_constant(*, shape, dtype, value):
    """An array of `shape` and `dtype` filled with `value`."""
    return jnp.full(shape, value, dtype=dtypes.to_numpy(dtype))


@op("fill_zeros_like", inputs=[In("X")], outputs=[Out("Out")], differentiable=False)
def fill_zeros_like(X):
    """Zeros of the shape and dtype of `X`."""
    return jnp.zeros_like(X)


@op("dim_size", inputs=[In("X", differentiable=False, doc="only its shape is used")],
    outputs=[Out("Out")],
    attrs={"axis": Attr("axis", "int", 0, "the dim whose size is taken"),
           "multiplier": Attr("multiplier", "int", 1, "a factor applied to the size"),
           "dtype": Attr("dtype", "dtype", "int32", doc="element type of the result")},
    differentiable=False)
def dim_size(X, *, axis, multiplier, dtype):
    """The scalar `X.shape[axis] * multiplier`: a size known only at run time (a batch
    dim) as a value, e.g. the count a mean divides by."""
    checks.axis("X", X, axis)
    return jnp.asarray(X.shape[axis] * multiplier, dtype=dtypes.to_numpy(dtype))


@op("uniform_random", inputs=[], outputs=[Out("Out")],
    attrs={"shape": _SHAPE, "dtype": _DTYPE, "min": -1.0, "max": 1.0},
    random=True, differentiable=False)
def uniform_random(*, key, shape, dtype, min, max):  # noqa: A002  (the attributes' names)
    """Samples drawn uniformly from [min, max)."""
    checks.float_dtype(dtype, "random draws are floats")
    return jax.random.uniform(key, shape, dtypes.to_numpy(dtype), minval=min, maxval=max)


@op("gaussian_random", inputs=[], outputs=[Out("Out")],
    attrs={"shape": _SHAPE, "dtype": _DTYPE, "mean": 0.0, "std": 1.0},
    random=True, differentiable=False)
def gaussian_random(*, key, shape, dtype, mean, std):
    """Samples drawn from the normal distribution N(mean, std**2)."""
    checks.float_dtype(dtype, "random draws are floats")
    return mean + std * jax.random.normal(key, shape, dtypes.to_numpy(dtype))


@op("iota", inputs=[], outputs=[Out("Out")],
    attrs={"shape": _SHAPE, "dtype": Attr("dtype", "dtype", "int32", doc="element type"),
           "dimension": Attr("dimension", "int", 0, "the dim that counts up", where=non_negative)},
    differentiable=False)
def iota(*, shape, dtype, dimension):
    """0, 1, 2, ... along dim `dimension` of an array of `shape`, the same along the others."""
    if not 0 <= dimension < len(shape):
        raise ValueError(f"iota: dimension {dimension} is not a dim of shape {list(shape)}")
    return lax.broadcasted_iota(dtypes.to_numpy(dtype), tuple(shape), dimension)
