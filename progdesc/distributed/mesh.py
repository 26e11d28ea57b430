"""A device mesh: named axes over this host's (or, after `initialize`, every host's) devices."""
import math

import jax
import numpy as np
from jax.sharding import AxisType


class Mesh:
    """Named mesh axes and their sizes, e.g. `Mesh({"data": 4})` or
    `Mesh({"data": 2, "model": 2})`, laid over the first devices of `devices`
    (default: `jax.devices()`, every device of every process).

    `data_axis` names the axis that splits the batch: data-parallel programs run
    one copy per device along it, and in sharded runs fed batches are split along it.
    """

    def __init__(self, axes, devices=None, data_axis="data"):
        axes = dict(axes)
        for name, size in axes.items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"mesh axis names are non-empty strings, got {name!r}")
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise ValueError(f"mesh axis '{name}' needs a positive int size, got {size!r}")
        devices = list(jax.devices() if devices is None else devices)
        needed = math.prod(axes.values())
        if len(devices) < needed:
            raise ValueError(
                f"mesh {axes} needs {needed} devices, {len(devices)} are available (on CPU, "
                f"set XLA_FLAGS=--xla_force_host_platform_device_count={needed} before JAX "
                "starts)")
        self.axes = axes
        """{axis name: size}, in mesh order."""
        self.data_axis = data_axis
        self.jax_mesh = jax.sharding.Mesh(
            np.array(devices[:needed], dtype=object).reshape(tuple(axes.values())),
            tuple(axes), axis_types=(AxisType.Auto,) * len(axes))
        """The `jax.sharding.Mesh` it stands for."""

    @property
    def size(self):
        """The number of devices."""
        return self.jax_mesh.size

    @property
    def data_size(self):
        """How many ways the batch is split: the size of `data_axis` (1 if the mesh has none)."""
        return self.axes.get(self.data_axis, 1)

    def __repr__(self):
        return f"Mesh({self.axes}, data_axis={self.data_axis!r})"
