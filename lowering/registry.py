"""The operator registry: one `OpDef` per op type.

An op is declared once, in `lowering/ops/<family>.py`, with the `op` decorator:

    @op("softmax", inputs=[In("X", "float")], outputs=["Out"], attrs={"axis": -1})
    def softmax(X, *, axis):
        "Softmax along `axis`."
        return jax.nn.softmax(X, axis=axis)

    @softmax.gradient
    def _(g):
        ...   # emit gradient ops, see lowering.gradients.GradContext

The decorated function is the lowering rule: it receives each input slot as a
keyword argument (a list for a `many` slot, None for an absent optional one),
each attribute as a keyword argument, and `key` (a PRNG key) when the op is
`random`. It returns one array per output slot (a tuple when there are
several, a list for a `many` slot). Shapes and dtypes are inferred from it
(lowering.infer) unless an explicit `infer` rule is given.
"""
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np

from lowering import dtypes
from lowering import progdesc_pb2 as pb
from lowering.errors import (AttributeTypeError, AttributeValueError, ProgramError,
                             UnknownOpError)

REQUIRED = object()
"""Default of an attribute that every op of the type must set."""

# attribute type -> (proto oneof field, whether it is a list)
ATTR_TYPES = {
    "int": ("i", False), "float": ("f", False), "string": ("s", False),
    "bool": ("b", False), "int64": ("l", False), "float64": ("d", False),
    "ints": ("ints", True), "floats": ("floats", True), "strings": ("strings", True),
    "bools": ("bools", True), "int64s": ("longs", True), "float64s": ("doubles", True),
    "block": ("block_idx", False), "blocks": ("blocks_idx", True),
    "dtype": ("s", False),
}
_LIST_ELEMENT = {"ints": "int", "floats": "float", "strings": "string", "bools": "bool",
                 "int64s": "int64", "float64s": "float64", "blocks": "block"}
_INT32_RANGE = (-2**31, 2**31 - 1)


@dataclass(frozen=True)
class Slot:
    """A named input or output of an op.

    `dtypes` is the family of element types accepted ('float', 'int', 'bool',
    'number' or 'any'); `many` slots hold a list of variables; `optional`
    slots may be left unbound; `differentiable` is False for inputs that never
    receive a gradient (indices, labels, masks).
    """
    name: str
    dtypes: str = "any"
    many: bool = False
    optional: bool = False
    differentiable: bool = True
    doc: str = ""

    def accepts(self, dtype):
        """Whether a variable of `dtype` may be bound to this slot."""
        if self.dtypes == "any":
            return True
        kind = dtypes.kind_of(dtype)
        return self.dtypes == kind or (self.dtypes == "number" and kind != "bool")

    @property
    def accepted(self):
        """The dtype names this slot accepts."""
        return frozenset(d for d in dtypes.DTYPE_NAMES if self.accepts(d))


def In(name, dtypes="any", **kw):
    """An input slot (see `Slot`)."""
    return Slot(name, dtypes, **kw)


def Out(name, **kw):
    """An output slot (see `Slot`)."""
    return Slot(name, **kw)


@dataclass(frozen=True)
class Attr:
    """A typed attribute with a default (or REQUIRED).

    `where` is a constraint on what the value means (lowering.constraints: a range,
    positive sizes, a choice of strings, a shape that fits in memory), checked with
    the type whenever an op is appended or loaded. `lone_int` lets an `ints` attribute
    take a single int as a one-element list (`axis=1` is `axis=[1]`): set it where that
    is the only reading (axes, shapes), not on per-dimension sizes such as strides,
    where 2 would as well mean [2, 2].
    """
    name: str
    type: str
    default: Any = REQUIRED
    doc: str = ""
    where: Any = None
    lone_int: bool = False

    def __post_init__(self):
        if self.type not in ATTR_TYPES:
            raise ValueError(f"attribute {self.name!r}: unknown type {self.type!r}")
        if self.lone_int and self.type != "ints":
            raise ValueError(f"attribute {self.name!r}: lone_int is for 'ints' attributes, "
                             f"not {self.type!r}")

    def check(self, value):
        """Return `value` normalized to this attribute's type, or raise AttributeTypeError."""
        scalar = _LIST_ELEMENT.get(self.type)
        if scalar is None:
            return self._check_scalar(self.type, value)
        if self.lone_int and isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            return (self._check_scalar(scalar, value),)
        if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
            raise self._wrong(value)
        return tuple([self._check_scalar(scalar, v) for v in value])

    def _check_scalar(self, kind, value):
        if kind == "dtype":
            try:
                return dtypes.name_of(value)
            except ProgramError:
                raise self._wrong(value, kind=kind) from None
        if isinstance(value, np.generic):
            value = value.item()
        if kind in ("int", "int64", "block"):
            if isinstance(value, bool) or not isinstance(value, int):
                raise self._wrong(value, kind=kind)
            if kind in ("int", "block") and not _INT32_RANGE[0] <= value <= _INT32_RANGE[1]:
                raise self._wrong(value, "out of int32 range; declare the attribute int64", kind)
            return value
        if kind in ("float", "float64"):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise self._wrong(value, kind=kind)
            return float(value)
        if kind == "bool":
            if not isinstance(value, bool):
                raise self._wrong(value, kind=kind)
            return value
        if not isinstance(value, str):
            raise self._wrong(value, kind=kind)
        return value

    def _wrong(self, value, why=None, kind=None):
        got = f"{type(value).__name__} {value!r}"
        expected = kind or (f"{self.type} or one int" if self.lone_int else self.type)
        return AttributeTypeError(f"attribute '{self.name}' expects {expected}, got {got}"
                                  + (f" ({why})" if why else ""))


def encode_attr(attr_def, value, attribute):
    """Write a checked attribute value into a proto `Attribute` message."""
    fld, is_list = ATTR_TYPES[attr_def.type]
    if is_list:
        values = getattr(attribute, fld)
        values.SetInParent()
        values.values.extend(value)
    else:
        setattr(attribute, fld, value)


def decode_attr(attr_def, attribute):
    """Read a proto `Attribute` back into a Python value, checking its type."""
    fld, is_list = ATTR_TYPES[attr_def.type]
    which = attribute.WhichOneof("value")
    if which != fld:
        raise AttributeTypeError(
            f"attribute '{attr_def.name}' expects {attr_def.type}, got a '{which}' value")
    value = getattr(attribute, fld)
    return tuple(value.values) if is_list else value


@dataclass
class OpDef:
    """Everything about one op type: slots, attributes, lowering, shape rule, gradient."""
    type: str
    inputs: tuple
    outputs: tuple
    attrs: tuple
    lower: Callable
    doc: str = ""
    infer: Optional[Callable] = None
    grad: Optional[Callable] = None
    random: bool = False
    differentiable: bool = True
    same_dtype: tuple = ()
    _attr_index: dict = field(default_factory=dict, repr=False)
    _defaults: dict = field(default_factory=dict, repr=False)
    _checked: dict = field(default_factory=dict, repr=False, compare=False)   # checked_attrs
    input_index: dict = field(init=False, repr=False, compare=False)    # {slot name: Slot}
    output_index: dict = field(init=False, repr=False, compare=False)
    # {input slot name: accepted dtype names} of the slots that do not take any dtype
    accepted_dtypes: dict = field(init=False, repr=False, compare=False)
    required_inputs: tuple = field(init=False, repr=False, compare=False)   # slot names
    has_blocks: bool = field(init=False, repr=False, compare=False)   # refers to sub-blocks
    _constrained: tuple = field(init=False, repr=False, compare=False)   # Attrs with `where`

    def __post_init__(self):
        self._attr_index = {a.name: a for a in self.attrs}
        self._defaults = {a.name: a.check(a.default) for a in self.attrs
                          if a.default is not REQUIRED}
        self.input_index = {s.name: s for s in self.inputs}
        self.output_index = {s.name: s for s in self.outputs}
        self.accepted_dtypes = {s.name: s.accepted for s in self.inputs if s.dtypes != "any"}
        self.required_inputs = tuple(s.name for s in self.inputs if not s.optional)
        self.has_blocks = any(a.type in ("block", "blocks") for a in self.attrs)
        self._constrained = tuple(a for a in self.attrs if a.where is not None)

    def attr(self, name):
        """The `Attr` declared under `name`, or None."""
        return self._attr_index.get(name)

    def input(self, name):
        """The input `Slot` declared under `name`, or None."""
        return self.input_index.get(name)

    def output(self, name):
        """The output `Slot` declared under `name`, or None."""
        return self.output_index.get(name)

    def gradient(self, maker):
        """Decorator: register `maker(g)` as this op's gradient maker."""
        self.grad = maker
        return maker

    def shape_rule(self, rule):
        """Decorator: register an explicit shape/dtype rule instead of tracing the lowering."""
        self.infer = rule
        return rule

    def complete_attrs(self, given):
        """Checked attributes with defaults filled in; raises on unknown, missing or mistyped ones."""
        if not given.keys() <= self._attr_index.keys():
            unknown = sorted(set(given) - set(self._attr_index))
            raise AttributeTypeError(
                f"attribute '{unknown[0]}' is not declared by '{self.type}' "
                f"(declared: {', '.join(self._attr_index) or 'none'})")
        out = {}
        for a in self.attrs:
            if a.name in given:
                out[a.name] = a.check(given[a.name])
            elif a.name in self._defaults:
                out[a.name] = self._defaults[a.name]
            else:
                raise AttributeTypeError(f"required attribute '{a.name}' ({a.type}) is missing")
        for a in self._constrained:
            why = a.where.violation(out[a.name], out)
            if why is not None:
                raise AttributeValueError(f"attribute {a.name}={_shown(out[a.name])} {why}")
        return out

    def checked_attrs(self, given):
        """(complete_attrs(given), those attributes serialized as an otherwise empty `OpDesc`).

        Cached per distinct `given`, its values compared together with their types; the
        returned dict is shared between calls, so it must not be modified.
        """
        try:
            key = tuple([(k, v.__class__, repr(v) if v.__class__ is float and not v else v)
                         for k, v in given.items()])   # 0.0 == -0.0, but they encode apart
            hit = self._checked.get(key)
        except TypeError:   # list-valued attributes
            key = tuple([(k, _typed(v)) for k, v in given.items()])
            try:
                hit = self._checked.get(key)
            except TypeError:   # an unhashable value: it fails the type check below
                key, hit = None, None
        if hit is None:
            attrs = self.complete_attrs(given)
            desc = pb.OpDesc()
            for a in self.attrs:
                encode_attr(a, attrs[a.name], desc.attrs[a.name])
            hit = (attrs, desc.SerializeToString())
            if key is not None:
                if len(self._checked) > 4096:
                    self._checked.clear()
                self._checked[key] = hit
        return hit

    @property
    def differentiable_inputs(self):
        """Names of input slots that may receive gradients."""
        if not self.differentiable:
            return ()
        return tuple(s.name for s in self.inputs if s.differentiable and s.dtypes != "int"
                     and s.dtypes != "bool")


def _shown(value):
    """An attribute value as a message shows it: lists as lists, long ones cut."""
    if not isinstance(value, tuple):
        return repr(value)
    if len(value) <= 16:
        return str(list(value))
    return f"[{', '.join(map(repr, value[:8]))}, ... ({len(value)} values)]"


def _typed(value):
    """A hashable stand-in for an attribute value that tells 1, 1.0 and True apart."""
    if isinstance(value, (list, tuple)):
        return (list, tuple([_typed(v) for v in value]))
    if value.__class__ is float and not value:
        return (float, repr(value))   # 0.0 and -0.0
    return (value.__class__, value)


_REGISTRY: dict = {}


GENERATION = [0]
"""Bumped whenever a definition is registered: compiled programs made before may be stale."""

WATCHERS = []
"""Functions called with the op type whenever its definition is registered or removed."""


def _changed(op_type):
    GENERATION[0] += 1
    for watcher in tuple(WATCHERS):
        watcher(op_type)


def register(opdef, replace=False):
    """Add an `OpDef` to the registry; registering a type twice needs `replace=True`."""
    _ensure_loaded()   # built-ins first, so a user's definition cannot block one of them
    if opdef.type in _REGISTRY and not replace:
        raise ProgramError(f"op type '{opdef.type}' is already registered "
                           "(pass replace=True to replace it)")
    _REGISTRY[opdef.type] = opdef
    _changed(opdef.type)
    return opdef


def get(op_type):
    """The `OpDef` of `op_type`; raises UnknownOpError if none is registered."""
    _ensure_loaded()
    try:
        return _REGISTRY[op_type]
    except KeyError:
        raise UnknownOpError(f"unknown op type '{op_type}'", op_type=op_type) from None


def is_registered(op_type):
    """Whether `op_type` has a definition."""
    _ensure_loaded()
    return op_type in _REGISTRY


def unregister(op_type, previous=None):
    """Remove `op_type`'s definition, or put `previous` (an OpDef) back in its place."""
    _ensure_loaded()
    if previous is None:
        _REGISTRY.pop(op_type, None)
    else:
        _REGISTRY[op_type] = previous
    _changed(op_type)


def all_ops():
    """Every registered `OpDef`, sorted by type."""
    _ensure_loaded()
    return [_REGISTRY[k] for k in sorted(_REGISTRY)]


def attr_from_default(name, default):
    """`default` if it is an Attr, else the Attr named `name` whose type is that of the
    Python value `default` (bool, int, float or str) and whose default it is."""
    if isinstance(default, Attr):
        return default
    for py, kind in ((bool, "bool"), (int, "int"), (float, "float"), (str, "string")):
        if isinstance(default, py):
            return Attr(name, kind, default)
    raise TypeError(f"attribute {name!r}: give Attr(...) for default {default!r}")


def op(op_type, inputs, outputs, attrs=None, *, random=False, differentiable=True,
       same_dtype=(), replace=False):
    """Decorator declaring an op type whose lowering rule is the decorated function.

    `inputs`/`outputs` are `Slot`s or plain names; `attrs` maps a name to a
    default value (its type is taken from the default) or to an `Attr`.
    Returns the registered `OpDef` (use its `.gradient` decorator next).
    """
    def wrap(fn):
        attr_defs = tuple(
            (a if isinstance(a, Attr) and a.name == name else attr_from_default(name, a))
            for name, a in (attrs or {}).items())
        opdef = OpDef(
            type=op_type,
            inputs=tuple(s if isinstance(s, Slot) else Slot(s) for s in inputs),
            outputs=tuple(s if isinstance(s, Slot) else Slot(s) for s in outputs),
            attrs=attr_defs, lower=fn, doc=(fn.__doc__ or "").strip(), random=random,
            differentiable=differentiable, same_dtype=tuple(same_dtype))
        return register(opdef, replace=replace)
    return wrap


_loaded = False


def _ensure_loaded():
    global _loaded
    if not _loaded:
        _loaded = True
        import lowering.ops  # noqa: F401  (registers the built-in ops)
