"""progdesc and the JAX ecosystem: JAX functions and Flax modules as programs."""
from progdesc.interop.from_flax import from_flax
from progdesc.interop.from_jax import from_jax

__all__ = ["from_flax", "from_jax"]
