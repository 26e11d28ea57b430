"""Bounds on what a loaded program may hold, and the cleaning of the text it carries.

A program file may come from a stranger: `Program.from_bytes` / `from_text` (and so
`io.load_program`, inference models and the CLI) check a parsed ProgramDesc against these
bounds before anything else looks at it, so no file can make loading take minutes, and
raise `FormatError` naming the bound. They are far above what real models need: a GPT
or ResNet program with its backward and optimizer ops has tens of thousands of ops.

========================  ===========  =============================================
bound                     value        counts
========================  ===========  =============================================
MAX_BLOCKS                4,096        blocks of the program
MAX_BLOCK_DEPTH           64           sub-block nesting (the root block is depth 0)
MAX_OPS                   100,000      ops, all blocks together
MAX_VARS                  200,000      variable declarations, all blocks together
MAX_SLOT_ARGUMENTS        100,000      variables bound to one slot of one op
MAX_LIST_VALUES           16,777,216   values of one list attribute (a constant's data)
MAX_NAME_CHARS            1,024        a name: variable, op type, slot, attribute
MAX_STRING_CHARS          1,048,576    a string attribute value
MAX_CALLSITE_CHARS        256          a callsite (longer ones are cut, not refused)
========================  ===========  =============================================

Names must be printable (no control characters: they are echoed in messages). An op's
callsite ('file.py:12') is shown in error messages, so one read from a file is cleaned:
every character that is not printable (ANSI escapes, newlines) becomes '?' and it is cut
to MAX_CALLSITE_CHARS, so a file cannot forge the text of an error.
"""
from lowering.errors import FormatError

MAX_BLOCKS = 4096
MAX_BLOCK_DEPTH = 64
MAX_OPS = 100_000
MAX_VARS = 200_000
MAX_SLOT_ARGUMENTS = 100_000
MAX_LIST_VALUES = 1 << 24
MAX_NAME_CHARS = 1024
MAX_STRING_CHARS = 1 << 20
MAX_CALLSITE_CHARS = 256

_LISTS = ("ints", "floats", "strings", "bools", "longs", "doubles", "blocks_idx")


def clean_text(text, limit=MAX_CALLSITE_CHARS):
    """`text` with every non-printable character replaced by '?', cut to `limit` chars."""
    if len(text) <= limit and text.isprintable():
        return text
    cleaned = "".join(c if c.isprintable() else "?" for c in text[:limit])
    return cleaned if len(text) <= limit else cleaned[:limit - 3] + "..."


def check_and_clean(desc):
    """Raise FormatError if the parsed ProgramDesc `desc` exceeds a bound of this module;
    clean its callsites in place (see the module docstring)."""
    blocks = desc.blocks
    _at_most(len(blocks), MAX_BLOCKS, "blocks")
    _at_most(sum(len(b.ops) for b in blocks), MAX_OPS, "ops")
    _at_most(sum(len(b.vars) for b in blocks), MAX_VARS, "variables")
    depth = [0] * len(blocks)
    for i, block in enumerate(blocks):
        if 0 <= block.parent_idx < i:   # other orders are refused by the program's checks
            depth[i] = depth[block.parent_idx] + 1
            _at_most(depth[i], MAX_BLOCK_DEPTH, "levels of sub-block nesting",
                     f" (block {i})")
        for var in block.vars:
            _check_name(var.name, "variable name", block_idx=i)
        for j, op in enumerate(block.ops):
            where = dict(op_index=j, block_idx=i)
            _check_name(op.type, "op type", **where)
            where["op_type"] = op.type
            if op.callsite:
                cleaned = clean_text(op.callsite)
                if cleaned != op.callsite:
                    op.callsite = cleaned
            for slot in (*op.inputs, *op.outputs):
                _check_name(slot.parameter, "slot name", **where)
                _at_most(len(slot.arguments), MAX_SLOT_ARGUMENTS,
                         f"variables in slot '{slot.parameter}'", **where)
                for name in slot.arguments:
                    _check_name(name, "variable name", **where)
            for name, attr in op.attrs.items():
                _check_name(name, "attribute name", **where)
                _check_attr(name, attr, where)


def _check_attr(name, attr, where):
    kind = attr.WhichOneof("value")
    if kind in _LISTS:
        values = getattr(attr, kind).values
        _at_most(len(values), MAX_LIST_VALUES, f"values in attribute '{name}'", **where)
        if kind == "strings":
            for value in values:
                _at_most(len(value), MAX_STRING_CHARS, f"characters in attribute '{name}'",
                         **where)
    elif kind == "s":
        _at_most(len(attr.s), MAX_STRING_CHARS, f"characters in attribute '{name}'", **where)


def _check_name(name, what, **where):
    if len(name) > MAX_NAME_CHARS or not name.isprintable():
        shown = ascii(name[:64]) + ("..." if len(name) > 64 else "")
        raise FormatError(f"{what} {shown} is not a name: names are at most {MAX_NAME_CHARS} "
                          "printable characters", **where)


def _at_most(count, bound, what, suffix="", **where):
    if count > bound:
        raise FormatError(f"the program has {count} {what}{suffix}; at most {bound} are "
                          "allowed (bounds: progdesc.limits)", **where)
