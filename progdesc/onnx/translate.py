"""The translator of ONNX graphs: walks a ModelProto's graph node by node with the shared
translator (`progdesc.translate`) and the table (`progdesc.onnx.rules.RULES`), into one
of our Programs.

What becomes what:

- Graph inputs (those no initializer gives a value) become data variables of ours under
  their ONNX names, each symbolic dim (a `dim_param` such as 'batch', or an unnamed one)
  a -1 whose name the translator remembers (`dims`), so that shapes computed from it
  are folded symbolically and export keeps it symbolic.
- Initializers become persistable variables under their ONNX names: trainable
  parameters if floating point, state otherwise; one whose value a rule reads at import
  (a Reshape's shape, a Resize's scales: `value_of`) is not trainable, and is left out
  when no op of ours reads it.
- Graph outputs are the fetch targets, in order.
- Every node goes through the row of the table for its domain, type and opset; nodes
  without a row, or whose attributes a row refuses, are collected with their name and
  index into one UnsupportedOpError once the whole graph has been walked.
- Sub-graphs (If's branches, Loop's and Scan's bodies) are translated by the rules that
  own them, through `inline` / `sub_block`; a sub-graph reads the values of the graphs
  around it by name.
"""
import numpy as np

from lowering import dtypes
from lowering.errors import FormatError, ProgramError, UnsupportedOpError
from progdesc.framework import Program, program_guard
from progdesc.onnx import folding, symbolic
from progdesc.onnx import model as onnx_model
from progdesc.onnx.rules import RULES
from progdesc.onnx.table import key
from progdesc.translate import FAILED, Environment, Node, Translator, Unsupported


class _OnnxEnvironment(Environment):
    """ONNX value names -> ours, for one graph; a name nothing defines is refused."""

    def read(self, name):
        try:
            return super().read(name)
        except KeyError:
            raise Unsupported(f"it reads '{onnx_model.shown(name)}', which no node before it "
                              "defines and which is neither an input nor an "
                              "initializer") from None


class OnnxTranslator(Translator):
    """Appends the nodes of an ONNX model's graph to a Program of ours (see the module's
    text).

    Rules (`progdesc.onnx.rules`) call, besides the shared translator's methods:
    `value_of` (the value of a variable known at import: a constant, an initializer, a
    folded shape), `dims` (a variable's dims with the names of its symbolic ones),
    `sizes_of` / `set_sizes` (what an int vector holds, symbolically: ints and
    `progdesc.onnx.symbolic.Size`s such as batch*seq), `size_of_dim` / `source_of` (a
    dim as a Size, and the variable holding a symbol at run time), `materialize` (a
    folded value as a variable), `opset`, `for_training` and `graph_of` (a sub-graph
    attribute as a graph for `inline`).

    Nodes whose inputs are known at import (constants, int initializers, sizes) and that
    `progdesc.onnx.folding` can compute are folded before their rule is looked up: into
    a constant, or, for symbolic sizes, into the `dim_size` ops computing them at run
    time (dropped at the end when only shapes read them).
    """

    def __init__(self, program, model, *, for_training=False, rules=RULES):
        super().__init__(program, rules)
        self.model = model
        self.opsets = onnx_model.opsets(model)
        self.opset = self.opsets.get("", 0)
        self.for_training = for_training
        self.onnx_types = onnx_model.inferred_types(model)   # ONNX name -> (dims, dtype)
        self.known = {}         # our name -> its value, known at import (not trainable)
        self.initializers = {}  # our name -> the value of a trainable initializer
        self.read_at_import = set()   # initializers whose value a rule read
        self._sizes = {}        # our name -> object array of ints and symbolic Sizes
        self._sources = {}      # symbol name -> (our variable, axis) holding it at run time
        self._size_ops = set()  # outputs of the ops computing sizes at run time (materialize)
        self._state = set()     # the initializers that are not trained (ints, bools)
        self._computed = {}     # our name -> (ONNX op, inputs, attrs, output index) of a
        #                         foldable node a trainable initializer kept from folding
        self._dims = {}         # our name -> its dims, symbolic ones by name
        self._envs = []         # the environments of the graphs being walked, innermost last
        self._node = None       # the NodeProto being translated

    # --- what rules call, besides the shared ones ---
    def constant(self, value):
        """`Translator.constant`, remembering the value (see `value_of`)."""
        value = np.asarray(value)
        name = super().constant(value)
        self.known[name] = value
        return name

    def value_of(self, name):
        """The value of our variable `name` if it is known at import (a constant, an
        initializer, a folded shape, or a value computed from initializers), else None.
        An initializer read this way is not trained (its value shapes the program)."""
        if name is None:
            return None
        if name in self.known:
            if name in self._state:
                self.read_at_import.add(name)
            return self.known[name]
        if name in self.initializers:
            self.read_at_import.add(name)
            return self.initializers[name]
        if name in self._computed:
            used = set()
            value = self._computed_value(name, used)
            if value is not None:
                self.read_at_import |= used
            return value
        return None

    def _computed_value(self, name, used, depth=0):
        """The value of `name`, computed by a foldable node left to its row because some
        input was a trainable initializer (collected into `used`, frozen if it succeeds),
        or None."""
        if name in self.known:
            return self.known[name]
        if name in self.initializers:
            used.add(name)
            return self.initializers[name]
        entry = self._computed.get(name)
        if entry is None or depth > 64:
            return None
        op_type, ins, attrs, index = entry
        values = []
        for i in ins:
            value = None if i is None else self._computed_value(i, used, depth + 1)
            if i is not None and value is None:
                return None
            values.append(value)
        outs = folding.fold(op_type, values, attrs)
        if outs is None or symbolic.is_symbolic(outs[index]):
            return None
        return outs[index]

    def dims(self, name):
        """The dims of our variable `name`: ints where known, the name of a symbolic dim
        ('batch') or a `symbolic.Size` (batch*seq) where one is known to hold it, None
        where unknown."""
        ours, _ = self.var(name)
        symbolic_dims = self._dims.get(name)
        if symbolic_dims is None or len(symbolic_dims) != len(ours):
            return [d if d >= 0 else None for d in ours]
        return [d if d >= 0 else s for d, s in zip(ours, symbolic_dims)]

    def set_dims(self, name, dims):
        """Record the dims of our variable `name` (ints, symbol names, Sizes, None)."""
        self._dims[name] = tuple(dims)

    def size_of_dim(self, name, axis):
        """Dim `axis` of our variable `name` as a size: an int, or a `symbolic.Size` whose
        symbols some variable holds at run time (an unknown dim gets a symbol of its own,
        held by `name`)."""
        d = self.dims(name)[axis]
        if isinstance(d, int) or isinstance(d, symbolic.Size):
            return d
        if d is None:
            d = f"{name}:{axis}"
        self._sources.setdefault(d, (name, axis))
        return symbolic.symbol(d)

    def source_of(self, symbol_name):
        """(our variable, axis) holding the symbolic dim `symbol_name` at run time, or None."""
        return self._sources.get(symbol_name)

    def sizes_of(self, name):
        """The elements of a 0-D or 1-D int variable of ours as sizes: ints and symbolic
        `Size`s (`batch`, `batch*seq`), as `Shape` made them and shape computations kept
        them; None if some element is neither."""
        value = self.folded(name)
        if value is None and name in self._computed:
            value = self.value_of(name)
        if value is None or value.ndim > 1 or (value.dtype != object
                                               and value.dtype.kind not in "iub"):
            return None
        return [v if isinstance(v, symbolic.Size) else int(v) for v in value.reshape(-1)]

    def set_sizes(self, name, sizes):
        """Record that our int variable `name` holds `sizes` (ints and Sizes; a list or a
        NumPy array of dtype object)."""
        array = np.empty(np.shape(sizes) if isinstance(sizes, np.ndarray) else len(sizes),
                         dtype=object)
        array[...] = sizes if isinstance(sizes, np.ndarray) else list(sizes)
        self._sizes[name] = array

    def folded(self, name):
        """What our variable `name` holds, as far as import knows: its value (a constant, an
        int initializer), an object array of ints and symbolic Sizes, or None. Trainable
        initializers are not read (their value is not frozen)."""
        if name is None:
            return None
        if name in self._sizes:
            return self._sizes[name]
        return self.known.get(name)

    def graph_of(self, graph):
        """A sub-graph attribute (GraphProto) as a graph for `inline` / `sub_block`."""
        return graph

    def inline(self, graph, args=None):
        """Translate the ONNX sub-graph `graph` into the current block, its inputs bound
        to `args` (our names; None: all FAILED); returns our names of its outputs. The
        sub-graph reads the values of the graphs around it by name."""
        env = _OnnxEnvironment(self, self._envs[-1] if self._envs else None)
        inputs = [i.name for i in graph.input]
        env.bind(inputs, [FAILED] * len(inputs) if args is None else list(args))
        for tensor in graph.initializer:
            env.bind([tensor.name], [self.constant(onnx_model.to_array(tensor))])
        self.walk(graph, env)
        outs = []
        for out in graph.output:
            try:
                outs.append(env.read(out.name))
            except Unsupported:
                outs.append(FAILED)
        return outs

    # --- the walk ---
    def walk(self, graph, env):
        """Translate the nodes of `graph` into the current block of ours."""
        self._envs.append(env)
        try:
            for index, node in enumerate(graph.node):
                self._apply(node, index, env)
        finally:
            self._envs.pop()

    def _apply(self, proto, index, env):
        name = onnx_model.shown(proto.name or (proto.output[0] if proto.output else ""))
        op_key = key(proto.domain, proto.op_type)
        outputs = tuple(o or None for o in proto.output)
        line = f"node '{name}'" if name else ""
        try:
            attrs = onnx_model.attributes(proto)
        except FormatError as e:
            self.note(Node(op_key, (), outputs, {}, line=line, index=index), str(e))
            env.bind(outputs, [FAILED] * len(outputs))
            return
        subgraphs = tuple(v for v in attrs.values() if hasattr(v, "node"))
        node = Node(op_key, (), outputs, attrs, line=line, scope=_scope_of(name),
                    block=len(self._envs) - 1, index=index,
                    in_types=tuple(self.onnx_types.get(i) for i in proto.input),
                    out_types=tuple(self.onnx_types.get(o) for o in proto.output),
                    subgraphs=subgraphs)
        try:
            ins = [env.read(i) if i else None for i in proto.input]
        except Unsupported as e:
            self.note(node, str(e), type(e))
            env.bind(outputs, [FAILED] * len(outputs))
            return
        self.version = self.opsets.get("" if proto.domain in onnx_model.DEFAULT_DOMAINS
                                       else proto.domain)
        folded = self._fold(proto, ins, attrs)
        if folded is not None:   # known at import: a constant, or sizes computed at run time
            saved = self._scope, self._callsite
            self._scope, self._callsite = node.scope or saved[0], node.line or saved[1]
            try:
                env.bind(outputs, [None if o is None else
                                   self.materialize(v, self.onnx_types.get(o))
                                   for o, v in zip(outputs, folded)])
                return
            except (ProgramError, TypeError, ValueError):
                pass   # a value no variable of ours holds: the node's row decides
            finally:
                self._scope, self._callsite = saved
        self._node = proto
        try:
            results = self.apply_checked(node, ins)
        finally:
            self._node = None
        results = list(results) + [None] * (len(outputs) - len(results))
        if folding.can_fold(proto.op_type) and proto.domain in onnx_model.DEFAULT_DOMAINS:
            for k, result in enumerate(results):
                if isinstance(result, str) and result not in self.known and result not in ins:
                    self._computed.setdefault(result, (proto.op_type, ins, dict(
                        attrs, _outputs=len(proto.output)), k))
        for out, result in zip(outputs, results):
            if out is not None and result is None:
                if out in self._read:
                    self.note(node, f"its output '{onnx_model.shown(out)}' is not translated")
                result = FAILED
            if out is not None and result is not FAILED:
                typ = self.onnx_types.get(out)
                if typ is not None and typ[0] is not None and result not in self._dims:
                    self._dims[result] = typ[0]
            env.bind([out], [result])

    def materialize(self, value, onnx_type=None):
        """Our variable holding the folded `value` (an array; of dtype object for symbolic
        sizes): a constant, or the dims its sizes are made of read at run time
        (`dim_size`), the sizes recorded beside it (`sizes_of`). `onnx_type`: the ONNX
        (dims, dtype) of the value, for its dtype."""
        dtype = onnx_type[1] if onnx_type is not None else None
        if not symbolic.is_symbolic(value):
            if dtype is not None and value.dtype != onnx_model.as_numpy_dtype(dtype):
                value = value.astype(onnx_model.as_numpy_dtype(dtype))
            return self.constant(value)
        dtype = dtype or "int64"
        work = "float32" if dtype.startswith("float") else "int64"
        elements = []
        for v in value.reshape(-1):
            if not isinstance(v, symbolic.Size):
                elements.append(self.constant(np.asarray(v, dtype=work)))
                continue
            total = None
            for mono, coef in v.terms.items():
                term = None if coef == 1 and mono else self.constant(
                    np.asarray(coef, dtype=work))
                for name in mono:
                    var, axis = self._sources[name]
                    dim = self._size_op("dim_size", var, axis=axis, dtype=work)
                    term = dim if term is None else self._size_op("mul", term, dim)
                total = term if total is None else self._size_op("add", total, term)
            elements.append(total)
        out = self._size_op("stack", elements, axis=0)
        if value.ndim != 1:
            out = self._size_op("reshape", out, shape=list(value.shape))
        if dtype != work:
            out = self._size_op("cast", out, dtype=dtype)
        self._sizes[out] = value
        return out

    def _size_op(self, op_type, *args, **attrs):
        out = self.call(op_type, *args, **attrs)
        self._size_ops.add(out)
        return out

    def _drop_unread_sizes(self, fetches):
        """Remove the ops computing sizes at run time and the constants that no op reads
        (what only gave shapes at import)."""
        block = self.program.global_block()
        ops = block.desc.ops
        reads = {}
        for b in self.program.blocks:
            for op in b.desc.ops:
                for slot in op.inputs:
                    for a in slot.arguments:
                        reads[a] = reads.get(a, 0) + 1
        for name in fetches:
            reads[name] = reads.get(name, 0) + 1
        dropped = set()
        for index in range(len(ops) - 1, -1, -1):
            outs = [a for slot in ops[index].outputs for a in slot.arguments]
            if outs and all((o in self._size_ops or o in self.known) and not reads.get(o)
                            for o in outs):
                for slot in ops[index].inputs:
                    for a in slot.arguments:
                        reads[a] -= 1
                dropped.update(outs)
                del ops[index]
        if dropped:
            keep = [v for v in block.desc.vars if v.name not in dropped]
            del block.desc.vars[:]
            block.desc.vars.extend(keep)
            block.sync()

    def _fold(self, proto, ins, attrs):
        """The outputs of a default-domain node computed at import (see
        `progdesc.onnx.folding`) from its inputs' folded values, or None."""
        if (proto.domain not in onnx_model.DEFAULT_DOMAINS
                or not folding.can_fold(proto.op_type)):
            return None
        values = []
        for name in ins:
            if name is FAILED:
                return None
            value = self.folded(name)
            if name is not None and value is None:
                return None
            values.append(value)
        outs = folding.fold(proto.op_type, values, dict(attrs, _outputs=len(proto.output)))
        if outs is None or len(outs) < len(proto.output):
            return None
        self.read_at_import |= self._state.intersection(ins)   # dropped if no op reads them
        return outs[:len(proto.output)]

    def computed_by(self, name):
        """(ONNX op type, our input names, attributes) of the foldable default-domain node
        that made our variable `name` at run time (its inputs not all known at import),
        or None."""
        entry = self._computed.get(name)
        return None if entry is None else entry[:3]

    @property
    def node_proto(self):
        """The NodeProto being translated (for a rule that needs more than its inputs and
        attributes: how many outputs it has)."""
        return self._node

    def translate_graph(self, values):
        """Translate the model's main graph whose initializers hold `values`; returns
        (feed names, fetch names, state)."""
        graph = self.model.graph
        block = self.program.global_block()
        self._read = _read_names(graph)
        env = _OnnxEnvironment(self)
        state = {}
        for name, value in values.items():
            trainable = value.dtype.kind == "f"
            dtype = value.dtype
            if trainable:
                block.create_parameter(name, list(value.shape), str(dtype))
                self.initializers[name] = value
            else:
                block.create_var(name, list(value.shape), str(dtype), persistable=True,
                                 stop_gradient=True)
                self.known[name] = value
                self._state.add(name)
            state[name] = value
            env.bind([name], [name])
        feeds = []
        for info in graph.input:
            if info.name in values:
                continue
            typ = onnx_model.tensor_type(info.type)
            if typ is None or typ[0] is None:
                raise FormatError(f"graph input '{onnx_model.shown(info.name)}' is not a "
                                  "tensor of known rank and element type")
            dims, dtype = typ
            named = [d if d is not None else f"{info.name}:{axis}"
                 for axis, d in enumerate(dims)]
            block.create_var(info.name, [d if isinstance(d, int) else -1 for d in dims],
                             dtype, stop_gradient=True, need_check_feed=True)
            self._dims[info.name] = tuple(named)
            for axis, d in enumerate(named):
                if isinstance(d, str):
                    self._sources.setdefault(d, (info.name, axis))
            env.bind([info.name], [info.name])
            feeds.append(info.name)
        with program_guard(self.program):   # control-flow builders append to it
            self.walk(graph, env)
            fetches = []
            for out in graph.output:
                try:
                    fetches.append(env.read(out.name))
                except Unsupported as e:
                    self.note(Node("graph output", (), (), {},
                                   line=f"output '{onnx_model.shown(out.name)}'"), str(e))
        self.check()
        if any(f is FAILED for f in fetches):
            raise FormatError("a graph output could not be computed")
        self._drop_unread_sizes(fetches)
        self._settle_initializers(state)
        state.update(self.values)
        fetches = [self._named_output(out.name, ours) for out, ours in zip(graph.output, fetches)]
        return feeds, fetches, state

    def _named_output(self, name, ours):
        """Our variable `ours` of the graph output `name`, as a variable of that name (a
        copy) where no variable has it yet: fetched and saved back under its ONNX name."""
        block = self.program.global_block()
        if ours == name or block.find_var(name) is not None:
            return ours
        dims, dtype = block.var_type(ours)
        block.create_var(name, list(dims), dtype)
        block.append_op("assign", {"X": ours}, {"Out": name})
        if ours in self._dims:
            self._dims[name] = self._dims[ours]
        return name

    def _settle_initializers(self, state):
        """Initializers read at import are not trained; those no op reads are dropped."""
        if not self.read_at_import:
            return
        block = self.program.global_block()
        read = {a for b in self.program.blocks for op in b.desc.ops
                for slot in op.inputs for a in slot.arguments}
        dropped = False
        for name in self.read_at_import:
            if name not in read:
                del state[name]
                dropped = True
            else:
                var = block.var(name)
                var.desc.stop_gradient = True
                var.stop_gradient = True
        if dropped:
            keep = [v for v in block.desc.vars if v.name in read or v.name not in
                    self.read_at_import]
            del block.desc.vars[:]
            block.desc.vars.extend(keep)
            block.sync()


def _check_single_definitions(graph, values):
    """FormatError if a node writes a value that an input, an initializer or an earlier
    node defines (ONNX graphs are in single assignment form; taking either definition
    would be a guess)."""
    defined = set(values) | {i.name for i in graph.input}
    for node in graph.node:
        for out in node.output:
            if out in defined:
                raise FormatError(f"node '{onnx_model.shown(node.name)}' writes "
                                  f"'{onnx_model.shown(out)}', which is defined before it")
            if out:
                defined.add(out)


def _check_initializer_types(values):
    """UnsupportedOpError naming every initializer of an element type we have no dtype
    for (strings, complex numbers, uint16, uint64)."""
    bad = []
    for name, value in values.items():
        try:
            dtypes.name_of(value.dtype)
        except ProgramError:
            bad.append((name, value.dtype))
    if bad:
        raise UnsupportedOpError(
            "initializers of element types progdesc has no dtype for: " + "; ".join(
                f"'{onnx_model.shown(n)}' ({d})" for n, d in bad),
            unsupported=[("initializer", "", f"'{onnx_model.shown(n)}' of type {d}")
                         for n, d in bad])


def _scope_of(name):
    """A prefix for the names of our variables made for the node `name`."""
    return name.strip("/").replace("/", ".") if name else ""


def _read_names(graph):
    """Every value name some node (in any sub-graph) or graph output reads."""
    read = set()
    for g in _walk_graphs(graph):
        for node in g.node:
            read.update(node.input)
        read.update(o.name for o in g.output)
    read.discard("")
    return read


def _walk_graphs(graph):
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.g.ByteSize():
                yield from _walk_graphs(attr.g)
            for g in attr.graphs:
                yield from _walk_graphs(g)


def translate(model, *, for_training=False):
    """Translate the ONNX ModelProto `model` (external data already read) into a new
    Program.

    Returns (program, feed names, fetch names, state): `state` holds the values of the
    program's persistables (initializers, large constants), to be stored in a Scope.
    Raises UnsupportedOpError listing every node that could not be translated,
    FormatError for a model that does not hold together."""
    opset = onnx_model.opsets(model).get("")
    if opset is not None and opset < onnx_model.MIN_OPSET:
        raise UnsupportedOpError(f"the model's default opset is {opset}; opsets "
                                 f"{onnx_model.MIN_OPSET} and up are translated (convert "
                                 "it with onnx.version_converter first)",
                                 unsupported=[("opset", "", str(opset))])
    values = {}
    for tensor in model.graph.initializer:
        if tensor.name in values:
            raise FormatError(f"two initializers are named '{onnx_model.shown(tensor.name)}'")
        values[tensor.name] = onnx_model.to_array(tensor)
    _check_single_definitions(model.graph, values)
    _check_initializer_types(values)
    program = Program()
    translator = OnnxTranslator(program, model, for_training=for_training)
    feeds, fetches, state = translator.translate_graph(values)
    return program, feeds, fetches, state
