"""progdesc: serializable program descriptions, compiled to XLA through JAX."""
from lowering.errors import (AttributeTypeError, AttributeValueError, BackwardError, FeedError,
                             FetchError, FormatError, ProgdescError, ProgramError, RecordingError,
                             ScopeError, ShapeError, DistributedError, NumericsError,
                             UnknownOpError, UnsupportedPrimitiveError, BatchPolymorphismError,
                             CompiledCallError, OperandError, SaveError, JaxCompatError,
                             UnsupportedOpError)
from progdesc import (compile_cache, control_flow, custom_op, display, distributed, export,
                      initializer, io, layers, ops, optimizer, reader)
from progdesc.backward import append_backward, gradients
from progdesc.compile_cache import set_compilation_cache
from progdesc.param import ParamAttr, create_parameter
from progdesc.prune import prune
from progdesc.executor import Executor
from progdesc.interop import as_jax, from_flax, from_jax
from progdesc.framework import (Block, Operator, Program, Variable, data, default_main_program,
                                default_startup_program, program_guard)
from progdesc.scope import Scope, global_scope, scope_guard
from progdesc import amp
from progdesc import regularizer
from progdesc.paddle_names import CPUPlace, CUDAPlace   # Paddle's places (paddle_names.NAMES)
from progdesc.recording import (Captured, LargeConstantWarning, RecordingWarning, capture,
                                eager)

compile_cache.configure_default()   # progdesc's compiled programs kept on disk; JAX's settings untouched

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
    "LargeConstantWarning", "Captured", "capture", "eager", "BatchPolymorphismError",
    "CompiledCallError", "OperandError", "SaveError", "JaxCompatError", "UnsupportedOpError",
    "regularizer", "CPUPlace", "CUDAPlace",
]
