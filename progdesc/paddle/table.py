"""The table class of Paddle's ops: a `RuleTable` whose rows also declare the op's slots.

A Paddle op names its inputs and outputs by slot ('Input', 'Filter' -> 'Output'), each
slot a list of variables; a row says which slots its rule takes, in which order, and
which of them are lists (a trailing '*': 'X*'). See `progdesc.paddle.rules` for the
guide to writing rows.
"""
from progdesc.translate import Entry, RuleTable


class PaddleEntry(Entry):
    """A row of the Paddle table: the rule, and its input and output slot names in order
    (a name ending in '*' is a list slot)."""

    __slots__ = ("inputs", "outputs")

    def __init__(self, fn, inputs, outputs, op_type=None):
        super().__init__(fn, op_type)
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)


def slot_name(slot):
    """The Paddle slot name of a declared slot ('X*' -> 'X')."""
    return slot[:-1] if slot.endswith("*") else slot


def is_list(slot):
    """Whether a declared slot holds a list of variables ('X*')."""
    return slot.endswith("*")


def _rename_rule(op_type, fixed):
    def rename(t, *ins):
        return t.call(op_type, *ins, **fixed)
    rename.__name__ = rename.__qualname__ = op_type
    return rename


class PaddleRuleTable(RuleTable):
    """Legacy Paddle op type -> rule, each row with its slots.

    - `@table.rule("conv2d", inputs=("Input", "Filter"), outputs=("Output",))` registers
      `def conv2d(t, x, w, *, strides=[1, 1], ...)`.
    - `table.rename("relu", "relu")`: one input slot 'X' to our op's first input, one
      output 'Out'; `inputs=`/`outputs=` for other slots
      (`table.rename("elementwise_pow", "pow", inputs=("X", "Y"))`), keyword arguments
      for attributes of our op that the row fixes (the Paddle op's are dropped).
    - `since` is the Paddle op version (the program's OpVersionMap) a row holds from.
    """

    def __init__(self, what="Paddle op"):
        super().__init__(what)

    def _add(self, name, since, entry):
        """Add a row; a second row for the same op type and version is a mistake (the
        modules filling the table would override each other by import order)."""
        if any(s == since for s, _ in self._rows.get(name, ())):
            raise ValueError(f"the Paddle table has a row for '{name}' (since {since}) "
                             "already")
        super()._add(name, since, entry)

    def rule(self, *types, inputs=("X",), outputs=("Out",), since=0):
        """Decorator: register a rule under the Paddle op types `types`, with its input
        slots and output slots in order."""
        def register(fn):
            entry = PaddleEntry(fn, inputs, outputs)
            for name in types:
                self._add(name, since, entry)
            return fn
        return register

    def rename(self, foreign, ours, inputs=("X",), outputs=("Out",), since=0, **fixed):
        """Register the one-to-one translation of `foreign` into our op `ours` (its inputs
        in slot order, `fixed` as our op's attributes)."""
        self._add(foreign, since, PaddleEntry(_rename_rule(ours, fixed), inputs, outputs,
                                              op_type=ours))


RULES = PaddleRuleTable("Paddle op")
"""The table: `progdesc.paddle.rules` (its guide) and the rules_* modules fill it."""
