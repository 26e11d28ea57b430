"""progdesc and the JAX ecosystem: programs as JAX functions and Flax modules, and JAX
functions and Flax modules as programs.

Each name loads its module on first use: `ProgramModule` (in `progdesc.flax` too) imports
Flax, `from_jax` and `from_flax` jax.extend, none of which `import progdesc` needs.
"""
import importlib
import sys
import types

_MODULES = {"as_jax": "progdesc.interop.as_jax", "from_flax": "progdesc.interop.from_flax",
            "from_jax": "progdesc.interop.from_jax",
            "ProgramModule": "progdesc.interop.flax_module"}


def __getattr__(name):
    if name not in _MODULES:
        raise AttributeError(f"module 'progdesc.interop' has no attribute '{name}'")
    value = getattr(importlib.import_module(_MODULES[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_MODULES))


class _Package(types.ModuleType):
    """The package, whose names `as_jax`, `from_jax` and `from_flax` stay the functions.

    Importing a submodule binds it on its package under its own name: without this, the
    first `import progdesc.interop.from_jax` anywhere would turn `progdesc.interop.from_jax`
    into the module, where the function of that name is meant.
    """

    def __setattr__(self, name, value):
        if name in _MODULES and isinstance(value, types.ModuleType):
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


__all__ = ["as_jax", "from_flax", "from_jax", "ProgramModule"]
