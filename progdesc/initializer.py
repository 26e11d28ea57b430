"""Initializers: each appends the op that fills a persistable variable in the startup program.

The random ones draw from the startup program's RNG state, so a seeded
startup program initializes the same weights on every run. The scaled
families are `jax.nn.initializers.variance_scaling` behind one op.
"""


class Initializer:
    """Base class: `append(block, var)` appends the op writing `var`'s initial value."""

    def append(self, block, var):
        """Append the initializing op for `var` to `block`."""
        op_type, attrs = self.op()
        attrs = dict(attrs, shape=var.shape, dtype=var.dtype)
        return block.append_op(op_type, {}, {"Out": [var.name]}, attrs)

    def op(self):
        """(op type, attributes other than shape and dtype)."""
        raise NotImplementedError

    def __repr__(self):
        op_type, attrs = self.op()
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in attrs.items())})"


class Constant(Initializer):
    """Every element `value`."""

    def __init__(self, value=0.0):
        self.value = float(value)

    def op(self):
        return "fill_constant", {"value": self.value}


class Uniform(Initializer):
    """Uniform on [low, high)."""

    def __init__(self, low=-1.0, high=1.0):
        self.low, self.high = float(low), float(high)

    def op(self):
        return "uniform_random", {"min": self.low, "max": self.high}


class Normal(Initializer):
    """Normal(mean, std)."""

    def __init__(self, mean=0.0, std=1.0):
        self.mean, self.std = float(mean), float(std)

    def op(self):
        return "gaussian_random", {"mean": self.mean, "std": self.std}


class TruncatedNormal(Initializer):
    """Normal(mean, std) truncated to two standard deviations."""

    def __init__(self, mean=0.0, std=1.0):
        self.mean, self.std = float(mean), float(std)

    def op(self):
        return "truncated_gaussian_random", {"mean": self.mean, "std": self.std}


class VarianceScaling(Initializer):
    """jax.nn.initializers.variance_scaling; fans are read along `in_axis` and `out_axis`.

    For a matrix [in, out] the defaults fit; a conv filter [O, I, kh, kw]
    needs in_axis=1, out_axis=0 (the layers set this).
    """

    def __init__(self, scale=1.0, mode="fan_in", distribution="truncated_normal",
                 in_axis=-2, out_axis=-1):
        self.scale, self.mode, self.distribution = float(scale), mode, distribution
        self.in_axis, self.out_axis = in_axis, out_axis

    def op(self):
        return "variance_scaling_random", {
            "scale": self.scale, "mode": self.mode, "distribution": self.distribution,
            "in_axis": self.in_axis, "out_axis": self.out_axis}


def XavierUniform(**axes):
    """Glorot/Xavier uniform: U(-a, a) with a = sqrt(6 / (fan_in + fan_out))."""
    return VarianceScaling(1.0, "fan_avg", "uniform", **axes)


def XavierNormal(**axes):
    """Glorot/Xavier normal: std sqrt(2 / (fan_in + fan_out)) (truncated, as jax.nn)."""
    return VarianceScaling(1.0, "fan_avg", "truncated_normal", **axes)


def KaimingUniform(**axes):
    """He/Kaiming uniform: U(-a, a) with a = sqrt(6 / fan_in)."""
    return VarianceScaling(2.0, "fan_in", "uniform", **axes)


def KaimingNormal(**axes):
    """He/Kaiming normal: std sqrt(2 / fan_in) (truncated, as jax.nn)."""
    return VarianceScaling(2.0, "fan_in", "truncated_normal", **axes)


def LeCunNormal(**axes):
    """LeCun normal: std sqrt(1 / fan_in) (truncated); Flax's default kernel initializer."""
    return VarianceScaling(1.0, "fan_in", "truncated_normal", **axes)
