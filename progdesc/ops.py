"""One function per registered op type (seed 003's operator package).

Each function is made from its op's definition in `lowering/ops/`: input
slots are positional parameters, attributes keyword-only ones with their
defaults, and the docstring lists both. Ops registered later (custom ops)
are found through the module's `__getattr__`.
"""
import inspect
import keyword

from lowering import registry
from progdesc.framework import default_main_program

_INTERNAL = {"feed", "fetch"}


class _Required:
    """The default of a required input slot after an optional one (Python wants one)."""

    def __repr__(self):
        return "<required>"


_MISSING = _Required()


def _signature(opdef):
    params = []
    optional_before = False
    for slot in opdef.inputs:
        if slot.optional:
            default, optional_before = None, True
        else:   # Python wants a default after one; the call checks it was given
            default = _MISSING if optional_before else inspect.Parameter.empty
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
        kind = f"{a.type} (or one int)" if a.lone_int else a.type
        lines.append(f"    {a.name}: {kind}, {default}. {a.doc}".rstrip())
    lines.append("    name: prefix of the output variables' names.")
    outs = ", ".join(s.name + (" (list)" if s.many else "") for s in opdef.outputs)
    lines += ["", f"Returns: the output Variable(s): {outs}."]
    return "\n".join(lines)


def make_op_function(opdef):
    """The Python function that appends one `opdef` op to the current block.

    Its parameters are real ones (the source is generated, as namedtuple does), so a
    call binds its arguments at the speed of any Python call.
    """
    signature = _signature(opdef)
    slots = tuple(s.name for s in opdef.inputs)
    attrs = tuple(a.name for a in opdef.attrs)
    function = opdef.type + "_" if keyword.iskeyword(opdef.type) else opdef.type   # 'while'
    source = (f"def {function}({_parameter_list(signature)}):\n"
              f"    return _append({{{''.join(f'{s!r}: {s.lower()}, ' for s in slots)}}}, "
              f"{{{''.join(f'{a!r}: {a}, ' for a in attrs)}}}, name)\n")

    may_miss = any(p.default is _MISSING for p in signature.parameters.values())
    op_type = opdef.type
    single = [s.name for s in opdef.outputs if not s.many]   # the one output Variable
    single = single[0] if len(opdef.outputs) == 1 and single else None

    def _append(inputs, attributes, name):
        block = default_main_program().current_block()
        if single is not None:   # one output Variable: the cheap path where it has a plan
            var = block.append_planned(opdef, inputs, attributes, name)   # None where an
            if var is not None:                                  # input is not a Variable
                return var
        if may_miss:
            for slot, value in inputs.items():
                if value is _MISSING:
                    raise TypeError(f"{op_type}() missing required argument '{slot.lower()}'")
        out_map = block.append_op_outputs(op_type, inputs, attributes, name=name)
        if single is not None and len(out_map.get(single, ())) == 1:
            return block.var(out_map[single][0])
        return _outputs_of(opdef, block, out_map)

    namespace = {"_append": _append}
    exec(compile(source, f"<progdesc.ops.{opdef.type}>", "exec"), namespace)  # noqa: S102
    append = namespace[function]
    append.__defaults__ = tuple(p.default for p in signature.parameters.values()
                                if p.kind is p.POSITIONAL_OR_KEYWORD
                                and p.default is not p.empty) or None
    append.__kwdefaults__ = {p.name: p.default for p in signature.parameters.values()
                             if p.kind is p.KEYWORD_ONLY and p.default is not p.empty}
    append.__doc__ = _docstring(opdef)
    append.__module__ = __name__
    return append


def _parameter_list(signature):
    """`signature`'s parameters as source, defaults left as None (they are set afterwards)."""
    parts = []
    for p in signature.parameters.values():
        if p.kind is p.KEYWORD_ONLY and "*" not in parts:
            parts.append("*")
        parts.append(p.name if p.default is p.empty else f"{p.name}=None")
    return ", ".join(parts)


def _outputs_of(opdef, block, out_map):
    """The op's output Variable, or a tuple of them (a list for a many slot)."""
    outs = []
    for slot in opdef.outputs:
        vars_ = [block.var(n) for n in out_map.get(slot.name, ())]
        if slot.many:
            outs.append(vars_)
        elif vars_:
            outs.append(vars_[0])
    return outs[0] if len(outs) == 1 else tuple(outs)


_made = {}
_bound = set()   # op types whose function is a global of this module (found without
                 # __getattr__) until their definition changes


def forget(op_type):
    """Make the function of `op_type` again on its next use (its definition changed)."""
    _made.pop(op_type, None)
    if op_type in _bound:
        _bound.discard(op_type)
        globals().pop(op_type, None)


registry.WATCHERS.append(forget)


def is_op_function(name):
    """Whether global `name` of this module is the function of op type `name` (kept there
    once made), not one of the module's own names."""
    return name in _bound


def __getattr__(name):
    made = _made.get(name)
    if made is not None and made[2] == registry.GENERATION[0]:   # no op registered since
        return made[1]
    if name.startswith("__") or name in _INTERNAL or not registry.is_registered(name):
        raise AttributeError(f"module 'progdesc.ops' has no op '{name}'")
    opdef = registry.get(name)
    if made is None or made[0] is not opdef:
        made = (opdef, make_op_function(opdef))
    made = _made[name] = (*made[:2], registry.GENERATION[0])
    globals()[name] = made[1]   # later lookups skip __getattr__ (`forget` takes it back)
    _bound.add(name)
    return made[1]


def __dir__():
    return sorted(o.type for o in registry.all_ops() if o.type not in _INTERNAL)
