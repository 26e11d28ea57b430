"""The export table: op type of ours -> the rule that writes it as ONNX nodes, and the
`Emitter` those rules write through. The rows are in `export_math`, `export_nn`,
`export_shape` and `export_rules` (control flow), one family each.

A row, the mirror of an import row (`progdesc.onnx.rules`):

```python
@EXPORT.rule("conv2d")
def conv2d(e, Input, Filter, *, strides, paddings, dilations, groups, padding_algorithm):
    return e.node("Conv", [Input, Filter], strides=strides, ...)
```

- Positional parameters after `e` are the op's input slots in order: the ONNX name of
  the value bound to each (None for an empty optional slot, a list for a `many` slot).
  Keyword-only parameters are the op's attributes (defaults filled in); `in_types` /
  `out_types` give our (dims, dtype) of each input / output slot (a list for a `many`
  slot, None for an empty one).
- Return the ONNX name of the op's output (one output slot), or a tuple with one entry
  per output slot (None for an output the rule does not write: reading it is an error).
- A rule appends nodes with `e.node(type, inputs, outputs=1, **attributes)` and makes
  constants with `e.const(array)`, `e.ints(values)`, `e.scalar(value, dtype)`; a
  sub-block of ours (a loop step, a branch) becomes a graph attribute through
  `e.subgraph(block, inputs, outputs)`.
- `e.opset` is the opset being written: one rule covers every version, with the forms
  that differ (Reduce* axes, Split) picked by the emitter's helpers.
- Raise `Unsupported("why")` for attributes with no ONNX form: the op is named in the
  error listing them all.
"""
import numpy as np
from onnx import helper, numpy_helper

from lowering import dtypes
from progdesc.translate import RuleTable

MIN_OPSET, MAX_OPSET = 13, 21


class ExportTable(RuleTable):
    """Op type of ours -> export rule (`since`: the first opset the row holds for)."""

    def __init__(self):
        super().__init__("op of ours")

    def _add(self, name, since, entry):
        if any(s == since for s, _ in self._rows.get(name, ())):
            raise ValueError(f"the ONNX export table has a row for '{name}' (since {since})")
        super()._add(name, since, entry)


EXPORT = ExportTable()


def onnx_dtype(dtype):
    """The ONNX TensorProto element type of one of our dtype names."""
    return helper.np_dtype_to_tensor_dtype(dtypes.to_numpy(dtype))


class Emitter:
    """Appends ONNX nodes and initializers for the rules, with fresh value names."""

    def __init__(self, opset, reserved=(), writer=None):
        self.opset = opset
        self._writer = writer   # what walks our blocks (export_graph.GraphWriter)
        self.nodes = []
        self.initializers = {}      # name -> TensorProto
        self._used = set(reserved)
        self._consts = {}
        self._count = 0

    def fresh(self, base="v"):
        """A value name used nowhere else in the graph."""
        while True:
            self._count += 1
            name = f"{base}__{self._count}"
            if name not in self._used:
                self._used.add(name)
                return name

    def node(self, op_type, inputs, outputs=1, **attrs):
        """Append an ONNX node of the default domain; returns its output name (a list when
        `outputs` > 1). None in `inputs` is an absent optional input; None attributes are
        left out."""
        names = [self.fresh(op_type) for _ in range(outputs)]
        attrs = {k: v for k, v in attrs.items() if v is not None}
        self.nodes.append(helper.make_node(op_type, ["" if i is None else i for i in inputs],
                                           names, **attrs))
        return names[0] if outputs == 1 else names

    def const(self, value, dtype=None):
        """The name of an initializer holding `value` (made once per distinct value)."""
        array = np.asarray(value, dtype=None if dtype is None else _np(dtype))
        key = (array.dtype.str, array.shape, array.tobytes())
        name = self._consts.get(key)
        if name is None:
            name = self._consts[key] = self.fresh("const")
            self.initializers[name] = numpy_helper.from_array(array, name)
        return name

    def ints(self, values):
        """A 1-D int64 initializer (shapes, axes, starts...)."""
        return self.const(np.asarray(list(values), dtype=np.int64).reshape(-1))

    def scalar(self, value, dtype):
        """A 0-D initializer of our dtype `dtype`."""
        return self.const(np.asarray(value, dtype=_np(dtype)))

    def initializer(self, name, value):
        """Add `value` as the initializer `name` (a parameter read from the Scope)."""
        self._used.add(name)
        self.initializers[name] = numpy_helper.from_array(np.asarray(value, order="C"), name)
        return name

    def subgraph(self, block_idx, inputs, outputs, finish=None):
        """The ONNX GraphProto of our sub-block `block_idx` (a step, a branch): its
        variables `inputs` are the graph's inputs (an entry (dims, dtype) is an input no
        variable stands for), the values of its variables `outputs` the graph's outputs;
        it reads the enclosing graphs' values by name, as ONNX sub-graphs do. `finish`,
        given the outputs' ONNX names, may emit more nodes into the sub-graph and return
        its outputs instead, as [(name, (dims, dtype))]."""
        return self._writer.subgraph(block_idx, inputs, outputs, finish)

    def graph(self, nodes, outputs):
        """A GraphProto of `nodes` with no inputs (a branch reading the enclosing graphs'
        values) and the outputs [(name, (dims, dtype))]."""
        return helper.make_graph(nodes, self.fresh("branch"), [],
                                 [value_info(n, dims, dtype, None) for n, (dims, dtype)
                                  in outputs])

    # --- forms that differ by opset ---
    def reduce(self, op_type, x, axes, keepdims):
        """ReduceX of `x` over `axes` (all when empty): axes as an input for ReduceSum from
        opset 13 and for the others from 18, else as an attribute."""
        axes = [int(a) for a in axes]
        keep = int(bool(keepdims))
        if not axes:
            return self.node(op_type, [x], keepdims=keep)
        if op_type == "ReduceSum" or self.opset >= 18:
            return self.node(op_type, [x, self.ints(axes)], keepdims=keep)
        return self.node(op_type, [x], axes=axes, keepdims=keep)

    def unsqueeze(self, x, axes):
        """Unsqueeze `x` at `axes` (an input from opset 13)."""
        return self.node("Unsqueeze", [x, self.ints(axes)])

    def squeeze(self, x, axes):
        """Squeeze `axes` of `x` (an input from opset 13)."""
        return self.node("Squeeze", [x, self.ints(axes)])

    def split(self, x, axis, sizes=None, parts=None):
        """Split `x` along `axis` into the given `sizes`, or into `parts` equal parts
        (`num_outputs` from opset 18, the output count before)."""
        if sizes is not None:
            return self.node("Split", [x, self.ints(sizes)], outputs=len(sizes), axis=axis)
        if self.opset >= 18:
            return self.node("Split", [x], outputs=parts, axis=axis, num_outputs=parts)
        return self.node("Split", [x], outputs=parts, axis=axis)

    def dim(self, x, axis):
        """The size of dim `axis` of `x` as a 1-D int64 of one element."""
        return self.node("Gather", [self.node("Shape", [x]), self.ints([axis])], axis=0)

    def cast(self, x, dtype):
        """`x` cast to our dtype `dtype`."""
        return self.node("Cast", [x], to=onnx_dtype(dtype))


def _np(dtype):
    return dtypes.to_numpy(dtype)


def value_info(name, dims, dtype, dim_params):
    """A graph input or output: -1 dims named by `dim_params` (unnamed where None)."""
    shape = [d if d >= 0 else (dim_params[i] if dim_params else None)
             for i, d in enumerate(dims)]
    return helper.make_tensor_value_info(name, onnx_dtype(dtype), shape)
