"""Import-time folding of ONNX nodes whose inputs are known: shape computations, mostly.

`fold(op_type, inputs, attrs)` computes a node in NumPy from its inputs' values, each a
NumPy array or None (unknown at import). Arrays of dtype object hold ints and symbolic
sizes (`progdesc.onnx.symbolic.Size`): the sizes `Shape` makes of a value with symbolic
dims, carried through Gather, Slice, Concat, Unsqueeze, Cast, Add, Mul, Equal, Where,
Max... so that Reshape's and Expand's targets stay symbolic.

The translator (`progdesc.onnx.translate`) uses it two ways: a node whose inputs are all
known as numbers becomes a constant (its rule is not called); a node some of whose inputs
hold symbolic sizes is translated by its rule as usual, and its result's sizes are
recorded beside it. A node that cannot be folded (an op not here, a comparison that
depends on the symbols' values) gives None.
"""
import numpy as np

from progdesc.onnx import symbolic
from progdesc.onnx.symbolic import Size, Undecided

MAX_FOLDED = 1 << 16
"""The most elements a folded result may have (a larger one is computed at run time)."""

_FOLDERS = {}


def folder(*op_types):
    """Register `fn(inputs, attrs) -> [arrays]` as the folding of ONNX `op_types`."""
    def register(fn):
        for t in op_types:
            _FOLDERS[t] = fn
        return fn
    return register


def can_fold(op_type):
    """Whether ONNX op type `op_type` (default domain) has a folding."""
    return op_type in _FOLDERS


def fold(op_type, inputs, attrs):
    """The outputs of the node computed from `inputs` (arrays; None for an absent optional
    input), or None if it cannot be folded. `attrs` are the node's, and `_outputs` how
    many outputs it has (Split's equal parts)."""
    fn = _FOLDERS.get(op_type)
    if fn is None:
        return None
    try:
        outs = fn(list(inputs), dict(attrs))
    except (Undecided, TypeError, ValueError, IndexError, ArithmeticError, OverflowError):
        return None
    if outs is None:
        return None
    outs = [np.asarray(o) if not isinstance(o, np.ndarray) else o for o in outs]
    if any(o.size > MAX_FOLDED or o.dtype.kind not in "biufO" for o in outs):
        return None
    try:
        return [_tidy(o) for o in outs]
    except (TypeError, ValueError, OverflowError):
        return None


def _tidy(array):
    """An object array with no Size left becomes a number array: int64, or float32 where
    it holds floats (sizes cast to float; the node's ONNX type decides in the end)."""
    if array.dtype == object and not symbolic.is_symbolic(array):
        floats = any(isinstance(v, (float, np.floating)) for v in array.reshape(-1))
        return array.astype(np.float32 if floats else np.int64)
    return array


def _objects(result):
    """The result of a NumPy ufunc of dtype object (a scalar for 0-D inputs) as an array."""
    if isinstance(result, np.ndarray):
        return result.astype(object)
    out = np.empty((), dtype=object)
    out[()] = result
    return out


def _ints(array):
    return [int(v) for v in np.asarray(array).reshape(-1)]


def _known(*arrays):
    if any(a is None for a in arrays):
        raise ValueError("an input is unknown")


def _numeric(*arrays):
    """Refuse symbolic inputs (an op that only folds numbers)."""
    for a in arrays:
        if a is not None and symbolic.is_symbolic(a):
            raise Undecided("symbolic input")


# --- elementwise ---
def _int_div(x, y):
    """ONNX's division of sizes and numbers: exact for sizes (which may stand in a float
    array, cast from a shape), true division of floats, truncating division of ints."""
    if isinstance(x, Size) or isinstance(y, Size):
        return _integral(x) // _integral(y)
    if isinstance(x, (float, np.floating)) or isinstance(y, (float, np.floating)):
        return float(x) / float(y)
    q, r = divmod(int(x), int(y))
    if r and ((x < 0) != (y < 0)):
        q += 1
    return q


def _integral(v):
    if isinstance(v, (float, np.floating)):
        if not float(v).is_integer():
            raise Undecided(f"a size and the fraction {v}")
        return int(v)
    return v


_BINARY = {"Add": lambda a, b: a + b, "Sub": lambda a, b: a - b, "Mul": lambda a, b: a * b}


def _binary(name, fn):
    def run(inputs, attrs):
        a, b = inputs[:2]
        _known(a, b)
        if a.dtype == object or b.dtype == object:
            return [_objects(np.frompyfunc(fn, 2, 1)(a, b))]
        return [fn(a, b).astype(np.result_type(a, b))]
    _FOLDERS[name] = run


for _name, _fn in _BINARY.items():
    _binary(_name, _fn)


@folder("Div")
def _div(inputs, attrs):
    a, b = inputs[:2]
    _known(a, b)
    if a.dtype == object or b.dtype == object:
        return [_objects(np.frompyfunc(_int_div, 2, 1)(a, b))]
    if a.dtype.kind in "iu":
        return [np.asarray(np.frompyfunc(_int_div, 2, 1)(a, b)).astype(a.dtype)]
    return [np.divide(a, b).astype(a.dtype)]


@folder("Mod")
def _mod(inputs, attrs):
    a, b = inputs[:2]
    _known(a, b)
    _numeric(a, b)
    if attrs.get("fmod", 0) or a.dtype.kind == "f":
        return [np.fmod(a, b)]
    return [np.mod(a, b)]


@folder("Neg")
def _neg(inputs, attrs):
    _known(inputs[0])
    return [-inputs[0]]


def _rounding(fn):
    """Floor, Ceil or Round of sizes and numbers: a size is itself (a whole number)."""
    return lambda v: v if isinstance(v, Size) else float(fn(v))


def _size_abs(v):
    if isinstance(v, Size):
        return v if symbolic.at_least(v, 0) else -v
    return abs(v)


def _size_relu(v):
    if isinstance(v, Size):
        if symbolic.at_least(v, 0):
            return v
        raise Undecided(f"whether {v} >= 0")
    return max(v, 0)


for _name, _fn, _sizes in (("Abs", np.abs, _size_abs),
                           ("Relu", lambda x: np.maximum(x, 0), _size_relu),
                           ("Floor", np.floor, _rounding(np.floor)),
                           ("Ceil", np.ceil, _rounding(np.ceil)),
                           ("Round", np.round, _rounding(np.round)),
                           ("Sqrt", np.sqrt, None), ("Sign", np.sign, None),
                           ("Not", np.logical_not, None)):
    def _run(inputs, attrs, fn=_fn, sizes=_sizes):
        x = inputs[0]
        _known(x)
        if x.dtype == object:
            if sizes is None:
                raise Undecided("a symbolic size")
            return [_objects(np.frompyfunc(sizes, 1, 1)(x))]
        return [fn(x).astype(x.dtype)]
    _FOLDERS[_name] = _run


def _comparison(fn, numeric):
    def run(inputs, attrs):
        a, b = inputs[:2]
        _known(a, b)
        if a.dtype == object or b.dtype == object:
            return [np.asarray(np.frompyfunc(lambda x, y: fn(symbolic.compare(x, y)), 2, 1)
                               (a, b)).astype(bool)]
        return [numeric(a, b)]
    return run


for _name, _fn, _np in (("Equal", lambda c: c == 0, np.equal),
                        ("Less", lambda c: c < 0, np.less),
                        ("Greater", lambda c: c > 0, np.greater),
                        ("LessOrEqual", lambda c: c <= 0, np.less_equal),
                        ("GreaterOrEqual", lambda c: c >= 0, np.greater_equal)):
    _FOLDERS[_name] = _comparison(_fn, _np)


for _name, _fn in (("And", np.logical_and), ("Or", np.logical_or), ("Xor", np.logical_xor)):
    def _run(inputs, attrs, fn=_fn):
        _known(*inputs[:2])
        _numeric(*inputs[:2])
        return [fn(inputs[0], inputs[1])]
    _FOLDERS[_name] = _run


@folder("Where")
def _where(inputs, attrs):
    c, x, y = inputs[:3]
    _known(c, x, y)
    _numeric(c)
    if x.dtype == object or y.dtype == object:
        return [np.where(c, x.astype(object), y.astype(object))]
    return [np.where(c, x, y).astype(np.result_type(x, y))]


def _holds(relation, a, b):
    """Whether relation(a, b) surely holds (False where it is undecided)."""
    try:
        return relation(a, b)
    except Undecided:
        return False


def _extreme(pick):
    def run(inputs, attrs):
        _known(*inputs)
        if not any(a.dtype == object for a in inputs):
            return [pick(np.stack(np.broadcast_arrays(*inputs)), axis=0)
                    .astype(np.result_type(*inputs))]
        arrays = np.broadcast_arrays(*[a.astype(object) for a in inputs])
        out = np.empty(arrays[0].shape, dtype=object)
        for index in np.ndindex(out.shape):
            best = arrays[0][index]
            for a in arrays[1:]:
                low, high = (a[index], best) if pick is np.max else (best, a[index])
                if _holds(symbolic.at_least, high, low):
                    continue   # the best so far stays
                if not _holds(symbolic.at_least, low, high):
                    raise Undecided(f"the extreme of {best} and {a[index]}")
                best = a[index]
            out[index] = best
        return [out]
    return run


_FOLDERS["Max"] = _extreme(np.max)
_FOLDERS["Min"] = _extreme(np.min)


@folder("Cast")
def _cast(inputs, attrs):
    x = inputs[0]
    _known(x)
    import onnx
    to = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(attrs["to"]))
    if x.dtype == object:   # sizes stay sizes, whole numbers in ints or floats
        if to.kind not in "iuf":
            raise Undecided("symbolic sizes cast to a non-number type")
        number = float if to.kind == "f" else int
        return [_objects(np.frompyfunc(lambda v: v if isinstance(v, Size) else number(v),
                                       1, 1)(x))]
    return [x.astype(to)]


@folder("Identity")
def _identity(inputs, attrs):
    _known(inputs[0])
    return [inputs[0]]


# --- shapes ---
@folder("Gather")
def _gather(inputs, attrs):
    x, index = inputs[:2]
    _known(x, index)
    _numeric(index)
    axis = int(attrs.get("axis", 0))
    index = np.where(index < 0, index + x.shape[axis], index)
    return [np.take(x, index, axis=axis)]


@folder("Concat")
def _concat(inputs, attrs):
    _known(*inputs)
    if any(a.dtype == object for a in inputs):
        inputs = [a.astype(object) for a in inputs]
    return [np.concatenate(inputs, axis=int(attrs["axis"]))]


def _axes_of(inputs, attrs, index):
    if len(inputs) > index and inputs[index] is not None:
        _numeric(inputs[index])
        return _ints(inputs[index])
    return attrs.get("axes")


@folder("Split")
def _split(inputs, attrs):
    x = inputs[0]
    _known(x)
    axis = int(attrs.get("axis", 0)) % x.ndim
    n = x.shape[axis]
    if len(inputs) > 1 and inputs[1] is not None:
        _numeric(inputs[1])
        sections = _ints(inputs[1])
    elif attrs.get("split") is not None:
        sections = list(attrs["split"])
    else:
        parts = attrs.get("num_outputs") or attrs["_outputs"]
        chunk = -(-n // parts)
        sections = [chunk] * (n // chunk) + ([n % chunk] if n % chunk else [])
    if sum(sections) != n:
        raise ValueError(f"sections {sections} do not add up to {n}")
    return np.split(x, np.cumsum(sections)[:-1], axis=axis)


@folder("Unsqueeze")
def _unsqueeze(inputs, attrs):
    x = inputs[0]
    _known(x)
    axes = _axes_of(inputs, attrs, 1)
    rank = x.ndim + len(axes)
    return [np.expand_dims(x, tuple(sorted(a % rank for a in axes)))]


@folder("Squeeze")
def _squeeze(inputs, attrs):
    x = inputs[0]
    _known(x)
    axes = _axes_of(inputs, attrs, 1)
    if axes is None:
        return [np.squeeze(x)]
    return [np.squeeze(x, tuple(a % x.ndim for a in axes))]


@folder("Reshape")
def _reshape(inputs, attrs):
    x, shape = inputs[:2]
    _known(x, shape)
    _numeric(shape)
    shape = _ints(shape)
    if not attrs.get("allowzero", 0):
        shape = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return [x.reshape(shape)]


@folder("Flatten")
def _flatten(inputs, attrs):
    x = inputs[0]
    _known(x)
    axis = int(attrs.get("axis", 1))
    axis = axis + x.ndim if axis < 0 else axis
    outer = int(np.prod(x.shape[:axis]))
    return [x.reshape(outer, -1) if x.size else x.reshape(outer, int(np.prod(x.shape[axis:])))]


@folder("Slice")
def _slice(inputs, attrs):
    x, starts, ends = inputs[:3]
    axes = inputs[3] if len(inputs) > 3 else None
    steps = inputs[4] if len(inputs) > 4 else None
    _known(x, starts, ends)
    _numeric(starts, ends, axes, steps)
    starts, ends = _ints(starts), _ints(ends)
    axes = _ints(axes) if axes is not None else list(range(len(starts)))
    steps = _ints(steps) if steps is not None else [1] * len(starts)
    index = [slice(None)] * x.ndim
    for s, e, a, k in zip(starts, ends, axes, steps):
        if k == 0:
            raise ValueError("a slice step of 0")
        index[a % x.ndim] = slice(s, e, k)   # NumPy's clamping is ONNX's
    return [x[tuple(index)]]


@folder("Range")
def _range(inputs, attrs):
    start, limit, delta = inputs[:3]
    _known(start, limit, delta)
    _numeric(start, limit, delta)
    dtype = start.dtype
    count = max(int(np.ceil((float(limit) - float(start)) / float(delta))), 0)
    return [(start + np.arange(count) * delta).astype(dtype)]


@folder("ConstantOfShape")
def _constant_of_shape(inputs, attrs):
    shape = inputs[0]
    _known(shape)
    _numeric(shape)
    value = attrs.get("value")
    value = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)
    return [np.full(_ints(shape), value[0], dtype=value.dtype)]


@folder("Expand")
def _expand(inputs, attrs):
    x, shape = inputs[:2]
    _known(x, shape)
    _numeric(x, shape)
    return [np.broadcast_to(x, np.broadcast_shapes(x.shape, tuple(_ints(shape)))).copy()]


@folder("Tile")
def _tile(inputs, attrs):
    x, reps = inputs[:2]
    _known(x, reps)
    _numeric(reps)
    return [np.tile(x, _ints(reps))]


@folder("Transpose")
def _transpose(inputs, attrs):
    _known(inputs[0])
    perm = attrs.get("perm")
    return [np.transpose(inputs[0], perm)]


def _reduce(fn):
    def run(inputs, attrs):
        x = inputs[0]
        _known(x)
        axes = _axes_of(inputs, attrs, 1)
        keep = bool(attrs.get("keepdims", 1))
        if not axes:
            if attrs.get("noop_with_empty_axes", 0):
                return [x]
            axes = list(range(x.ndim))
        axes = tuple(a % x.ndim for a in axes)
        if x.dtype == object:
            out = fn(x, axis=axes, keepdims=keep, initial=None)
            return [np.asarray(out, dtype=object)]
        return [fn(x, axis=axes, keepdims=keep).astype(x.dtype)]
    return run


def _object_prod(x, axis, keepdims, initial=None):
    out = np.multiply.reduce(x, axis=axis, keepdims=keepdims, initial=1)
    return out


def _object_sum(x, axis, keepdims, initial=None):
    return np.add.reduce(x, axis=axis, keepdims=keepdims, initial=0)


_FOLDERS["ReduceProd"] = _reduce(_object_prod)
_FOLDERS["ReduceSum"] = _reduce(_object_sum)


# --- results whose shapes depend on values: only ever folded ---
@folder("NonZero")
def _nonzero(inputs, attrs):
    _known(inputs[0])
    _numeric(inputs[0])
    return [np.array(np.nonzero(inputs[0]), dtype=np.int64).reshape(inputs[0].ndim, -1)]


@folder("Compress")
def _compress(inputs, attrs):
    x, condition = inputs[:2]
    _known(x, condition)
    _numeric(condition)
    axis = attrs.get("axis")
    return [np.compress(condition.astype(bool), x, axis=axis)]


@folder("Unique")
def _unique(inputs, attrs):
    x = inputs[0]
    _known(x)
    _numeric(x)
    axis = attrs.get("axis")
    values, first, inverse, counts = np.unique(x, return_index=True, return_inverse=True,
                                               return_counts=True, axis=axis)
    if not attrs.get("sorted", 1):   # in the order of their first occurrence
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        values = np.take(values, order, axis=0 if axis is None else axis)
        first, counts, inverse = first[order], counts[order], rank[inverse.reshape(-1)]
    return [values, first.astype(np.int64), inverse.reshape(-1).astype(np.int64),
            counts.astype(np.int64)]
