"""How large one array may be: no buffer larger than this machine's physical memory.

A shape whose buffer would exceed it cannot run here (XLA aborts the process on a
size that overflows, or fails to allocate), so it is refused before anything is
compiled: on a shape attribute when an op is appended or a program loaded
(lowering.constraints.Dims), on a variable declaration, and on every op's result
when its shape is inferred and when the block is traced with the fed sizes.
"""
import functools
import os

from lowering import checks, dtypes
from lowering.errors import ProgramError, ShapeError

_UNKNOWN_MEMORY = 2**40   # where the OS does not say: 1 TiB


@functools.cache
def max_buffer_bytes():
    """The most bytes one array may take: the machine's physical memory (os.sysconf)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return _UNKNOWN_MEMORY


def _shown(n):
    return f"{n:,} bytes" if n < 2**30 else f"{n / 2**30:.3g} GiB"


def _shape(dims):
    if len(dims) <= 8:
        return checks.dims(dims)
    return f"[{', '.join(map(str, dims[:6]))}, ... ({len(dims)} dims)]"


_COUNTED = 2**128   # element counts are exact up to here (a product of many dims stops)


def oversized(dims, dtype=None):
    """Why an array of `dims` and `dtype` (in any spelling lowering.dtypes reads; None:
    unknown, one byte per element at least) cannot be held, or None when it can."""
    extent, empty = 1, False   # the product of the dims other than 0
    for d in dims:
        if isinstance(d, int) and d >= 0:   # unknown (-1) and symbolic dims left out
            empty = empty or d == 0
            extent = min(extent * max(d, 1), _COUNTED)
    limit = max_buffer_bytes()
    where = f"more than one array may take on this machine ({_shown(limit)}, its physical memory)"
    if empty:   # no element, but XLA aborts or hangs on such extents
        if extent <= limit:
            return None
        return f"shape {_shape(dims)} holds no element, but its other dims span {where}"
    if dtype is None:
        name, itemsize, at_least = "an array of shape ", 1, "at least "
    else:
        try:
            name, itemsize, at_least = dtypes.name_of(dtype), dtypes.to_numpy(dtype).itemsize, ""
        except ProgramError:   # a dtype no variable declares (a PRNG key's, while tracing)
            name, itemsize, at_least = str(dtype), getattr(dtype, "itemsize", 1), ""
    size = extent * itemsize
    if size <= limit:
        return None
    if extent >= _COUNTED:
        return f"{name}{_shape(dims)} holds more than 2^128 elements: {where}"
    return (f"{name}{_shape(dims)} holds {extent:,} elements, {at_least}{_shown(size)}: "
            f"{where}")


def check_results(produced):
    """ShapeError for the first of an op's results too large to hold: `produced` maps each
    output slot to its values, arrays (or tracers) or (dims, dtype) pairs."""
    for slot, values in produced.items():
        for value in values:
            if value is None:
                continue
            dims, dtype = value if isinstance(value, tuple) else (value.shape, value.dtype)
            too_big = oversized(dims, dtype)
            if too_big:
                raise ShapeError(f"output {slot} {too_big}")
