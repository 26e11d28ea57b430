"""Reading and writing the slots and attributes of an `OpDesc` message."""
from lowering import progdesc_pb2 as pb
from lowering.registry import decode_attr

FORWARD_OP = "@forward_op"
"""Attribute of a gradient op: [block, index] of the forward op whose gradient maker emitted it
(ints). No op type declares it, and none can: it is not a Python identifier."""
PIPELINE_STAGE = "@pipeline_stage"
"""Attribute of a forward op: the pipeline stage that runs it (i), set by
`progdesc.distributed.pipeline_stage` and the pipeline pass."""
SPLIT_HEADS = "@split_heads"
"""Attribute of the `reshape` op of a tensor-parallel attention layer that cuts a device's
slice of a projection into heads: the layer's num_heads (i), which must divide by the size
of the mesh axis "model" (progdesc.distributed.run checks it once the mesh is known)."""


def slot_map(slots):
    """{slot name: [variable names]} of a repeated `OpDesc.Slot` field."""
    return {s.parameter: s.arguments[:] for s in slots}   # slicing copies faster than list()


def read_attrs(opdef, op_desc):
    """Decoded attributes of `op_desc`, defaults filled in for absent ones."""
    out = {}
    written = op_desc.attrs
    for a in opdef.attrs:
        if a.name in written:
            out[a.name] = decode_attr(a, written[a.name])
        else:
            out[a.name] = a.check(a.default)
    return out


def fill_op_desc(desc, opdef, inputs, outputs, encoded_attrs, role=pb.FORWARD, callsite=""):
    """Write a checked op into the empty `OpDesc` message `desc`; returns `desc`.

    `encoded_attrs` are its attributes as `OpDef.checked_attrs` serializes them.
    """
    if encoded_attrs:
        desc.MergeFromString(encoded_attrs)
    desc.type, desc.role, desc.callsite = opdef.type, role, callsite
    for name, args in inputs.items():
        desc.inputs.add(parameter=name, arguments=args)
    for name, args in outputs.items():
        desc.outputs.add(parameter=name, arguments=args)
    return desc
