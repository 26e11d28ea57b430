"""A tiny pickle assembler for the tests of progdesc.paddle.pickles and .training: opcodes
written from pickletools' documentation, never with the pickle module."""
import struct

import numpy as np


def proto(n=2):
    return b"\x80" + bytes([n])


def ustr(s):
    raw = s.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw


def short_bytes(b):
    return b"C" + bytes([len(b)]) + b


def glob_(module, name):
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def stack_glob(module, name):
    return ustr(module) + ustr(name) + b"\x93"


def int1(n):
    return b"K" + bytes([n])


def binint(n):
    return b"J" + struct.pack("<i", n)


def tup(*parts):
    return b"(" + b"".join(parts) + b"t"


def array(arr, module="numpy.core.multiarray", protocol=3):
    """The opcodes NumPy's ndarray.__reduce__ produces for `arr` (a numeric array)."""
    data = arr.tobytes()
    raw = (b"B" + struct.pack("<I", len(data)) + data) if protocol >= 3 else (
        glob_("_codecs", "encode") + tup(ustr(data.decode("latin1")), ustr("latin1")) + b"R")
    b_ = short_bytes(b"b") if protocol >= 3 else (
        glob_("_codecs", "encode") + tup(ustr("b"), ustr("latin1")) + b"R")
    order = arr.dtype.byteorder if arr.dtype.byteorder in "<>|" else "<"
    dtype = (glob_("numpy", "dtype") + tup(ustr(arr.dtype.str[1:]), b"\x89", b"\x88") + b"R"
             + tup(int1(3), ustr(order), b"N", b"N", b"N", binint(-1), binint(-1), int1(0))
             + b"b")
    shape = tup(*(binint(d) for d in arr.shape))
    return (glob_(module, "_reconstruct") + tup(glob_("numpy", "ndarray"), tup(int1(0)), b_)
            + b"R" + tup(int1(1), shape, dtype, b"\x89", raw) + b"b")


def dict_of(**items):
    return b"}(" + b"".join(ustr(k) + v for k, v in items.items()) + b"u"



def pickle_of_arrays(arrays, protocol=3):
    """A whole pickle of the dict {name: numeric array}, as NumPy and Paddle write one."""
    return proto(protocol) + dict_of(**{k: array(np.asarray(v), "numpy._core.multiarray",
                                              protocol) for k, v in arrays.items()}) + b"."
