"""Reading and writing the slots and attributes of an `OpDesc` message."""
from lowering import progdesc_pb2 as pb
from lowering.registry import decode_attr, encode_attr


def slot_map(slots):
    """{slot name: [variable names]} of a repeated `OpDesc.Slot` field."""
    return {s.parameter: list(s.arguments) for s in slots}


def set_slots(field, mapping):
    """Replace a repeated `OpDesc.Slot` field with `mapping` ({slot: [names]})."""
    del field[:]
    for name, args in mapping.items():
        field.add(parameter=name, arguments=list(args))


def read_attrs(opdef, op_desc):
    """Decoded attributes of `op_desc`, defaults filled in for absent ones."""
    out = {}
    for a in opdef.attrs:
        if a.name in op_desc.attrs:
            out[a.name] = decode_attr(a, op_desc.attrs[a.name])
        else:
            out[a.name] = a.check(a.default)
    return out


def write_attrs(opdef, op_desc, attrs):
    """Encode checked attribute values into `op_desc.attrs`."""
    op_desc.attrs.clear()
    for a in opdef.attrs:
        encode_attr(a, attrs[a.name], op_desc.attrs[a.name])


def new_op_desc(op_type, inputs, outputs, role=pb.FORWARD, callsite=""):
    """An `OpDesc` with its slots set (attributes are written separately)."""
    desc = pb.OpDesc(type=op_type, role=role, callsite=callsite)
    set_slots(desc.inputs, inputs)
    set_slots(desc.outputs, outputs)
    return desc
