"""A translation table: foreign op type -> the rule that appends our ops for it."""
import inspect

from progdesc.translate.translator import Unsupported

DRIVER_KEYWORDS = ("in_types", "out_types")
"""Keyword arguments the driver fills for a rule that names them (they are not foreign
attributes): the foreign types of the node's inputs and of its outputs, as the front end
gives them (for JAX, the avals)."""


class Entry:
    """One row of a table: a rule function and the attributes its signature asks for."""

    __slots__ = ("fn", "op_type", "keywords", "required")

    def __init__(self, fn, op_type=None):
        self.fn = fn
        self.op_type = op_type   # set for a one-to-one rename
        params = inspect.signature(fn).parameters.values()
        self.keywords = tuple(p.name for p in params if p.kind is p.KEYWORD_ONLY)
        self.required = tuple(p.name for p in params if p.kind is p.KEYWORD_ONLY
                              and p.default is p.empty and p.name not in DRIVER_KEYWORDS)

    def arguments(self, attrs, in_types=(), out_types=()):
        """The keyword arguments of a call of the rule: the attributes its signature names
        (those it does not name are not passed), and the driver's keywords it names.
        Raises Unsupported for a required attribute the foreign op lacks."""
        kwargs = {}
        for name in self.keywords:
            if name in attrs:
                kwargs[name] = attrs[name]
            elif name == "in_types":
                kwargs[name] = in_types
            elif name == "out_types":
                kwargs[name] = out_types
        for name in self.required:
            if name not in kwargs:
                raise Unsupported(f"no attribute '{name}'")
        return kwargs


def _rename_rule(op_type):
    def rename(t, *ins):
        return t.call(op_type, *ins)
    rename.__name__ = rename.__qualname__ = op_type
    return rename


class RuleTable:
    """Foreign op type -> rule, with one-to-one renames as plain rows and versions resolved
    here, not inside the rules.

    - `@table.rule("Softmax", since=13)` registers `def softmax(t, x, *, axis=-1)`: its
      positional parameters after `t` are the inputs, its keyword-only parameters the
      attributes (with their defaults).
    - `table.rename("Relu", "relu")`: the inputs go to our op `relu` in slot order, the
      attributes are dropped.
    - `table.alias("pjit", "jit")`: an old (or other) name of a foreign op.
    - `since` is the first version (ONNX opset, Paddle op version) a row holds for;
      `lookup(type, version)` takes the row with the greatest `since` not above
      `version` (the newest row when `version` is None).
    """

    def __init__(self, what):
        self.what = what   # 'JAX primitive', 'ONNX op': how errors name a foreign op
        self._rows = {}    # type -> [(since, Entry)], ascending
        self._aliases = {}

    def rule(self, *types, since=0):
        """Decorator: register a rule function under the foreign op types `types`."""
        def register(fn):
            entry = Entry(fn)
            for name in types:
                self._add(name, since, entry)
            return fn
        return register

    def rename(self, foreign, ours, since=0):
        """Register the one-to-one translation of `foreign` into our op `ours`."""
        self._add(foreign, since, Entry(_rename_rule(ours), op_type=ours))

    def alias(self, other, name):
        """Make the foreign op type `other` translate as `name` does."""
        self._aliases[other] = name

    def _add(self, name, since, entry):
        rows = [r for r in self._rows.get(name, []) if r[0] != since] + [(since, entry)]
        self._rows[name] = sorted(rows, key=lambda r: r[0])

    def lookup(self, foreign, version=None):
        """The Entry translating `foreign` at `version`, or None if there is none."""
        rows = self._rows.get(self._aliases.get(foreign, foreign))
        if not rows:
            return None
        if version is None:
            return rows[-1][1]
        fitting = [entry for since, entry in rows if since <= version]
        return fitting[-1] if fitting else None

    def __contains__(self, foreign):
        return self.lookup(foreign) is not None
