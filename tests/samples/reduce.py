"""Samples of lowering/ops/reduce.py."""
import numpy as np

from op_table import Invalid, Sample, positive, rand, spec


def _reduce_ref(fn):
    def ref(X, axis=(), keep_dim=False):
        return np.asarray(fn(X, axis=tuple(axis) or None, keepdims=keep_dim)).astype(X.dtype)
    return ref


def _reductions(op, fn, x):
    ref = _reduce_ref(fn)
    return [
        Sample(op, {"X": x}, ref, name="all"),
        Sample(op, {"X": x}, ref, {"axis": [1]}, name="axis1"),
        Sample(op, {"X": x}, ref, {"axis": [0, -1], "keep_dim": True}, name="neg_axes_keep_dim"),
        Sample(op, {"X": x}, ref, {"keep_dim": True}, name="all_keep_dim"),
    ]


_TIES = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, -5.0, 1.0, -5.0]], np.float32)


def _argmax_ref(X, axis=-1, keep_dim=False, dtype="int64"):
    return np.argmax(X, axis=axis, keepdims=keep_dim).astype(dtype)


def _top_k_ref(X, k, axis=-1, largest=True):
    x = np.moveaxis(X, axis, -1)
    index = np.argsort(-x if largest else x, axis=-1, kind="stable")[..., :k]
    values = np.take_along_axis(x, index, axis=-1)
    return np.moveaxis(values, -1, axis), np.moveaxis(index, -1, axis).astype(np.int64)


# nonzero and not too small: the reduce_prod gradient divides by the input
_NONZERO = positive(2, 3, 4) * np.sign(rand(2, 3, 4, seed=1))

SAMPLES = [
    Sample("mean", {"X": rand(3, 4)}, lambda X: np.mean(X)),
    Sample("mean", {"X": rand(2, 3, 4)}, lambda X: np.mean(X), name="3d"),
    Sample("mean", {"X": rand(2, 3, 4)}, _reduce_ref(np.mean), {"axis": [0, -1], "keep_dim": True},
           name="axes_keep_dim"),
    *_reductions("reduce_sum", np.sum, rand(2, 3, 4)),
    Sample("reduce_sum", {"X": np.arange(12, dtype=np.int32).reshape(3, 4)},
           _reduce_ref(np.sum), {"axis": [0]}, name="int32"),
    *_reductions("reduce_mean", np.mean, rand(2, 3, 4)),
    *_reductions("reduce_max", np.max, rand(2, 3, 4)),
    Sample("reduce_max", {"X": _TIES}, _reduce_ref(np.max), {"axis": [1]}, name="ties"),
    Sample("reduce_max", {"X": np.array([[3, 7], [9, 1]], np.int64)}, _reduce_ref(np.max),
           {"axis": [-1]}, name="int64"),
    *_reductions("reduce_min", np.min, rand(2, 3, 4)),
    Sample("reduce_min", {"X": _TIES}, _reduce_ref(np.min), {"axis": [1]}, name="ties"),
    *_reductions("reduce_prod", np.prod, _NONZERO),
    Sample("reduce_prod", {"X": np.array([[1, 2, 3], [4, 5, 6]], np.int32)},
           _reduce_ref(np.prod), {"axis": [1]}, name="int32"),
    Sample("argmax", {"X": rand(3, 4)}, _argmax_ref),
    Sample("argmax", {"X": _TIES}, _argmax_ref, {"axis": 0, "keep_dim": True, "dtype": "int32"},
           name="ties_axis0_keep_dim_int32"),
    Sample("top_k", {"X": rand(3, 5)}, _top_k_ref, {"k": 2}),
    Sample("top_k", {"X": rand(3, 5)}, _top_k_ref, {"k": 3, "largest": False}, name="smallest"),
    Sample("top_k", {"X": _TIES}, _top_k_ref, {"k": 2}, name="ties_not_differentiable",
           grad=False),
    Sample("top_k", {"X": rand(4, 2, 3)}, _top_k_ref, {"k": 2, "axis": 0},
           name="batch_axis_needs_static_size", symbolic=False),
    Sample("top_k", {"X": rand(2, 4, 3)}, _top_k_ref, {"k": 2, "axis": 1, "largest": False},
           name="middle_axis_smallest"),
    Sample("top_k", {"X": np.array([[3, 1, 3, 2]], np.int32)}, _top_k_ref, {"k": 3},
           name="int32_ties"),
]

INVALID = [
    Invalid("argmax", {"X": spec(4, 3)}, attrs={"axis": 2}, name="axis",
            expect=["attribute axis=2 is out of range for X float32[4, 3] (valid: -2 to 1)"]),
]


# --- cumsum ---

def _cumsum_ref(X, axis=0, reverse=False):
    if reverse:
        return np.flip(np.cumsum(np.flip(X, axis), axis=axis), axis).astype(X.dtype)
    return np.cumsum(X, axis=axis).astype(X.dtype)


# --- reduce_window: explicit loops over output positions and window taps ---

_INIT = {"sum": 0.0, "max": -np.inf, "min": np.inf}


def _windows(X, computation, window_dimensions, window_strides=(), padding=(),
             base_dilation=(), window_dilation=()):
    """(padded and dilated X as float64, [(output index, [padded-X index of each tap])])."""
    n = X.ndim
    strides = window_strides or (1,) * n
    pads = list(zip(padding[::2], padding[1::2])) or [(0, 0)] * n
    base = base_dilation or (1,) * n
    wdil = window_dilation or (1,) * n
    dilated = np.full([(d - 1) * b + 1 for d, b in zip(X.shape, base)], _INIT[computation])
    dilated[tuple(slice(None, None, b) for b in base)] = X
    padded = np.pad(dilated, pads, constant_values=_INIT[computation])
    out_shape = [(p - ((k - 1) * w + 1)) // s + 1
                 for p, k, w, s in zip(padded.shape, window_dimensions, wdil, strides)]
    cells = []
    for o in np.ndindex(*out_shape):
        taps = [tuple(i * s + t * w for i, s, t, w in zip(o, strides, tap, wdil))
                for tap in np.ndindex(*window_dimensions)]
        cells.append((o, taps))
    return padded, out_shape, cells, (pads, base)


def _reduce_window_ref(X, computation, **geometry):
    padded, out_shape, cells, _ = _windows(X, computation, **geometry)
    fn = {"sum": np.sum, "max": np.max, "min": np.min}[computation]
    out = np.zeros(out_shape)
    for o, taps in cells:
        out[o] = fn([padded[t] for t in taps])
    return out.astype(X.dtype)


def _to_input(index, pads, base):
    """The index of X a padded-and-dilated index holds, or None for padding."""
    held = []
    for i, (lo, _), b in zip(index, pads, base):
        if (i - lo) % b or i < lo:
            return None
        held.append((i - lo) // b)
    return tuple(held)


def _selected(padded, computation, taps):
    """The taps a window's gradient goes to: all (sum) or the first extreme (max, min)."""
    if computation == "sum":
        return taps
    values = [padded[t] for t in taps]
    return [taps[int(np.argmax(values) if computation == "max" else np.argmin(values))]]


def _reduce_window_grad_ref(X, OutGrad, computation, **geometry):
    padded, _, cells, (pads, base) = _windows(X, computation, **geometry)
    out = np.zeros(X.shape)
    for o, taps in cells:
        for t in _selected(padded, computation, taps):
            held = _to_input(t, pads, base)
            if held is not None and all(h < d for h, d in zip(held, X.shape)):
                out[held] += OutGrad[o]
    return out.astype(X.dtype)


def _reduce_window_jvp_ref(X, Tangent, computation, **geometry):
    padded, out_shape, cells, (pads, base) = _windows(X, computation, **geometry)
    out = np.zeros(out_shape)
    for o, taps in cells:
        for t in _selected(padded, computation, taps):
            held = _to_input(t, pads, base)
            if held is not None and all(h < d for h, d in zip(held, X.shape)):
                out[o] += Tangent[held]
    return out.astype(X.dtype)


def _window_samples(name, x, symbolic=True, **attrs):
    out = _reduce_window_ref(x, **attrs)
    return [
        Sample("reduce_window", {"X": x}, _reduce_window_ref, attrs, name=name,
               symbolic=symbolic),
        Sample("reduce_window_grad", {"X": x, "OutGrad": rand(*out.shape, seed=3)},
               _reduce_window_grad_ref, attrs, name=name, symbolic=False),
        Sample("reduce_window_jvp", {"X": x, "Tangent": rand(*x.shape, seed=4)},
               _reduce_window_jvp_ref, attrs, name=name, symbolic=symbolic),
    ]


SAMPLES += [
    Sample("cumsum", {"X": rand(3, 4)}, _cumsum_ref, {"axis": 1}, name="axis1"),
    Sample("cumsum", {"X": rand(3, 4)}, _cumsum_ref, {"axis": 0, "reverse": True},
           name="reverse"),
    Sample("cumsum", {"X": np.arange(6, dtype=np.int32).reshape(2, 3)}, _cumsum_ref,
           {"axis": -1}, name="int"),
    # NHWC pooling windows as Flax's max_pool and avg_pool make them
    *_window_samples("max_nhwc", rand(2, 4, 4, 2), computation="max",
                     window_dimensions=[1, 2, 2, 1], window_strides=[1, 2, 2, 1]),
    *_window_samples("sum_nhwc_padded", rand(1, 3, 5, 2), computation="sum",
                     window_dimensions=[1, 2, 3, 1], window_strides=[1, 1, 2, 1],
                     padding=[0, 0, 1, 0, 1, 1, 0, 0]),
    *_window_samples("min_base_dilated", rand(5, 6), computation="min",
                     window_dimensions=[2, 2], window_strides=[1, 2], base_dilation=[2, 1],
                     symbolic=False),
    # (JAX differentiates max and min windows without window dilation only)
    *_window_samples("sum_window_dilated", rand(5, 6), computation="sum",
                     window_dimensions=[2, 2], window_dilation=[1, 2], symbolic=False),
]
INVALID += [
    Invalid("reduce_window", {"X": spec(2, 4, 4)}, name="window_rank",
            attrs={"computation": "max", "window_dimensions": [2, 2]},
            expect=["window attributes must hold one entry per dim of X float32[2, 4, 4]"]),
]

SAMPLES += [
    Sample("argmax", {"X": np.array([[False, True, True], [False, False, False]])},
           _argmax_ref, {"axis": 1, "dtype": "int32"}, name="bool"),
    Sample("argmin", {"X": np.array([[True, False, False], [True, True, True]])},
           lambda X, **attrs: _argmax_ref(~X, **attrs), {"axis": 1}, name="bool"),
    Sample("argmin", {"X": rand(3, 4)}, lambda X, **attrs: _argmax_ref(-X, **attrs)),
    Sample("argmin", {"X": -_TIES}, lambda X, **attrs: _argmax_ref(-X, **attrs),
           {"axis": 0, "keep_dim": True, "dtype": "int32"}, name="ties_first"),
]

_BOOLS = np.array([[True, False, True], [True, True, True]])
SAMPLES += [
    Sample("reduce_all", {"X": _BOOLS}, _reduce_ref(np.all), {"axis": [1]}, name="axis1"),
    Sample("reduce_all", {"X": _BOOLS}, _reduce_ref(np.all), name="all"),
    Sample("reduce_any", {"X": ~_BOOLS}, _reduce_ref(np.any), {"axis": [0], "keep_dim": True},
           name="axis0_keep_dim"),
    Sample("reduce_any", {"X": np.zeros((2, 2), bool)}, _reduce_ref(np.any), name="none"),
]


# --- cumprod, cummax, cummin ---

def _cumulative_ref(ufunc):
    def ref(X, axis=0, reverse=False):
        if reverse:
            return np.flip(ufunc.accumulate(np.flip(X, axis), axis=axis), axis).astype(X.dtype)
        return ufunc.accumulate(X, axis=axis).astype(X.dtype)
    return ref


def _running_extreme_at(X, computation, axis, reverse):
    """For each position j along `axis`, the index i <= j (>= j when reverse) of the
    running extreme (inputs without ties)."""
    x = np.moveaxis(X, axis, -1)
    n = x.shape[-1]
    order = range(n - 1, -1, -1) if reverse else range(n)
    pick = np.argmax if computation == "max" else np.argmin
    at = np.zeros(x.shape, np.int64)
    for j in order:
        span = list(range(j, n)) if reverse else list(range(j + 1))
        at[..., j] = np.asarray(span)[pick(x[..., span], axis=-1)]
    return x, at


def _cum_extreme_grad_ref(X, OutGrad, computation, axis=0, reverse=False):
    x, at = _running_extreme_at(X, computation, axis, reverse)
    dout = np.moveaxis(OutGrad, axis, -1)
    out = np.zeros(x.shape)
    for idx in np.ndindex(x.shape):
        out[idx[:-1] + (at[idx],)] += dout[idx]
    return np.moveaxis(out, -1, axis).astype(X.dtype)


def _cum_extreme_jvp_ref(X, Tangent, computation, axis=0, reverse=False):
    x, at = _running_extreme_at(X, computation, axis, reverse)
    t = np.moveaxis(Tangent, axis, -1)
    out = np.take_along_axis(t, at, axis=-1)
    return np.moveaxis(out, -1, axis).astype(X.dtype)


_NO_TIES = np.random.default_rng(5).permutation(12).reshape(3, 4).astype(np.float32) / 4
_WITH_ZEROS = np.array([[2.0, 0.0, 3.0, 0.0, 0.5], [0.5, 1.5, -2.0, 0.0, 1.2],
                        [0.0, 0.7, 1.1, -0.9, 2.0]], np.float32)

SAMPLES += [
    Sample("cumprod", {"X": rand(3, 4, low=0.5, high=1.5)}, _cumulative_ref(np.multiply),
           {"axis": 1}, name="axis1"),
    Sample("cumprod", {"X": rand(3, 4)}, _cumulative_ref(np.multiply),
           {"axis": 0, "reverse": True}, name="reverse"),
    Sample("cumprod", {"X": _WITH_ZEROS}, _cumulative_ref(np.multiply), {"axis": 1},
           name="zeros"),
    Sample("cumprod", {"X": _WITH_ZEROS}, _cumulative_ref(np.multiply),
           {"axis": -1, "reverse": True}, name="zeros_reverse"),
    Sample("cumprod", {"X": np.array([[2, -1, 3], [0, 4, 5]], np.int32)},
           _cumulative_ref(np.multiply), {"axis": 1}, name="int"),
    Sample("cummax", {"X": _NO_TIES}, _cumulative_ref(np.maximum), {"axis": 1}, name="axis1"),
    Sample("cummax", {"X": _NO_TIES}, _cumulative_ref(np.maximum),
           {"axis": 0, "reverse": True}, name="reverse"),
    Sample("cummax", {"X": np.array([[1, 3, 3, 2], [5, 0, 7, 7]], np.int32)},
           _cumulative_ref(np.maximum), {"axis": -1}, name="int"),
    Sample("cummin", {"X": _NO_TIES}, _cumulative_ref(np.minimum), {"axis": 1}, name="axis1"),
    Sample("cummin", {"X": _NO_TIES}, _cumulative_ref(np.minimum),
           {"axis": -1, "reverse": True}, name="reverse"),
]
# (JAX differentiates them with an associative scan, which needs the axis' size: not over
# an unknown batch dim)
for _computation in ("max", "min"):
    for _attrs in ({"axis": 1}, {"axis": 0, "reverse": True}):
        _name = f"{_computation}_{'reverse_axis0' if _attrs.get('reverse') else 'axis1'}"
        _symbolic = _attrs["axis"] != 0
        SAMPLES += [
            Sample("cum_extreme_grad", {"X": _NO_TIES, "OutGrad": rand(3, 4, seed=3)},
                   _cum_extreme_grad_ref, dict(_attrs, computation=_computation), name=_name,
                   symbolic=_symbolic),
            Sample("cum_extreme_jvp", {"X": _NO_TIES, "Tangent": rand(3, 4, seed=4)},
                   _cum_extreme_jvp_ref, dict(_attrs, computation=_computation), name=_name,
                   symbolic=_symbolic),
        ]

INVALID += [
    Invalid("cumprod", {"X": spec(4, 3)}, attrs={"axis": 2}, name="axis",
            expect=["attribute axis=2 is out of range for X float32[4, 3] (valid: -2 to 1)"]),
]


# --- sort ---

def _sort_ref(X, axis=-1, num_keys=1, is_stable=True):
    moved = [np.moveaxis(x, axis, -1) for x in X]
    order = np.empty(moved[0].shape, np.int64)
    for idx in np.ndindex(moved[0].shape[:-1]):
        keys = [m[idx] for m in moved[:num_keys]]
        order[idx] = np.lexsort(keys[::-1])   # lexsort: the last key is the primary one
    outs = [np.moveaxis(np.take_along_axis(m, order, -1), -1, axis) for m in moved]
    return outs, np.moveaxis(order, -1, axis)


_KEYS = np.array([[3, 1, 2, 1, 0], [2, 2, 2, 1, 1], [0, 4, 4, 3, 3]], np.int32)

SAMPLES += [
    Sample("sort", {"X": [rand(3, 5)]}, _sort_ref, name="one"),
    Sample("sort", {"X": [rand(4, 3)]}, _sort_ref, {"axis": 0}, name="axis0"),
    Sample("sort", {"X": [rand(3, 5), rand(3, 5, seed=1)]}, _sort_ref, {"axis": 1},
           name="values_follow_keys"),
    Sample("sort", {"X": [_KEYS, rand(3, 5, seed=2)]}, _sort_ref, {"num_keys": 2},
           name="two_keys"),
    Sample("sort", {"X": [_KEYS, rand(3, 5, seed=2)]}, _sort_ref, name="int_key_ties_stable"),
    Sample("sort", {"X": [np.array([[1.0, np.nan, -1.0, 0.5]], np.float32)]}, _sort_ref,
           name="nan_last", grad=False),
]

INVALID += [
    Invalid("sort", {"X": [spec(3, 4), spec(3, 4)]}, attrs={"num_keys": 3}, name="num_keys",
            expect=["num_keys 3 exceeds the 2 arrays of X"]),
    Invalid("sort", {"X": [spec(3, 4), spec(4, 3)]}, name="shapes",
            expect=["X[0] float32[3, 4], X[1] float32[4, 3]"]),
]
