"""The translator of Paddle programs: walks a `graph.PaddleProgram` (from either reader)
op by op with the shared translator (`progdesc.translate`) and the table
(`progdesc.paddle.rules.RULES`), into one of our Programs.

What becomes what:

- `feed` ops of block 0: their outputs become data variables of ours, with Paddle's
  names, shapes (-1 for the batch) and dtypes, in the order of their `col`;
  `fetch` ops: their inputs are the fetch targets, in the order of their `col`.
- Persistable tensors of block 0 become persistable variables of ours under Paddle's
  names, with the values of the parameter file: trainable parameters if they are
  floating point and no op of the program writes them; state otherwise (batch norm's
  running mean and variance).
- Every other op goes through its row of the table (its input slots gathered in the
  row's order, its attributes decoded); ops without a row or whose attributes a row
  refuses are collected, with their type, block and index, into one
  UnsupportedOpError once the whole program has been walked.
- Sub-blocks (legacy `while`, `conditional_block`) and PIR regions are translated by
  the rules that own them, through `subgraph` and `inline` / `sub_block`.
"""
import importlib
import importlib.util
from typing import NamedTuple

import numpy as np

from lowering.errors import FormatError
from progdesc.framework import Program, program_guard
from progdesc.paddle.graph import Block as PaddleBlock
from progdesc.paddle.rules import RULES
from progdesc.paddle.table import is_list, slot_name
from progdesc.translate import FAILED, Environment, Node, Translator, Unsupported

# the rows of the sequence ops and control flow (helper pseq's module), once it is merged
_SEQUENCE = (importlib.import_module("progdesc.paddle.rules_sequence")
             if importlib.util.find_spec("progdesc.paddle.rules_sequence") else None)

_SKIPPED_KINDS = ("feed_minibatch", "fetch_list", "feed_list", "step_scopes", "raw")


class SubGraph(NamedTuple):
    """A Paddle block as a graph for `inline` / `sub_block`: its arguments are bound to
    the Paddle names `inputs`, its results are the Paddle names `outputs`."""
    block: PaddleBlock
    inputs: tuple
    outputs: tuple


class _PaddleEnvironment(Environment):
    """Paddle names -> ours, for one block; a name no op has written yet is refused."""

    def read(self, key):
        try:
            return super().read(key)
        except KeyError:
            raise Unsupported(f"it reads '{key}', which no op before it writes and which "
                              "is neither a feed nor a persistable") from None


class PaddleTranslator(Translator):
    """Appends the ops of a PaddleProgram to a Program of ours (see the module's text).

    Rules (progdesc.paddle.rules) call, besides the shared translator's methods: `rank`,
    `value_of` and `sizes_of` (what is known of a variable's value while translating),
    `paddle_var`, `for_training`, `paddle` (the PaddleProgram) and `subgraph`."""

    def __init__(self, program, paddle, *, for_training=False, rules=RULES):
        super().__init__(program, rules)
        self.paddle = paddle
        self.for_training = for_training
        self.feeds = {}     # col -> data variable name
        self.fetches = {}   # col -> our name of the fetched value
        self._envs = {}     # Paddle block index -> the environment of its walk
        self.known = {}     # our name -> its value, for the variables made by `constant`
        self._sizes = {}    # our name -> the sizes an int vector (or scalar) holds

    def constant(self, value):
        """`Translator.constant`, remembering the value (see `value_of`)."""
        value = np.asarray(value)
        name = super().constant(value)
        self.known[name] = value
        return name

    def sizes_of(self, name):
        """The elements of a 1-D (or 0-D) int variable of ours as sizes: a list of ints
        and `(variable, axis)` pairs (the size of that dim of one of our variables, known
        only at run time), as `shape` made them and `slice` or `cast` kept them; None if
        unknown. For `fill_constant`, `range`, `reshape2` of a shape computed from
        the batch size."""
        if name is None:
            return None
        if name in self._sizes:
            return list(self._sizes[name])
        value = self.known.get(name)
        if value is not None and value.dtype.kind in "iu" and value.ndim <= 1:
            return [int(v) for v in value.reshape(-1)]
        return None

    def set_sizes(self, name, sizes):
        """Record that our variable `name` holds `sizes` (see `sizes_of`)."""
        self._sizes[name] = list(sizes)

    def value_of(self, name):
        """The value of one of our variables if the translation knows it (a constant, a
        folded shape), else None: for inputs Paddle passes as tensors that are
        attributes of ours (a reshape's ShapeTensor)."""
        return None if name is None else self.known.get(name)

    # --- what rules call, besides the shared ones ---
    def rank(self, name):
        """The rank of one of our variables."""
        return len(self.var(name)[0])

    def subgraph(self, block, inputs=(), outputs=()):
        """The Paddle block `block` (an index or a graph.Block) as a graph for `inline` /
        `sub_block` whose arguments are the Paddle names `inputs` and whose results are
        the Paddle names `outputs`."""
        if isinstance(block, int):
            if not 0 <= block < len(self.paddle.blocks):
                raise Unsupported(f"it names block {block} of {len(self.paddle.blocks)}")
            block = self.paddle.blocks[block]
        return SubGraph(block, tuple(inputs), tuple(outputs))

    def inline(self, graph, args=None):
        """Translate the ops of a SubGraph into the current block, its inputs bound to
        `args` (our names; None: all FAILED); returns our names of its outputs. A block
        being translated already (one that holds, or encloses, the op that runs it: a
        hostile file) is refused: Unsupported."""
        if graph.block.idx in self._envs:
            raise Unsupported(f"block {graph.block.idx} would run itself (it holds or "
                              "encloses the op that runs it)")
        parent = self._envs.get(graph.block.parent)
        env = _PaddleEnvironment(self, parent)
        env.bind(graph.inputs, [FAILED] * len(graph.inputs) if args is None else args)
        self.walk(graph.block, env)
        outs = []
        for name in graph.outputs:
            try:
                outs.append(env.read(name))
            except Unsupported:
                outs.append(FAILED)
        return outs

    def paddle_var(self, name, block):
        """The graph.Var `name` as `block` (a graph.Block) sees it, or None."""
        while block is not None:
            var = block.vars.get(name)
            if var is not None:
                return var
            block = self.paddle.blocks[block.parent] if block.parent >= 0 else None
        return None

    # --- the walk ---
    def walk(self, block, env):
        """Translate the ops of the Paddle block `block` into the current block of ours."""
        saved = self._envs.get(block.idx)
        self._envs[block.idx] = env
        try:
            for op in block.ops:
                if block.idx == 0 and op.type in ("feed", "fetch"):
                    self._feed_or_fetch(op, env)
                else:
                    self._apply(op, block, env)
        finally:
            if saved is None:
                self._envs.pop(block.idx, None)
            else:
                self._envs[block.idx] = saved

    def _apply(self, op, block, env):
        version = self.paddle.op_versions.get(op.type)
        entry = self.rules.lookup(op.type, version)
        outputs = entry.outputs if entry is not None else tuple(op.outputs)
        node = Node(op.type, (), outputs, op.attrs, block=op.block, index=op.index)
        if entry is None:
            self.note(node, "")
            self._bind(op, outputs, [FAILED] * len(outputs), env)
            return
        try:
            ins, in_types = self._inputs(op, entry, block, env)
        except Unsupported as e:
            self.note(node, str(e), type(e))
            self._bind(op, outputs, [FAILED] * len(outputs), env)
            return
        out_types = tuple(self._types(op.outputs.get(slot_name(s), []), s, block)
                          for s in outputs)
        node = Node(op.type, (), outputs, op.attrs, block=op.block, index=op.index,
                    in_types=in_types, out_types=out_types)
        self.version = version
        results = self.apply_checked(node, ins)
        if len(outputs) == 1 and not (len(results) == 1 and results[0] is FAILED):
            results = [results if is_list(outputs[0]) else results[0]]
        self._bind(op, outputs, results, env)

    def _inputs(self, op, entry, block, env):
        """Our names of the op's inputs in the row's slot order, and their Paddle types."""
        declared = {slot_name(s) for s in entry.inputs}
        extra = sorted(s for s, names in op.inputs.items() if names and s not in declared)
        if extra:
            raise Unsupported(f"input slot(s) {extra} hold variables the translation "
                              "does not read")
        ins, types = [], []
        for slot in entry.inputs:
            names = op.inputs.get(slot_name(slot), [])
            types.append(self._types(names, slot, block))
            if is_list(slot):
                ours = [env.read(n) for n in names]
                ins.append(FAILED if any(n is FAILED for n in ours) else ours)
            elif not names:
                ins.append(None)
            elif len(names) > 1:
                raise Unsupported(f"input slot '{slot}' holds {len(names)} variables")
            else:
                ins.append(env.read(names[0]))
        return ins, tuple(types)

    def _types(self, names, slot, block):
        types = [self.paddle_var(n, block) for n in names]
        if is_list(slot):
            return types
        return types[0] if types else None

    def _bind(self, op, outputs, results, env):
        for slot, result in zip(outputs, results):
            names = op.outputs.get(slot_name(slot), [])
            if result is None or not names:
                continue
            if result is FAILED:
                env.bind(names, [FAILED] * len(names))
            elif is_list(slot):
                env.bind(names, list(result))
            else:
                env.bind(names[:1], [result])

    def _feed_or_fetch(self, op, env):
        col = op.attrs.get("col", 0)
        if op.type == "feed":
            for name in op.outputs.get("Out", []):
                self.feeds[col] = name
                env.bind([name], [name])
        else:
            node = Node("fetch", (), (), op.attrs, block=op.block, index=op.index)
            for name in op.inputs.get("X", []):
                try:
                    self.fetches[col] = env.read(name)
                except Unsupported as e:
                    self.note(node, str(e), type(e))


def _written(paddle):
    """The Paddle names any op of the program writes."""
    return {n for b in paddle.blocks for op in b.ops for names in op.outputs.values()
            for n in names}


def translate(paddle, values, *, for_training=False):
    """Translate the PaddleProgram `paddle` whose persistables hold `values` ({name:
    array}) into a new Program.

    Returns (program, feed names, fetch names, state): `state` holds the values of the
    program's persistables (parameters, running statistics, constants the rules made),
    to be stored in a Scope. Raises UnsupportedOpError listing every op that could not
    be translated, FormatError for a program that does not hold together (a feed without
    a declared variable, a persistable without a value)."""
    if getattr(_SEQUENCE, "prepare", None) is not None:   # loops over range(tensor)
        paddle = _SEQUENCE.prepare(paddle)
    program = Program()
    ours = program.global_block()
    block0 = paddle.blocks[0]
    written = _written(paddle)
    translator = PaddleTranslator(program, paddle, for_training=for_training)
    env = _PaddleEnvironment(translator)
    feeds_out = {n for op in block0.ops if op.type == "feed" for n in op.outputs.get("Out", [])}
    state = {}
    for var in block0.vars.values():
        if var.kind in _SKIPPED_KINDS:
            continue
        if var.name in feeds_out:
            if var.kind != "dense" or not var.dtype:
                raise FormatError(f"feed variable '{var.name}' is a {var.kind} of no element "
                                  "type", var=var.name)
            ours.create_var(var.name, list(var.shape), var.dtype, stop_gradient=True,
                            need_check_feed=True)
            env.bind([var.name], [var.name])
        elif var.persistable and var.kind == "dense":
            if var.name not in values:
                raise FormatError(f"persistable variable '{var.name}' has no value in the "
                                  "parameter file", var=var.name)
            value = np.asarray(values[var.name])
            if tuple(value.shape) != tuple(var.shape) or str(value.dtype) != var.dtype:
                raise FormatError(f"persistable variable '{var.name}': the program declares "
                                  f"{var.dtype}{list(var.shape)}, the parameter file holds "
                                  f"{value.dtype}{list(value.shape)}", var=var.name)
            trainable = value.dtype.kind == "f" and var.name not in written
            if trainable:
                ours.create_parameter(var.name, list(value.shape), str(value.dtype))
            else:
                ours.create_var(var.name, list(value.shape), str(value.dtype),
                                persistable=True, stop_gradient=True)
            state[var.name] = value
            env.bind([var.name], [var.name])
    with program_guard(program):   # control-flow builders append to the current program
        translator.walk(block0, env)
    translator.check()
    feeds = [translator.feeds[c] for c in sorted(translator.feeds)]
    fetches = [translator.fetches[c] for c in sorted(translator.fetches)]
    state.update(translator.values)
    return program, feeds, fetches, state
