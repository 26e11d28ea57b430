"""Custom operators from user code: the public way to add an op type.

An op type is declared once with the `op` decorator: its input and output
slots, its typed attributes, and its lowering rule (a plain JAX function).
A gradient maker, registered with the returned definition's `.gradient`
decorator, says how to differentiate it *as a composition of other ops*;
`append_backward` and `gradients` call it at compile time, so the op then
works in training, in second-order gradients and in exports exactly like a
built-in one:

    import jax.numpy as jnp
    import progdesc as pd
    from progdesc.custom_op import In, Out, op

    @op("softsign", inputs=[In("X", "float")], outputs=[Out("Out")])
    def softsign(X):
        "x / (1 + |x|)."
        return X / (1 + jnp.abs(X))

    @softsign.gradient
    def _(g):                           # d/dx = 1 / (1 + |x|)^2
        denom = g.call("scale", g.call("abs", g.input("X")), bias=1.0)
        g.call("div", g.out_grad("Out"), g.call("square", denom), out=g.in_grad("X"))

    y = pd.ops.softsign(x)              # the op's Python function now exists

The lowering rule
    receives each input slot as a keyword argument named after the slot
    (a list for a `many` slot, None for an unbound optional one), each
    attribute as a keyword argument, and `key` (a PRNG key) when the op is
    declared `random=True`. It returns one array per output slot: a tuple
    when there are several, a list for a `many` slot. Output shapes and
    dtypes are inferred by tracing it with `jax.eval_shape` (unknown `-1`
    dims stay symbolic); name dtypes explicitly inside it (programs are
    traced with 64-bit types enabled).

Slots and attributes
    `In(name, dtypes="any", many=False, optional=False, differentiable=True)`
    and `Out(name, many=False)`; `dtypes` is 'float', 'int', 'bool',
    'number' or 'any'. `attrs` maps a name to a default value (its type is
    taken from the default: bool, int, float or str) or to an
    `Attr(name, type, default=REQUIRED)` for the other types ('ints',
    'floats', 'strings', 'int64', 'float64', 'dtype', ...). `Attr(...,
    where=...)` states what the value must mean, checked whenever the op is
    appended or loaded (`AttributeValueError` otherwise): `between(0, 1)`,
    `at_least(n)`, `positive`, `non_negative` (each element of a list),
    `one_of("a", "b")`, or `Dims()` for a shape (sizes whose array fits in
    memory).

The gradient maker `maker(g)` (see `lowering.gradients.GradContext`)
    reads the forward op (`g.input(slot)`, `g.output(slot)`, `g.attr(name)`,
    `g.var(name)` -> (dims, dtype)) and emits ops: `g.call(op_type, *inputs,
    out=None, **attrs)` for single-output ops, `g.op(op_type, inputs,
    outputs, **attrs)` otherwise. `g.out_grad(slot)` is the incoming gradient,
    `g.in_grad(slot)` the name the input's gradient must be written to (None
    when that gradient is not wanted). Compose only registered ops (custom ones
    included) whose own gradients exist if you want higher-order gradients.

Registering and replacing
    Registering a type that already exists (built-in or custom) raises
    `progdesc.ProgramError`, unless `replace=True` is passed: then the new
    definition replaces the old one for every program built or lowered
    afterwards (an Executor recompiles programs it had compiled before).
    `unregister` removes a custom type again (restoring the built-in one it
    replaced, if any).

Saving and loading
    A program stores only the op's type name, attributes and slots, so
    `Program.to_bytes()`/`from_bytes()`, checkpoints and inference models
    work unchanged, but **every process that loads or runs such a program
    must register the op first** (import the module that defines it).
    A compiled StableHLO export (`progdesc.export.export_compiled`) holds the
    op's lowered computation and needs no registration to be called.
"""
import keyword

from lowering import registry
from lowering.errors import ProgramError
from lowering.gradients import GradContext
from lowering.constraints import Dims, at_least, between, non_negative, one_of, positive
from lowering.registry import REQUIRED, Attr, In, OpDef, Out

__all__ = ["Attr", "Dims", "GradContext", "In", "OpDef", "Out", "REQUIRED", "at_least", "between",
           "non_negative", "one_of", "positive", "custom_ops", "get",
           "is_registered", "op", "register", "unregister"]

_custom = {}
"""{op type: the OpDef it replaced, or None} for every type registered through this module."""


def _check_name(op_type):
    if not isinstance(op_type, str) or not op_type.isidentifier() or keyword.iskeyword(op_type):
        raise ProgramError(f"op type {op_type!r} must be a Python identifier "
                           "(it becomes progdesc.ops.<type>)")
    if op_type.startswith("_"):
        raise ProgramError(f"op type {op_type!r} must not start with '_'")
    import progdesc.ops as ops_module
    if op_type in vars(ops_module) and not ops_module.is_op_function(op_type):
        raise ProgramError(f"op type {op_type!r} would hide progdesc.ops.{op_type}; "
                           "choose another name")


def _check_parameter_names(opdef):
    params = [s.name.lower() for s in opdef.inputs] + [a.name for a in opdef.attrs]
    for name in params:
        if not name.isidentifier() or keyword.iskeyword(name) or name == "name":
            raise ProgramError(f"slot and attribute names become parameters of "
                               f"progdesc.ops.{opdef.type}: {name!r} must be a Python identifier "
                               "other than 'name'", op_type=opdef.type)
    repeated = sorted({n for n in params if params.count(n) > 1})
    if repeated:
        raise ProgramError(f"slot and attribute names become parameters of "
                           f"progdesc.ops.{opdef.type}: {repeated[0]!r} is used twice "
                           "(slot names count lower-cased)", op_type=opdef.type)


def register(opdef, replace=False):
    """Register a ready-made `OpDef`; returns it.

    Raises `progdesc.ProgramError` if its type is already registered, unless
    `replace=True`. Prefer the `op` decorator, which builds the `OpDef`.
    """
    if not isinstance(opdef, OpDef):
        raise TypeError(f"register expects an OpDef, got {type(opdef).__name__}")
    _check_name(opdef.type)
    _check_parameter_names(opdef)
    existing = registry.get(opdef.type) if registry.is_registered(opdef.type) else None
    registry.register(opdef, replace=replace)   # raises ProgramError on a duplicate
    if opdef.type not in _custom:
        _custom[opdef.type] = existing
    _forget_op_function(opdef.type)
    return opdef


def op(op_type, inputs, outputs, attrs=None, *, random=False, differentiable=True,
       same_dtype=(), replace=False):
    """Decorator: declare op type `op_type` whose lowering rule is the decorated function.

    `inputs` / `outputs` are lists of `In(...)` / `Out(...)` slots (or plain
    slot names); `attrs` maps attribute names to defaults or `Attr`s.
    `random=True` passes a PRNG `key` to the rule; `differentiable=False`
    marks an op no gradient flows through; `same_dtype` names input slots
    that must share one dtype. Registering an existing type raises
    `progdesc.ProgramError` unless `replace=True`.

    Returns the registered `OpDef`; decorate the gradient maker with its
    `.gradient`. Afterwards `progdesc.ops.<op_type>(...)` appends the op.
    """
    _check_name(op_type)

    def wrap(fn):
        if not callable(fn):
            raise TypeError("@op decorates the op's lowering function")
        attr_defs = tuple(
            (a if isinstance(a, Attr) and a.name == name
             else registry.attr_from_default(name, a))
            for name, a in (attrs or {}).items())
        opdef = OpDef(
            type=op_type,
            inputs=tuple(s if isinstance(s, registry.Slot) else In(s) for s in inputs),
            outputs=tuple(s if isinstance(s, registry.Slot) else Out(s) for s in outputs),
            attrs=attr_defs, lower=fn, doc=(fn.__doc__ or "").strip(), random=random,
            differentiable=differentiable, same_dtype=tuple(same_dtype))
        return register(opdef, replace=replace)
    return wrap


def unregister(op_type):
    """Remove an op type registered through this module (a built-in it replaced comes back).

    Programs that use the type can no longer be built, loaded or run.
    Raises `progdesc.ProgramError` for a type this module did not register.
    """
    if op_type not in _custom:
        raise ProgramError(f"op type '{op_type}' was not registered through "
                           "progdesc.custom_op", op_type=op_type)
    registry.unregister(op_type, _custom.pop(op_type))
    _forget_op_function(op_type)


def is_registered(op_type):
    """Whether an op type (built-in or custom) is registered."""
    return registry.is_registered(op_type)


def get(op_type):
    """The registered `OpDef` of `op_type`; raises `progdesc.UnknownOpError` if there is none."""
    return registry.get(op_type)


def custom_ops():
    """Sorted types registered through this module in this process."""
    return sorted(_custom)


def _forget_op_function(op_type):
    import progdesc.ops as ops_module   # (progdesc.ops finds custom ops through this module)
    ops_module.forget(op_type)
