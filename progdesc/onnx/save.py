"""Programs of ours written as ONNX models: the forward part of a program, pruned to its
fetch targets, op by op through the export table (`progdesc.onnx.export_rules.EXPORT`).

What becomes what:

- The program is pruned as `progdesc.io.save_inference_model` prunes it (test mode; no
  gradient or optimizer ops; only what the fetches need).
- Feeds become graph inputs under their names, each -1 dim a `dim_param` ('batch' for
  dim 0 when every feed's dim 0 is unknown, else '<feed>_dim<axis>', or the name
  `dim_names` gives it), so the model runs at any size.
- Persistable variables the kept ops read become initializers, with their values from
  the Scope (trained parameters, batch norm statistics).
- Fetch targets become graph outputs under their names.
- Ops of ours become ONNX nodes through their rows; ops with no row, or whose
  attributes a row refuses, are all named in one UnsupportedOpError (type, index in the
  program, source line), and nothing is written.
"""
import collections
import os

import numpy as np

from lowering import dtypes
from lowering import registry
from lowering.desc import read_attrs
from lowering.errors import FeedError, FormatError, ScopeError, UnsupportedOpError
from progdesc.atomic import atomic_write
from progdesc.framework import Variable
from progdesc.onnx.export_rules import EXPORT
from progdesc.onnx.export_table import MAX_OPSET, MIN_OPSET, Emitter, onnx_dtype
from progdesc.prune import prune
from progdesc.scope import global_scope
from progdesc.translate import Unsupported

__all__ = ["save", "to_onnx"]

_SKIPPED = ("feed", "fetch")
_FAILED = object()


class _NotWritten:
    """What an output the op's ONNX form does not compute is bound to."""

    def __init__(self, op_type, index, slot):
        self.why = (f"output {slot} of op #{index} '{op_type}', which the op's ONNX form "
                    "does not compute")


class _BodyFailed(Exception):
    """A sub-block holds ops that could not be written (they are noted already)."""


def save(program, path, feed_names, fetch_vars, opset=17, scope=None, *, dim_names=None):
    """Write the forward part of `program` from `feed_names` to `fetch_vars` as the ONNX
    model file `path` (see the module's text), parameters read from `scope` (default:
    the global one). Returns the ModelProto.

    `opset` is the default domain's opset (13 to 21). `dim_names` names the unknown
    dims of feeds: {feed name: a tuple with a name or None (the default name) for each
    dim, None for known ones}, e.g. {"x": ("batch", None)}; feeds that share a name
    share the size. The model is checked with `onnx.checker.check_model(full_check=True)`
    and written atomically: on any error no file is written (a previous one is kept).
    """
    model = to_onnx(program, feed_names, fetch_vars, opset=opset, scope=scope,
                    dim_names=dim_names)
    atomic_write(os.fspath(path), model.SerializeToString())
    return model


def to_onnx(program, feed_names, fetch_vars, opset=17, scope=None, *, dim_names=None):
    """The checked ONNX ModelProto `save` writes (nothing is written)."""
    import onnx
    from onnx import helper
    if not (isinstance(opset, int) and MIN_OPSET <= opset <= MAX_OPSET):
        raise ValueError(f"opset must be an int from {MIN_OPSET} to {MAX_OPSET}, got {opset!r}")
    feeds = [_name(v) for v in feed_names]
    fetches = [_name(v) for v in fetch_vars]
    if not fetches:
        raise FormatError("an ONNX model needs at least one fetch variable")
    block = program.global_block()
    for name in feeds:
        if block.find_var(name) is None:
            raise FeedError("is a feed but not a variable of the program", var=name)
    pruned = prune(program, feeds, fetches)
    graph = _GraphWriter(pruned, opset, global_scope() if scope is None else scope)
    inputs = [_value_info(n, *pruned.global_block().var_type(n), dims)
              for n, dims in zip(feeds, _dim_params(pruned, feeds, dim_names))]
    graph.walk(feeds, _original_indices(program, pruned))
    outputs = [graph.output(n) for n in fetches]
    graph_proto = helper.make_graph(graph.e.nodes, "progdesc", inputs, outputs,
                                    initializer=graph.used_initializers())
    opsets = [helper.make_opsetid("", opset)]
    model = helper.make_model(graph_proto, opset_imports=opsets, producer_name="progdesc",
                              ir_version=helper.find_min_ir_version_for(opsets))
    onnx.checker.check_model(model, full_check=True)
    return model


def _name(v):
    return v.name if isinstance(v, Variable) else str(v)


class _GraphWriter:
    """Walks the pruned program's global block, binding our variable names to ONNX names."""

    def __init__(self, program, opset, scope):
        self.program = program
        self.block = program.global_block()
        self.scope = scope
        names = {n for b in program.blocks for n in b.vars}
        self.e = Emitter(opset, reserved=names, writer=self)
        self.env = collections.ChainMap()   # our variable -> ONNX name (a map per graph)
        self.taken = set()     # our names already given to an ONNX value
        self.unsupported = []  # (op type, index, callsite, why)

    def walk(self, feeds, indices):
        for name in feeds:
            self.env[name] = name
            self.taken.add(name)
        for idx, op_desc in enumerate(self.block.desc.ops):
            if op_desc.type not in _SKIPPED:
                self.apply(op_desc, indices[idx])
        if self.unsupported:
            raise self.error()

    def subgraph(self, block_idx, inputs, outputs, finish=None):
        """The ONNX graph of our sub-block `block_idx` (see `Emitter.subgraph`)."""
        from onnx import helper
        saved = self.e.nodes, self.block, self.env, len(self.unsupported)
        self.e.nodes, self.block = [], self.program.block(block_idx)
        self.env = self.env.new_child()
        try:
            graph_inputs = []
            for var in inputs:
                if isinstance(var, str):
                    self.env[var] = self.e.fresh(var)
                    graph_inputs.append(_value_info(self.env[var], *self.block.var_type(var),
                                                    None))
                else:   # (dims, dtype) of an input no variable of ours stands for
                    graph_inputs.append(_value_info(self.e.fresh("unused"), *var, None))
            for idx, op_desc in enumerate(self.block.desc.ops):
                self.apply(op_desc, idx)
            if len(self.unsupported) > saved[3]:
                raise _BodyFailed()
            values = [self.read(var, _FetchDesc, -1) for var in outputs]
            if _FAILED in values:
                raise _BodyFailed()
            results = finish(values) if finish else [
                (v, self.block.var_type(var)) for v, var in zip(values, outputs)]
            graph_outputs = []
            for value, (dims, dtype) in results:
                out = self.e.fresh("out")
                self.e.nodes.append(_identity(value, out))
                graph_outputs.append(_value_info(out, dims, dtype, None))
            return helper.make_graph(self.e.nodes, self.e.fresh(f"block{block_idx}"),
                                     graph_inputs, graph_outputs)
        finally:
            self.e.nodes, self.block, self.env = saved[:3]

    def read(self, name, op_desc, index):
        """The ONNX name of our variable `name`: bound already, or a parameter."""
        if name in self.env:
            value = self.env[name]
            if isinstance(value, _NotWritten):
                raise Unsupported(f"it reads '{name}', {value.why}")
            return value
        var = self.block.find_var(name)
        if var is None or not var.persistable:
            raise FeedError(f"is read by op #{index} '{op_desc.type}' but neither fed nor "
                            "computed: add it to feed_names", var=name)
        if name not in self.scope:
            raise ScopeError("has no value in the scope: run the startup program first (or "
                             "load a checkpoint)", var=name)
        dims, dtype = self.block.var_type(name)
        value = np.asarray(self.scope.get(name)).astype(dtypes.to_numpy(dtype), copy=False)
        self.env.maps[-1][name] = self.e.initializer(name, value)
        self.taken.add(name)
        return name

    def apply(self, op_desc, index):
        opdef = registry.get(op_desc.type)
        entry = EXPORT.lookup(op_desc.type, self.e.opset)
        if entry is None:
            self.note(op_desc, index, "no ONNX form")
            return self.fail(op_desc)
        first = len(self.e.nodes)
        try:
            ins, in_types = self._slots(opdef.inputs, op_desc.inputs, op_desc, index)
            _, out_types = self._slots(opdef.outputs, op_desc.outputs, op_desc, index,
                                       read=False)
            if any(x is _FAILED or isinstance(x, list) and _FAILED in x for x in ins):
                return self.fail(op_desc)
            kwargs = entry.arguments(read_attrs(opdef, op_desc), in_types, out_types)
            result = entry.fn(self.e, *ins, **kwargs)
        except Unsupported as err:
            del self.e.nodes[first:]
            self.note(op_desc, index, str(err))
            return self.fail(op_desc)
        except _BodyFailed:
            del self.e.nodes[first:]
            return self.fail(op_desc)
        self.bind(opdef, op_desc, result, first, index)

    def _slots(self, slots, bound, op_desc, index, read=True):
        by_slot = {s.parameter: list(s.arguments) for s in bound}
        values, types = [], []
        for slot in slots:
            names = by_slot.get(slot.name, [])
            if slot.many:
                values.append([self.read(n, op_desc, index) if read else n for n in names])
                types.append([self.block.var_type(n) for n in names])
            elif names:
                values.append(self.read(names[0], op_desc, index) if read else names[0])
                types.append(self.block.var_type(names[0]))
            else:
                values.append(None)
                types.append(None)
        return values, types

    def bind(self, opdef, op_desc, result, first, index):
        """Bind the op's outputs to what the rule returned, naming each new ONNX value
        after the variable it becomes where that name is still free."""
        if len(opdef.outputs) == 1:
            result = (result,)
        elif not isinstance(result, tuple):
            result = (result,) + (None,) * (len(opdef.outputs) - 1)
        by_slot = {s.parameter: list(s.arguments) for s in op_desc.outputs}
        made = {o for node in self.e.nodes[first:] for o in node.output}
        for slot, value in zip(opdef.outputs, result + (None,) * len(opdef.outputs)):
            names = by_slot.get(slot.name, [])
            if value is None:
                values = [None] * len(names)
            else:
                values = list(value) if slot.many else [value] * bool(names)
            for var, onnx_name in zip(names, values):
                if onnx_name is None:
                    if var not in self.env:
                        self.env[var] = _NotWritten(op_desc.type, index, slot.name)
                    continue
                if onnx_name in made and var not in self.taken:
                    self._rename(first, onnx_name, var)
                    made.discard(onnx_name)
                    onnx_name = var
                    self.taken.add(var)
                self.env[var] = onnx_name

    def _rename(self, first, old, new):
        for node in self.e.nodes[first:]:
            for field in (node.input, node.output):
                for i, n in enumerate(field):
                    if n == old:
                        field[i] = new

    def fail(self, op_desc):
        for s in op_desc.outputs:
            for n in s.arguments:
                self.env[n] = _FAILED

    def note(self, op_desc, index, why):
        self.unsupported.append((op_desc.type, self.block.idx, index, op_desc.callsite, why))

    def error(self):
        parts = [f"#{i} '{t}'" + (f" in block {b}" if b else "")
                 + (f" at {line}" if line else "") + f" ({why})"
                 for t, b, i, line, why in self.unsupported]
        return UnsupportedOpError(
            f"cannot write {len(parts)} op(s) as ONNX (opset {self.e.opset}): "
            + "; ".join(parts),
            unsupported=[(t, line, why) for t, _, _, line, why in self.unsupported],
            places=list(self.unsupported))

    def output(self, name):
        """The graph output `name`: the value bound to the fetch target of that name."""
        value = self.env.get(name)
        if isinstance(value, _NotWritten):
            raise UnsupportedOpError(f"the fetch target is {value.why}", var=name)
        value = self.read(name, _FetchDesc, -1)
        if value != name:
            self.e.nodes.append(_identity(value, name))
        return _value_info(name, *self.block.var_type(name), None)

    def used_initializers(self):
        used = set(_names_read(self.e.nodes))
        return [t for n, t in self.e.initializers.items() if n in used]


def _names_read(nodes):
    """The value names `nodes` read, in their sub-graphs too."""
    for node in nodes:
        yield from node.input
        for attr in node.attribute:
            for graph in [attr.g] * attr.HasField("g") + list(attr.graphs):
                yield from _names_read(graph.node)


class _FetchDesc:
    type = "fetch"


def _identity(source, target):
    from onnx import helper
    return helper.make_node("Identity", [source], [target])


def _value_info(name, dims, dtype, dim_params):
    """A graph input or output: -1 dims named by `dim_params` (unnamed where None)."""
    from onnx import helper
    shape = [d if d >= 0 else (dim_params[i] if dim_params else None)
             for i, d in enumerate(dims)]
    return helper.make_tensor_value_info(name, onnx_dtype(dtype), shape)


def _dim_params(program, feeds, dim_names):
    """The dim_param of each -1 dim of each feed (None for the known dims)."""
    dim_names = dict(dim_names or {})
    unknown = sorted(set(dim_names) - set(feeds))
    if unknown:
        raise FeedError(f"dim_names names '{unknown[0]}', which is no feed (the feeds: {feeds})",
                        var=unknown[0])
    shapes = [program.global_block().var_type(n)[0] for n in feeds]
    batch = bool(shapes) and all(len(s) and s[0] == -1 for s in shapes)
    out = []
    for name, dims in zip(feeds, shapes):
        given = dim_names.get(name)
        if given is not None and (not isinstance(given, (tuple, list)) or len(given) != len(dims)):
            raise FeedError(f"dim_names gives {given!r} for a feed of {len(dims)} dims: give a "
                            "tuple with a name or None for each", var=name)
        params = []
        for axis, d in enumerate(dims):
            chosen = given[axis] if given is not None else None
            if d >= 0:
                if chosen is not None:
                    raise FeedError(f"dim_names names dim {axis}, of known size {d}: name only "
                                    "the unknown (-1) dims", var=name)
                params.append(None)
            elif chosen is not None:
                if not isinstance(chosen, str) or not chosen:
                    raise FeedError(f"dim_names[{name!r}][{axis}] must be a name, got "
                                    f"{chosen!r}", var=name)
                params.append(chosen)
            else:
                params.append("batch" if axis == 0 and batch else f"{name}_dim{axis}")
        out.append(params)
    return out


def _original_indices(program, pruned):
    """The index in `program`'s global block of each op of `pruned`'s (its ops are a
    subsequence of those, in order)."""
    original = program.global_block().desc.ops
    out, at = [], 0
    for op_desc in pruned.global_block().desc.ops:
        found = at
        while found < len(original) and not _same_op(original[found], op_desc):
            found += 1
        if found == len(original):
            out.append(len(out))
            continue
        out.append(found)
        at = found + 1
    return out


def _same_op(a, b):
    return (a.type == b.type and list(a.inputs) == list(b.inputs)
            and list(a.outputs) == list(b.outputs) and a.role == b.role)



