"""Indexing ops: Gather, GatherElements, GatherND, ScatterElements, ScatterND, OneHot,
Trilu, Pad; and NonZero, Compress, Unique, whose results' shapes depend on values: those
are translated only where their inputs are known at import (the translator folds them),
else refused."""
from progdesc.onnx import folding
from progdesc.onnx.shape_args import axis_of, ints_of, wrapped_indices, zero_of
from progdesc.onnx.table import RULES
from progdesc.translate import Unsupported


def _known_dims(t, x, what):
    dims = t.dims(x)
    if not all(isinstance(d, int) for d in dims):
        raise Unsupported(f"{what} of a value whose dims {dims} are not all known at import")
    return dims


@RULES.rule("Gather")
def gather(t, x, indices, *, axis=0):   # our gather counts negative indices from the end
    return t.call("gather", x, indices, axis=axis_of(axis, len(t.var(x)[0])))


@RULES.rule("GatherElements")
def gather_elements(t, x, indices, *, axis=0):   # as take_along_axis does
    return t.call("take_along_axis", x, indices, axis=axis_of(axis, len(t.var(x)[0])))


@RULES.rule("GatherND")
def gather_nd(t, x, indices, *, batch_dims=0):
    dims = t.dims(x)
    index_dims = t.dims(indices)
    k = index_dims[-1]
    b = int(batch_dims)
    if not isinstance(k, int) or b + k > len(dims):
        raise Unsupported(f"indices of dims {index_dims} for data of dims {dims}")
    looked_up = dims[b:b + k]
    if all(isinstance(d, int) for d in looked_up):
        indices = wrapped_indices(t, indices, looked_up)
    rank = len(index_dims)
    return t.call("gather_general", x, indices,
                  offset_dims=list(range(rank - 1, rank - 1 + len(dims) - b - k)),
                  collapsed_slice_dims=list(range(b, b + k)),
                  start_index_map=list(range(b, b + k)),
                  operand_batching_dims=list(range(b)),
                  start_indices_batching_dims=list(range(b)),
                  slice_sizes=[1] * (b + k) + [d if isinstance(d, int) else -1
                                               for d in dims[b + k:]],
                  mode="clip")


_SCATTER = {"none": "set", "mul": "mul", "max": "max", "min": "min"}


def _scatter(t, x, indices, updates, reduction, **numbers):
    if reduction == "add":
        return t.call("scatter_add_general", x, indices, updates, mode="fill", **numbers)
    if reduction not in _SCATTER:
        raise Unsupported(f"reduction '{reduction}'")
    return t.call("scatter_general", x, indices, updates, computation=_SCATTER[reduction],
                  mode="fill", **numbers)


@RULES.rule("ScatterND")
def scatter_nd(t, x, indices, updates, *, reduction="none"):
    dims = t.dims(x)
    index_dims = t.dims(indices)
    k = index_dims[-1]
    if not isinstance(k, int) or k > len(dims):
        raise Unsupported(f"indices of dims {index_dims} for data of dims {dims}")
    if all(isinstance(d, int) for d in dims[:k]):
        indices = wrapped_indices(t, indices, dims[:k])
    rank = len(index_dims)
    update_rank = len(t.dims(updates))
    return _scatter(t, x, indices, updates, reduction,
                    update_window_dims=list(range(rank - 1, update_rank)),
                    inserted_window_dims=list(range(k)),
                    scatter_dims_to_operand_dims=list(range(k)))


@RULES.rule("ScatterElements")
def scatter_elements(t, x, indices, updates, *, axis=0, reduction="none"):
    dims = t.dims(x)
    axis = axis_of(axis, len(dims))
    shape = _known_dims(t, indices, "ScatterElements")
    if isinstance(dims[axis], int):
        indices = wrapped_indices(t, indices, dims[axis])
    dtype = t.var(indices)[1]
    coords = []   # the full index of each update: iotas, and indices along axis
    for d in range(len(shape)):
        part = indices if d == axis else t.call("iota", shape=shape, dtype=dtype, dimension=d)
        coords.append(t.call("unsqueeze", part, axes=[len(shape)]))
    full = t.call("concat", coords, axis=len(shape))
    return _scatter(t, x, full, updates, reduction, update_window_dims=[],
                    inserted_window_dims=list(range(len(dims))),
                    scatter_dims_to_operand_dims=list(range(len(dims))))


@RULES.rule("OneHot")
def one_hot(t, indices, depth, values, *, axis=-1):
    depth_value = ints_of(t, depth, "depth")
    if len(depth_value) != 1 or depth_value[0] <= 0:
        raise Unsupported(f"depth {depth_value}")
    n = depth_value[0]
    rank = len(t.dims(indices)) + 1
    axis = axis_of(axis, rank)
    dtype = t.var(values)[1]
    if t.var(indices)[1].startswith("float"):
        indices = t.call("cast", indices, dtype="int64")
    indices = wrapped_indices(t, indices, n)
    hot = t.call("one_hot", indices, depth=n, dtype=dtype)
    off = t.call("slice", values, axes=[0], starts=[0], ends=[1])
    on = t.call("slice", values, axes=[0], starts=[1], ends=[2])
    out = t.call("add", t.call("mul", hot, t.call("sub", on, off)), off)
    if axis != rank - 1:
        perm = list(range(rank - 1))
        perm.insert(axis, rank - 1)
        out = t.call("transpose", out, perm=perm)
    return out


@RULES.rule("Trilu")
def trilu(t, x, k=None, *, upper=1):
    diagonal = ints_of(t, k, "k")[0] if k is not None else 0
    return t.call("triu" if upper else "tril", x, diagonal=int(diagonal))


_BORDER = {"reflect": "reflect", "edge": "replicate", "wrap": "circular"}


@RULES.rule("Pad")
def pad(t, x, pads, constant_value=None, axes=None, *, mode="constant"):
    rank = len(t.var(x)[0])
    amounts = ints_of(t, pads, "pads")
    axes = ints_of(t, axes, "axes") if axes is not None else list(range(rank))
    axes = [axis_of(a, rank) for a in axes]
    if len(amounts) != 2 * len(axes):
        raise Unsupported(f"{len(amounts)} pads for {len(axes)} axes")
    low, high = [0] * rank, [0] * rank
    for i, a in enumerate(axes):
        low[a], high[a] = amounts[i], amounts[i + len(axes)]
    if mode == "constant":
        if constant_value is None:
            value = zero_of(t, x)
        elif len(t.var(constant_value)[0]) != 0:
            value = t.call("reshape", constant_value, shape=[])
        else:
            value = constant_value
        return t.call("pad", x, value,
                      padding_config=[v for lo, hi in zip(low, high) for v in (lo, hi, 0)])
    if mode not in _BORDER:
        raise Unsupported(f"mode '{mode}'")
    if min(low + high) < 0:
        raise Unsupported(f"negative pads in mode '{mode}'")
    return t.call("border_pad", x, paddings=[v for lo, hi in zip(low, high) for v in (lo, hi)],
                  mode=_BORDER[mode])


def _value_dependent(t, op_type, inputs, attrs):
    """The results of NonZero, Compress or Unique computed at import from inputs known
    then (a float initializer read here is frozen: its values shape the program), else
    Unsupported."""
    values = [t.value_of(i) for i in inputs]
    if any(v is None for v, i in zip(values, inputs) if i is not None):
        raise Unsupported("the shape of its result depends on the values of its input, "
                          f"known only at run time ({op_type} of a constant is computed at "
                          "import)")
    outs = folding.fold(op_type, values, {k: v for k, v in attrs.items() if v is not None})
    if outs is None:
        raise Unsupported(f"its result has more than {folding.MAX_FOLDED} elements")
    return [t.constant(o) for o in outs[:len(t.node_proto.output)]]


@RULES.rule("NonZero")
def nonzero(t, x):
    return _value_dependent(t, "NonZero", [x], {})[0]


@RULES.rule("Compress")
def compress(t, x, condition, *, axis=None):
    return _value_dependent(t, "Compress", [x, condition], {"axis": axis})[0]


@RULES.rule("Unique")
def unique(t, x, *, axis=None, sorted=1):  # noqa: A002  (ONNX's attribute)
    return _value_dependent(t, "Unique", [x], {"axis": axis, "sorted": sorted})
