"""The JSON layer of Paddle 3's PIR programs: `model.json` decoded into plain op records
(`RawOp`: name, operand ids, results with their types, attributes as Python values,
regions), every field checked, with the bounds of `progdesc.limits`. A file that is not
well formed raises FormatError naming the JSON path
(`program.regions[0].blocks[0].ops[12].A[3]`).

The format (Paddle's serialize_deserialize writer; field names are one or two letters):

    {"base_code": {"magic": "pir", "version": 4, "trainable": true},
     "program": {"regions": [{"#": "region_0", "blocks": [{"#": "block_0",
        "args": [], "ops": [op, ...]}]}]}}

- An op is {"#": "<dialect>.<name>", "I": [{"%": id}, ...], "O": [{"%": id, "TT": type},
  ...], "A": [{"N": name, "AT": attr}, ...], "regions": [{"blocks": [block]}]}; dialects
  are numbered (0 builtin, 1 pd_op, 2 cf). Value ids are positive, block arguments
  negative ({"#": id, "TT": type} in a block's "args"), 0 is the empty value.
- A parameter is the short op {"#": "p", "A": [is_distributed, is_parameter, need_clip,
  name], "O": {"%": id, "TT": type}, "OA": [persistable, stop_gradient, trainable]}
  ("OA" only when the program was saved trainable).
- A type is {"#": "0.t_dtensor", "D": [element type, dims (-1 dynamic), layout, lod,
  offset]}, {"#": "0.t_vec", "D": [types]} or an element type such as {"#": "0.t_f32"};
  an attribute is {"#": "0.a_i32", "D": 3}, "0.a_array" of attributes, "1.a_intarray",
  "1.a_dtype" ("float32"), "1.a_scalar" ([dtype, value]), "1.a_place", ...
- Older writers named dialects in full ('pd_op.relu'), value ids "#" like block
  arguments, and wrote parameters as full `builtin.parameter` ops (attribute
  'parameter_name', result attribute 'persistable'); those files read the same.
  Paddle's later patch files (serialize_deserialize/patch/*.yaml) change attribute
  types only (int32 or int64, float or double), which Python values do not see.
"""
import json

from lowering.errors import FormatError
from progdesc import limits

DTYPE_CODES = {"bool": 0, "int16": 1, "int32": 2, "int64": 3, "float16": 4, "float32": 5,
               "float64": 6, "uint8": 20, "int8": 21, "bfloat16": 22, "complex64": 23,
               "complex128": 24, "uint16": 36, "uint32": 37, "uint64": 38}
"""NumPy's dtype names -> Paddle's legacy element type numbers (VarType.Type), which
legacy attributes ('dtype' of fill_constant, 'out_dtype' of cast) hold."""

_ELEMENT_TYPES = {"t_bool": "bool", "t_i8": "int8", "t_ui8": "uint8", "t_i16": "int16",
                  "t_i32": "int32", "t_i64": "int64", "t_f16": "float16", "t_bf16": "bfloat16",
                  "t_f32": "float32", "t_f64": "float64", "t_c64": "complex64",
                  "t_c128": "complex128", "t_index": "int64"}
_DIALECTS = {"0": "builtin", "1": "pd_op", "2": "cf", "3": "custom_op", "4": "dist_op"}
_INT64 = (-(1 << 63), (1 << 63) - 1)
_MAX_RANK = 64
_MAX_ATTR_DEPTH = 8


class DType(str):
    """A PIR dtype attribute ('float32'), kept apart from strings so that the reader can
    write it as the legacy element type number."""


class Path:
    """A JSON path ('program.regions[0].blocks[0].ops[3]') for messages: `path / key`
    is one step deeper; the text is only made when a message needs it."""

    __slots__ = ("parent", "key")

    def __init__(self, key, parent=None):
        self.parent, self.key = parent, key

    def __truediv__(self, key):
        return Path(key, self)

    @property
    def text(self):
        steps, node = [], self
        while node is not None:
            steps.append(node.key)
            node = node.parent
        out = ""
        for key in reversed(steps):
            out += f"[{key}]" if isinstance(key, int) else (f".{key}" if out else key)
        return out

    def fail(self, message):
        raise FormatError(f"PIR program: {self.text}: {message}")


def _field(obj, key, path, kind=None):
    """obj[key], which must exist (and be a `kind`)."""
    if not isinstance(obj, dict):
        path.fail(f"expected an object, got {_what(obj)}")
    if key not in obj:
        path.fail(f"has no field '{key}'")
    return _typed(obj[key], kind, path / key)


def _typed(value, kind, path):
    if kind is None:
        return value
    ok = (isinstance(value, kind) and not (kind is int and isinstance(value, bool)))
    if not ok:
        path.fail(f"expected {_KIND_NAMES.get(kind, kind.__name__)}, got {_what(value)}")
    if kind is int and not _INT64[0] <= value <= _INT64[1]:
        path.fail(f"the integer {_short(value)} does not fit 64 bits")
    if kind is list and len(value) > limits.MAX_LIST_VALUES:
        path.fail(f"a list of {len(value)} items; at most {limits.MAX_LIST_VALUES} "
                  "are allowed (bounds: progdesc.limits)")
    if kind is str and len(value) > limits.MAX_STRING_CHARS:
        path.fail(f"a string of {len(value)} characters; at most "
                  f"{limits.MAX_STRING_CHARS} are allowed (bounds: progdesc.limits)")
    return value


_KIND_NAMES = {dict: "an object", list: "a list", str: "a string", int: "an integer",
               bool: "a boolean", float: "a number"}


def _what(value):
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, (int, float)):
        return f"the number {_short(value)}"
    if isinstance(value, str):
        return f"the string {_short(value)}"
    return _KIND_NAMES.get(type(value), type(value).__name__)


def _short(value):
    text = repr(value) if not isinstance(value, int) or abs(value) < 10 ** 30 else "(huge)"
    return text if len(text) <= 60 else text[:57] + "..."


def check_name(value, path, what):
    _typed(value, str, path)
    if not value or len(value) > limits.MAX_NAME_CHARS or not value.isprintable():
        path.fail(f"{what} {_short(value)} is not a name: names are 1 to "
                  f"{limits.MAX_NAME_CHARS} printable characters")
    return value


# --- types and attributes -------------------------------------------------------------

def _type(obj, path):
    """A PIR type as ('dense', dtype, dims), ('array', dtype, dims), ('vec', [types]),
    ('scalar', dtype) or None (the null type)."""
    tid = _field(obj, "#", path, str)
    if tid == "NULL":
        return None
    dialect, _, name = tid.partition(".")
    if name in _ELEMENT_TYPES and dialect == "0":
        return ("scalar", _ELEMENT_TYPES[name])
    if tid in ("0.t_dtensor", "1.t_dense_tensor_array"):
        data = _field(obj, "D", path, list)
        if len(data) < 2:
            (path / "D").fail(f"expected [element type, dims, ...], got {len(data)} items")
        element = _type(data[0], path / "D" / 0)
        if element is None or element[0] != "scalar":
            (path / "D" / 0).fail("expected an element type")
        dims = _typed(data[1], list, path / "D" / 1)
        if len(dims) > _MAX_RANK:
            (path / "D" / 1).fail(f"a rank of {len(dims)}; at most {_MAX_RANK} is allowed")
        for i, d in enumerate(dims):
            if _typed(d, int, path / "D" / 1 / i) < -1:
                (path / "D" / 1 / i).fail(f"a dim of {d}")
        return ("dense" if tid == "0.t_dtensor" else "array", element[1], tuple(dims))
    if tid == "0.t_vec":
        data = _field(obj, "D", path, list)
        return ("vec", [_type(t, path / "D" / i) for i, t in enumerate(data)])
    path.fail(f"a type {_short(tid)} that progdesc does not read")


def _attr(obj, path, depth=0):
    """A PIR attribute as a Python value (see the module's text)."""
    if depth > _MAX_ATTR_DEPTH:
        path.fail(f"attributes nested more than {_MAX_ATTR_DEPTH} deep")
    aid = _field(obj, "#", path, str)
    data = path / "D"
    if aid == "0.a_bool":
        return _field(obj, "D", path, bool)
    if aid in ("0.a_i32", "0.a_i64", "0.a_index"):
        return _field(obj, "D", path, int)
    if aid in ("0.a_f32", "0.a_f64"):
        return _float(_field(obj, "D", path), data)
    if aid in ("0.a_str", "0.a_tensorname", "1.a_layout"):
        return _field(obj, "D", path, str)
    if aid == "0.a_array":
        items = _field(obj, "D", path, list)
        return [_attr(a, data / i, depth + 1) for i, a in enumerate(items)]
    if aid == "1.a_intarray":
        items = _field(obj, "D", path, list)
        return [_typed(v, int, data / i) for i, v in enumerate(items)]
    if aid == "1.a_dtype":
        name = _field(obj, "D", path, str)
        if name.startswith("Undefined"):
            return DType("undefined")
        if name not in DTYPE_CODES:
            data.fail(f"a dtype {_short(name)} that progdesc does not know")
        return DType(name)
    if aid == "1.a_scalar":
        return _scalar(_field(obj, "D", path, list), data)
    if aid == "1.a_place":
        return tuple(_field(obj, "D", path, list))
    if aid in ("0.a_c64", "0.a_c128"):
        parts = _field(obj, "D", path, list)
        if len(parts) != 2:
            data.fail("expected [real, imaginary]")
        return complex(_float(parts[0], data / 0), _float(parts[1], data / 1))
    if aid == "0.a_type":
        return _type(_field(obj, "D", path), data)
    path.fail(f"an attribute of type {_short(aid)} that progdesc does not read")


def _float(value, path):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        if value is None:
            path.fail("a number JSON cannot hold (NaN or infinity, written as null)")
        path.fail(f"expected a number, got {_what(value)}")
    if isinstance(value, int):
        _typed(value, int, path)
    return float(value)


def _scalar(data, path):
    if len(data) < 2:
        path.fail(f"expected [dtype, value], got {len(data)} items")
    dtype = _typed(data[0], str, path / 0)
    if dtype == "bool":
        return _typed(data[1], bool, path / 1)
    if dtype.startswith(("int", "uint")):
        return _typed(data[1], int, path / 1)
    if dtype.startswith("complex"):
        if len(data) != 3:
            path.fail("expected [dtype, real, imaginary]")
        return complex(_float(data[1], path / 1), _float(data[2], path / 2))
    return _float(data[1], path / 1)


# --- the program ------------------------------------------------------------------------

class RawOp:
    """A decoded PIR op: its name, operand ids, results [(id, type)], attributes,
    regions (lists of blocks: (args [(id, type)], ops)), and its path and index."""

    __slots__ = ("name", "operands", "results", "attrs", "regions", "path", "index",
                 "extra")

    def __init__(self, name, operands, results, attrs, regions, path, index, extra=None):
        self.name, self.operands, self.results = name, operands, results
        self.attrs, self.regions, self.path, self.index = attrs, regions, path, index
        self.extra = extra


class _Decoder:
    """JSON objects -> _Raw ops, with the bounds of progdesc.limits checked."""

    def __init__(self):
        self.ops = 0
        self.blocks = 0
        self.values = 0
        self.defined = set()

    def block(self, obj, path, depth):
        self.blocks += 1
        if self.blocks > limits.MAX_BLOCKS:
            path.fail(f"more than {limits.MAX_BLOCKS} blocks (bounds: progdesc.limits)")
        if depth > limits.MAX_BLOCK_DEPTH:
            path.fail(f"regions nested more than {limits.MAX_BLOCK_DEPTH} deep "
                      "(bounds: progdesc.limits)")
        args = [self.result(a, path / "args" / i, negative=True)
                for i, a in enumerate(_field(obj, "args", path, list))]
        ops = [self.op(o, path / "ops" / i, i, depth)
               for i, o in enumerate(_field(obj, "ops", path, list))]
        return args, ops

    def result(self, obj, path, negative=False):
        key = "#" if negative or (isinstance(obj, dict) and "%" not in obj) else "%"
        vid = _field(obj, key, path, int)   # older writers named value ids "#" too
        where = path / key
        if negative and vid >= 0:
            where.fail(f"a block argument's id must be negative, got {vid}")
        if not negative and vid < 0:
            where.fail(f"a value id must not be negative, got {vid}")
        if vid != 0:
            if vid in self.defined:
                where.fail(f"value %{vid} is defined twice")
            self.defined.add(vid)
            self.values += 1
            if self.values > limits.MAX_VARS:
                path.fail(f"more than {limits.MAX_VARS} values (bounds: progdesc.limits)")
        return vid, _type(_field(obj, "TT", path), path / "TT")

    def op(self, obj, path, index, depth):
        self.ops += 1
        if self.ops > limits.MAX_OPS:
            path.fail(f"more than {limits.MAX_OPS} ops (bounds: progdesc.limits)")
        name = check_name(_field(obj, "#", path), path / "#", "op name")
        if name == "p":
            return self.parameter(obj, path, index)
        dialect, dot, base = name.partition(".")
        if dot and dialect in _DIALECTS:
            name = f"{_DIALECTS[dialect]}.{base}"
        operands = []
        for i, o in enumerate(_field(obj, "I", path, list) if "I" in obj else []):
            key = "#" if isinstance(o, dict) and "%" not in o else "%"
            operands.append(_field(o, key, path / "I" / i, int))
        results = [self.result(r, path / "O" / i)
                   for i, r in enumerate(_field(obj, "O", path, list))]
        attrs = {}
        for i, a in enumerate(_field(obj, "A", path, list) if "A" in obj else []):
            key = check_name(_field(a, "N", path / "A" / i), path / "A" / i / "N", "attribute name")
            attrs[key] = _attr(_field(a, "AT", path / "A" / i), path / "A" / i / "AT")
        regions = []
        for r, region in enumerate(_field(obj, "regions", path, list)
                                   if "regions" in obj else []):
            rpath = path / "regions" / r
            blocks = _field(region, "blocks", rpath, list)
            regions.append([self.block(b, rpath / "blocks" / k, depth + 1)
                            for k, b in enumerate(blocks)])
        if name == "builtin.parameter":   # the long form older writers used
            return self.long_parameter(obj, path, index, attrs, results)
        return RawOp(name, operands, results, attrs, regions, path, index)

    def long_parameter(self, obj, path, index, attrs, results):
        pname = attrs.get("parameter_name")
        if not isinstance(pname, str) or len(results) != 1:
            path.fail("builtin.parameter has a string attribute 'parameter_name' and one "
                      "result")
        persistable = True
        for i, a in enumerate(_field(obj, "OA", path, list) if "OA" in obj else []):
            key = _field(a, "N", path / "OA" / i, str)
            if key == "persistable":
                flags = _attr(_field(a, "AT", path / "OA" / i), path / "OA" / i / "AT")
                persistable = bool(flags[0]) if isinstance(flags, list) and flags \
                    else bool(flags)
        if pname.endswith("__non_persistable"):
            persistable = False
        return RawOp("builtin.parameter", [], results, {"parameter_name": pname}, [], path,
                     index, extra=persistable)

    def parameter(self, obj, path, index):
        attrs = _field(obj, "A", path, list)
        if len(attrs) != 4:
            (path / "A").fail("expected [is_distributed, is_parameter, need_clip, name], "
                              f"got {len(attrs)} items")
        pname = check_name(attrs[3], path / "A" / 3, "parameter name")
        result = self.result(_field(obj, "O", path, dict), path / "O")
        persistable = True
        if "OA" in obj:
            flags = _field(obj, "OA", path, list)
            if flags:
                persistable = bool(_typed(flags[0], int, path / "OA" / 0))
        if pname.endswith("__non_persistable"):
            persistable = False
        return RawOp("builtin.parameter", [], [result], {"parameter_name": pname}, [], path,
                     index, extra=persistable)


def decode(text):
    """The top block of a PIR program (`model.json`: its text or bytes) as (args, [RawOp]).

    Raises FormatError naming the JSON path for a file that is not such a program."""
    if isinstance(text, (bytes, bytearray, memoryview)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as e:
            raise FormatError(f"not a PIR program (.json): byte {e.start} is not UTF-8 "
                              "text") from None
    if not isinstance(text, str):
        raise FormatError(f"not a PIR program (.json): expected text, got "
                          f"{type(text).__name__}")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise FormatError(f"not a PIR program (.json): {e.msg} at line {e.lineno} column "
                          f"{e.colno} (character {e.pos} of {len(text)})") from None
    except (RecursionError, ValueError) as e:
        raise FormatError(f"not a PIR program (.json): {str(e)[:200]}") from None
    root = Path("file")
    base = _field(doc, "base_code", root, dict)
    if base.get("magic") != "pir":
        (root / "base_code" / "magic").fail(f"expected 'pir', got {_what(base.get('magic'))}")
    program = _field(doc, "program", root, dict)
    path = Path("program")
    regions = _field(program, "regions", path, list)
    if len(regions) != 1:
        (path / "regions").fail(f"expected one region, got {len(regions)}")
    blocks = _field(regions[0], "blocks", path / "regions" / 0, list)
    if len(blocks) != 1:
        (path / "regions" / 0 / "blocks").fail(f"expected one block, got {len(blocks)}")
    return _Decoder().block(blocks[0], path / "regions" / 0 / "blocks" / 0, 0)
