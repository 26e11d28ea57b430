"""progdesc: serializable program descriptions, compiled to XLA through JAX.

The optional parts load on first use (`_LAZY`): `pd.from_jax`, `pd.from_flax`, `pd.as_jax`
and `pd.export` import their modules (and jax.extend, Flax's) when first touched, so that
`import progdesc` costs little more than `import jax` (bench/import_time.py).
"""
import importlib
from lowering.errors import (AttributeTypeError, AttributeValueError, BackwardError, FeedError,
                             FetchError, FormatError, ProgdescError, ProgramError, RecordingError,
                             ScopeError, ShapeError, DistributedError, NumericsError,
                             UnknownOpError, UnsupportedPrimitiveError, BatchPolymorphismError,
                             CompiledCallError, OperandError, SaveError, JaxCompatError,
                             UnsupportedOpError)
from progdesc import (compile_cache, control_flow, custom_op, display, distributed,
                      initializer, io, layers, ops, optimizer, reader)
from progdesc.backward import append_backward, gradients
from progdesc.compile_cache import set_compilation_cache
from progdesc.param import ParamAttr, create_parameter
from progdesc.prune import prune
from progdesc.executor import Executor
from progdesc.framework import (Block, Operator, Program, Variable, data, default_main_program,
                                default_startup_program, program_guard)
from progdesc.scope import Scope, global_scope, scope_guard
from progdesc import amp
from progdesc import regularizer
from progdesc.paddle_names import CPUPlace, CUDAPlace   # Paddle's places (paddle_names.NAMES)
from progdesc.recording import (Captured, LargeConstantWarning, Model, RecordingWarning,
                                capture, eager)
from progdesc.recording import EagerLoopWarning

compile_cache.configure_default()   # progdesc's compiled programs kept on disk; JAX's settings untouched

_LAZY = {   # public name -> (module, attribute; None for the module itself)
    "as_jax": ("progdesc.interop.as_jax", "as_jax"),
    "from_flax": ("progdesc.interop.from_flax", "from_flax"),
    "from_jax": ("progdesc.interop.from_jax", "from_jax"),
    "export": ("progdesc.export", None),
    # bound by the imports above before they were lazy, so kept as attributes
    "interop": ("progdesc.interop", None),
    "export_check": ("progdesc.export_check", None),
    "translate": ("progdesc.translate", None),
}


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module 'progdesc' has no attribute '{name}'")
    module_name, attribute = _LAZY[name]
    module = importlib.import_module(module_name)
    value = module if attribute is None else getattr(module, attribute)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__version__ = "0.1.0"
__all__ = [
    "AttributeTypeError", "AttributeValueError", "BackwardError", "Block", "Executor",
    "FeedError", "FetchError",
    "FormatError", "Operator", "ProgdescError", "Program", "ProgramError", "Scope", "ScopeError",
    "ShapeError", "UnknownOpError", "Variable", "data", "default_main_program",
    "default_startup_program", "global_scope", "ops", "program_guard", "scope_guard",
    "ParamAttr", "append_backward", "create_parameter", "gradients", "initializer", "layers",
    "optimizer", "prune", "reader", "control_flow", "custom_op", "display", "export", "io",
    "set_compilation_cache", "from_flax", "from_jax", "UnsupportedPrimitiveError", "as_jax",
    "NumericsError", "distributed", "DistributedError", "RecordingError", "RecordingWarning",
    "LargeConstantWarning", "Captured", "capture", "eager", "Model", "BatchPolymorphismError",
    "CompiledCallError", "OperandError", "SaveError", "JaxCompatError", "UnsupportedOpError",
    "regularizer", "CPUPlace", "CUDAPlace", "EagerLoopWarning",
]
