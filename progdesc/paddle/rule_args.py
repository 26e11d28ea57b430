"""What the rows of the Paddle table share: Paddle's axes, element types and numbers, the
values of tensor inputs that stand for attributes (a reshape's ShapeTensor), and
reshapes that keep a dim known only at run time."""
import numpy as np

from progdesc.paddle.pdmodel import DTYPES
from progdesc.translate import Unsupported


INT32_MAX = 2**31 - 1


def axis_of(axis, rank):
    """Paddle's possibly negative axis made non-negative."""
    return axis + rank if axis < 0 else axis


def dtype_name(code, what="dtype"):
    """NumPy's name of a Paddle element type number (or a name a PIR reader passed);
    Unsupported for a number progdesc does not know."""
    if isinstance(code, str):
        return code
    name = DTYPES.get(code)
    if name is None:
        raise Unsupported(f"{what}={code}, an element type progdesc does not know")
    return name


def ints_of(t, name, what):
    """The value of a tensor input that Paddle lets stand for an int list attribute."""
    value = t.value_of(name)
    if value is None:
        raise Unsupported(f"{what} is computed at run time (a tensor input that is not a "
                          "constant)")
    return [int(v) for v in np.asarray(value).reshape(-1)]


def list_ints(t, names, what):
    """The values of a list of scalar tensors (ShapeTensorList, StartsTensorList)."""
    return [v for name in names for v in ints_of(t, name, what)]


def sizes_in(t, names, what):
    """The sizes held by a shape tensor or a list of them: ints and (variable, axis)
    pairs for sizes known only at run time (see PaddleTranslator.sizes_of)."""
    out = []
    for name in names:
        sizes = t.sizes_of(name)
        if sizes is None:
            raise Unsupported(f"{what} is computed at run time (not from a shape)")
        out += sizes
    return out


def with_unknown(sizes, what):
    """Sizes as dims: -1 for the one size known only at run time (Unsupported if more)."""
    unknown = [s for s in sizes if not isinstance(s, int)]
    if len(unknown) > 1:
        raise Unsupported(f"{what} holds {len(unknown)} sizes known only at run time")
    return [s if isinstance(s, int) else -1 for s in sizes], (unknown[0] if unknown else None)


def dims_of(t, x):
    return list(t.var(x)[0])


def reshape_to(t, x, dims):
    """reshape x to `dims` (ints, -1 for unknown): an unknown dim that stays at its place
    copies x's (0), one other unknown is inferred (-1)."""
    src = dims_of(t, x)
    shape = []
    for i, d in enumerate(dims):
        if d == -1 and i < len(src) and src[i] == -1 and all(
                a == b for a, b in zip(src[:i], dims[:i])):
            shape.append(0)
        else:
            shape.append(d)
    if shape.count(-1) > 1:
        raise Unsupported(f"the result's shape {dims} has more than one unknown dim")
    return t.call("reshape", x, shape=shape)


def unsqueezed(rank, axes):
    """The positions of the new dims after Paddle's unsqueeze of `axes`, one after the
    other, into a rank-`rank` array."""
    dims = ["x"] * rank
    for a in axes:
        a = a + len(dims) + 1 if a < 0 else a
        dims.insert(min(a, len(dims)), "new")
    return [i for i, d in enumerate(dims) if d == "new"]


def floats_of(t, name, what):
    value = t.value_of(name)
    if value is None:
        raise Unsupported(f"{what} is computed at run time")
    return [float(v) for v in np.asarray(value).reshape(-1)]


def parse_number(text):
    """The number of a Paddle `str_value` attribute ('7', '-inf', '1e-05')."""
    text = text.strip().lower()
    if text in ("inf", "+inf", "infinity"):
        return float("inf")
    if text in ("-inf", "-infinity"):
        return float("-inf")
    if text == "nan":
        return float("nan")
    try:
        return int(text)
    except ValueError:
        return float(text)


def numpy_dtype(name):
    """The NumPy dtype of a dtype name (bfloat16 from ml_dtypes)."""
    if name == "bfloat16":
        import ml_dtypes
        return ml_dtypes.bfloat16
    return np.dtype(name)
