"""Programs as Flax NNX modules: `from progdesc.flax import ProgramModule`."""
from progdesc.interop.flax_module import ProgramModule, attribute_name

__all__ = ["ProgramModule", "attribute_name"]
