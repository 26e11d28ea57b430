"""The driver: walks a foreign graph node by node, calling each node's rule with its
inputs and its decoded attributes, and collects what it cannot translate."""
import hashlib
from typing import NamedTuple

import numpy as np

from lowering import registry
from lowering.errors import ProgramError, UnsupportedOpError
from progdesc.constants import imported_constant

FAILED = object()
"""The value, in an Environment, of a foreign value whose node could not be translated
(or that no variable can hold): a node reading it is skipped, not reported again."""


class Unsupported(Exception):
    """Raised by a rule for attributes or inputs it cannot translate; the message says
    which (it becomes the 'why' of the op's entry in the error)."""


class _SubgraphFailed(Exception):
    """A sub-graph being built into a sub-block holds an op that could not be translated
    (already noted): the builder takes its work back and the node's outputs fail."""


class Literal:
    """A constant operand written in the foreign graph itself (a JAX literal, an ONNX
    Constant's value): read from an Environment, it becomes a constant of ours."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


class Node(NamedTuple):
    """One foreign op, as a front end hands it to `Translator.translate`.

    `attrs` are its attributes decoded once into Python values (keyword arguments of its
    rule); `inputs` are foreign values (keys of the Environment, or Literals) and
    `outputs` the foreign values it defines (None for an output nobody reads). `line`
    is the user's source line where known, `scope` a prefix for the names of its
    results ('Dense_0'), `block` and `index` where it sits in the foreign program.
    `in_types` / `out_types` are the foreign types of its inputs and outputs (passed to
    a rule that asks for them), `subgraphs` its foreign sub-graphs (searched for more
    unsupported ops when an input of the node already failed).
    """
    type: str
    inputs: tuple
    outputs: tuple
    attrs: dict
    line: str = ""
    scope: str = ""
    block: int = 0
    index: int = 0
    in_types: tuple = ()
    out_types: tuple = ()
    subgraphs: tuple = ()


class Place(NamedTuple):
    """An op the translator could not translate, and where it sits."""
    type: str
    block: int
    index: int
    line: str
    why: str
    error: type = None   # the Unsupported subclass a rule raised; None: no rule


class Environment:
    """Foreign values -> the names of our variables that hold them, for one graph."""

    def __init__(self, translator, parent=None):
        self._translator = translator
        self._parent = parent   # an enclosing graph's environment, for names it can see
        self._names = {}

    def bind(self, keys, names):
        """Map each foreign value in `keys` (None: skipped) to our name in `names`."""
        for key, name in zip(keys, names):
            if key is not None:
                self._names[key] = name

    def read(self, key):
        """Our name for the foreign value `key` (a Literal becomes a constant)."""
        if isinstance(key, Literal):
            return self._translator.constant(key.value)
        env = self
        while key not in env._names and env._parent is not None:
            env = env._parent
        return env._names[key]


class Translator:
    """Appends the ops of a foreign program to a Program, node by node, through the
    public program-writing API.

    A front end subclasses it: it decodes each foreign op into a `Node` (attributes
    decoded once), walks its graphs with `translate(nodes, env)` and implements
    `inline(graph, args)` for the foreign sub-graphs its rules meet. Rules (see
    `progdesc.translate`) receive the translator as `t` and call `call`, `var`,
    `constant`, `inline` and `sub_block`. `values` collects the values of constants
    stored in the Scope (see `progdesc.constants.imported_constant`); `check()` raises
    one error listing every op that could not be translated.
    """

    error_class = UnsupportedOpError

    def __init__(self, program, rules, *, version=None):
        self.program = program
        self.rules = rules
        self.version = version   # of the foreign format, for the table's rows
        self.values = {}
        self.unsupported = []    # [Place]
        self._seen = set()
        self._walked = set()   # ids of the sub-graphs sub_block began
        self._constants = {}
        self._callsite = ""
        self._scope = ""

    # --- what rules call ---
    @property
    def block(self):
        """The block ops go to: the program's current block (a sub-block while a control
        flow builder runs a branch or step)."""
        return self.program.current_block()

    def call(self, op_type, *args, **attrs):
        """Append our op `op_type`, binding `args` to its input slots in order (None: the
        slot is left empty) with `attrs`; returns the names of its outputs (one name for a
        single output, a list for a many slot, a tuple for several slots)."""
        opdef = registry.get(op_type)
        inputs = {slot.name: arg for slot, arg in zip(opdef.inputs, args) if arg is not None}
        name = f"{self._scope}.{op_type}" if self._scope else None
        out_map = self.block.append_op(op_type, inputs, attrs=attrs, name=name,
                                       callsite=self._callsite).outputs
        outs = [out_map.get(s.name, []) if s.many else out_map[s.name][0]
                for s in opdef.outputs if s.name in out_map]
        return outs[0] if len(outs) == 1 else tuple(outs)

    def var(self, name):
        """(dims, dtype name) of one of our variables."""
        return self.block.var_type(name)

    def constant(self, value):
        """The name of a variable holding the array `value`, made once per block (and
        visible in its sub-blocks) by `progdesc.constants.imported_constant`."""
        value = np.asarray(value)
        data = value.tobytes()
        key = (value.dtype.str, value.shape,
               data if len(data) <= 1 << 14 else hashlib.blake2b(data).digest())
        block = self.block
        while block is not None:   # made in this block or an enclosing one: visible here
            name = self._constants.get((block.idx, key))
            if name is not None:
                return name
            block = block.parent
        name = f"{self._scope}.constant" if self._scope else None
        var = imported_constant(self.block, value, self.values, name=name,
                                callsite=self._callsite)
        self._constants[(var.block.idx, key)] = var.name
        return var.name

    def inline(self, graph, args=None):
        """Translate the foreign sub-graph `graph` applied to `args` (our names; None: all
        FAILED, to find the unsupported ops inside it) into the current block; returns
        the names of its outputs. A front end implements it."""
        raise NotImplementedError

    def sub_block(self, graph, args):
        """`inline`, for the body of a branch or loop step being built in a sub-block
        (by a `progdesc.control_flow` builder): the results as Variables of that block
        (a copy of those made outside it)."""
        block = self.block
        outs = []
        self._walked.add(id(graph))
        for name in self.inline(graph, args):
            if name is FAILED:
                raise _SubgraphFailed()
            if name not in block.vars:
                name = self.call("assign", name)
            outs.append(block.var(name))
        return tuple(outs)

    def tag_last_op(self):
        """Give the last op of the current block (one a control-flow builder appended) the
        current node's source line."""
        self.block.desc.ops[-1].callsite = self._callsite

    # --- the walk ---
    def translate(self, nodes, env):
        """Translate `nodes` in order, reading their inputs from `env` and binding their
        outputs in it."""
        for node in nodes:
            env.bind(node.outputs, self.apply(node, [env.read(i) for i in node.inputs]))

    def apply(self, node, ins):
        """Translate one node whose inputs are our names `ins`; returns the names of its
        outputs (each FAILED if it could not be translated)."""
        saved = self._callsite, self._scope
        self._callsite = node.line or saved[0]
        self._scope = node.scope or saved[1]
        try:
            entry = self.rules.lookup(node.type, self.version)
            if entry is None:
                self.note(node, "")
            elif all(i is not FAILED for i in ins):
                try:
                    kwargs = entry.arguments(node.attrs, node.in_types, node.out_types)
                    outs = entry.fn(self, *ins, **kwargs)
                    return list(outs) if isinstance(outs, (list, tuple)) else [outs]
                except Unsupported as e:
                    self.note(node, str(e), type(e))
                except _SubgraphFailed:   # the other sub-graphs may hold more to report
                    self._forget_taken_back()
                    for graph in node.subgraphs:
                        if id(graph) not in self._walked:
                            self.inline(graph, None)
            else:   # an input already failed; its sub-graphs may hold more to report
                for graph in node.subgraphs:
                    self.inline(graph, None)
        finally:
            self._callsite, self._scope = saved
        return [FAILED] * len(node.outputs)

    def apply_checked(self, node, ins):
        """`apply`, for a node read from a file: a rule failing on attributes or shapes that
        do not fit our op (ProgramError), or on attribute values of another type or size
        than the format defines (a hostile file: TypeError, ValueError, ...), notes the node
        as not translated instead of raising; its outputs are then FAILED."""
        try:
            return self.apply(node, ins)
        except UnsupportedOpError:
            raise
        except ProgramError as e:
            self.note(node, f"it does not fit: {e.detail}", type(e))
        except (TypeError, ValueError, IndexError, KeyError, ArithmeticError) as e:
            self.note(node, f"attributes it cannot read ({type(e).__name__}: {e})")
        return [FAILED] * len(node.outputs)

    def _forget_taken_back(self):
        """Forget the constants a control-flow builder took back with its failed work."""
        blocks = self.program.blocks
        self._constants = {key: name for key, name in self._constants.items()
                           if key[0] < len(blocks) and name in blocks[key[0]].vars}
        self.values = {name: value for name, value in self.values.items()
                       if name in blocks[0].vars}

    def note(self, node, why, error=None):
        """Record that `node` could not be translated, and why (once per type, line and
        reason; once per place where the line is unknown)."""
        line = node.line or self._callsite
        key = (node.type, line or (node.block, node.index), why)
        if key not in self._seen:
            self._seen.add(key)
            self.unsupported.append(Place(node.type, node.block, node.index, line, why, error))

    def message(self):
        """The text of the error listing every op that could not be translated."""
        parts = [f"'{p.type}' at {p.line or f'#{p.index} in block {p.block}'}"
                 + (f" ({p.why})" if p.why else "") for p in self.unsupported]
        return (f"cannot translate {len(parts)} {self.rules.what}(s) into progdesc ops: "
                + "; ".join(parts))

    def check(self):
        """Raise `error_class` (an UnsupportedOpError) if any node could not be
        translated, listing every one with its place."""
        if self.unsupported:
            raise self.error_class(self.message(), **self.error_fields())

    def error_fields(self):
        """The `unsupported` and `places` fields of the error `check` raises."""
        return {"unsupported": [(p.type, p.line, p.why) for p in self.unsupported],
                "places": [p[:5] for p in self.unsupported]}
