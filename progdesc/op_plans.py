"""Appending an op of a signature seen before: what its first append worked out, kept.

An op appended with the same type, attributes and input variable types as an earlier one
binds, checks and infers exactly as that one did: the checks and the shape rule are
functions of these alone (ops with sub-blocks excepted, whose shape rule reads them).
`signature_key` names that signature; an `OpPlan` keeps what the first append of it found
(the checked and encoded attributes, the output slots, their inferred types) and writes
the new OpDesc and output VarDescs as protobuf wire-format bytes, each parsed by one
`MergeFromString`: the very messages `fill_op_desc` and `create_var` would make.

Most ops (those of one fresh output variable, appended by the functions of progdesc.ops
through `Block.append_planned`) are not even written at once: the block keeps them as
pending entries and writes them all, one `MergeFromString` of `block_bytes`, when
anything reads its `desc` (or the program's, or an output Variable's). What a reader
sees is the same; an eager loop that never reads the program never pays for the writes.

Only the common case has a signature (`Block` makes its key with `signature_key`): every
input a Variable of the block appending it (or of an enclosing block), attributes of
hashable values or lists, fresh outputs appended at the end. Anything else (names,
arrays, explicit outputs, an insert) takes the general path, which also makes the first
plan of each signature, so an error is always raised by the general path's checks, with
their messages.
"""
from lowering import dtypes
from lowering import progdesc_pb2 as pb

_PLANS = {}
_MAX_PLANS = 8192


def signature_key(parts, attrs):
    """The signature key of an op whose type and input types are `parts` (a list, extended
    here) and whose attributes are `attrs`; None where a value cannot be hashed."""
    unsure = False   # whether a value may be unhashable
    if attrs:
        parts.append(None)
        for k, v in attrs.items():
            cls = v.__class__
            parts.append(k)
            parts.append(cls)
            if cls is list or cls is tuple:
                v, unsure = _frozen(v), True
            elif cls is float and not v:   # 0.0 == -0.0, but they encode apart
                v = repr(v)
            elif cls not in _HASHABLE:
                unsure = True
            parts.append(v)
    key = tuple(parts)
    if unsure:
        try:
            hash(key)
        except TypeError:
            return None
    return key


_HASHABLE = frozenset((int, float, bool, str, bytes, type(None)))


def lookup(key):
    """The plan of signature `key`, or None."""
    return _PLANS.get(key)


def remember(key, opdef, full_attrs, encoded_attrs, inferred, out_map, base):
    """Keep what the general path found for signature `key`: outputs named `base`.<...>."""
    if len(_PLANS) >= _MAX_PLANS:
        _PLANS.clear()
    cut = len(base)
    outputs = tuple((slot, tuple(n[cut:] for n in names)) for slot, names in out_map.items())
    inputs = key[2:key.index(None) if None in key else len(key):2]   # slot, type, slot, ...
    _PLANS[key] = OpPlan(opdef, full_attrs, encoded_attrs, inferred, outputs, inputs)


def _frozen(value):
    return tuple(_frozen(v) if v.__class__ in (list, tuple)
                 else (float, repr(v)) if v.__class__ is float and not v else (v.__class__, v)
                 for v in value)


class OpPlan:
    """What appending an op of one signature needs (see the module docstring)."""

    __slots__ = ("opdef", "full_attrs", "encoded_attrs", "outputs", "inputs", "head",
                 "slot_heads", "var_tails", "single")

    def __init__(self, opdef, full_attrs, encoded_attrs, inferred, outputs, inputs):
        self.opdef = opdef
        self.inputs = inputs     # the input slots bound (one variable each), in order
        self.full_attrs = full_attrs
        self.encoded_attrs = encoded_attrs
        self.outputs = outputs   # ((slot, (suffix after the base name, ...)), ...)
        self.head = b"\x0a" + _counted(opdef.type) + encoded_attrs   # type and attributes
        self.slot_heads = {s.name: b"\x0a" + _counted(s.name)
                           for s in (*opdef.inputs, *opdef.outputs)}
        self.var_tails = tuple(
            (slot, tuple((tuple(dims), dtype, pb.VarDesc(
                kind=pb.DENSE_TENSOR, dtype=dtypes.to_enum(dtype), dims=dims).SerializeToString())
                         for dims, dtype in inferred.get(slot, ())[:len(suffixes)]))
            for slot, suffixes in outputs)
        # (slot, suffix, dims, dtype, VarDesc tail, (dims, dtype)) where the op makes one
        # output variable
        self.single = None
        if len(outputs) == 1 and len(outputs[0][1]) == 1 and len(self.var_tails[0][1]) == 1:
            (slot, (suffix,)), (_, ((dims, dtype, tail),)) = outputs[0], self.var_tails[0]
            self.single = (slot, suffix, dims, dtype, tail, (dims, dtype))

    def out_map(self, base):
        """{slot: [names]} of the outputs, named after `base`."""
        return {slot: [base + s for s in suffixes] for slot, suffixes in self.outputs}

    def op_bytes(self, in_map, out_map, role, callsite):
        """The OpDesc, as wire-format bytes."""
        parts = [self.head]
        heads = self.slot_heads
        for tag, slots in ((b"\x12", in_map), (b"\x1a", out_map)):
            for slot, names in slots.items():
                if len(names) == 1:   # most slots: one variable
                    body = heads[slot] + b"\x12" + _counted(names[0])
                else:
                    body = heads[slot] + b"".join([b"\x12" + _counted(n) for n in names])
                parts.append(tag + _varint(len(body)) + body)
        if callsite:
            parts.append(b"\x2a" + _counted(callsite))
        if role:
            parts.append(b"\x30" + _varint(role))
        return b"".join(parts)


def block_bytes(pending):
    """The wire-format bytes that, merged into a BlockDesc, append the ops of `pending` and
    their output variables in order: each entry (plan, role, callsite, output Variable,
    input name, ...), an op of a plan with one output (`OpPlan.single`) whose variable is
    new, its inputs in `plan.inputs`' order. (Entries hold few objects that the garbage
    collector tracks: they live until the block is read.)"""
    parts = []
    for plan, role, callsite, var, *names in pending:
        in_map = {slot: [name] for slot, name in zip(plan.inputs, names)}
        op = plan.op_bytes(in_map, {plan.single[0]: [var.name]}, role, callsite)
        declared = b"\x0a" + _counted(var.name) + plan.single[4]
        parts.append(b"\x1a" + _varint(len(declared)) + declared)   # BlockDesc.vars (3)
        parts.append(b"\x22" + _varint(len(op)) + op)               # BlockDesc.ops (4)
    return b"".join(parts)


_COUNTED = {}   # text -> its UTF-8 bytes after their length (a varint): names recur
_MAX_COUNTED = 65536


def _varint(n):
    if n < 0x80:
        return _BYTES[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_BYTES = [bytes((i,)) for i in range(0x80)]


def _counted(text):
    """`text`'s UTF-8 bytes after their length, as a length-delimited field holds them."""
    try:
        return _COUNTED[text]
    except KeyError:
        data = text.encode("utf-8")
        encoded = _varint(len(data)) + data
        if len(_COUNTED) >= _MAX_COUNTED:
            _COUNTED.clear()
        _COUNTED[text] = encoded
        return encoded


def name_field(name):
    """A VarDesc's `name` field, as wire-format bytes."""
    return b"\x0a" + _counted(name)
