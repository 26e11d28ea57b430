"""Samples of lowering/ops/shape.py."""
import numpy as np

from op_table import Invalid, Sample, rand, spec


def _slice_ref(X, axes, starts, ends, strides=()):
    index = [slice(None)] * X.ndim
    for k, axis in enumerate(axes):
        index[axis] = slice(starts[k], ends[k], strides[k] if strides else None)
    return X[tuple(index)]


def _slice_grad_ref(X, OutGrad, **attrs):
    out = np.zeros_like(X, dtype=OutGrad.dtype)
    index = [slice(None)] * X.ndim
    for k, axis in enumerate(attrs["axes"]):
        step = attrs["strides"][k] if attrs.get("strides") else None
        index[axis] = slice(attrs["starts"][k], attrs["ends"][k], step)
    out[tuple(index)] += OutGrad
    return out


def _split_ref(X, num=0, sections=(), axis=0):
    if num:
        return np.split(X, num, axis=axis)
    sections = list(sections)
    if -1 in sections:
        sections[sections.index(-1)] = X.shape[axis] - (sum(sections) + 1)
    return np.split(X, np.cumsum(sections)[:-1], axis=axis)


def _concat_grad_ref(X, DOut, axis=0):
    return np.split(DOut, np.cumsum([x.shape[axis] for x in X])[:-1], axis=axis)


def _expand_ref(X, shape):
    lead = len(shape) - X.ndim
    return np.broadcast_to(X, [X.shape[i - lead] if d == -1 else d for i, d in enumerate(shape)])


def _gather_grad_ref(X, Index, OutGrad, axis=0):
    out = np.zeros_like(X, dtype=OutGrad.dtype)
    np.add.at(out, (slice(None),) * axis + (Index,), OutGrad)
    return out


def _take_along_axis_grad_ref(X, Indices, OutGrad, axis=0):
    out = np.zeros_like(X, dtype=OutGrad.dtype)
    where = list(np.indices(Indices.shape, sparse=True))
    where[axis] = Indices
    np.add.at(out, tuple(where), OutGrad)
    return out


def _one_hot_ref(X, depth, dtype="float32"):
    return (X[..., None] == np.arange(depth)).astype(dtype)


SAMPLES = [
    Sample("reshape", {"X": rand(2, 3, 4)}, lambda X, shape: X.reshape(2, 12),
           {"shape": [0, 12]}, name="copy_dim"),
    Sample("reshape", {"X": rand(2, 3, 4)}, lambda X, shape: X.reshape(-1, 4),
           {"shape": [-1, 4]}, name="infer"),
    Sample("reshape", {"X": rand(2, 3, 4)}, lambda X, shape: X.reshape(4, 3, 2),
           {"shape": [4, -1, 2]}, name="fixed_dims_need_static_batch", symbolic=False),
    Sample("reshape", {"X": np.arange(6, dtype=np.int32).reshape(2, 3)},
           lambda X, shape: X.reshape(2, 3, 1), {"shape": [0, 0, 1]}, name="int"),
    Sample("reshape_as", {"X": rand(2, 3, 4), "Target": rand(2, 4, 3, seed=1)},
           lambda X, Target: X.reshape(Target.shape)),
    Sample("transpose", {"X": rand(2, 3, 4)}, lambda X, perm: X.transpose(perm),
           {"perm": [2, 0, 1]}),
    Sample("transpose", {"X": rand(3, 4)}, lambda X, perm: X.T, {"perm": [1, 0]}, name="2d"),
    Sample("concat", {"X": [rand(2, 3), rand(2, 2, seed=1), rand(2, 1, seed=2)]},
           lambda X, axis: np.concatenate(X, axis=1), {"axis": 1}),
    Sample("concat", {"X": [rand(2, 3, 2), rand(2, 3, 1, seed=1)]},
           lambda X, axis: np.concatenate(X, axis=-1), {"axis": -1}, name="neg_axis"),
    Sample("concat", {"X": [rand(2, 3), rand(1, 3, seed=1)]},
           lambda X: np.concatenate(X, axis=0), name="axis0"),
    Sample("concat_grad", {"X": [rand(2, 3), rand(2, 2, seed=1), rand(2, 1, seed=2)],
                           "DOut": rand(2, 6, seed=3)}, _concat_grad_ref, {"axis": 1}),
    Sample("concat_grad", {"X": [rand(2, 3), rand(1, 3, seed=1)], "DOut": rand(3, 3, seed=2)},
           _concat_grad_ref, name="axis0"),
    Sample("concat_grad", {"X": [rand(2, 3, 1), rand(2, 3, 2, seed=1)],
                           "DOut": rand(2, 3, 3, seed=2)},
           lambda X, DOut, axis: _concat_grad_ref(X, DOut, axis=2), {"axis": -1},
           name="neg_axis"),
    Sample("split", {"X": rand(3, 6)}, _split_ref, {"num": 3, "axis": 1}, name="num"),
    Sample("split", {"X": rand(3, 6)}, _split_ref, {"sections": [2, -1, 1], "axis": 1},
           name="sections_infer"),
    Sample("split", {"X": rand(4, 3)}, _split_ref, {"sections": [1, 3]}, name="sections_axis0"),
    Sample("split", {"X": rand(4, 3)}, _split_ref, {"sections": [-1, 2, 1]},
           name="infer_first_axis0"),
    Sample("stack", {"X": [rand(2, 3), rand(2, 3, seed=1), rand(2, 3, seed=2)]},
           lambda X: np.stack(X)),
    Sample("stack", {"X": [rand(2, 3), rand(2, 3, seed=1)]},
           lambda X, axis: np.stack(X, axis=-1), {"axis": -1}, name="neg_axis"),
    Sample("slice", {"X": rand(4, 5)}, _slice_ref,
           {"axes": [0, 1], "starts": [1, -3], "ends": [3, 100]}, name="neg_and_clamped"),
    Sample("slice", {"X": rand(4, 5)}, _slice_ref,
           {"axes": [0], "starts": [-2], "ends": [2**31 - 1]}, name="batch_axis_tail"),
    Sample("slice", {"X": rand(2, 5, 3)}, _slice_ref,
           {"axes": [1], "starts": [0], "ends": [5], "strides": [2]}, name="strided"),
    Sample("slice", {"X": rand(2, 5)}, _slice_ref,
           {"axes": [-1], "starts": [3], "ends": [-10], "strides": [-1]}, name="reversed"),
    Sample("slice_grad", {"X": rand(3, 5), "OutGrad": rand(3, 2, seed=1)}, _slice_grad_ref,
           {"axes": [1], "starts": [1], "ends": [3]}),
    Sample("slice_grad", {"X": rand(4, 5), "OutGrad": rand(2, 2, seed=1)}, _slice_grad_ref,
           {"axes": [0, 1], "starts": [-3, 4], "ends": [100, 0], "strides": [2, -2]},
           name="strided_part_of_batch_axis", symbolic=False),
    Sample("squeeze", {"X": rand(2, 1, 3, 1)}, lambda X: X.reshape(2, 3), name="all"),
    Sample("squeeze", {"X": rand(2, 1, 3, 1)}, lambda X, axes: X.reshape(2, 3, 1),
           {"axes": [1]}, name="one"),
    Sample("squeeze", {"X": rand(2, 1, 3, 1)}, lambda X, axes: X.reshape(2, 1, 3),
           {"axes": [-1]}, name="neg"),
    Sample("unsqueeze", {"X": rand(2, 3)}, lambda X, axes: X.reshape(1, 2, 3, 1),
           {"axes": [0, 3]}),
    Sample("unsqueeze", {"X": rand(2, 3)}, lambda X, axes: X.reshape(2, 3, 1),
           {"axes": [-1]}, name="neg"),
    Sample("expand", {"X": rand(3, 1)}, _expand_ref, {"shape": [2, -1, 4]}),
    Sample("expand", {"X": rand(3, 1)}, _expand_ref, {"shape": [-1, 5]}, name="keep"),
    Sample("expand", {"X": rand(3, 1)}, _expand_ref, {"shape": [3, 2]},
           name="fixed_dims_need_static_batch", symbolic=False),
    Sample("gather", {"X": rand(5, 3), "Index": np.array([0, 3, 3, -1])},
           lambda X, Index: np.take(X, Index, axis=0), name="dup_and_negative"),
    Sample("gather", {"X": rand(2, 4), "Index": np.array([2, 0], np.int32)},
           lambda X, Index, axis: np.take(X, Index, axis=1), {"axis": 1}, name="axis1_int32"),
    Sample("gather_grad", {"X": rand(2, 4), "Index": np.array([1, 1, 3]),
                           "OutGrad": rand(2, 3, seed=1)}, _gather_grad_ref, {"axis": 1}),
    Sample("gather_grad", {"X": rand(5, 2), "Index": np.array([0, 4, 0, -1]),
                           "OutGrad": rand(4, 2, seed=1)}, _gather_grad_ref,
           name="rows_differ_from_batch", symbolic=False),
    Sample("take_along_axis", {"X": rand(3, 4), "Indices": np.array([[0, 3], [1, 1], [2, 0]])},
           lambda X, Indices, axis: np.take_along_axis(X, Indices, axis), {"axis": 1}),
    Sample("take_along_axis", {"X": rand(3, 4), "Indices": np.array([[2, 0, 1, 1]], np.int32)},
           lambda X, Indices: np.take_along_axis(X, Indices, 0), name="axis0_int32"),
    Sample("take_along_axis_grad",
           {"X": rand(3, 4), "Indices": np.array([[0, 3], [1, 1], [2, 0]]),
            "OutGrad": rand(3, 2, seed=1)}, _take_along_axis_grad_ref, {"axis": 1}),
    Sample("one_hot", {"X": np.array([[0, 2], [3, 1]])}, _one_hot_ref, {"depth": 4}),
    Sample("one_hot", {"X": np.array([1, -1, 5, 0], np.int32)}, _one_hot_ref,
           {"depth": 3, "dtype": "int32"}, name="out_of_range_int32"),
]

INVALID = [
    Invalid("concat", {"X": [spec(-1, 4), spec(-1, 5)]}, name="other_dim",
            expect=["X[1] must have shape [-1, 4]", "got float32[-1, 5]",
                    "concat along axis 0 needs the shape of X[0] float32[-1, 4] except on axis 0"]),
    Invalid("concat", {"X": [spec(2, 4), spec(2, 4, 1)]}, attrs={"axis": 1}, name="rank",
            expect=["X[1] must have shape [2, 4]", "got float32[2, 4, 1]"]),
    Invalid("concat", {"X": [spec(2, 4), spec(2, 4)]}, attrs={"axis": 2}, name="axis",
            expect=["attribute axis=2 is out of range for X[0] float32[2, 4] (valid: -2 to 1)"]),
    Invalid("stack", {"X": [spec(2, 4), spec(2, 5)]}, name="shapes",
            expect=["X[1] must have shape [2, 4]", "got float32[2, 5]"]),
    Invalid("reshape", {"X": spec(4, 6)}, attrs={"shape": [5, 5]}, name="size",
            expect=["cannot reshape X float32[4, 6] to shape [5, 5]: 25 elements, X has 24"]),
    Invalid("reshape", {"X": spec(4, 6)}, attrs={"shape": [-1, 5]}, name="not_divisible",
            expect=["cannot reshape X float32[4, 6] to shape [-1, 5]",
                    "24 elements do not divide into rows of 5"]),
    Invalid("reshape", {"X": spec(-1, 6)}, attrs={"shape": [-1, -1]}, name="two_unknown",
            expect=["cannot reshape X float32[-1, 6] to shape [-1, -1]", "one -1"]),
    Invalid("slice", {"X": spec(4, 3)}, attrs={"axes": [2], "starts": [0], "ends": [1]},
            name="axis", expect=["attribute axes=2 is out of range for X float32[4, 3]"]),
]


# --- lax primitives ---

def _broadcast_in_dim_ref(X, shape, broadcast_dimensions, Like=None, like_axis=0):
    target = [d if d != -1 else X.shape[list(broadcast_dimensions).index(i)]
              if i in broadcast_dimensions else Like.shape[like_axis]
              for i, d in enumerate(shape)]
    placed = [1] * len(target)
    for i, d in enumerate(broadcast_dimensions):
        placed[d] = X.shape[i]
    return np.broadcast_to(X.reshape(placed), target)


def _starts(*values):
    return [np.array(v, np.int32) for v in values]


def _clamped(X, StartIndices, sizes):
    return [min(max(int(s), 0), n - k) for s, n, k in zip(StartIndices, X.shape, sizes)]


def _dynamic_slice_ref(X, StartIndices, sizes):
    starts = _clamped(X, StartIndices, sizes)
    return X[tuple(slice(s, s + k) for s, k in zip(starts, sizes))]


def _dynamic_update_slice_ref(X, Update, StartIndices):
    starts = _clamped(X, StartIndices, Update.shape)
    out = X.copy()
    out[tuple(slice(s, s + k) for s, k in zip(starts, Update.shape))] = Update
    return out


SAMPLES += [
    Sample("broadcast_in_dim", {"X": rand(3, 1)}, _broadcast_in_dim_ref,
           {"shape": [2, 3, 4], "broadcast_dimensions": [1, 2]}, name="expand_fixed_dims",
           symbolic=False),
    Sample("broadcast_in_dim", {"X": rand(3, 1)}, _broadcast_in_dim_ref,
           {"shape": [2, -1, 4], "broadcast_dimensions": [1, 2]}, name="keep_unknown"),
    Sample("broadcast_in_dim", {"X": rand(4, 3)}, _broadcast_in_dim_ref,
           {"shape": [-1, 2, 3], "broadcast_dimensions": [0, 2]}, name="middle"),
    Sample("broadcast_in_dim", {"X": np.array(1.5, np.float32)}, _broadcast_in_dim_ref,
           {"shape": [2, 3], "broadcast_dimensions": []}, name="scalar"),
    Sample("broadcast_in_dim", {"X": np.arange(3, dtype=np.int32)}, _broadcast_in_dim_ref,
           {"shape": [2, 3], "broadcast_dimensions": [1]}, name="int_fixed_dims",
           symbolic=False),
    Sample("broadcast_in_dim", {"X": rand(3), "Like": rand(4, 2, seed=1)},
           _broadcast_in_dim_ref, {"shape": [-1, 3], "broadcast_dimensions": [1]},
           name="size_of_like"),
    Sample("broadcast_in_dim", {"X": np.array(2.5, np.float32), "Like": rand(2, 5, seed=1)},
           _broadcast_in_dim_ref, {"shape": [-1, 1], "broadcast_dimensions": [],
                                   "like_axis": 1}, name="scalar_to_like_axis"),
    Sample("dynamic_slice", {"X": rand(5, 6), "StartIndices": _starts(1, 2)},
           _dynamic_slice_ref, {"sizes": [3, 2]}, symbolic=False),
    Sample("dynamic_slice", {"X": rand(5, 6), "StartIndices": _starts(4, -3)},
           _dynamic_slice_ref, {"sizes": [3, 2]}, name="clamped", symbolic=False),
    Sample("dynamic_slice", {"X": rand(5, 6), "StartIndices": _starts(1, 2)},
           lambda X, StartIndices, sizes: _dynamic_slice_ref(X, StartIndices, [5, 3]),
           {"sizes": [-1, 3]}, name="dim_whole"),
    Sample("dynamic_update_slice", {"X": rand(5, 6), "Update": rand(2, 3, seed=1),
                                    "StartIndices": _starts(1, 2)},
           _dynamic_update_slice_ref, symbolic=False),
    Sample("dynamic_update_slice", {"X": rand(5, 6), "Update": rand(2, 3, seed=1),
                                    "StartIndices": _starts(9, -1)},
           _dynamic_update_slice_ref, name="clamped", symbolic=False),
]
INVALID += [
    Invalid("broadcast_in_dim", {"X": spec(3, 2)}, name="dim_differs",
            attrs={"shape": [3, 4], "broadcast_dimensions": [0, 1]},
            expect=["dim 1 of X float32[3, 2] must be 4", "it becomes dim 1 of the result"]),
    Invalid("dynamic_slice", {"X": spec(5, 6), "StartIndices": [spec(dtype="int32")]},
            name="one_start_missing", attrs={"sizes": [2, 2]},
            expect=["StartIndices must hold 2 int scalars, one per dim of X float32[5, 6]"]),
]


# --- gather_general (as jnp.take and array indexing make it), pad, rev ---

def _take_rows_ref(X, Indices, mode="fill", fill_value=np.nan, **_):
    """Rows Indices[..., 0] of X; out-of-range rows filled (fill) or clipped."""
    rows = Indices[..., 0]
    if mode == "clip":
        return X[np.clip(rows, 0, X.shape[0] - 1)]
    out = np.full(rows.shape + X.shape[1:], fill_value, X.dtype)
    inside = (rows >= 0) & (rows < X.shape[0])
    out[inside] = X[rows[inside]]
    return out


def _take_rows_grad_ref(X, Indices, OutGrad, mode="fill", **_):
    rows = Indices[..., 0]
    if mode == "clip":
        rows = np.clip(rows, 0, X.shape[0] - 1)
    out = np.zeros(X.shape, OutGrad.dtype)
    for index in np.ndindex(*rows.shape):
        if 0 <= rows[index] < X.shape[0]:
            out[rows[index]] += OutGrad[index]
    return out


_TAKE_ROWS = {"offset_dims": [2], "collapsed_slice_dims": [0], "start_index_map": [0],
              "slice_sizes": [1, 4]}
_ROWS = np.array([[[2], [0], [4]], [[1], [7], [2]]], np.int32)   # 7 is out of range


def _pad_ref(X, PaddingValue, padding_config):
    out = X
    for axis in range(X.ndim):
        lo, hi, interior = padding_config[3 * axis:3 * axis + 3]
        n = out.shape[axis]
        shape = list(out.shape)
        shape[axis] = n + max(n - 1, 0) * interior
        spread = np.full(shape, PaddingValue, X.dtype)
        index = [slice(None)] * X.ndim
        index[axis] = slice(None, None, interior + 1)
        spread[tuple(index)] = out
        widths = [(0, 0)] * X.ndim
        widths[axis] = (max(lo, 0), max(hi, 0))
        spread = np.pad(spread, widths, constant_values=PaddingValue)
        index[axis] = slice(max(-lo, 0), spread.shape[axis] - max(-hi, 0))
        out = spread[tuple(index)]
    return out


SAMPLES += [
    Sample("gather_general", {"X": rand(5, 4), "Indices": _ROWS}, _take_rows_ref,
           dict(_TAKE_ROWS, mode="fill"), name="take_rows_fill_nan_no_grad", grad=False,
           symbolic=False),
    Sample("gather_general", {"X": rand(5, 4), "Indices": _ROWS}, _take_rows_ref,
           dict(_TAKE_ROWS, mode="fill", fill_value=-2.0), name="take_rows_fill_value",
           symbolic=False),
    Sample("gather_general", {"X": rand(5, 4), "Indices": _ROWS}, _take_rows_ref,
           dict(_TAKE_ROWS, mode="clip"), name="take_rows_clip", symbolic=False),
    Sample("gather_general", {"X": rand(3, 5), "Indices": np.array([[1], [4]], np.int32)},
           lambda X, Indices, **_: X[:, Indices[:, 0]],
           {"offset_dims": [0], "collapsed_slice_dims": [1], "start_index_map": [1],
            "slice_sizes": [-1, 1], "mode": "clip"}, name="columns_whole_batch_dim"),
    Sample("gather_general_grad", {"X": rand(5, 4), "Indices": _ROWS,
                                   "OutGrad": rand(2, 3, 4, seed=1)}, _take_rows_grad_ref,
           dict(_TAKE_ROWS, mode="fill"), name="take_rows_fill", symbolic=False),
    Sample("pad", {"X": rand(2, 3), "PaddingValue": np.array(0.5, np.float32)}, _pad_ref,
           {"padding_config": [1, 2, 0, 0, 1, 1]}, name="edges_interior", symbolic=False),
    Sample("pad", {"X": rand(3, 4), "PaddingValue": np.array(-1.0, np.float32)}, _pad_ref,
           {"padding_config": [0, 0, 0, -1, 2, 0]}, name="negative_cuts"),
    Sample("rev", {"X": rand(3, 4)}, lambda X, dimensions: np.flip(X, tuple(dimensions)),
           {"dimensions": [1]}),
    Sample("rev", {"X": rand(2, 3, 2)}, lambda X, dimensions: np.flip(X, tuple(dimensions)),
           {"dimensions": [0, -1]}, name="two_dims"),
]
INVALID += [
    Invalid("pad", {"X": spec(2, 3), "PaddingValue": spec()}, name="config_length",
            attrs={"padding_config": [1, 1, 0]},
            expect=["padding_config [1, 1, 0] must hold (low, high, interior >= 0) for each "
                    "dim of X float32[2, 3]"]),
]


def _add_rows_ref(X, Indices, Updates, mode="fill", **_):
    """X with Updates[k] added to row Indices[k, 0] (out-of-range rows dropped or clipped)."""
    out = X.copy()
    for k, row in enumerate(Indices[:, 0]):
        if mode == "clip":
            row = min(max(row, 0), X.shape[0] - 1)
        if 0 <= row < X.shape[0]:
            out[row] += Updates[k]
    return out


_ADD_ROWS = {"update_window_dims": [1], "inserted_window_dims": [0],
             "scatter_dims_to_operand_dims": [0]}
_ROW_IDS = np.array([[1], [3], [1], [9]], np.int32)   # row 1 twice; 9 is out of range

SAMPLES += [
    Sample("scatter_add_general", {"X": rand(5, 3), "Indices": _ROW_IDS,
                                   "Updates": rand(4, 3, seed=1)}, _add_rows_ref,
           dict(_ADD_ROWS, mode="fill"), name="add_rows_drop", symbolic=False),
    Sample("scatter_add_general", {"X": rand(5, 3), "Indices": _ROW_IDS,
                                   "Updates": rand(4, 3, seed=1)}, _add_rows_ref,
           dict(_ADD_ROWS, mode="clip"), name="add_rows_clip", symbolic=False),
]


# --- scatter_general: x.at[rows].set / mul / min / max ---

_COMBINE = {"set": lambda old, new: new, "mul": np.multiply, "min": np.minimum,
            "max": np.maximum}


def _row_of(row, n, mode):
    row = min(max(row, 0), n - 1) if mode == "clip" else row
    return row if 0 <= row < n else None


def _scatter_rows_ref(X, Indices, Updates, computation, mode="fill", **_):
    """X with Updates[k] combined into row Indices[k, 0] (out-of-range rows dropped or
    clipped)."""
    out = X.copy()
    for k, row in enumerate(Indices[:, 0]):
        row = _row_of(row, X.shape[0], mode)
        if row is not None:
            out[row] = _COMBINE[computation](out[row], Updates[k])
    return out


def _winners(X, Indices, Updates, computation, mode="fill"):
    """(x_kept, won): whether each entry of X stays in Out, and whether each entry of
    Updates is the one in Out (inputs without ties; set: the later update wins)."""
    out = _scatter_rows_ref(X, Indices, Updates, computation, mode)
    x_kept = np.ones(X.shape, bool)
    won = np.zeros(Updates.shape, bool)
    for k, row in enumerate(Indices[:, 0]):
        row = _row_of(row, X.shape[0], mode)
        if row is not None:
            x_kept[row] &= out[row] == X[row] if computation != "set" else False
            won[k] = out[row] == Updates[k]
    return x_kept, won


def _scatter_grad_ref(X, Indices, Updates, OutGrad, wrt, computation, mode="fill", **_):
    x_kept, won = _winners(X, Indices, Updates, computation, mode)
    if wrt == "X":
        return np.where(x_kept, OutGrad, 0).astype(X.dtype)
    out = np.zeros(Updates.shape, X.dtype)
    for k, row in enumerate(Indices[:, 0]):
        row = _row_of(row, X.shape[0], mode)
        if row is not None:
            out[k] = np.where(won[k], OutGrad[row], 0)
    return out


def _scatter_jvp_ref(X, Indices, Updates, Tangent, wrt, computation, mode="fill", **_):
    x_kept, won = _winners(X, Indices, Updates, computation, mode)
    if wrt == "X":
        return np.where(x_kept, Tangent, 0).astype(X.dtype)
    out = np.zeros(X.shape, X.dtype)
    for k, row in enumerate(Indices[:, 0]):
        row = _row_of(row, X.shape[0], mode)
        if row is not None:
            out[row] += np.where(won[k], Tangent[k], 0)
    return out


_DISTINCT_ROWS = np.array([[3], [0], [9]], np.int32)   # 9 is out of range
# values without ties: a permutation, so that each max and min has one winner
_X_ROWS = np.random.default_rng(7).permutation(15).reshape(5, 3).astype(np.float32) / 8 - 1
_U_ROWS = np.random.default_rng(8).permutation(12).reshape(4, 3).astype(np.float32) / 6 - 1 \
    + 1 / 48

SAMPLES += [
    Sample("scatter_general", {"X": rand(5, 3), "Indices": _DISTINCT_ROWS,
                               "Updates": rand(3, 3, seed=1)}, _scatter_rows_ref,
           dict(_ADD_ROWS, computation="set", mode="fill", unique_indices=True),
           name="set_rows_drop", symbolic=False),
    Sample("scatter_general", {"X": rand(5, 3), "Indices": _DISTINCT_ROWS,
                               "Updates": rand(3, 3, seed=1)}, _scatter_rows_ref,
           dict(_ADD_ROWS, computation="set", mode="clip"), name="set_rows_clip",
           symbolic=False),
    Sample("scatter_general", {"X": rand(5, 3), "Indices": _ROW_IDS,
                               "Updates": rand(4, 3, seed=1)}, _scatter_rows_ref,
           dict(_ADD_ROWS, computation="mul", mode="fill"), name="mul_rows_twice_x_only",
           grad_slots=("X",), symbolic=False),
    Sample("scatter_general", {"X": rand(5, 3), "Indices": _DISTINCT_ROWS,
                               "Updates": rand(3, 3, seed=1)}, _scatter_rows_ref,
           dict(_ADD_ROWS, computation="mul", mode="fill", unique_indices=True),
           name="mul_rows_unique", symbolic=False),
    Sample("scatter_general", {"X": _X_ROWS, "Indices": _ROW_IDS, "Updates": _U_ROWS},
           _scatter_rows_ref, dict(_ADD_ROWS, computation="max", mode="fill"),
           name="max_rows_twice", symbolic=False),
    Sample("scatter_general", {"X": _X_ROWS, "Indices": _ROW_IDS, "Updates": _U_ROWS},
           _scatter_rows_ref, dict(_ADD_ROWS, computation="min", mode="fill"),
           name="min_rows_twice", symbolic=False),
    Sample("scatter_general", {"X": _X_ROWS, "Indices": _ROW_IDS, "Updates": _U_ROWS},
           _scatter_rows_ref, dict(_ADD_ROWS, computation="min", mode="clip"),
           name="min_rows_clip_jax_nan_grad_at_clipped", grad=False, symbolic=False),
    Sample("scatter_general", {"X": np.arange(15, dtype=np.int32).reshape(5, 3),
                               "Indices": _DISTINCT_ROWS,
                               "Updates": -np.ones((3, 3), np.int32)}, _scatter_rows_ref,
           dict(_ADD_ROWS, computation="set"), name="set_int", symbolic=False),
]
for _computation, _mode in (("set", "clip"), ("max", "fill"), ("min", "fill")):
    _ids = _DISTINCT_ROWS if _computation == "set" else _ROW_IDS
    _updates = _U_ROWS[:len(_ids)]
    for _wrt in ("X", "Updates"):
        _attrs = dict(_ADD_ROWS, computation=_computation, mode=_mode, wrt=_wrt)
        _shape = _X_ROWS.shape if _wrt == "X" else _updates.shape
        SAMPLES += [
            Sample("scatter_general_grad", {"X": _X_ROWS, "Indices": _ids, "Updates": _updates,
                                            "OutGrad": rand(5, 3, seed=3)},
                   _scatter_grad_ref, _attrs, name=f"{_computation}_{_wrt}", symbolic=False),
            Sample("scatter_general_jvp", {"X": _X_ROWS, "Indices": _ids, "Updates": _updates,
                                           "Tangent": rand(*_shape, seed=4)},
                   _scatter_jvp_ref, _attrs, name=f"{_computation}_{_wrt}", symbolic=False),
        ]


# --- tile ---

def _tile_grad_ref(X, OutGrad, reps):
    out = np.zeros(X.shape, OutGrad.dtype)
    for copy in np.ndindex(*reps):
        at = tuple(slice(c * d, (c + 1) * d) for c, d in zip(copy, X.shape))
        out += OutGrad[at]
    return out


SAMPLES += [
    Sample("tile", {"X": rand(3, 4)}, lambda X, reps: np.tile(X, reps), {"reps": [1, 3]},
           name="columns"),
    Sample("tile", {"X": rand(2, 3, 2)}, lambda X, reps: np.tile(X, reps),
           {"reps": [2, 1, 2]}, name="rows_and_depth"),
    Sample("tile", {"X": np.arange(6, dtype=np.int32).reshape(2, 3)},
           lambda X, reps: np.tile(X, reps), {"reps": [2, 2]}, name="int"),
    Sample("tile_grad", {"X": rand(3, 2), "OutGrad": rand(3, 6, seed=1)}, _tile_grad_ref,
           {"reps": [1, 3]}, name="columns"),
    Sample("tile_grad", {"X": rand(2, 3), "OutGrad": rand(4, 6, seed=1)}, _tile_grad_ref,
           {"reps": [2, 2]}, name="both", symbolic=False),
]

INVALID += [
    Invalid("tile", {"X": spec(3, 4)}, attrs={"reps": [2]}, name="reps_per_dim",
            expect=["X must have rank 1 (one dim per entry of reps), got float32[3, 4]"]),
]
