"""The reader of a legacy `.pdmodel` file: Paddle's ProgramDesc protobuf, decoded with our
own description of its fields (proto/paddle_framework.proto) into a `graph.PaddleProgram`.

It only decodes and checks the structure (block indices, parents, attribute types); the
meaning of the ops is the table's (`rules`).
"""
from google.protobuf.message import DecodeError

from lowering.errors import FormatError
from progdesc.paddle import framework_pb2 as fpb
from progdesc.paddle.graph import Block, Op, PaddleProgram, Var
from progdesc.paddle.wire import first_bad_offset

DTYPES = {0: "bool", 1: "int16", 2: "int32", 3: "int64", 4: "float16", 5: "float32",
          6: "float64", 20: "uint8", 21: "int8", 22: "bfloat16", 23: "complex64",
          24: "complex128", 36: "uint16", 37: "uint32", 38: "uint64"}
"""Paddle's element type numbers (VarType.Type) -> NumPy's dtype names."""

_KINDS = {7: "dense", 8: "selected_rows", 9: "feed_minibatch", 10: "fetch_list",
          11: "step_scopes", 12: "lod_rank_table", 13: "lod_tensor_array", 14: "place_list",
          15: "reader", 17: "raw", 18: "tuple", 25: "string", 26: "strings", 27: "vocab",
          28: "feed_list", 29: "pstring", 30: "sparse_coo", 31: "sparse_csr"}

# Paddle's AttrType -> how to read the value out of an Attr message
_ATTR_READERS = {
    0: lambda a: a.i, 1: lambda a: a.f, 2: lambda a: _text(a.s, "attribute value"),
    3: lambda a: list(a.ints), 4: lambda a: list(a.floats),
    5: lambda a: [_text(s, "attribute value") for s in a.strings],
    6: lambda a: a.b, 7: lambda a: list(a.bools), 8: lambda a: a.block_idx,
    9: lambda a: a.l, 10: lambda a: list(a.blocks_idx), 11: lambda a: list(a.longs),
    12: lambda a: list(a.float64s), 13: lambda a: _text(a.var_name, "variable name"),
    14: lambda a: [_text(s, "variable name") for s in a.vars_name], 15: lambda a: a.float64,
    16: lambda a: _scalar(a.scalar), 17: lambda a: [_scalar(s) for s in a.scalars],
}


class _Bad(Exception):
    """A malformed part of a well-formed protobuf (becomes a FormatError with context)."""


def _text(raw, what):
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _Bad(f"a {what} that is not UTF-8 text ({raw[:40]!r})") from None


def _scalar(s):
    if s.type == 1:
        return s.b
    if s.type == 2:
        return s.i
    if s.type == 3:
        return s.r
    raise _Bad(f"a Scalar attribute of type {s.type} (complex or unknown)")


def read_pdmodel(data: bytes) -> PaddleProgram:
    """Decode the bytes of a `.pdmodel` file into a PaddleProgram.

    Raises FormatError for bytes that are not a ProgramDesc (naming the byte offset where
    the protobuf breaks), or a program whose blocks, variables or attributes do not hold
    together (naming the block, op and attribute)."""
    data = bytes(data)
    message = fpb.PdProgram()
    try:
        message.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as e:
        offset = first_bad_offset(data, fpb.PdProgram.DESCRIPTOR)
        at = f" at byte offset {offset}" if offset is not None else ""
        raise FormatError(f"not a Paddle ProgramDesc (.pdmodel): the protobuf is malformed"
                          f"{at} of {len(data)} ({e})") from None
    if not message.blocks:
        raise FormatError("not a Paddle ProgramDesc (.pdmodel): it has no blocks "
                          f"({len(data)} bytes)")
    blocks = []
    for i, b in enumerate(message.blocks):
        try:
            blocks.append(_block(b, i, len(message.blocks)))
        except _Bad as e:
            raise FormatError(f".pdmodel block {i}: {e}", block_idx=i) from None
    try:
        versions = {_text(p.op_name, "op name"): p.op_version.version
                    for p in message.op_version_map.pair}
    except _Bad as e:
        raise FormatError(f".pdmodel op version map: {e}") from None
    return PaddleProgram(blocks, "pdmodel", versions)


def _block(b, i, count):
    if b.idx != i:
        raise _Bad(f"says it is block {b.idx}")
    parent = b.parent_idx if b.HasField("parent_idx") else -1
    if (i == 0 and parent != -1) or (i > 0 and not 0 <= parent < count) or parent == i:
        raise _Bad(f"has parent block {parent}")
    variables = {}
    for v in b.vars:
        var = _var(v)
        variables[var.name] = var
    ops = []
    for j, o in enumerate(b.ops):
        try:
            ops.append(_op(o, i, j, count))
        except _Bad as e:
            raise _Bad(f"op #{j} '{_printable(o.type)}': {e}") from None
    return Block(i, parent, variables, ops)


def _printable(raw):
    return raw.decode("utf-8", "replace")


def _var(v):
    name = _text(v.name, "variable name")
    if not name:
        raise _Bad("a variable without a name")
    kind_code = v.type.type
    kind = _KINDS.get(kind_code, f"type_{kind_code}")
    shape, dtype = (), ""
    desc = None
    if kind == "dense" and v.type.HasField("dense_tensor"):
        desc = v.type.dense_tensor.tensor
    elif kind == "lod_tensor_array" and v.type.HasField("tensor_array"):
        desc = v.type.tensor_array.tensor
    elif kind == "selected_rows" and v.type.HasField("selected_rows"):
        desc = v.type.selected_rows
    if desc is not None:
        # any negative dim is unknown, as in the PIR reader: Paddle writes -1, and
        # products of it (-4 for an unknown batch times 4 channels: instance_norm's
        # SavedMean)
        shape = tuple(-1 if d < 0 else int(d) for d in desc.dims)
        dtype = DTYPES.get(desc.data_type)
        if dtype is None:
            raise _Bad(f"variable '{name}' has element type {desc.data_type}, which progdesc "
                       "does not know")
    return Var(name, shape, dtype, bool(v.persistable), kind, bool(v.stop_gradient))


def _op(o, block, index, count):
    op_type = _text(o.type, "op type")
    if not op_type:
        raise _Bad("an op without a type")
    attrs = {}
    for a in o.attrs:
        name = _text(a.name, "attribute name")
        reader = _ATTR_READERS.get(a.type)
        if reader is None:
            raise _Bad(f"attribute '{name}' has type {a.type}, which progdesc does not know")
        value = reader(a)
        if a.type == 8 and not 0 <= value < count:
            raise _Bad(f"attribute '{name}' names block {value} of {count}")
        if a.type == 10 and not all(0 <= v < count for v in value):
            raise _Bad(f"attribute '{name}' names blocks {value} of {count}")
        attrs[name] = value
    return Op(op_type, _slots(o.inputs), _slots(o.outputs), attrs, block, index)


def _slots(slots):
    out = {}
    for s in slots:
        out[_text(s.parameter, "slot name")] = [_text(a, "variable name") for a in s.arguments]
    return out
