"""progdesc and the JAX ecosystem: programs as JAX functions and Flax modules.

`as_jax` is imported with progdesc; `ProgramModule` (in `progdesc.flax` too) imports
Flax, so it loads on first use.
"""
from progdesc.interop.as_jax import as_jax


def __getattr__(name):
    if name == "ProgramModule":
        from progdesc.interop.flax_module import ProgramModule
        return ProgramModule
    raise AttributeError(f"module 'progdesc.interop' has no attribute '{name}'")


__all__ = ["as_jax", "ProgramModule"]
