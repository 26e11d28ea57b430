"""The readers of Paddle's parameter files: the combined `.pdiparams` stream and the
older layout of one file per variable.

A tensor is stored as: uint32 version (0), uint64 count of LoD levels, each level a
uint64 byte size and that many bytes of uint64 offsets, uint32 version (0), int32 size
of a TensorDesc protobuf, the TensorDesc (element type, dims), then the elements, raw
and little-endian. The combined stream is one such tensor per persistable variable, in
sorted name order, and nothing else.

Every count and size is checked against the bytes left before anything is allocated,
so a truncated or hostile file is a FormatError naming the byte offset and the
variable, never a crash or an oversized allocation.
"""
import struct

import numpy as np
from google.protobuf.message import DecodeError

from lowering.errors import FormatError
from progdesc.paddle import framework_pb2 as fpb
from progdesc.paddle.pdmodel import DTYPES
from progdesc.paddle.wire import first_bad_offset

MAX_RANK = 64


class _Stream:
    """A cursor over the bytes of a parameter file."""

    def __init__(self, data, what):
        self.data = memoryview(data)
        self.pos = 0
        self.what = what   # the file, for errors
        self.var = None    # the variable being read, for errors

    def left(self):
        return len(self.data) - self.pos

    def fail(self, message, at=None):
        at = self.pos if at is None else at
        var = f" (variable '{self.var}')" if self.var is not None else ""
        raise FormatError(f"{self.what}, byte offset {at}{var}: {message}", var=self.var)

    def take(self, n, what):
        if n < 0 or n > self.left():
            self.fail(f"{what} needs {n} bytes but only {self.left()} are left "
                      "(truncated or not a Paddle parameter file)")
        chunk = self.data[self.pos:self.pos + n]
        self.pos += n
        return chunk

    def unpack(self, fmt, what):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]


def _read_tensor(s):
    """One tensor at the cursor: (array, LoD levels as lists of offsets)."""
    start = s.pos
    version = s.unpack("<I", "the LoD version word")
    if version != 0:
        s.fail(f"LoD version {version}, expected 0", start)
    levels = s.unpack("<Q", "the LoD level count")
    if levels > s.left() // 8:
        s.fail(f"{levels} LoD levels cannot fit in the {s.left()} bytes left", s.pos - 8)
    lod = []
    for _ in range(levels):
        size = s.unpack("<Q", "a LoD level's size")
        if size % 8:
            s.fail(f"a LoD level of {size} bytes (not a whole number of uint64)", s.pos - 8)
        lod.append(np.frombuffer(s.take(size, "a LoD level"), "<u8").tolist())
    at = s.pos
    version = s.unpack("<I", "the tensor version word")
    if version != 0:
        s.fail(f"tensor version {version}, expected 0", at)
    at = s.pos
    size = s.unpack("<i", "the TensorDesc size")
    if size < 0:
        s.fail(f"a TensorDesc of {size} bytes", at)
    at = s.pos
    raw = bytes(s.take(size, "the TensorDesc"))
    desc = fpb.PdTensorDesc()
    try:
        desc.ParseFromString(raw)
    except (DecodeError, RuntimeError, ValueError):
        bad = first_bad_offset(raw, fpb.PdTensorDesc.DESCRIPTOR)
        s.fail("the TensorDesc protobuf is malformed", at + (bad or 0))
    dtype = DTYPES.get(desc.data_type)
    if dtype is None:
        s.fail(f"element type {desc.data_type}, which progdesc does not know", at)
    dims = list(desc.dims)
    nonzero = 1
    for d in dims[:MAX_RANK + 1]:
        nonzero *= max(d, 1)
    if len(dims) > MAX_RANK or any(d < 0 for d in dims) or nonzero >= 2**62:
        s.fail(f"dims {dims[:8]}{'...' if len(dims) > 8 else ''}", at)
    np_dtype = _numpy_dtype(dtype)
    count = 0 if 0 in dims else 1
    for d in dims if count else ():
        count *= d
        if count * np_dtype.itemsize > s.left():
            s.fail(f"a {dtype} tensor of dims {dims} needs more bytes than the "
                   f"{s.left()} left (truncated, or dims not of this file)", s.pos)
    data = s.take(count * np_dtype.itemsize, f"the {dtype} elements")
    array = np.frombuffer(data, np_dtype.newbyteorder("<")).astype(np_dtype).reshape(dims)
    return array, lod


def _numpy_dtype(name):
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def read_combined(data: bytes, names, what=".pdiparams") -> dict:
    """{name: array} of the combined parameter stream `data` holding the variables
    `names` (stored in sorted order). Raises FormatError, naming the byte offset and the
    variable, for a stream that is truncated, malformed, or has bytes left over."""
    s = _Stream(bytes(data), what)
    values = {}
    for name in sorted(names):
        s.var = name
        values[name] = _read_tensor(s)[0]
    s.var = None
    if s.left():
        s.fail(f"{s.left()} bytes left over after the {len(values)} variables the program "
               "lists (a parameter file of another model?)")
    return values


def read_tensor_file(data: bytes, name=None) -> np.ndarray:
    """The array in a file of the one-file-per-variable layout (one tensor, nothing
    after it). `name` (the variable) is named in errors."""
    s = _Stream(bytes(data), f"parameter file of '{name}'" if name else "parameter file")
    s.var = name
    array = _read_tensor(s)[0]
    if s.left():
        s.fail(f"{s.left()} bytes left over after the tensor")
    return array


def write_tensor(array) -> bytes:
    """The bytes of one tensor in Paddle's stream format (no LoD): for tests and for
    writing a one-file-per-variable model."""
    array = np.ascontiguousarray(array)
    codes = {v: k for k, v in DTYPES.items()}
    desc = fpb.PdTensorDesc(data_type=codes[str(array.dtype)], dims=list(array.shape))
    raw = desc.SerializeToString()
    return (struct.pack("<IQI", 0, 0, 0) + struct.pack("<i", len(raw)) + raw
            + array.astype(array.dtype.newbyteorder("<")).tobytes())
