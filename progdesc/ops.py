"""One function per registered op type (seed 003's operator package).

Each function is made from its op's definition in `lowering/ops/`: input
slots are positional parameters, attributes keyword-only ones with their
defaults, and the docstring lists both. Ops registered later (custom ops)
are found through the module's `__getattr__`.
"""
import inspect

from lowering import registry
from lowering.errors import ProgramError
from progdesc.framework import default_main_program

_INTERNAL = {"feed", "fetch"}


def _signature(opdef):
    params = []
    for slot in opdef.inputs:
        default = None if slot.optional else inspect.Parameter.empty
        params.append(inspect.Parameter(slot.name.lower(), inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                        default=default))
    for a in opdef.attrs:
        default = inspect.Parameter.empty if a.default is registry.REQUIRED else a.default
        params.append(inspect.Parameter(a.name, inspect.Parameter.KEYWORD_ONLY, default=default))
    params.append(inspect.Parameter("name", inspect.Parameter.KEYWORD_ONLY, default=None))
    return inspect.Signature(params)


def _docstring(opdef):
    lines = [opdef.doc or f"The '{opdef.type}' op.", "", "Args:"]
    for slot in opdef.inputs:
        extra = ", list" if slot.many else ""
        extra += ", optional" if slot.optional else ""
        lines.append(f"    {slot.name.lower()}: Variable ({slot.dtypes} dtype{extra}). {slot.doc}".rstrip())
    for a in opdef.attrs:
        default = "required" if a.default is registry.REQUIRED else f"default {a.default!r}"
        lines.append(f"    {a.name}: {a.type}, {default}. {a.doc}".rstrip())
    lines.append("    name: prefix of the output variables' names.")
    outs = ", ".join(s.name + (" (list)" if s.many else "") for s in opdef.outputs)
    lines += ["", f"Returns: the output Variable(s): {outs}."]
    return "\n".join(lines)


def make_op_function(opdef):
    """The Python function that appends one `opdef` op to the current block."""
    signature = _signature(opdef)
    slot_of = {s.name.lower(): s.name for s in opdef.inputs}

    def append(*args, **kwargs):
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as e:
            raise ProgramError(str(e), op_type=opdef.type) from None
        bound.apply_defaults()
        values = dict(bound.arguments)
        name = values.pop("name")
        inputs = {slot_of[k]: values.pop(k) for k in list(values) if k in slot_of}
        block = default_main_program().current_block()
        op = block.append_op(opdef.type, inputs=inputs, attrs=values, name=name)
        outs = []
        for slot in opdef.outputs:
            names = op.output(slot.name)
            vars_ = [block.var(n) for n in names]
            if slot.many:
                outs.append(vars_)
            elif vars_:
                outs.append(vars_[0])
        return outs[0] if len(outs) == 1 else tuple(outs)

    append.__name__ = append.__qualname__ = opdef.type
    append.__signature__ = signature
    append.__doc__ = _docstring(opdef)
    append.__module__ = __name__
    return append


_made = {}


def __getattr__(name):
    if name.startswith("__") or name in _INTERNAL or not registry.is_registered(name):
        raise AttributeError(f"module 'progdesc.ops' has no op '{name}'")
    opdef = registry.get(name)
    made = _made.get(name)
    if made is None or made[0] is not opdef:
        made = _made[name] = (opdef, make_op_function(opdef))
    return made[1]


def __dir__():
    return sorted(o.type for o in registry.all_ops() if o.type not in _INTERNAL)
