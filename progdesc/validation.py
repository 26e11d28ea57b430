"""Checks of a parsed ProgramDesc (from bytes, text or a file): what no API call could have
made is a FormatError naming the block, op or variable, before any view of it is built."""
from lowering import progdesc_pb2 as pb
from lowering import sizes
from lowering.blocks import check_block_references
from lowering.errors import FormatError
from lowering.lower import PRECISIONS
from progdesc import limits

FORMAT_VERSION = 1
"""The ProgramDesc format this progdesc writes; it reads 1..FORMAT_VERSION."""

_UNTYPED_KINDS = (pb.FEED_LIST, pb.FETCH_LIST, pb.STEP_SCOPES)
_VAR_KINDS, _DTYPES = frozenset(pb.VarKind.values()), frozenset(pb.DataType.values())
_ROLES = frozenset(pb.OpRole.values())


def _check_var_descs(block):
    """FormatError naming the first VarDesc of a parsed block that no API could have made."""
    seen = set()
    for var in block.vars:
        where = dict(var=var.name, block_idx=block.idx)
        if not var.name or var.name in seen:
            raise FormatError("is declared twice in its block" if var.name else
                              "has an empty name", **where)
        seen.add(var.name)
        if var.kind == pb.KIND_INVALID or var.kind not in _VAR_KINDS:
            raise FormatError(f"has unknown kind {var.kind}", **where)
        if var.kind not in _UNTYPED_KINDS and (var.dtype == pb.DT_INVALID
                                               or var.dtype not in _DTYPES):
            raise FormatError(f"has unknown dtype {var.dtype}", **where)
        if any(d < -1 for d in var.dims):
            raise FormatError(f"has dims {list(var.dims)}: each must be -1 (unknown) or a size",
                              **where)
        too_big = var.kind not in _UNTYPED_KINDS and sizes.oversized(var.dims, var.dtype)
        if too_big:
            raise FormatError(f"is too large: {too_big}", **where)


def check_desc(desc):
    """FormatError for the first thing in `desc` no API could have made: no blocks, counts or
    names past `progdesc.limits`, an unknown format version, precision, role, variable kind
    or dtype, blocks out of order, a variable declared twice or too large, a reference to a
    block that does not exist. Cleans callsites as `limits.check_and_clean` does."""
    if not desc.blocks:
        raise FormatError("program has no blocks")
    limits.check_and_clean(desc)   # bounded counts and sizes, printable callsites
    if desc.format_version > FORMAT_VERSION or desc.format_version < 1:
        raise FormatError(f"format version {desc.format_version} is not supported "
                          f"(this progdesc reads 1..{FORMAT_VERSION})")
    if not 0 <= desc.precision < len(PRECISIONS):
        raise FormatError(f"precision {desc.precision} is not one of {list(PRECISIONS)}")
    for i, block in enumerate(desc.blocks):
        parent_ok = block.parent_idx == -1 if i == 0 else 0 <= block.parent_idx < i
        if block.idx != i or not parent_ok:
            raise FormatError(f"block {i} has idx {block.idx} and parent {block.parent_idx}: "
                              "blocks must be numbered in order, each after its parent")
        _check_var_descs(block)
        for j, op in enumerate(block.ops):
            if op.role not in _ROLES:
                raise FormatError(f"unknown op role {op.role}", op_type=op.type, op_index=j,
                                  block_idx=i)
    bad_reference = check_block_references(desc)
    if bad_reference:
        raise FormatError(bad_reference)
