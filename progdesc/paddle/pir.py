"""The reader of Paddle 3's PIR programs: the `.json` file that `paddle.jit.save` and
`paddle.static.save_inference_model` write by default, decoded into a
`graph.PaddleProgram` whose ops read as legacy ops (`pir_ops`), so that one table
(`progdesc.paddle.rules`) serves both formats.

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
import math

from lowering.errors import FormatError
from progdesc import limits
from progdesc.paddle import pir_ops
from progdesc.paddle.graph import Block, Op, PaddleProgram, Var
from progdesc.paddle.pir_json import DTYPE_CODES, DType, Path, check_name, decode

_UNDEFINED_DTYPE = -1
_BOOKKEEPING = ("struct_name", "op_callstack", "op_role", "op_dist_attr", "stop_gradient",
                "persistable", "place")


def read_pir(text, *, prune=True) -> PaddleProgram:
    """Decode a Paddle 3 PIR program (`model.json`: its text or bytes) into a
    PaddleProgram whose ops read as legacy ops (see the module's text). `prune=False`
    keeps the ops whose results nothing reads (a training program's updates).

    Raises FormatError naming the JSON path for a file that is not such a program."""
    return _Builder().build(decode(text), prune)


# --- PIR ops -> legacy ops -------------------------------------------------------------

def _value_name(vid):
    return f"%{vid}"


class _Builder:
    """Decoded PIR blocks -> graph blocks of legacy ops."""

    def __init__(self):
        self.blocks = []
        self.names = {}       # value id -> variable name
        self.types = {}       # value id -> decoded type
        self.producer = {}    # value id -> (RawOp op, result index)
        self.parts = {}       # vector value id -> ids of its parts (builtin.split)
        self.taken = set()    # names given, to refuse a clash
        self.param_names = set()   # names of the parameters
        self.feeds = 0
        self._splits = {}     # of the block being built: vector id -> builtin.split

    def build(self, top, prune=True):
        self._block(top, -1)
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
    def _block(self, decoded, parent):
        args, ops = decoded
        block = Block(len(self.blocks), parent, {}, [])
        self.blocks.append(block)
        if len(self.blocks) > limits.MAX_BLOCKS:
            raise FormatError(f"PIR program: more than {limits.MAX_BLOCKS} blocks")
        for k, (vid, vtype) in enumerate(args):
            self._define(vid, vtype, block, Path(f"block argument {k}"))
        splits = {}   # vector id -> the first builtin.split of it in this block
        for raw in ops:
            if raw.name == "builtin.split" and len(raw.operands) == 1:
                splits.setdefault(raw.operands[0], raw)
        outer, self._splits = self._splits, splits
        try:
            for raw in ops:
                self._op(raw, block)
        finally:
            self._splits = outer
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
            self.param_names.add(self.names[vid])
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

    def _results_declared(self, raw, block, named=False):
        for k, (vid, vtype) in enumerate(raw.results):
            if named and vid == 0:
                (raw.path / "O" / k).fail(f"{raw.name}'s result is the empty value %0")
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
        check_name(fname, raw.path / "A", "feed name")
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
        if raw.results[0][0] == 0:
            (raw.path / "O" / 0).fail(f"{raw.name}'s result is the empty value %0")
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
        self._results_declared(raw, block, named=True)
        outs = [self.names[vid] for vid, _ in raw.results]
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
        self._results_declared(raw, block, named=True)
        outs = [self.names[vid] for vid, _ in raw.results]
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
        sub = self._block((block_args, ops[:-1]), parent.idx)
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
            if target is not None and target in self.param_names:
                self.names[vid] = target
                self.types[vid] = vtype
            else:
                self._define(vid, vtype, block, raw.path / "O" / k)
            outputs[slot] = [self.names[vid]]
        self._finish_attrs(row.type, raw, attrs, inputs)
        self._emit(block, raw, row.type, inputs, outputs, attrs)


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
        other = self._splits.get(vid)
        if other is None:
            return [None] * count
        if len(other.results) != count:
            (other.path / "O").fail(f"builtin.split gives {len(other.results)} parts of a "
                                    f"vector of {count}")
        other.extra = "named"
        return [sid or None for sid, _ in other.results]

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
                if _int_list(shape) and len(shape) == 1 and 0 <= shape[0] <= 64 \
                        and _is_integral(value):
                    return [int(value)] * shape[0]
            return None
        if op.name != "pd_op.full":
            return None
        shape = op.attrs.get("shape", [])
        if not _int_list(shape) or math.prod(shape) != 1:
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
        """Drop the ops none of whose outputs anything reads (constants folded into
        attributes, the shape arithmetic that fed them), in one pass over a worklist."""
        ops = [op for b in self.blocks for op in b.ops]
        reads, producer = {}, {}
        for op in ops:
            for name in _reads(op):
                reads[name] = reads.get(name, 0) + 1
            for name in _writes(op):
                producer[name] = op

        def removable(op):
            outs = _writes(op)
            return outs and op.type not in _KEPT and \
                not any(n in self.param_names or reads.get(n) for n in outs)

        dead = set()
        work = [op for op in ops if removable(op)]
        while work:
            op = work.pop()
            if id(op) in dead or not removable(op):
                continue
            dead.add(id(op))
            for name in _reads(op):
                reads[name] -= 1
                if not reads[name] and name in producer:
                    work.append(producer[name])
        for b in self.blocks:
            b.ops[:] = [op for op in b.ops if id(op) not in dead]


_KEPT = ("feed", "fetch", "pir.if", "pir.while")


def _reads(op):
    names = [n for slot in op.inputs.values() for n in slot]
    if op.type in ("pir.if", "pir.while"):
        for key in ("then_outputs", "else_outputs", "body_outputs"):
            names.extend(op.attrs.get(key, ()))
        if "body_cond" in op.attrs:
            names.append(op.attrs["body_cond"])
    return names


def _writes(op):
    return [n for slot in op.outputs.values() for n in slot if n]


def _int_list(value):
    return isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value)


def _is_integral(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and \
        math.isfinite(value) and float(value).is_integer()
