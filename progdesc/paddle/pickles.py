"""Read the Python pickles Paddle writes (`.pdparams`, `.pdopt`) without executing them.

`paddle.static.save` and `paddle.save` write a dict of name -> NumPy array with Python's
pickle (protocols 2 to 4). Loading a pickle with the pickle module runs whatever callables
the file names, so this module never calls it: `loads` walks the opcodes itself and knows
only the constructs that build containers, strings, numbers and NumPy arrays:

- containers: dicts (and `collections.OrderedDict`, read as a dict), lists, tuples;
- str, bytes (also protocol 2's `_codecs.encode(str, 'latin1')` and `bytes()`), int,
  float, bool, None;
- arrays as NumPy pickles them: `numpy.core.multiarray._reconstruct(numpy.ndarray, (0,),
  b'b')` (or `numpy._core...` from NumPy 2) followed by BUILD with (version, shape,
  dtype, fortran order, raw bytes); dtypes `numpy.dtype('f4', False, True)` + BUILD with
  the byte order; NumPy scalars `numpy.core.multiarray.scalar(dtype, raw bytes)`.

Only plain numeric and bool dtypes are accepted (no object, string or structured ones),
and an array's byte count must equal its shape times its item size, so nothing is
allocated beyond the bytes of the file. Anything else (another global, REDUCE of another
callable or with other arguments, BUILD on anything but an array or a dtype, INST, OBJ,
NEWOBJ, persistent ids, extension codes, buffers, truncation, data after STOP, nesting
deeper than MAX_DEPTH) is a `FormatError` naming the byte offset and the opcode.
"""
import struct

import numpy as np

from lowering.errors import FormatError

MAX_DEPTH = 64        # nesting of containers in the result, and of MARKs while reading
MAX_NDIM = 32
MAX_LONG_BYTES = 64   # LONG1/LONG4 integers: no file of arrays needs bigger ones
MAX_SPAN = 1 << 62    # bytes of an array's shape with zero sizes counted as 1 (NumPy's bound)

_DTYPES = frozenset({"b1", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8",
                     "f2", "f4", "f8", "c8", "c16"})

_RECONSTRUCT, _NDARRAY, _DTYPE, _SCALAR, _ENCODE, _BYTES, _ORDERED_DICT = range(7)
_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"): _RECONSTRUCT,
    ("numpy._core.multiarray", "_reconstruct"): _RECONSTRUCT,
    ("numpy", "ndarray"): _NDARRAY,
    ("numpy", "dtype"): _DTYPE,
    ("numpy.core.multiarray", "scalar"): _SCALAR,
    ("numpy._core.multiarray", "scalar"): _SCALAR,
    ("_codecs", "encode"): _ENCODE,
    ("__builtin__", "bytes"): _BYTES,
    ("builtins", "bytes"): _BYTES,
    ("collections", "OrderedDict"): _ORDERED_DICT,
}
_KEY_TYPES = (str, bytes, int, float, bool, type(None))


class _Global:
    """A global the file names: a token, never the object itself."""

    def __init__(self, tag, name):
        self.tag, self.name = tag, name


class _Dtype:
    """A dtype under construction: REDUCE made it, BUILD sets its byte order."""

    def __init__(self, code):
        self.code, self.dtype = code, None


class _Array:
    """An array under construction: _reconstruct made it, BUILD fills it."""

    def __init__(self):
        self.value = None


class _Error(Exception):
    """A reason, turned into a FormatError with the offset and opcode by the reader."""


def load(path):
    """Read the pickle file at `path` (see `loads`); FormatError if it cannot be read."""
    from progdesc.io import read_file
    return loads(read_file(path, "pickle"), where=f"'{path}'")


def loads(data, *, where="pickle"):
    """The value the pickle `data` holds: dicts, lists, tuples, str, bytes, numbers, bool,
    None and NumPy arrays (NumPy scalars for pickled scalars). Executes nothing.

    Raises FormatError naming `where`, the byte offset and the opcode for any construct
    outside that set, a truncated or malformed stream, or data after STOP.
    """
    return _Reader(bytes(data), where).run()


class _Reader:
    def __init__(self, data, where):
        self.data, self.where = data, where
        self.pos = 0
        self.stack, self.marks, self.memo = [], [], {}

    # -- bytes ------------------------------------------------------------------
    def take(self, n):
        if n < 0 or self.pos + n > len(self.data):
            raise _Error(f"needs {n} bytes, {len(self.data) - self.pos} left (truncated)")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def uint(self, n):
        return int.from_bytes(self.take(n), "little")

    def line(self):
        end = self.data.find(b"\n", self.pos, self.pos + 256)
        if end < 0:
            raise _Error("no end of line within 256 bytes")
        out = self.data[self.pos:end]
        self.pos = end + 1
        try:
            return out.decode("ascii")
        except UnicodeDecodeError:
            raise _Error("a global's name is not ASCII") from None

    # -- stack ------------------------------------------------------------------
    def pop(self):
        floor = self.marks[-1] if self.marks else 0
        if len(self.stack) <= floor:
            raise _Error("stack underflow")
        return self.stack.pop()

    def top(self):
        floor = self.marks[-1] if self.marks else 0
        if len(self.stack) <= floor:
            raise _Error("stack underflow")
        return self.stack[-1]

    def pop_mark(self):
        if not self.marks:
            raise _Error("no MARK to pop to")
        mark = self.marks.pop()
        items = self.stack[mark:]
        del self.stack[mark:]
        return items

    def push(self, value):
        self.stack.append(value)

    def run(self):
        while True:
            offset = self.pos
            if offset >= len(self.data):
                raise FormatError(f"{self.where}: truncated at byte {offset}: no STOP opcode")
            code = self.data[offset]
            self.pos += 1
            name, handler = _OPCODES.get(code, (None, None))
            try:
                if handler is None:
                    raise _Error("opcode not accepted in a file of arrays")
                if handler(self) is _STOP:
                    return self.finish(offset)
            except _Error as e:
                label = name or _OTHER_NAMES.get(code, "unknown")
                raise FormatError(f"{self.where}: byte {offset}: opcode {label} "
                                  f"(0x{code:02x}): {e}") from None

    def finish(self, offset):
        if self.marks or len(self.stack) != 1:
            raise _Error(f"stack holds {len(self.stack)} values and {len(self.marks)} "
                         "MARKs at STOP, expected one value")
        if self.pos != len(self.data):
            raise _Error(f"{len(self.data) - self.pos} bytes after STOP")
        return _resolve(self.stack[0], 0)


_STOP = object()


def _resolve(value, depth, done=None):
    """The value with arrays and dtypes under construction replaced by NumPy's objects.

    A container the memo shares is converted once (`done`, by id), so a file that nests
    one list in itself many times costs its size, not 2 ** depth."""
    if depth > MAX_DEPTH:
        raise _Error(f"containers nested deeper than {MAX_DEPTH} (or a cycle)")
    if isinstance(value, _Array):
        if value.value is None:
            raise _Error("an array was never filled (no BUILD)")
        return value.value
    if isinstance(value, (_Dtype, _Global)):
        raise _Error("a dtype or a global is not a value of the file")
    if not isinstance(value, (dict, list, tuple)):
        return value
    done = {} if done is None else done
    if id(value) in done:
        return done[id(value)]
    if isinstance(value, dict):
        out = {k: _resolve(v, depth + 1, done) for k, v in value.items()}
    else:
        out = type(value)(_resolve(v, depth + 1, done) for v in value)
    done[id(value)] = out
    return out


# -- opcodes ----------------------------------------------------------------------
def _proto(r):
    version = r.uint(1)
    if not 2 <= version <= 4:
        raise _Error(f"protocol {version}; Paddle writes 2 to 4")


def _frame(r):
    size = r.uint(8)
    if size > len(r.data) - r.pos:
        raise _Error(f"frame of {size} bytes, {len(r.data) - r.pos} left (truncated)")


def _stop(r):
    return _STOP


def _mark(r):
    if len(r.marks) >= MAX_DEPTH:
        raise _Error(f"MARKs nested deeper than {MAX_DEPTH}")
    r.marks.append(len(r.stack))


def _str(n_bytes):
    def op(r):
        raw = r.take(r.uint(n_bytes))
        try:
            r.push(raw.decode("utf-8", "surrogatepass"))
        except UnicodeDecodeError:
            raise _Error("string is not UTF-8") from None
    return op


def _latin1(n_bytes):      # protocol 2's Python 2 str, read as NumPy and Paddle read it
    def op(r):
        r.push(r.take(r.uint(n_bytes)).decode("latin1"))
    return op


def _bytes(n_bytes):
    def op(r):
        r.push(r.take(r.uint(n_bytes)))
    return op


def _int(n_bytes, signed):
    def op(r):
        r.push(int.from_bytes(r.take(n_bytes), "little", signed=signed))
    return op


def _long(n_bytes):
    def op(r):
        n = r.uint(n_bytes)
        if n > MAX_LONG_BYTES:
            raise _Error(f"integer of {n} bytes (at most {MAX_LONG_BYTES})")
        r.push(int.from_bytes(r.take(n), "little", signed=True))
    return op


def _binfloat(r):
    r.push(struct.unpack(">d", r.take(8))[0])


def _const(value):
    def op(r):
        r.push(value)
    return op


def _empty(kind):
    def op(r):
        r.push(kind())
    return op


def _tuple_n(n):
    def op(r):
        items = [r.pop() for _ in range(n)][::-1]
        r.push(tuple(items))
    return op


def _tuple(r):
    r.push(tuple(r.pop_mark()))


def _list(r):
    r.push(list(r.pop_mark()))


def _dict(r):
    items = r.pop_mark()
    out = {}
    _set_items(out, items)
    r.push(out)


def _set_items(target, items):
    if len(items) % 2:
        raise _Error("odd number of items for a dict")
    if not isinstance(target, dict):
        raise _Error(f"SETITEM on a {_kind(target)}, not a dict")
    for key, value in zip(items[::2], items[1::2]):
        if not isinstance(key, _KEY_TYPES):
            raise _Error(f"dict key of type {_kind(key)}")
        target[key] = value


def _setitem(r):
    value = r.pop()
    key = r.pop()
    _set_items(r.top(), [key, value])


def _setitems(r):
    items = r.pop_mark()
    _set_items(r.top(), items)


def _append(r):
    value = r.pop()
    target = r.top()
    if not isinstance(target, list):
        raise _Error(f"APPEND to a {_kind(target)}, not a list")
    target.append(value)


def _appends(r):
    items = r.pop_mark()
    target = r.top()
    if not isinstance(target, list):
        raise _Error(f"APPENDS to a {_kind(target)}, not a list")
    target.extend(items)


def _pop(r):
    r.pop()


def _pop_mark(r):
    r.pop_mark()


def _dup(r):
    r.push(r.top())


def _put(n_bytes):
    def op(r):
        r.memo[r.uint(n_bytes)] = r.top()
    return op


def _memoize(r):
    r.memo[len(r.memo)] = r.top()


def _get(n_bytes):
    def op(r):
        index = r.uint(n_bytes)
        if index not in r.memo:
            raise _Error(f"memo entry {index} was never stored")
        r.push(r.memo[index])
    return op


def _global(r):
    module, name = r.line(), r.line()
    r.push(_named_global(module, name))


def _stack_global(r):
    name = r.pop()
    module = r.pop()
    if not isinstance(module, str) or not isinstance(name, str):
        raise _Error("STACK_GLOBAL needs two strings")
    r.push(_named_global(module, name))


def _named_global(module, name):
    tag = _GLOBALS.get((module, name))
    if tag is None:
        raise _Error(f"global {module}.{name} is not one that builds arrays")
    return _Global(tag, f"{module}.{name}")


def _reduce(r):
    args = r.pop()
    func = r.pop()
    if not isinstance(func, _Global):
        raise _Error(f"REDUCE of a {_kind(func)}, not an accepted global")
    if not isinstance(args, tuple):
        raise _Error(f"REDUCE of {func.name} with arguments of type {_kind(args)}")
    reducer = _REDUCERS.get(func.tag)
    if reducer is None:
        raise _Error(f"REDUCE of {func.name}, which builds nothing by itself")
    r.push(reducer(func.name, args))


def _reconstruct(name, args):
    if (len(args) != 3 or not isinstance(args[0], _Global) or args[0].tag != _NDARRAY
            or args[2] != b"b" or not isinstance(args[1], tuple)):
        raise _Error(f"{name} with arguments other than (numpy.ndarray, (0,), b'b')")
    return _Array()


def _make_dtype(name, args):
    if (len(args) != 3 or not isinstance(args[0], str) or args[0] not in _DTYPES
            or args[1] is not False or args[2] is not True):
        shown = args[0] if args and isinstance(args[0], str) else "?"
        raise _Error(f"{name} of {shown!r}: only plain numeric and bool dtypes are accepted")
    return _Dtype(args[0])


def _scalar(name, args):
    if (len(args) != 2 or not isinstance(args[0], _Dtype) or args[0].dtype is None
            or not isinstance(args[1], bytes)):
        raise _Error(f"{name} with arguments other than (a built dtype, bytes)")
    dtype, raw = args[0].dtype, args[1]
    if len(raw) != dtype.itemsize:
        raise _Error(f"scalar of {dtype} with {len(raw)} bytes, expected {dtype.itemsize}")
    return np.frombuffer(raw, dtype)[0]


def _encode(name, args):
    if len(args) != 2 or not isinstance(args[0], str) or args[1] not in ("latin1", "latin-1"):
        raise _Error(f"{name} with arguments other than (str, 'latin1')")
    try:
        return args[0].encode("latin1")
    except UnicodeEncodeError:
        raise _Error(f"{name}: a character beyond latin1") from None


def _empty_bytes(name, args):
    if args:
        raise _Error(f"{name} with arguments (only bytes() is accepted)")
    return b""


def _ordered_dict(name, args):
    if args:
        raise _Error(f"{name} with arguments (only OrderedDict() is accepted)")
    return {}


_REDUCERS = {_RECONSTRUCT: _reconstruct, _DTYPE: _make_dtype, _SCALAR: _scalar,
             _ENCODE: _encode, _BYTES: _empty_bytes, _ORDERED_DICT: _ordered_dict}


def _build(r):
    state = r.pop()
    target = r.top()
    if isinstance(target, _Dtype) and target.dtype is None:
        target.dtype = _dtype_state(target.code, state)
    elif isinstance(target, _Array) and target.value is None:
        target.value = _array_state(state)
    else:
        raise _Error(f"BUILD on a {_kind(target)}: only a new array or dtype is accepted")


def _dtype_state(code, state):
    if not isinstance(state, tuple) or len(state) not in (8, 9):
        raise _Error("dtype state is not an 8- or 9-tuple")
    version, order, subarray, names, fields = state[:5]
    if version not in (3, 4) or order not in ("<", ">", "|", "=") or (
            subarray, names, fields) != (None, None, None) or any(
            not isinstance(v, int) for v in state[5:8]) or (
            len(state) == 9 and state[8] is not None):
        raise _Error(f"dtype state {_short(state)} is not a plain dtype's")
    dtype = np.dtype(code)
    return dtype.newbyteorder(order) if order in "<>" else dtype


def _array_state(state):
    if not isinstance(state, tuple) or len(state) not in (4, 5):
        raise _Error("array state is not a 4- or 5-tuple")
    if len(state) == 5:
        if state[0] != 1:
            raise _Error(f"array state version {_short(state[0])}, expected 1")
        state = state[1:]
    shape, dtype, fortran, raw = state
    if not isinstance(shape, tuple) or len(shape) > MAX_NDIM or any(
            type(d) is not int or d < 0 for d in shape):
        raise _Error(f"array shape {_short(shape)} is not up to {MAX_NDIM} sizes >= 0")
    if not isinstance(dtype, _Dtype) or dtype.dtype is None:
        raise _Error("array dtype is not a built numpy.dtype")
    if not isinstance(fortran, bool):
        raise _Error("array order flag is not a bool")
    if not isinstance(raw, bytes):
        raise _Error(f"array data of type {_kind(raw)}, expected bytes")
    count, span = 1, 1      # elements; the extent NumPy checks (zero sizes as 1)
    for d in shape:
        count *= d
        span *= max(d, 1)
    if span * dtype.dtype.itemsize > MAX_SPAN:
        raise _Error(f"array shape {_short(list(shape))} is beyond any array NumPy can hold")
    if count * dtype.dtype.itemsize != len(raw):
        raise _Error(f"array of shape {list(shape)} and dtype {dtype.dtype} needs "
                     f"{count * dtype.dtype.itemsize} bytes, the file holds {len(raw)}")
    try:
        flat = np.frombuffer(raw, dtype.dtype)
        out = flat.reshape(shape, order="F" if fortran else "C")
        return np.array(out, dtype=dtype.dtype.newbyteorder("="), order="C")
    except ValueError as e:
        raise _Error(f"array of shape {_short(list(shape))}: {e}") from None


def _kind(value):
    if isinstance(value, _Global):
        return f"global {value.name}"
    if isinstance(value, _Dtype):
        return "dtype"
    if isinstance(value, _Array):
        return "array"
    return type(value).__name__


def _short(value):
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


_OPCODES = {
    0x80: ("PROTO", _proto), 0x95: ("FRAME", _frame), ord("."): ("STOP", _stop),
    ord("("): ("MARK", _mark), ord("1"): ("POP_MARK", _pop_mark),
    ord("0"): ("POP", _pop), ord("2"): ("DUP", _dup),
    ord("N"): ("NONE", _const(None)), 0x88: ("NEWTRUE", _const(True)),
    0x89: ("NEWFALSE", _const(False)),
    ord("J"): ("BININT", _int(4, True)), ord("K"): ("BININT1", _int(1, False)),
    ord("M"): ("BININT2", _int(2, False)), 0x8a: ("LONG1", _long(1)),
    0x8b: ("LONG4", _long(4)), ord("G"): ("BINFLOAT", _binfloat),
    0x8c: ("SHORT_BINUNICODE", _str(1)), ord("X"): ("BINUNICODE", _str(4)),
    0x8d: ("BINUNICODE8", _str(8)),
    ord("U"): ("SHORT_BINSTRING", _latin1(1)), ord("T"): ("BINSTRING", _latin1(4)),
    ord("C"): ("SHORT_BINBYTES", _bytes(1)), ord("B"): ("BINBYTES", _bytes(4)),
    0x8e: ("BINBYTES8", _bytes(8)),
    ord(")"): ("EMPTY_TUPLE", _empty(tuple)), 0x85: ("TUPLE1", _tuple_n(1)),
    0x86: ("TUPLE2", _tuple_n(2)), 0x87: ("TUPLE3", _tuple_n(3)),
    ord("t"): ("TUPLE", _tuple), ord("]"): ("EMPTY_LIST", _empty(list)),
    ord("l"): ("LIST", _list), ord("a"): ("APPEND", _append),
    ord("e"): ("APPENDS", _appends), ord("}"): ("EMPTY_DICT", _empty(dict)),
    ord("d"): ("DICT", _dict), ord("s"): ("SETITEM", _setitem),
    ord("u"): ("SETITEMS", _setitems),
    ord("q"): ("BINPUT", _put(1)), ord("r"): ("LONG_BINPUT", _put(4)),
    0x94: ("MEMOIZE", _memoize), ord("h"): ("BINGET", _get(1)),
    ord("j"): ("LONG_BINGET", _get(4)),
    ord("c"): ("GLOBAL", _global), 0x93: ("STACK_GLOBAL", _stack_global),
    ord("R"): ("REDUCE", _reduce), ord("b"): ("BUILD", _build),
}

# opcodes refused, named in the error (protocol 0/1 text forms, objects, extensions, buffers)
_OTHER_NAMES = {
    ord("i"): "INST", ord("o"): "OBJ", 0x81: "NEWOBJ", 0x92: "NEWOBJ_EX",
    ord("P"): "PERSID", ord("Q"): "BINPERSID", 0x82: "EXT1", 0x83: "EXT2", 0x84: "EXT4",
    0x97: "NEXT_BUFFER", 0x98: "READONLY_BUFFER", 0x96: "BYTEARRAY8",
    0x8f: "EMPTY_SET", 0x90: "ADDITEMS", 0x91: "FROZENSET",
    ord("I"): "INT", ord("L"): "LONG", ord("F"): "FLOAT", ord("S"): "STRING",
    ord("V"): "UNICODE", ord("p"): "PUT", ord("g"): "GET",
}
