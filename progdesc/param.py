"""Creating parameters and other persistable state in the main and startup programs.

A parameter is declared in both programs' root blocks; its initializer op
goes to the startup program, so running the startup program once fills the
Scope and every later run of the main program reads from it.
"""
from dataclasses import dataclass
from typing import Optional, Tuple

from lowering import progdesc_pb2 as pb
from lowering.errors import ProgramError
from progdesc import initializer as init
from progdesc.distributed.sharding import set_sharding, sharding_of
from progdesc.callsites import user_callsite
from progdesc.framework import default_main_program, default_startup_program


@dataclass
class ParamAttr:
    """How a layer creates one parameter: name, initializer, trainable, regularizer.

    `regularizer` is an L2 coefficient added to the parameter's gradient by
    the optimizer; `learning_rate` scales the optimizer's rate for it. Both
    are stored in the parameter's VarDesc (`param_settings`), so copies,
    saved programs and inference models keep them. `sharding` lays the parameter
    (and its optimizer state) out on a device mesh: one mesh axis name or None per
    dim, `()` for replicated (progdesc.distributed); stored in the VarDesc too.
    """
    name: Optional[str] = None
    initializer: Optional[init.Initializer] = None
    trainable: bool = True
    regularizer: float = 0.0
    learning_rate: float = 1.0
    sharding: Optional[Tuple[Optional[str], ...]] = None

    @staticmethod
    def of(attr):
        """A ParamAttr from None, a name, an Initializer or a ParamAttr."""
        if attr is None:
            return ParamAttr()
        if isinstance(attr, ParamAttr):
            return attr
        if isinstance(attr, str):
            return ParamAttr(name=attr)
        if isinstance(attr, init.Initializer):
            return ParamAttr(initializer=attr)
        raise TypeError(f"expected ParamAttr, name or Initializer, got {type(attr).__name__}")


def _record_settings(var_desc, attr):
    """Record `attr`'s optimizer settings in a new parameter's VarDesc (defaults leave it
    unset, so such a description reads the same to older versions)."""
    if attr.learning_rate != 1.0:
        var_desc.param_settings.learning_rate = attr.learning_rate
    if attr.regularizer:
        var_desc.param_settings.regularizer.l2 = attr.regularizer


def param_settings(var):
    """The ParamAttr of parameter Variable `var` as its description records it (its
    initializer is an op of the startup program, so `initializer` is None)."""
    settings = var.desc.param_settings
    return ParamAttr(name=var.name, trainable=not var.stop_gradient,
                     regularizer=settings.regularizer.l2,
                     learning_rate=(settings.learning_rate
                                    if settings.HasField("learning_rate") else 1.0),
                     sharding=sharding_of(var.desc))


def create_parameter(shape, dtype="float32", *, attr=None, default_name="param",
                     default_initializer=None):
    """Declare a trainable parameter in the current main and startup programs.

    `attr` is a ParamAttr (or name / Initializer); the name defaults to
    `default_name` and the initializer to `default_initializer` (Xavier
    uniform if that is None too).
    """
    attr = ParamAttr.of(attr)
    if any(d is None or d < 0 for d in shape):
        raise ProgramError(f"parameter shape {list(shape)} must be fully known",
                           var=attr.name or default_name, callsite=user_callsite())
    main, startup = default_main_program(), default_startup_program()
    name = attr.name or default_name
    if main.global_block().find_var(name) is not None:
        from progdesc.recording.loops import why_redeclared   # lazy: recording imports this
        raise ProgramError("a variable of this name already exists; give the parameter "
                           "another name" + why_redeclared(), var=name,
                           callsite=user_callsite())
    if attr.sharding is not None:   # a spec that does not fit refuses before anything is added
        set_sharding(pb.VarDesc(name=name, dims=shape), attr.sharding)
    var = main.global_block().create_parameter(name, shape, dtype, trainable=attr.trainable)
    svar = startup.global_block().create_parameter(name, shape, dtype, trainable=attr.trainable)
    (attr.initializer or default_initializer or init.XavierUniform()).append(
        startup.global_block(), svar)
    _record_settings(var.desc, attr)
    if attr.sharding is not None:
        set_sharding(var.desc, attr.sharding)
        set_sharding(svar.desc, attr.sharding)
    return var


def create_global_var(name, shape, value, dtype="float32", sharding=None):
    """Declare persistable, non-trainable state (step counters, moments) filled with `value`;
    `sharding` annotates it as ParamAttr.sharding does a parameter."""
    main, startup = default_main_program(), default_startup_program()
    var = main.global_block().find_var(name)
    if var is not None:
        return var
    var = main.global_block().create_var(name, shape, dtype, persistable=True,
                                         stop_gradient=True)
    svar = startup.global_block().create_var(name, shape, dtype, persistable=True,
                                             stop_gradient=True)
    if sharding is not None:
        set_sharding(var.desc, sharding)
        set_sharding(svar.desc, sharding)
    init.Constant(value).append(startup.global_block(), svar)
    return var
