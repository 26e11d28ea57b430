"""What an attribute's value must mean, declared beside the attribute.

    Attr("dropout_prob", "float", 0.5, where=between(0, 1))
    Attr("ksize", "ints", REQUIRED, where=positive)
    Attr("shape", "ints", where=Dims())

A constraint is checked after the value's type, whenever an op is appended or a
program is loaded (`OpDef.complete_attrs`); a value that breaks it raises
`AttributeValueError` naming the attribute, what it must be and what it is.
On a list attribute a range applies to each element.
"""
from dataclasses import dataclass

from lowering import sizes


@dataclass(frozen=True)
class Range:
    """A number (or each number of a list) between `lo` and `hi`; None: no bound.
    `open_lo` / `open_hi` exclude the bound itself."""
    lo: float = None
    hi: float = None
    open_lo: bool = False
    open_hi: bool = False

    def violation(self, value, attrs):
        """Why `value` breaks the range, or None."""
        for v in value if isinstance(value, tuple) else (value,):
            low = self.lo is not None and (v <= self.lo if self.open_lo else v < self.lo)
            high = self.hi is not None and (v >= self.hi if self.open_hi else v > self.hi)
            if low or high:
                return (f"must hold elements {self}" if isinstance(value, tuple)
                        else f"must be {self}")
        return None

    def __str__(self):
        if self.hi is None:
            return f"{'>' if self.open_lo else '>='} {self.lo}"
        if self.lo is None:
            return f"{'<' if self.open_hi else '<='} {self.hi}"
        return (f"in {'(' if self.open_lo else '['}{self.lo}, "
                f"{self.hi}{')' if self.open_hi else ']'}")


def at_least(lo):
    """`>= lo`."""
    return Range(lo)


def between(lo, hi, *, open_hi=False):
    """In [lo, hi] (or [lo, hi) with `open_hi`)."""
    return Range(lo, hi, open_hi=open_hi)


positive = Range(0, open_lo=True)
"""> 0: sizes, strides, kernel sizes, groups, epsilons that divide."""
non_negative = Range(0)
""">= 0: paddings, counts, rates."""


@dataclass(frozen=True)
class OneOf:
    """One of a few strings."""
    choices: tuple

    def violation(self, value, attrs):
        """Why `value` is not a choice, or None."""
        if value in self.choices:
            return None
        return "must be one of " + ", ".join(map(repr, self.choices))


def one_of(*choices):
    """One of `choices`."""
    return OneOf(tuple(choices))


@dataclass(frozen=True)
class Dims:
    """A shape: each dim a size >= `least` (-1 where a dim may be unknown or inferred), and
    the array it describes small enough to hold (lowering.sizes): its elements are of the
    op's `dtype` attribute, or taken as one byte each when the op declares none."""
    least: int = 0

    def violation(self, value, attrs):
        """Why `value` is not such a shape, or None."""
        if any(d < self.least for d in value):
            return f"must hold dims >= {self.least}"
        too_big = sizes.oversized(value, attrs.get("dtype"))
        return None if too_big is None else f"is too large: {too_big}"
