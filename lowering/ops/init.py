"""Initializer ops: random tensors drawn with jax.nn.initializers, seeded by the program's RNG.

Constant, uniform and normal fills are the creation ops (fill_constant,
uniform_random, gaussian_random); these add the scaled families.
"""
import jax

from lowering import checks
from lowering.constraints import Dims, non_negative, one_of
from lowering.registry import Attr, Out, op

_SHAPE = Attr("shape", "ints", doc="shape of the tensor", where=Dims(), lone_int=True)
_DTYPE = Attr("dtype", "dtype", "float32")


@op("truncated_gaussian_random", inputs=[], outputs=[Out("Out")],
    attrs={"shape": _SHAPE, "dtype": _DTYPE, "mean": 0.0,
           "std": Attr("std", "float", 1.0, where=non_negative)},
    random=True, differentiable=False)
def truncated_gaussian_random(*, shape, dtype, mean, std, key):
    """Normal(mean, std) samples truncated to two standard deviations."""
    checks.float_dtype(dtype, "random draws are floats")
    return mean + jax.nn.initializers.truncated_normal(std, dtype, lower=-2.0, upper=2.0)(
        key, tuple(shape), dtype)


@op("variance_scaling_random", inputs=[], outputs=[Out("Out")],
    attrs={"shape": _SHAPE, "dtype": _DTYPE, "scale": Attr("scale", "float", 1.0, where=non_negative),
           "mode": Attr("mode", "string", "fan_in", doc="fan_in, fan_out or fan_avg",
                        where=one_of("fan_in", "fan_out", "fan_avg")),
           "distribution": Attr("distribution", "string", "truncated_normal",
                                doc="truncated_normal, normal or uniform",
                                where=one_of("truncated_normal", "normal", "uniform")),
           "in_axis": -2, "out_axis": -1},
    random=True, differentiable=False)
def variance_scaling_random(*, shape, dtype, scale, mode, distribution, in_axis, out_axis, key):
    """jax.nn.initializers.variance_scaling: Glorot/Xavier, He/Kaiming and LeCun initializers."""
    checks.float_dtype(dtype, "random draws are floats")
    init = jax.nn.initializers.variance_scaling(scale, mode, distribution, in_axis=in_axis,
                                                out_axis=out_axis, dtype=dtype)
    return init(key, tuple(shape), dtype)
