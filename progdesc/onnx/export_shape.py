"""Export rows: reshapes, slices, gathers, broadcasts, concatenation, splits and constants."""
import numpy as np
from onnx import numpy_helper

from lowering import dtypes
from progdesc.onnx.export_table import EXPORT
from progdesc.translate import Unsupported


@EXPORT.rule("reshape")
def reshape(e, X, *, shape):   # 0 copies the input dim and -1 is inferred, as in ONNX
    return e.node("Reshape", [X, e.ints(shape)])


@EXPORT.rule("reshape_as")
def reshape_as(e, X, Target):
    return e.node("Reshape", [X, e.node("Shape", [Target])])


@EXPORT.rule("expand_as")
def expand_as(e, X, Target):
    return e.node("Expand", [X, e.node("Shape", [Target])])


@EXPORT.rule("expand")
def expand(e, X, *, shape):   # a -1 keeps X's dim: a 1 in ONNX's two-way broadcast
    return e.node("Expand", [X, e.ints([1 if d == -1 else d for d in shape])])


@EXPORT.rule("transpose")
def transpose(e, X, *, perm, in_types):
    rank = len(in_types[0][0])
    return e.node("Transpose", [X], perm=[p % rank for p in perm])


@EXPORT.rule("concat")
def concat(e, X, *, axis):
    return e.node("Concat", list(X), axis=axis)


@EXPORT.rule("stack")
def stack(e, X, *, axis):
    return e.node("Concat", [e.unsqueeze(x, [axis]) for x in X], axis=axis)


@EXPORT.rule("split")
def split(e, X, *, num, sections, axis, in_types):
    dim = in_types[0][0][axis]
    if num:
        return list(e.split(X, axis, parts=num))
    sections = list(sections)
    if -1 in sections:
        if dim == -1:
            raise Unsupported(f"split sections {sections} with -1 of a dim of unknown size")
        sections[sections.index(-1)] = dim - sum(s for s in sections if s != -1)
    out = e.split(X, axis, sizes=sections)
    return [out] if len(sections) == 1 else list(out)


@EXPORT.rule("slice")
def slice_(e, X, *, axes, starts, ends, strides):
    inputs = [X, e.ints(starts), e.ints(ends), e.ints(axes)]
    if strides:
        inputs.append(e.ints(strides))
    return e.node("Slice", inputs)


@EXPORT.rule("squeeze")
def squeeze(e, X, *, axes, in_types):
    if not axes:
        axes = [i for i, d in enumerate(in_types[0][0]) if d == 1]
    return e.squeeze(X, axes) if axes else e.node("Identity", [X])


@EXPORT.rule("unsqueeze")
def unsqueeze(e, X, *, axes):
    return e.unsqueeze(X, axes)


@EXPORT.rule("tile")
def tile(e, X, *, reps):
    return e.node("Tile", [X, e.ints(reps)])


@EXPORT.rule("gather")
def gather(e, X, Index, *, axis):
    return e.node("Gather", [X, Index], axis=axis)


@EXPORT.rule("take_along_axis")
def take_along_axis(e, X, Indices, *, axis):
    return e.node("GatherElements", [X, Indices], axis=axis)


@EXPORT.rule("broadcast_in_dim")
def broadcast_in_dim(e, X, Like=None, *, shape, broadcast_dimensions, like_axis, in_types):
    """X's dims moved to `broadcast_dimensions` (the others size 1), then expanded; a -1
    no dim of X maps to takes Like's dim `like_axis`."""
    x_dims = in_types[0][0]
    dims = list(broadcast_dimensions)
    order = sorted(range(len(dims)), key=dims.__getitem__)
    if order != list(range(len(dims))):
        X = e.node("Transpose", [X], perm=order)
        dims = sorted(dims)
    new = [i for i in range(len(shape)) if i not in dims]
    out = e.unsqueeze(X, new) if new else X
    mapped = dict(zip(broadcast_dimensions, x_dims))
    if all(d != -1 or i in mapped for i, d in enumerate(shape)):
        target = [1 if d == -1 else d for d in shape]
        return e.node("Expand", [out, e.ints(target)])
    if Like is None:
        raise Unsupported("broadcast_in_dim to a -1 dim with no Like")
    parts = [e.dim(Like, like_axis) if d == -1 and i not in mapped
             else e.ints([1 if d == -1 else d]) for i, d in enumerate(shape)]
    return e.node("Expand", [out, e.node("Concat", parts, axis=0)])


def _triangle_rule(upper):
    def rule(e, X, *, diagonal, in_types):
        if e.opset >= 14:
            return e.node("Trilu", [X, e.const(np.int64(diagonal))], upper=int(upper))
        rank, dtype = len(in_types[0][0]), in_types[0][1]   # opset 13: keep where col - row <= k

        def count(axis):
            return e.node("Range", [e.const(np.int64(0)), e.squeeze(e.dim(X, axis), [0]),
                                    e.const(np.int64(1))])
        offset = e.node("Sub", [count(rank - 1), e.unsqueeze(count(rank - 2), [1])])
        keep = e.node("GreaterOrEqual" if upper else "LessOrEqual",
                      [offset, e.const(np.int64(diagonal))])
        return e.node("Where", [keep, X, e.scalar(0, dtype)])
    rule.__name__ = rule.__qualname__ = "triu" if upper else "tril"
    return rule


EXPORT.rule("tril")(_triangle_rule(False))
EXPORT.rule("triu")(_triangle_rule(True))


# --- values the program makes ---

@EXPORT.rule("fill_constant")
def fill_constant(e, *, shape, dtype, value):
    if -1 in shape:
        raise Unsupported(f"fill_constant of shape {list(shape)}")
    array = np.asarray([value], dtype=dtypes.to_numpy(dtype))
    if dtype == "bfloat16" and e.opset < 20:   # ConstantOfShape makes bfloat16 from 20
        return e.const(np.broadcast_to(array.reshape(()), shape).copy())
    return e.node("ConstantOfShape", [e.ints(shape)], value=numpy_helper.from_array(array))


@EXPORT.rule("assign_value")
def assign_value(e, *, shape, dtype, values, int_values):
    source = (values, np.float64) if dtypes.kind_of(dtype) == "float" else (int_values, np.int64)
    array = np.asarray(source[0], dtype=source[1]).astype(dtypes.to_numpy(dtype))
    return e.const(array.reshape(shape))


@EXPORT.rule("iota")
def iota(e, *, shape, dtype, dimension):
    count = np.arange(shape[dimension]).reshape([-1] + [1] * (len(shape) - dimension - 1))
    array = np.broadcast_to(count, shape).astype(dtypes.to_numpy(dtype))
    return e.const(np.asarray(array, order="C"))


@EXPORT.rule("dim_size")
def dim_size(e, X, *, axis, multiplier, dtype):
    size = e.squeeze(e.dim(X, axis), [0])
    if multiplier != 1:
        size = e.node("Mul", [size, e.const(np.int64(multiplier))])
    return size if dtype == "int64" else e.cast(size, dtype)


@EXPORT.rule("top_k")
def top_k(e, X, *, k, axis, largest):   # ties: the lower index first, in both
    return tuple(e.node("TopK", [X, e.ints([k])], outputs=2, axis=axis,
                        largest=int(bool(largest)), sorted=1))


@EXPORT.rule("rev")
def rev(e, X, *, dimensions):
    n = len(dimensions)
    return e.node("Slice", [X, e.ints([-1] * n), e.ints([-2 ** 63] * n), e.ints(dimensions),
                            e.ints([-1] * n)])


@EXPORT.rule("pad")
def pad(e, X, PaddingValue, *, padding_config):
    config = [padding_config[i:i + 3] for i in range(0, len(padding_config), 3)]
    if any(c[2] for c in config):
        raise Unsupported("interior padding (ONNX Pad pads the borders only)")
    pads = [c[0] for c in config] + [c[1] for c in config]   # a negative one cuts, as ours
    return e.node("Pad", [X, e.ints(pads), PaddingValue], mode="constant")


@EXPORT.rule("border_pad")
def border_pad(e, X, *, paddings, mode, in_types):
    if mode == "circular":
        dims = [d for d in in_types[0][0] for _ in (0, 1)]
        if e.opset < 19 or any(p and (n == -1 or p > n) for p, n in zip(paddings, dims)):
            raise Unsupported("circular padding needs opset 19 and paddings of known dims, "
                              "at most their size")
    onnx_mode = {"reflect": "reflect", "replicate": "edge", "circular": "wrap"}[mode]
    return e.node("Pad", [X, e.ints(list(paddings[::2]) + list(paddings[1::2]))],
                  mode=onnx_mode)


# --- shapes computed from other arrays' dims (lowering/ops/shape_dims.py) ---

def _computed(e, values, dims, likes):
    """The 1-D int64 tensor of `values` in which each position the `dims` terms name adds
    coef times the product of the Like dims they list (see `reshape_dims`)."""
    terms, i = {}, 0
    while i < len(dims):
        pos, coef, n = dims[i:i + 3]
        term = e.ints([coef])
        for k in range(n):
            index, axis = dims[i + 3 + 2 * k:i + 5 + 2 * k]
            term = e.node("Mul", [term, e.dim(likes[index], axis)])
        terms.setdefault(pos, []).append(term)
        i += 3 + 2 * n
    if not terms:
        return e.ints(values)
    parts, run = [], []
    for pos, value in enumerate(values):
        if pos not in terms:
            run.append(value)
            continue
        if run:
            parts.append(e.ints(run))
            run = []
        part = e.ints([value])
        for term in terms[pos]:
            part = e.node("Add", [part, term])
        parts.append(part)
    if run:
        parts.append(e.ints(run))
    return e.node("Concat", parts, axis=0) if len(parts) > 1 else parts[0]


def _positions(dims):
    found, i = set(), 0
    while i < len(dims):
        found.add(dims[i])
        i += 3 + 2 * dims[i + 2]
    return found


@EXPORT.rule("reshape_dims")
def reshape_dims(e, X, Like=None, *, shape, dims):
    literal_zero = any(d == 0 for i, d in enumerate(shape) if i not in _positions(dims))
    if e.opset < 14 and literal_zero:
        raise Unsupported("a dim of size 0 in the target needs opset 14 (Reshape allowzero)")
    target = _computed(e, list(shape), list(dims), Like or [])
    return e.node("Reshape", [X, target], allowzero=1 if e.opset >= 14 else None)


@EXPORT.rule("broadcast_dims")
def broadcast_dims(e, X, Like=None, *, shape, dims):   # a -1 left: 1, which keeps X's dim
    computed = _positions(dims)
    base = [1 if d == -1 and i not in computed else d for i, d in enumerate(shape)]
    return e.node("Expand", [X, _computed(e, base, list(dims), Like or [])])


@EXPORT.rule("slice_dims")
def slice_dims(e, X, Like=None, *, axes, starts, ends, strides, dims):
    """ONNX Slice, whose bounds are clamped into each dim as ours are."""
    n = len(axes)
    bounds = _computed(e, list(starts) + list(ends), list(dims), Like or [])
    if _positions(dims):
        begin, end = e.split(bounds, 0, sizes=[n, n])
    else:
        begin, end = e.ints(starts), e.ints(ends)
    inputs = [X, begin, end, e.ints(axes)]
    if strides:
        inputs.append(e.ints(strides))
    return e.node("Slice", inputs)
