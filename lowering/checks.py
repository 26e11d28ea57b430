"""Checks a lowering rule makes on its inputs, raising ShapeError in the op's own terms.

A rule calls them before it computes. They run only while the rule is traced
(shape inference when an op is appended, and compilation), never per step.
A dim unknown while tracing (symbolic, -1 in the program) fails a check
only where JAX would reject it too (broadcasting it against a known size).
"""
from lowering import dtypes
from lowering.errors import ShapeError


def dims(shape):
    """A shape as the program shows it: unknown dims as -1."""
    return [d if isinstance(d, int) else -1 for d in shape]


def typed(x):
    """'float32[4, -1]': an array's dtype and dims."""
    return f"{dtypes.name_of(x.dtype)}{dims(x.shape)}"


def _differ(a, b):
    """Whether two dims are both known and differ."""
    return isinstance(a, int) and isinstance(b, int) and a != b


def rank(slot, x, expected, meaning=""):
    """Input `slot` holds an array of rank `expected`; `meaning` names its dims."""
    if x.ndim != expected:
        shown = f" ({meaning})" if meaning else ""
        raise ShapeError(f"{slot} must have rank {expected}{shown}, got {typed(x)}", slot=slot)


def min_rank(slot, x, least):
    """Input `slot` holds an array of rank `least` or more."""
    if x.ndim < least:
        raise ShapeError(f"{slot} must have rank {least} or more, got {typed(x)}", slot=slot)


def shape(slot, x, expected, why):
    """Input `slot` has the shape `expected` (another array's dims, or derived from them)."""
    if len(expected) != x.ndim or any(_differ(a, b) for a, b in zip(x.shape, expected)):
        raise ShapeError(f"{slot} must have shape {dims(expected)} ({why}), got {typed(x)}",
                         slot=slot)


def dim(slot, x, axis, expected, why):
    """Dim `axis` of input `slot` is `expected`."""
    got = x.shape[axis]
    if _differ(got, expected):
        raise ShapeError(f"dim {axis} of {slot} {typed(x)} must be {dims([expected])[0]} "
                         f"({why}), got {dims([got])[0]}", slot=slot)


def axis(slot, x, value, name="axis", extra=0):
    """Attribute `name` = `value` is an axis of input `slot` (of `extra` more dims, for ops
    that insert some); negative values count from the end."""
    n = x.ndim + extra
    if not -n <= value < n:
        raise ShapeError(f"attribute {name}={value} is out of range for {slot} {typed(x)} "
                         f"(valid: {-n} to {n - 1})", slot=slot)


def broadcast(**arrays):
    """The keyword-named inputs broadcast together (NumPy: trailing dims equal, or 1)."""
    named = list(arrays.items())
    for k in range(1, max(x.ndim for _, x in named) + 1):
        first = None
        for slot, x in named:
            if x.ndim < k or (isinstance(x.shape[-k], int) and x.shape[-k] == 1):
                continue
            if first is None:
                first = slot, x
            elif not first[1].shape[-k] == x.shape[-k]:   # unknown vs known: JAX refuses too
                other, y = first
                raise ShapeError(
                    f"{other} {typed(y)} and {slot} {typed(x)} do not broadcast: dim "
                    f"{y.ndim - k} of {other} is {dims(y.shape)[-k]} and dim {x.ndim - k} of "
                    f"{slot} is {dims(x.shape)[-k]} (sizes must be equal, or 1)"
                    + (_UNKNOWN_MEETS_FIXED if isinstance(y.shape[-k], int)
                       != isinstance(x.shape[-k], int) else ""), slot=slot)


_UNKNOWN_MEETS_FIXED = (
    "; an unknown size (-1, None in pd.data) never meets a fixed one: declare both fixed "
    "(pd.data with the fixed size) or both unknown (a program from from_jax/from_flax: "
    "import it with batch_polymorphic=True)")


def broadcasts_to(slot, x, target, meaning):
    """Input `slot` broadcasts to the shape `target`, whose dims `meaning` names: rank at
    most that of `target`, and each trailing dim equal to the target's, or 1."""
    fits = x.ndim <= len(target) and all(
        (isinstance(a, int) and a == 1) or a == b for a, b in zip(x.shape[::-1], target[::-1]))
    if not fits:
        raise ShapeError(f"{slot} must broadcast to {dims(target)} ({meaning}), got {typed(x)}",
                         slot=slot)


def float_dtype(dtype, why):
    """Attribute `dtype` names a floating-point type."""
    if dtypes.kind_of(dtype) != "float":
        raise ShapeError(f"attribute dtype={dtypes.name_of(dtype)!r} must be a float type ({why})")
