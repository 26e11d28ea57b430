"""Symbolic sizes: what a shape computation holds when some dims are known only at run time.

A `Size` is a polynomial with int coefficients over the names of symbolic dims ('batch',
'seq'): `batch`, `batch*seq`, `4*seq`, `seq - 1`. Shape computations of ONNX graphs
(Shape -> Gather -> Mul -> Concat -> Reshape) are folded at import over NumPy arrays of
dtype object holding ints and Sizes (see `progdesc.onnx.folding`); a consumer that needs a
static shape (Reshape, Expand) maps each Size onto the dims of variables that hold its
symbols at run time.

As in `jax.export`, a symbolic dim is taken to be >= 1: so `batch == -1` is False and
`max(batch, 1)` is `batch`. What cannot be decided (`batch == seq`) raises `Undecided`.
"""
import math

import numpy as np


class Undecided(ArithmeticError):
    """A comparison or division of sizes that depends on the run-time values of symbols."""


class Size:
    """A polynomial over symbolic dims: {monomial (sorted tuple of names): int coefficient}.

    Arithmetic with ints and Sizes gives a Size, or an int where the symbols cancel out.
    Use `size(...)` / `symbol(name)` to make one; `==` compares structurally."""

    __slots__ = ("terms",)

    def __init__(self, terms):
        self.terms = {m: c for m, c in terms.items() if c}

    # --- making ---
    @staticmethod
    def of(terms):
        """The int or Size that `terms` hold (an int when only the constant term is left)."""
        s = Size(terms)
        if not s.terms:
            return 0
        if set(s.terms) == {()}:
            return s.terms[()]
        return s

    @property
    def symbols(self):
        """The names of the symbols it reads."""
        return sorted({n for m in self.terms for n in m})

    # --- arithmetic ---
    def _add(self, other, sign=1):
        if isinstance(other, Size):
            other_terms = other.terms
        elif _is_int(other):
            other_terms = {(): int(other)}
        else:
            return NotImplemented
        terms = dict(self.terms)
        for m, c in other_terms.items():
            terms[m] = terms.get(m, 0) + sign * c
        return Size.of(terms)

    def __add__(self, other):
        return self._add(other)

    __radd__ = __add__

    def __sub__(self, other):
        return self._add(other, -1)

    def __rsub__(self, other):
        return (-self)._add(other)

    def __neg__(self):
        return Size.of({m: -c for m, c in self.terms.items()})

    def __mul__(self, other):
        if _is_int(other):
            return Size.of({m: c * int(other) for m, c in self.terms.items()})
        if not isinstance(other, Size):
            return NotImplemented
        terms = {}
        for m1, c1 in self.terms.items():
            for m2, c2 in other.terms.items():
                m = tuple(sorted(m1 + m2))
                terms[m] = terms.get(m, 0) + c1 * c2
        return Size.of(terms)

    __rmul__ = __mul__

    def __floordiv__(self, other):
        """Exact division by an int or by a monomial Size (`batch*seq // seq`); Undecided
        where the quotient is not a polynomial."""
        if _is_int(other):
            other = int(other)
            if other and all(c % other == 0 for c in self.terms.values()):
                return Size.of({m: c // other for m, c in self.terms.items()})
            raise Undecided(f"{self} / {other} depends on the symbols' values")
        if isinstance(other, Size) and len(other.terms) == 1:
            (mono, coef), = other.terms.items()
            terms = {}
            for m, c in self.terms.items():
                rest = list(m)
                for n in mono:
                    if n not in rest:
                        raise Undecided(f"{self} / {other} depends on the symbols' values")
                    rest.remove(n)
                if c % coef:
                    raise Undecided(f"{self} / {other} depends on the symbols' values")
                terms[tuple(rest)] = c // coef
            return Size.of(terms)
        if isinstance(other, Size):
            raise Undecided(f"{self} / {other} depends on the symbols' values")
        return NotImplemented

    def __rfloordiv__(self, other):
        raise Undecided(f"{other} / {self} depends on the symbols' values")

    def __truediv__(self, other):
        return self.__floordiv__(other)

    # --- comparing ---
    def __eq__(self, other):
        return isinstance(other, Size) and self.terms == other.terms

    def __hash__(self):
        return hash(tuple(sorted(self.terms.items())))

    def lower_bound(self):
        """The least value it can take with every symbol >= 1, or None if unbounded below."""
        if any(c < 0 for m, c in self.terms.items() if m):
            return None
        return sum(self.terms.values())

    def __repr__(self):
        parts = []
        for m, c in sorted(self.terms.items(), key=lambda t: (-len(t[0]), t[0])):
            body = "*".join(m)
            if not body:
                parts.append(str(c))
            else:
                parts.append(body if c == 1 else f"{c}*{body}")
        return " + ".join(parts).replace("+ -", "- ")

    __str__ = __repr__

    def __bool__(self):
        return True   # never 0 (Size.of made it an int then): a size's truth


def _is_int(v):
    """Whether `v` is a whole number (an int, or a float holding one: a size cast to
    float stays a size)."""
    if isinstance(v, (float, np.floating)):
        return float(v).is_integer()
    return isinstance(v, (int, np.integer))


def symbol(name):
    """The Size of one symbolic dim."""
    return Size({(str(name),): 1})


def compare(a, b):
    """-1, 0 or 1 as a < b, a == b, a > b for ints and Sizes (symbols >= 1); raises
    Undecided where it depends on the symbols' values."""
    if not isinstance(a, Size) and not isinstance(b, Size):
        return (a > b) - (a < b)
    diff = a - b
    if not isinstance(diff, Size):
        return (diff > 0) - (diff < 0)
    low = diff.lower_bound()
    if low is not None and low > 0:
        return 1
    high = (-diff).lower_bound()
    if high is not None and high > 0:
        return -1
    raise Undecided(f"whether {a} < {b} depends on the symbols' values")


def at_least(a, b):
    """Whether a >= b for ints and Sizes (symbols >= 1): True or False where that holds
    for every value of the symbols; raises Undecided otherwise."""
    diff = a - b
    if not isinstance(diff, Size):
        return diff >= 0
    low = diff.lower_bound()
    if low is not None and low >= 0:
        return True
    high = (-diff).lower_bound()
    if high is not None and high > 0:
        return False
    raise Undecided(f"whether {a} >= {b} depends on the symbols' values")


def is_symbolic(value):
    """Whether `value` (an int, a Size, or a NumPy array of them) holds a Size."""
    if isinstance(value, Size):
        return True
    dtype = getattr(value, "dtype", None)
    return dtype is not None and dtype == object and any(
        isinstance(v, Size) for v in value.reshape(-1))


def product(values):
    """The product of ints and Sizes."""
    return math.prod(values, start=1)
