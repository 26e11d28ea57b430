"""The reader of Paddle 3's PIR programs: the `.json` file that `paddle.jit.save` and
`paddle.static.save_inference_model` write by default, decoded into a
`graph.PaddleProgram` whose ops read as legacy ops (`pir_ops`), so that one table
(`progdesc.paddle.rules`) serves both formats.

The file (Paddle's serialize_deserialize writer; field names are one or two letters):

    {"base_code": {"magic": "pir", "version": 4, "trainable": true},
     "program": {"regions": [{"#": "region_0", "blocks": [{"#": "block_0",
        "args": [...], "ops": [op, ...]}]}]}}

- An op is {"#": "<dialect>.<name>", "I": [{"%": id}, ...], "O": [{"%": id, "TT": type},
  ...], "A": [{"N": name, "AT": attr}, ...], "regions": [...]}; dialects are numbered
  (0 builtin, 1 pd_op, 2 cf). Value ids are positive, block arguments negative, 0 is
  the empty value (an optional operand left out).
- A parameter is the short op {"#": "p", "A": [is_distributed, is_parameter, need_clip,
  name], "O": {"%": id, "TT": type}, "OA": [persistable, stop_gradient, trainable]}.
- A type is {"#": "0.t_dtensor", "D": [element type, dims (-1 dynamic), layout, lod,
  offset]}, {"#": "0.t_vec", "D": [types]} or a scalar type such as {"#": "0.t_f32"};
  an attribute is {"#": "0.a_i32", "D": 3}, "0.a_array" of attributes, "1.a_intarray",
  "1.a_dtype" ("float32"), "1.a_scalar" ([dtype, value]), "1.a_place", ...

What the reader makes of it:

- Every value is a variable: a parameter under its name, a `pd_op.data` under its name,
  any other value as '%<id>'. Parameters are persistable variables of block 0, except
  those the file marks non-persistable and those named '*__non_persistable' (the
  dropout state of RNN layers, which `.pdiparams` does not hold).
- `pd_op.data` becomes a legacy `feed` (its `col` in file order), `pd_op.fetch` a
  `fetch`; `builtin.combine` / `builtin.split` disappear into list slots;
  `pd_op.full` becomes `fill_constant` and `pd_op.full_int_array` `assign_value`
  where their values are read as tensors, and nothing where they are folded into an
  attribute; ops whose results nothing reads are left out.
- `pd_op.if` becomes an op 'pir.if': inputs {'Cond': [c]}, outputs {'Out': [...]},
  attributes `then_block`, `else_block` (indices of blocks of the PaddleProgram, also
  in `Op.regions`) and `then_outputs`, `else_outputs` (the names each branch's
  `cf.yield` gives). `pd_op.while` becomes 'pir.while': inputs {'Cond': [c], 'X':
  [initial values]}, outputs {'Out': [...]}, attributes `body_block`, `body_inputs`
  (the names of the body's block arguments, bound to X then to each step's results),
  `body_cond` and `body_outputs` (what the body's `cf.yield` gives: the next
  condition, then the next values). Region blocks are blocks of the program whose
  `parent` is the block of the op; a value of an enclosing block is read by name.
- A PIR op without a row in `pir_ops` keeps its name and positional slots ('0', '1',
  ...), so the translator reports it as unsupported by name, block and index.

A file that is not such a program (bad JSON, a missing or mistyped field, an undefined
value, a bound of `progdesc.limits` exceeded) raises FormatError naming the JSON path
(`program.regions[0].blocks[0].ops[12].A[3]`).
"""
import json
import math

from lowering.errors import FormatError
from progdesc import limits
from progdesc.paddle import pir_ops
from progdesc.paddle.graph import Block, Op, PaddleProgram, Var

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
_UNDEFINED_DTYPE = -1
_BOOKKEEPING = ("struct_name", "op_callstack", "op_role", "op_dist_attr", "stop_gradient",
                "persistable", "place")


class DType(str):
    """A PIR dtype attribute ('float32'), kept apart from strings so that the reader can
    write it as the legacy element type number."""


class _Path:
    """A JSON path ('program.regions[0].blocks[0].ops[3]') for messages."""

    __slots__ = ("text",)

    def __init__(self, text):
        self.text = text

    def __truediv__(self, key):
        return _Path(f"{self.text}[{key}]" if isinstance(key, int) else f"{self.text}.{key}")

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


def _name(value, path, what):
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

class _Raw:
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
        vid = _field(obj, "#" if negative else "%", path, int)
        where = path / ("#" if negative else "%")
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
        name = _name(_field(obj, "#", path), path / "#", "op name")
        if name == "p":
            return self.parameter(obj, path, index)
        dialect, dot, base = name.partition(".")
        if dot and dialect in _DIALECTS:
            name = f"{_DIALECTS[dialect]}.{base}"
        operands = []
        for i, o in enumerate(_field(obj, "I", path, list) if "I" in obj else []):
            operands.append(_field(o, "%", path / "I" / i, int))
        results = [self.result(r, path / "O" / i)
                   for i, r in enumerate(_field(obj, "O", path, list))]
        attrs = {}
        for i, a in enumerate(_field(obj, "A", path, list) if "A" in obj else []):
            key = _name(_field(a, "N", path / "A" / i), path / "A" / i / "N", "attribute name")
            attrs[key] = _attr(_field(a, "AT", path / "A" / i), path / "A" / i / "AT")
        regions = []
        for r, region in enumerate(_field(obj, "regions", path, list)
                                   if "regions" in obj else []):
            rpath = path / "regions" / r
            blocks = _field(region, "blocks", rpath, list)
            regions.append([self.block(b, rpath / "blocks" / k, depth + 1)
                            for k, b in enumerate(blocks)])
        return _Raw(name, operands, results, attrs, regions, path, index)

    def parameter(self, obj, path, index):
        attrs = _field(obj, "A", path, list)
        if len(attrs) != 4:
            (path / "A").fail("expected [is_distributed, is_parameter, need_clip, name], "
                              f"got {len(attrs)} items")
        pname = _name(attrs[3], path / "A" / 3, "parameter name")
        result = self.result(_field(obj, "O", path, dict), path / "O")
        persistable = True
        if "OA" in obj:
            flags = _field(obj, "OA", path, list)
            if flags:
                persistable = bool(_typed(flags[0], int, path / "OA" / 0))
        if pname.endswith("__non_persistable"):
            persistable = False
        return _Raw("builtin.parameter", [], [result], {"parameter_name": pname}, [], path,
                    index, extra=persistable)


def read_pir(text, *, prune=True) -> PaddleProgram:
    """Decode a Paddle 3 PIR program (`model.json`: its text or bytes) into a
    PaddleProgram whose ops read as legacy ops (see the module's text). `prune=False`
    keeps the ops whose results nothing reads (a training program's updates).

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
    root = _Path("file")
    base = _field(doc, "base_code", root, dict)
    if base.get("magic") != "pir":
        (root / "base_code" / "magic").fail(f"expected 'pir', got {_what(base.get('magic'))}")
    program = _field(doc, "program", root, dict)
    path = _Path("program")
    regions = _field(program, "regions", path, list)
    if len(regions) != 1:
        (path / "regions").fail(f"expected one region, got {len(regions)}")
    blocks = _field(regions[0], "blocks", path / "regions" / 0, list)
    if len(blocks) != 1:
        (path / "regions" / 0 / "blocks").fail(f"expected one block, got {len(blocks)}")
    decoder = _Decoder()
    top = decoder.block(blocks[0], path / "regions" / 0 / "blocks" / 0, 0)
    return _Builder().build(top, prune)


# --- PIR ops -> legacy ops -------------------------------------------------------------

def _value_name(vid):
    return f"%{vid}"


class _Builder:
    """Decoded PIR blocks -> graph blocks of legacy ops."""

    def __init__(self):
        self.blocks = []
        self.names = {}       # value id -> variable name
        self.types = {}       # value id -> decoded type
        self.producer = {}    # value id -> (_Raw op, result index)
        self.parts = {}       # vector value id -> ids of its parts (builtin.split)
        self.taken = set()    # names given, to refuse a clash
        self.params = set()   # value ids of parameters
        self.feeds = 0
        self._current = []    # the decoded ops of the block being built

    def build(self, top, prune=True):
        self._block(top, -1, None)
        if prune:
            self._prune()
        return PaddleProgram(self.blocks, "pir")

    # --- naming and declaring ---
    def _define(self, vid, vtype, block, path, name=None, persistable=False):
        if vid == 0:
            return None
        name = name or _value_name(vid)
        if name in self.taken:
            path.fail(f"the variable name '{name}' is given twice")
        self.taken.add(name)
        self.names[vid] = name
        self.types[vid] = vtype
        if vtype is not None and vtype[0] in ("dense", "array"):
            kind = "dense" if vtype[0] == "dense" else "lod_tensor_array"
            block.vars[name] = Var(name, vtype[2], vtype[1], persistable, kind,
                                   stop_gradient=persistable)
        return name

    def _read(self, vid, op, k):
        name = self.names.get(vid)
        if name is None:
            (op.path / "I" / k).fail(f"value %{vid} is not defined before this op")
        return name

    # --- blocks ---
    def _block(self, decoded, parent, _owner):
        args, ops = decoded
        block = Block(len(self.blocks), parent, {}, [])
        self.blocks.append(block)
        if len(self.blocks) > limits.MAX_BLOCKS:
            raise FormatError(f"PIR program: more than {limits.MAX_BLOCKS} blocks")
        for k, (vid, vtype) in enumerate(args):
            self._define(vid, vtype, block, _Path(f"block argument {k}"))
        outer, self._current = self._current, ops
        try:
            for raw in ops:
                self._op(raw, block)
        finally:
            self._current = outer
        return block

    def _op(self, raw, block):
        for k, (vid, _) in enumerate(raw.results):
            if vid:
                self.producer[vid] = (raw, k)
        name = raw.name
        if name == "builtin.parameter":
            vid, vtype = raw.results[0]
            if vtype is None or vtype[0] != "dense":
                (raw.path / "O" / "TT").fail("a parameter must be a dense tensor")
            self._define(vid, vtype, self.blocks[0], raw.path / "O",
                         raw.attrs["parameter_name"], persistable=raw.extra)
            self.params.add(vid)
            return
        if name == "builtin.combine":
            for k, vid in enumerate(raw.operands):
                self._read(vid, raw, k)
            self._results_declared(raw, block)
            return
        if name == "builtin.split":
            if raw.extra == "named":   # the op that made the vector named its parts
                return
            if len(raw.operands) != 1:
                (raw.path / "I").fail("builtin.split takes one vector")
            self._read(raw.operands[0], raw, 0)
            self._results_declared(raw, block)
            self.parts[raw.operands[0]] = [vid for vid, _ in raw.results]
            return
        if name in ("pd_op.data", "pd_op.feed"):
            return self._feed(raw, block)
        if name == "pd_op.fetch":
            return self._fetch(raw, block)
        if name == "pd_op.if":
            return self._if(raw, block)
        if name == "pd_op.while":
            return self._while(raw, block)
        if name == "pd_op.full":
            return self._full(raw, block)
        if name == "pd_op.full_int_array":
            return self._full_int_array(raw, block)
        if name == "cf.yield":
            (raw.path).fail("cf.yield outside the region of an if or a while")
        row = pir_ops.row(name)
        if row is None:
            return self._unknown(raw, block)
        self._legacy(raw, block, row)

    def _results_declared(self, raw, block):
        for k, (vid, vtype) in enumerate(raw.results):
            self._define(vid, vtype, block, raw.path / "O" / k)

    def _emit(self, block, raw, op_type, inputs, outputs, attrs, regions=()):
        block.ops.append(Op(op_type, inputs, outputs, attrs, block.idx, raw.index,
                            list(regions)))

    # --- special ops ---
    def _feed(self, raw, block):
        if len(raw.results) != 1:
            (raw.path / "O").fail("pd_op.data has one result")
        fname = raw.attrs.get("name")
        if not isinstance(fname, str):
            (raw.path / "A").fail("pd_op.data has no string attribute 'name'")
        _name(fname, raw.path / "A", "feed name")
        vid, vtype = raw.results[0]
        if vtype is None or vtype[0] != "dense":
            (raw.path / "O" / 0).fail("a feed must be a dense tensor")
        name = self._define(vid, vtype, block, raw.path / "O" / 0, fname)
        if "feed" not in block.vars:
            block.vars["feed"] = Var("feed", (), "", False, "feed_minibatch")
        self._emit(block, raw, "feed", {"X": ["feed"]}, {"Out": [name]},
                   {"col": self.feeds})
        self.feeds += 1

    def _fetch(self, raw, block):
        if len(raw.operands) != 1:
            (raw.path / "I").fail("pd_op.fetch takes one value")
        source = self._read(raw.operands[0], raw, 0)
        col = raw.attrs.get("col", 0)
        if isinstance(col, bool) or not isinstance(col, int):
            (raw.path / "A").fail("pd_op.fetch's 'col' is not an integer")
        if "fetch" not in block.vars:
            block.vars["fetch"] = Var("fetch", (), "", False, "fetch_list")
        self._emit(block, raw, "fetch", {"X": [source]}, {"Out": ["fetch"]}, {"col": col})

    def _full(self, raw, block):
        vid, vtype = self._one_result(raw)
        attrs = self._attrs(raw, {"place": None})
        if "value" in attrs and isinstance(attrs["value"], complex):
            attrs["value"] = attrs["value"].real
        self._define(vid, vtype, block, raw.path / "O" / 0)
        self._emit(block, raw, "fill_constant", {}, {"Out": [self.names[vid]]}, attrs)

    def _full_int_array(self, raw, block):
        vid, vtype = self._one_result(raw)
        values = raw.attrs.get("value", [])
        if not isinstance(values, list) or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in values):
            (raw.path / "A").fail("pd_op.full_int_array's 'value' is not a list of integers")
        dtype = raw.attrs.get("dtype", DType("int64"))
        code = DTYPE_CODES.get(dtype, DTYPE_CODES["int64"])
        typed = "int32_values" if dtype == "int32" else "int64_values"
        self._define(vid, vtype, block, raw.path / "O" / 0)
        self._emit(block, raw, "assign_value", {}, {"Out": [self.names[vid]]},
                   {"shape": [len(values)], "dtype": code, typed: list(values),
                    "values": list(values)})

    def _one_result(self, raw):
        if len(raw.results) != 1:
            (raw.path / "O").fail(f"{raw.name} has one result, got {len(raw.results)}")
        return raw.results[0]

    def _if(self, raw, block):
        if len(raw.operands) != 1:
            (raw.path / "I").fail("pd_op.if takes one condition")
        if len(raw.regions) != 2:
            (raw.path / "regions").fail(f"pd_op.if has two regions, got {len(raw.regions)}")
        cond = self._read(raw.operands[0], raw, 0)
        attrs, regions = {}, []
        for r, branch in enumerate(("then", "else")):
            sub, yielded = self._region(raw, r, block, args=0)
            if len(yielded) != len(raw.results):
                (raw.path / "regions" / r).fail(
                    f"the {branch} branch yields {len(yielded)} values for "
                    f"{len(raw.results)} results")
            attrs[f"{branch}_block"] = sub.idx
            attrs[f"{branch}_outputs"] = yielded
            regions.append(sub)
        self._results_declared(raw, block)
        outs = [self.names.get(vid, None) for vid, _ in raw.results]
        self._emit(block, raw, "pir.if", {"Cond": [cond]}, {"Out": outs}, attrs, regions)

    def _while(self, raw, block):
        if len(raw.operands) < 1 or len(raw.regions) != 1:
            (raw.path).fail("pd_op.while takes a condition and has one region")
        cond = self._read(raw.operands[0], raw, 0)
        inits = [self._read(v, raw, k + 1) for k, v in enumerate(raw.operands[1:])]
        if len(raw.results) != len(inits):
            (raw.path / "O").fail(f"pd_op.while has {len(raw.results)} results for "
                                  f"{len(inits)} loop values")
        sub, yielded = self._region(raw, 0, block, args=len(inits))
        if len(yielded) != len(inits) + 1:
            (raw.path / "regions" / 0).fail(
                f"the body yields {len(yielded)} values; expected the condition and "
                f"{len(inits)} loop values")
        args = [self.names[vid] for vid, _ in raw.regions[0][0][0]]
        self._results_declared(raw, block)
        outs = [self.names.get(vid) for vid, _ in raw.results]
        attrs = {"body_block": sub.idx, "body_inputs": args, "body_cond": yielded[0],
                 "body_outputs": yielded[1:]}
        self._emit(block, raw, "pir.while", {"Cond": [cond], "X": inits}, {"Out": outs},
                   attrs, [sub])

    def _region(self, raw, r, parent, args):
        """Build region `r` of `raw` (one block ending with cf.yield) as a block of the
        program; returns (block, the names it yields)."""
        blocks = raw.regions[r]
        rpath = raw.path / "regions" / r
        if len(blocks) != 1:
            (rpath / "blocks").fail(f"expected one block, got {len(blocks)}")
        block_args, ops = blocks[0]
        if len(block_args) != args:
            (rpath / "blocks" / 0 / "args").fail(f"expected {args} block arguments, got "
                                                  f"{len(block_args)}")
        if not ops or ops[-1].name != "cf.yield":
            (rpath / "blocks" / 0 / "ops").fail("the block does not end with cf.yield")
        last = ops[-1]
        sub = self._block((block_args, ops[:-1]), parent.idx, raw)
        yielded = [self._read(v, last, k) for k, v in enumerate(last.operands)]
        return sub, yielded

    def _unknown(self, raw, block):
        inputs = {str(k): [self._read(v, raw, k)] for k, v in enumerate(raw.operands) if v}
        self._results_declared(raw, block)
        outputs = {str(k): [self.names[vid]] for k, (vid, _) in enumerate(raw.results) if vid}
        self._emit(block, raw, raw.name, inputs, outputs, self._attrs(raw, {}))

    # --- table rows ---
    def _legacy(self, raw, block, row):
        if len(raw.operands) > len(row.operands):
            (raw.path / "I").fail(f"{raw.name} takes at most {len(row.operands)} operands, "
                                  f"got {len(raw.operands)}")
        if len(raw.results) > len(row.results):
            (raw.path / "O").fail(f"{raw.name} has at most {len(row.results)} results, got "
                                  f"{len(raw.results)}")
        attrs = self._attrs(raw, row.attrs)
        attrs.update(row.fixed)
        inputs = {}
        for k, vid in enumerate(raw.operands):
            spec = row.operands[k]
            if spec is None or vid == 0:
                continue
            if isinstance(spec, pir_ops.Fold):
                self._fold(raw, k, vid, spec, inputs, attrs)
            elif spec.endswith("*"):
                inputs[spec[:-1]] = [self._read(v, raw, k) for v in self._list(raw, k, vid)]
            else:
                inputs[spec] = [self._read(vid, raw, k)]
        inplace = pir_ops.INPLACE.get(raw.name, {})
        outputs = {}
        for k, (vid, vtype) in enumerate(raw.results):
            slot = row.results[k]
            if slot is None or vid == 0:
                continue
            if slot.endswith("*"):
                outputs[slot[:-1]] = self._vector_parts(raw, k, vid, vtype, block)
                continue
            over = inplace.get(slot)
            target = inputs.get(over, [None])[0] if over else None
            if target is not None and self._param_named(target):
                self.names[vid] = target
                self.types[vid] = vtype
            else:
                self._define(vid, vtype, block, raw.path / "O" / k)
            outputs[slot] = [self.names[vid]]
        self._finish_attrs(row.type, raw, attrs, inputs)
        self._emit(block, raw, row.type, inputs, outputs, attrs)

    def _param_named(self, name):
        return any(self.names.get(v) == name for v in self.params)

    def _attrs(self, raw, renames):
        out = {}
        for key, value in raw.attrs.items():
            if key in _BOOKKEEPING:
                continue
            legacy = renames.get(key, key)
            if legacy is None:
                continue
            if isinstance(value, DType):
                value = DTYPE_CODES.get(value, _UNDEFINED_DTYPE)
            out[legacy] = value
        return out

    def _finish_attrs(self, op_type, raw, attrs, inputs):
        if op_type.startswith("reduce_") and "dim" in attrs:
            attrs["reduce_all"] = len(attrs["dim"]) == 0
        if op_type == "cast" and inputs.get("X"):
            vtype = self.types.get(raw.operands[0])
            if vtype and vtype[0] == "dense":
                attrs["in_dtype"] = DTYPE_CODES[vtype[1]]
        if op_type == "split" and "sections" not in attrs and "num" not in attrs:
            attrs["num"] = 0

    def _list(self, raw, k, vid):
        """The value ids a list operand holds: the operands of the builtin.combine that
        made it."""
        made = self.producer.get(vid)
        if made is None or made[0].name != "builtin.combine":
            vtype = self.types.get(vid)
            if vtype is not None and vtype[0] == "vec":
                (raw.path / "I" / k).fail(f"the vector %{vid} is not a builtin.combine")
            return [vid]
        return made[0].operands

    def _vector_parts(self, raw, k, vid, vtype, block):
        """The names of the parts of a vector result: those builtin.split gives them,
        or fresh names where nothing splits it (yet)."""
        self.names[vid] = _value_name(vid)
        self.types[vid] = vtype
        if vtype is None or vtype[0] != "vec":
            (raw.path / "O" / k).fail("expected a vector type for a list result")
        ids = self._later_split(raw, vid, len(vtype[1]))
        names = []
        for j, (part, ptype) in enumerate(zip(ids, vtype[1])):
            if part is None:
                names.append(self._define_fresh(f"%{vid}.{j}", ptype, block))
            else:
                names.append(self._define(part, ptype, block, raw.path / "O" / k,
                                          f"%{part}"))
        return names

    def _define_fresh(self, name, vtype, block):
        self.taken.add(name)
        if vtype is not None and vtype[0] == "dense":
            block.vars[name] = Var(name, vtype[2], vtype[1])
        return name

    def _later_split(self, raw, vid, count):
        """Ids of the parts of vector `vid` as a later builtin.split in the same block
        names them; None for each part when no op splits it."""
        for other in self._current:
            if other.name == "builtin.split" and other.operands == [vid]:
                if len(other.results) != count:
                    (other.path / "O").fail(f"builtin.split gives {len(other.results)} "
                                            f"parts of a vector of {count}")
                other.extra = "named"
                return [sid or None for sid, _ in other.results]
        return [None] * count

    # --- constant folding ---
    def _fold(self, raw, k, vid, spec, inputs, attrs):
        value = self._constant(vid, spec.kind)
        if value is not None:
            attrs[spec.name] = value
            return
        made = self.producer.get(vid)
        parts = None
        if made is not None and made[0].name == "builtin.combine":
            parts = made[0].operands
        elif made is not None and made[0].name == "pd_op.stack":
            inner = self.producer.get(made[0].operands[0]) if made[0].operands else None
            if inner is not None and inner[0].name == "builtin.combine" and \
                    made[0].attrs.get("axis", 0) == 0:
                parts = inner[0].operands
        if parts is not None and spec.tensors:
            inputs[spec.tensors] = [self._read(v, raw, k) for v in parts]
        elif spec.tensor or not spec.tensors:
            inputs[spec.tensor or spec.name] = [self._read(vid, raw, k)]
        else:
            inputs[spec.tensors] = [self._read(vid, raw, k)]

    def _constant(self, vid, kind):
        """The value of a constant operand as the attribute kind wants it, or None."""
        made = self.producer.get(vid)
        if made is None:
            return None
        op = made[0]
        if kind == "ints":
            if op.name == "pd_op.full_int_array":
                return list(op.attrs.get("value", []))
            if op.name == "builtin.combine":
                items = [self._constant(v, "int") for v in op.operands]
                return None if any(i is None for i in items) else items
            if op.name == "pd_op.full":
                shape = op.attrs.get("shape", [])
                value = op.attrs.get("value")
                if isinstance(shape, list) and len(shape) == 1 and isinstance(shape[0], int) \
                        and 0 <= shape[0] <= 64 and _is_integral(value):
                    return [int(value)] * shape[0]
            return None
        if op.name != "pd_op.full":
            return None
        shape = op.attrs.get("shape", [])
        if not isinstance(shape, list) or math.prod(shape) != 1:
            return None
        value = op.attrs.get("value")
        if isinstance(value, complex) or value is None:
            return None
        if kind == "int":
            return int(value) if _is_integral(value) else None
        if kind == "bool":
            return bool(value)
        return float(value)

    # --- leaving out what nothing reads ---
    def _prune(self):
        """Drop ops none of whose outputs anything reads (constants folded into
        attributes, shape arithmetic for them), to a fixed point."""
        keep_types = ("feed", "fetch", "pir.if", "pir.while")
        while True:
            used = set()
            for b in self.blocks:
                for op in b.ops:
                    for names in op.inputs.values():
                        used.update(names)
                    if op.type in ("pir.if", "pir.while"):
                        for key in ("then_outputs", "else_outputs", "body_outputs"):
                            used.update(op.attrs.get(key, ()))
                        used.add(op.attrs.get("body_cond"))
            removed = False
            for b in self.blocks:
                kept = []
                for op in b.ops:
                    outs = [n for names in op.outputs.values() for n in names if n]
                    writes_param = any(self._param_named(n) for n in outs)
                    if outs and op.type not in keep_types and not writes_param and \
                            not any(n in used for n in outs):
                        removed = True
                        continue
                    kept.append(op)
                b.ops[:] = kept
            if not removed:
                return


def _is_integral(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and \
        math.isfinite(value) and float(value).is_integer()
