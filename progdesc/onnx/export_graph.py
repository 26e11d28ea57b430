"""The writer of ONNX graphs from our blocks (`progdesc.onnx.save`): walks a block op by op
through the export table (`progdesc.onnx.export_rules.EXPORT`), reading persistable
variables from the Scope as initializers, and writes sub-blocks (loop steps, branches)
as ONNX sub-graphs. Ops no row can write are collected into one UnsupportedOpError."""
import collections

import numpy as np
from onnx import helper

from lowering import dtypes
from lowering import registry
from lowering.desc import read_attrs
from lowering.errors import FeedError, ScopeError, UnsupportedOpError
from progdesc.onnx.export_rules import EXPORT
from progdesc.onnx.export_table import Emitter, value_info
from progdesc.translate import Unsupported

_FAILED = object()
_SKIPPED = ("feed", "fetch")


class _NotWritten:
    """What an output the op's ONNX form does not compute is bound to."""

    def __init__(self, op_type, index, slot):
        self.why = (f"output {slot} of op #{index} '{op_type}', which the op's ONNX form "
                    "does not compute")


class _BodyFailed(Exception):
    """A sub-block holds ops that could not be written (they are noted already)."""


class GraphWriter:
    """Walks a (pruned) program's global block through the export table into ONNX nodes,
    binding our variable names to ONNX value names."""

    def __init__(self, program, opset, scope):
        self.program = program
        self.block = program.global_block()
        self.scope = scope
        names = {n for b in program.blocks for n in b.vars}
        writes = collections.Counter(n for b in program.blocks for d in b.desc.ops
                                     for s in d.outputs for n in s.arguments)
        self.once = {n for n, count in writes.items() if count == 1}   # may name a value
        self.e = Emitter(opset, reserved=names, writer=self)
        self.env = collections.ChainMap()   # our variable -> ONNX name (a map per graph)
        self.taken = set()     # our names already given to an ONNX value
        self.unsupported = []  # (op type, block, index, callsite, why)

    def walk(self, feeds, indices):
        """Write the global block's ops (`indices`: their indices in the user's program,
        for the error); UnsupportedOpError naming every op that has no ONNX form."""
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
        saved = self.e.nodes, self.block, self.env, len(self.unsupported)
        self.e.nodes, self.block = [], self.program.block(block_idx)
        self.env = self.env.new_child()
        try:
            graph_inputs = []
            for var in inputs:
                if isinstance(var, str):
                    self.env[var] = self.e.fresh(var)
                    graph_inputs.append(value_info(self.env[var], *self.block.var_type(var),
                                                    None))
                else:   # (dims, dtype) of an input no variable of ours stands for
                    graph_inputs.append(value_info(self.e.fresh("unused"), *var, None))
            for idx, op_desc in enumerate(self.block.desc.ops):
                self.apply(op_desc, idx)
            if len(self.unsupported) > saved[3]:
                raise _BodyFailed()
            values = [self.read(var, f"block {block_idx}'s results") for var in outputs]
            if _FAILED in values:
                raise _BodyFailed()
            results = finish(values) if finish else [
                (v, self.block.var_type(var)) for v, var in zip(values, outputs)]
            graph_outputs = []
            for value, (dims, dtype) in results:
                out = self.e.fresh("out")
                self.e.nodes.append(identity(value, out))
                graph_outputs.append(value_info(out, dims, dtype, None))
            return helper.make_graph(self.e.nodes, self.e.fresh(f"block{block_idx}"),
                                     graph_inputs, graph_outputs)
        finally:
            self.e.nodes, self.block, self.env = saved[:3]

    def read(self, name, reader):
        """The ONNX name of our variable `name` (read by `reader`, for errors): bound
        already, or a persistable one, whose value in the Scope becomes an initializer."""
        if name in self.env:
            value = self.env[name]
            if isinstance(value, _NotWritten):
                raise Unsupported(f"it reads '{name}', {value.why}")
            return value
        var = self.block.find_var(name)
        if var is None or not var.persistable:
            raise FeedError(f"is read by {reader} but neither fed nor computed: add it to "
                            "feed_names", var=name)
        if name not in self.scope:
            raise ScopeError("has no value in the scope: run the startup program first (or "
                             "load a checkpoint)", var=name)
        dtype = self.block.var_type(name)[1]
        value = np.asarray(self.scope.get(name)).astype(dtypes.to_numpy(dtype), copy=False)
        self.env.maps[-1][name] = self.e.initializer(name, value)
        self.taken.add(name)
        return name

    def apply(self, op_desc, index):
        """Write one op through its row, or note why it cannot be."""
        opdef = registry.get(op_desc.type)
        entry = EXPORT.lookup(op_desc.type, self.e.opset)
        if entry is None:
            self.note(op_desc, index, "no ONNX form")
            return self.fail(op_desc)
        first = len(self.e.nodes)
        try:
            reader = f"op #{index} '{op_desc.type}'"
            ins, in_types = self._slots(opdef.inputs, op_desc.inputs, reader)
            _, out_types = self._slots(opdef.outputs, op_desc.outputs, None)
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
        self._name_nodes(first, op_desc.type, index)

    def _name_nodes(self, first, op_type, index):
        """Name the nodes an op became after it: '<type>#<index>[.k]' ('b<block>.' before
        it in a sub-block), so that ONNX tools point back to the op."""
        new = self.e.nodes[first:]
        where = f"b{self.block.idx}." if self.block.idx else ""
        for k, node in enumerate(new):
            node.name = f"{where}{op_type}#{index}" + (f".{k}" if len(new) > 1 else "")

    def _slots(self, slots, bound, reader):
        """The ONNX names (read by `reader`; None: not read) and our types of each slot."""
        by_slot = {s.parameter: list(s.arguments) for s in bound}
        read = reader is not None
        values, types = [], []
        for slot in slots:
            names = by_slot.get(slot.name, [])
            if slot.many:
                values.append([self.read(n, reader) if read else n for n in names])
                types.append([self.block.var_type(n) for n in names])
            elif names:
                values.append(self.read(names[0], reader) if read else names[0])
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
                if onnx_name in made and var in self.once and var not in self.taken:
                    self._rename(first, onnx_name, var)
                    made.discard(onnx_name)
                    onnx_name = var
                    self.taken.add(var)
                self.env[var] = onnx_name

    def _rename(self, first, old, new):   # in the nodes the op's row emitted
        for node in self.e.nodes[first:]:
            for field in (node.input, node.output):
                for i, n in enumerate(field):
                    if n == old:
                        field[i] = new

    def fail(self, op_desc):   # what reads its outputs is skipped, not reported again
        for s in op_desc.outputs:
            for n in s.arguments:
                self.env[n] = _FAILED

    def note(self, op_desc, index, why):
        self.unsupported.append((op_desc.type, self.block.idx, index, op_desc.callsite, why))

    def error(self):
        """The UnsupportedOpError naming every op noted."""
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
        value = self.read(name, "the fetch list")
        if value != name:
            self.e.nodes.append(identity(value, name))
        return value_info(name, *self.block.var_type(name), None)

    def used_initializers(self):
        """The initializers some node reads (in a sub-graph too)."""
        used = set(_names_read(self.e.nodes))
        return [t for n, t in self.e.initializers.items() if n in used]


def _names_read(nodes):
    """The value names `nodes` read, in their sub-graphs too."""
    for node in nodes:
        yield from node.input
        for attr in node.attribute:
            for graph in [attr.g] * attr.HasField("g") + list(attr.graphs):
                yield from _names_read(graph.node)


def identity(source, target):
    return helper.make_node("Identity", [source], [target])


def original_indices(program, pruned):
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
