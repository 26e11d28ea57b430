"""Activations by name, as layers' `act=` arguments take them (`act="relu"`)."""
from lowering import registry
from lowering.errors import ProgramError
from progdesc import ops
from progdesc.callsites import user_callsite


def _takes_one_input(opdef):
    return (len(opdef.inputs) == 1 and not opdef.inputs[0].many and len(opdef.outputs) == 1
            and all(a.default is not registry.REQUIRED for a in opdef.attrs))


def activation_op(act, layer):
    """The op function of activation `act` (identity for None), checked before `layer`
    appends anything: any op with one input and one output (all attributes defaulted)."""
    if act is None:
        return lambda x: x
    if registry.is_registered(act) and _takes_one_input(registry.get(act)):
        return getattr(ops, act)
    known = sorted(o.type for o in registry.all_ops()
                   if o.lower.__module__ == "lowering.ops.activation" and _takes_one_input(o))
    raise ProgramError(f"unknown activation {act!r} for {layer}; the activations are "
                       f"{', '.join(known)} (or any other op with one input and one output)",
                       callsite=user_callsite())
