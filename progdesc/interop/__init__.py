"""progdesc and the JAX ecosystem: programs as JAX functions and Flax modules, and JAX
functions and Flax modules as programs.

`ProgramModule` (in `progdesc.flax` too) imports Flax, so it loads on first use.
"""
from progdesc.interop.as_jax import as_jax
from progdesc.interop.from_flax import from_flax
from progdesc.interop.from_jax import from_jax


def __getattr__(name):
    if name == "ProgramModule":
        from progdesc.interop.flax_module import ProgramModule
        return ProgramModule
    raise AttributeError(f"module 'progdesc.interop' has no attribute '{name}'")


__all__ = ["as_jax", "from_flax", "from_jax", "ProgramModule"]
