"""Reductions: mean, reduce_sum / mean / max / min / prod / all / any, argmax, argmin, top_k,
sort, cumsum / cumprod / cummax / cummin, and reduce_window (sum, max or min over sliding windows).

`axis` lists the reduced axes (negative counts from the end; empty means all; a lone int is
one axis). `mean` is reduce_mean under the name Paddle programs use, with the same
attributes, rule and gradient, so that `ops.mean(x)` keeps meaning the mean of everything.
Gradients re-insert the reduced axes as size-1 dims (`unsqueeze`, unless
`keep_dim`) and broadcast back against the input. reduce_window differentiates through
`reduce_window_grad` and `reduce_window_jvp`, lowered with `jax.vjp` / `jax.jvp`
of its rule (as pool2d does), whose gradients close the loop; cummax and cummin the same
way (`cum_extreme_grad`, `cum_extreme_jvp`), so that ties share the gradient as in JAX.
"""
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from lowering import checks, dtypes
from lowering.constraints import one_of, positive
from lowering.errors import ShapeError
from lowering.ops.collective import local_vjp
from lowering.registry import REQUIRED, Attr, In, Out, op

_REDUCE_ATTRS = {"axis": Attr("axis", "ints", (), lone_int=True), "keep_dim": False}


def _axes(axis):
    return tuple(axis) or None


def _reduced_axes(g):
    """The reduced axes of the forward op, non-negative and sorted."""
    rank = len(g.var(g.input("X"))[0])
    return tuple(sorted({a % rank for a in g.attr("axis")})) or tuple(range(rank))


def _keep_dim(g, name):
    """`name` (shaped like the reduced output) with the reduced axes put back as size 1."""
    if g.attr("keep_dim") or not _reduced_axes(g):
        return name
    return g.call("unsqueeze", name, axes=list(_reduced_axes(g)))


def _count(g, axes):
    """Number of reduced elements: a float when the dims are known, else a variable."""
    x = g.input("X")
    dims = [g.var(x)[0][a] for a in axes]
    if -1 not in dims:
        return float(np.prod(dims))
    ones = g.call("scale", g.call("fill_zeros_like", x), bias=1.0)
    return g.call("reduce_sum", ones, axis=list(axes), keep_dim=True)


def _divide(g, name, count, out):
    if isinstance(count, float):
        return g.call("scale", name, scale=1.0 / count, out=out)
    return g.call("div", name, count, out=out)


@op("reduce_sum", inputs=[In("X", "number")], outputs=[Out("Out")], attrs=_REDUCE_ATTRS)
def reduce_sum(X, *, axis, keep_dim):
    """Sum of `X` over `axis`, in the dtype of `X`."""
    return jnp.sum(X, axis=_axes(axis), keepdims=keep_dim, dtype=X.dtype)


@reduce_sum.gradient
def _(g):
    g.call("expand_as", _keep_dim(g, g.out_grad("Out")), g.input("X"), out=g.in_grad("X"))


@op("reduce_mean", inputs=[In("X", "float")], outputs=[Out("Out")], attrs=_REDUCE_ATTRS)
def reduce_mean(X, *, axis, keep_dim):
    """Mean of `X` over `axis`."""
    return jnp.mean(X, axis=_axes(axis), keepdims=keep_dim)


@op("mean", inputs=[In("X", "float")], outputs=[Out("Out")], attrs=_REDUCE_ATTRS)
def mean(X, *, axis, keep_dim):
    """Mean of `X` over `axis`, by default of all its elements (shape ()): reduce_mean under
    the name Paddle programs and most scripts use."""
    return jnp.mean(X, axis=_axes(axis), keepdims=keep_dim)


@reduce_mean.gradient
@mean.gradient
def _(g):
    spread = g.call("expand_as", _keep_dim(g, g.out_grad("Out")), g.input("X"))
    _divide(g, spread, _count(g, _reduced_axes(g)), g.in_grad("X"))


@op("reduce_max", inputs=[In("X", "number")], outputs=[Out("Out")], attrs=_REDUCE_ATTRS)
def reduce_max(X, *, axis, keep_dim):
    """Maximum of `X` over `axis` (ties share the gradient equally)."""
    return jnp.max(X, axis=_axes(axis), keepdims=keep_dim)


@op("reduce_min", inputs=[In("X", "number")], outputs=[Out("Out")], attrs=_REDUCE_ATTRS)
def reduce_min(X, *, axis, keep_dim):
    """Minimum of `X` over `axis` (ties share the gradient equally)."""
    return jnp.min(X, axis=_axes(axis), keepdims=keep_dim)


@reduce_max.gradient
@reduce_min.gradient
def _(g):
    x = g.input("X")
    hit = g.call("cast", g.call("equal", x, _keep_dim(g, g.output("Out"))),
                 dtype=g.var(x)[1])
    ties = g.call("reduce_sum", hit, axis=list(_reduced_axes(g)), keep_dim=True)
    g.call("div", g.call("mul", hit, _keep_dim(g, g.out_grad("Out"))), ties,
           out=g.in_grad("X"))


@op("reduce_prod", inputs=[In("X", "number")], outputs=[Out("Out")], attrs=_REDUCE_ATTRS)
def reduce_prod(X, *, axis, keep_dim):
    """Product of `X` over `axis`, in the dtype of `X`."""
    return jnp.prod(X, axis=_axes(axis), keepdims=keep_dim, dtype=X.dtype)


@reduce_prod.gradient
def _(g):
    # out / x: exact for nonzero inputs only
    x = g.input("X")
    scaled = g.call("mul", _keep_dim(g, g.out_grad("Out")), _keep_dim(g, g.output("Out")))
    g.call("div", scaled, x, out=g.in_grad("X"))


@op("reduce_all", inputs=[In("X", "bool")], outputs=[Out("Out")], attrs=_REDUCE_ATTRS,
    differentiable=False)
def reduce_all(X, *, axis, keep_dim):
    """Whether every element of bool X over `axis` is true."""
    return jnp.all(X, axis=_axes(axis), keepdims=keep_dim)


@op("reduce_any", inputs=[In("X", "bool")], outputs=[Out("Out")], attrs=_REDUCE_ATTRS,
    differentiable=False)
def reduce_any(X, *, axis, keep_dim):
    """Whether any element of bool X over `axis` is true."""
    return jnp.any(X, axis=_axes(axis), keepdims=keep_dim)


@op("argmax", inputs=[In("X", "any", doc="numbers or bools")], outputs=[Out("Out")],
    attrs={"axis": -1, "keep_dim": False, "dtype": Attr("dtype", "dtype", "int64")},
    differentiable=False)
def argmax(X, *, axis, keep_dim, dtype):
    """Index of the first maximum of `X` along `axis` (of bools: the first true one)."""
    checks.axis("X", X, axis)
    return jnp.argmax(X, axis=axis, keepdims=keep_dim).astype(dtypes.to_numpy(dtype))


@op("argmin", inputs=[In("X", "any", doc="numbers or bools")], outputs=[Out("Out")],
    attrs={"axis": -1, "keep_dim": False, "dtype": Attr("dtype", "dtype", "int64")},
    differentiable=False)
def argmin(X, *, axis, keep_dim, dtype):
    """Index of the first minimum of `X` along `axis` (of bools: the first false one)."""
    checks.axis("X", X, axis)
    return jnp.argmin(X, axis=axis, keepdims=keep_dim).astype(dtypes.to_numpy(dtype))


@op("top_k", inputs=[In("X", "number")], outputs=[Out("Out"), Out("Indices")],
    attrs={"k": Attr("k", "int", REQUIRED, where=positive), "axis": -1, "largest": True})
def top_k(X, *, k, axis, largest):
    """The `k` largest (or smallest) entries of `X` along `axis`, sorted, and their indices
    (ties: lower index first)."""
    x = jnp.moveaxis(X, axis, -1)
    if largest:
        index = lax.top_k(x, k)[1]
    else:
        index = jnp.argsort(x, axis=-1, stable=True)[..., :k]
    index = index.astype(np.int64)
    values = jnp.take_along_axis(x, index, axis=-1)
    return jnp.moveaxis(values, -1, axis), jnp.moveaxis(index, -1, axis)


@top_k.gradient
def _(g):
    g.call("take_along_axis_grad", g.input("X"), g.output("Indices"), g.out_grad("Out"),
           axis=g.attr("axis"), out=g.in_grad("X"))


@op("cumsum", inputs=[In("X", "number")], outputs=[Out("Out")],
    attrs={"axis": Attr("axis", "int", 0), "reverse": False})
def cumsum(X, *, axis, reverse):
    """Running sums of X along `axis` (from the end when `reverse`), in X's dtype."""
    checks.axis("X", X, axis)
    return lax.cumsum(X, axis % X.ndim, reverse=reverse)


@cumsum.gradient
def _(g):
    g.call("cumsum", g.out_grad("Out"), axis=g.attr("axis"), reverse=not g.attr("reverse"),
           out=g.in_grad("X"))


@op("sort", inputs=[In("X", many=True, doc="arrays of one shape, sorted together")],
    outputs=[Out("Out", many=True), Out("Indices", doc="int64: where each entry came from")],
    attrs={"axis": -1,
           "num_keys": Attr("num_keys", "int", 1, "the first num_keys arrays of X are the "
                            "keys, compared in order", where=positive),
           "is_stable": Attr("is_stable", "bool", True, "ties keep their order")})
def sort(X, *, axis, num_keys, is_stable):
    """The arrays of X reordered together along `axis` so that their first `num_keys`
    arrays ascend in lexicographic order, NaNs last (`lax.sort`), and the permutation
    applied (`Indices`: as `argsort` gives it)."""
    if num_keys > len(X):
        raise ShapeError(f"num_keys {num_keys} exceeds the {len(X)} arrays of X", slot="X")
    for i, x in enumerate(X):
        checks.axis("X", x, axis)
        if x.shape != X[0].shape:
            raise ShapeError(f"the arrays of X must have one shape: X[0] {checks.typed(X[0])}, "
                             f"X[{i}] {checks.typed(x)}", slot="X")
    dim = axis % X[0].ndim
    order = lax.broadcasted_iota(np.int64, X[0].shape, dim)
    *out, indices = lax.sort((*X, order), dimension=dim, is_stable=is_stable,
                             num_keys=num_keys)
    return out, indices


@sort.gradient
def _(g):   # each array's gradient goes back to where its entries came from
    indices = g.output("Indices")
    for i, x in enumerate(g.input_list("X")):
        if g.in_grad("X", i):
            g.call("take_along_axis_grad", x, indices, g.out_grad("Out", i),
                   axis=g.attr("axis"), out=g.in_grad("X", i))


_CUMULATIVE_ATTRS = {"axis": Attr("axis", "int", 0), "reverse": False}


@op("cumprod", inputs=[In("X", "number")], outputs=[Out("Out")], attrs=_CUMULATIVE_ATTRS)
def cumprod(X, *, axis, reverse):
    """Running products of X along `axis` (from the end when `reverse`), in X's dtype."""
    checks.axis("X", X, axis)
    return lax.cumprod(X, axis % X.ndim, reverse=reverse)


@cumprod.gradient
def _(g):
    # dx_i = sum_{j >= i} dout_j * out_j / x_i before the first zero of x; at the first zero
    # z, (product before z) * sum_{j >= z} dout_j * (product of x from z + 1 to j); after
    # it, 0. "Before" and "after" run the way the products run.
    if not g.in_grad("X"):
        return
    x, out, dout = g.input("X"), g.output("Out"), g.out_grad("Out")
    axis, reverse = g.attr("axis"), g.attr("reverse")
    zeros, ones = g.call("fill_zeros_like", x), g.call("scale", g.call("fill_zeros_like", x),
                                                        bias=1.0)
    is_zero = g.call("equal", x, zeros)
    seen = g.call("cumsum", g.call("cast", is_zero, dtype="int32"), axis=axis, reverse=reverse)
    seen_zeros = g.call("fill_zeros_like", seen)
    before = g.call("equal", seen, seen_zeros)
    first = g.call("logical_and", is_zero,
                   g.call("equal", seen, g.call("scale", seen_zeros, bias=1.0)))

    def suffix_sum(v):
        return g.call("cumsum", v, axis=axis, reverse=not reverse)

    nonzero = g.call("div", suffix_sum(g.call("mul", dout, out)),
                     g.call("where", before, x, ones))
    after_first = g.call("cumprod", g.call("where", g.call("logical_or", before, first), ones, x),
                         axis=axis, reverse=reverse)
    at_first = g.call("mul", g.call("cumprod", g.call("where", first, ones, x), axis=axis,
                                    reverse=reverse),
                      suffix_sum(g.call("mul", dout, after_first)))
    g.call("where", before, nonzero, g.call("where", first, at_first, zeros),
           out=g.in_grad("X"))


_EXTREMES = {"max": lax.cummax, "min": lax.cummin}


@op("cummax", inputs=[In("X", "number")], outputs=[Out("Out")], attrs=_CUMULATIVE_ATTRS)
def cummax(X, *, axis, reverse):
    """Running maxima of X along `axis` (from the end when `reverse`); ties share the
    gradient as in JAX."""
    checks.axis("X", X, axis)
    return lax.cummax(X, axis % X.ndim, reverse=reverse)


@op("cummin", inputs=[In("X", "number")], outputs=[Out("Out")], attrs=_CUMULATIVE_ATTRS)
def cummin(X, *, axis, reverse):
    """Running minima of X along `axis` (from the end when `reverse`); ties share the
    gradient as in JAX."""
    checks.axis("X", X, axis)
    return lax.cummin(X, axis % X.ndim, reverse=reverse)


@cummax.gradient
@cummin.gradient
def _(g):
    g.call("cum_extreme_grad", g.input("X"), g.out_grad("Out"), out=g.in_grad("X"),
           computation=g.opdef.type[3:], **g.attrs)


_CUM_EXTREME_ATTRS = dict(_CUMULATIVE_ATTRS, computation=Attr(
    "computation", "string", REQUIRED, "max or min", where=one_of("max", "min")))


def _cum_extreme(computation, axis, reverse):
    return lambda x: _EXTREMES[computation](x, axis % x.ndim, reverse=reverse)


@op("cum_extreme_grad", inputs=[In("X", "float"), In("OutGrad", "float")],
    outputs=[Out("Out")], attrs=_CUM_EXTREME_ATTRS, same_dtype=("X", "OutGrad"))
def cum_extreme_grad(X, OutGrad, *, computation, axis, reverse):
    """Gradient of cummax's or cummin's X from the gradient of its Out (linear in OutGrad)."""
    checks.axis("X", X, axis)
    return local_vjp(_cum_extreme(computation, axis, reverse), (X,), OutGrad)[0]


@cum_extreme_grad.gradient
def _(g):
    x = g.input("X")
    if g.wants("OutGrad"):
        g.call("cum_extreme_jvp", x, g.out_grad("Out"), out=g.in_grad("OutGrad"), **g.attrs)
    if g.in_grad("X"):
        g.call("fill_zeros_like", x, out=g.in_grad("X"))


@op("cum_extreme_jvp", inputs=[In("X", "float"), In("Tangent", "float")],
    outputs=[Out("Out")], attrs=_CUM_EXTREME_ATTRS, same_dtype=("X", "Tangent"))
def cum_extreme_jvp(X, Tangent, *, computation, axis, reverse):
    """Derivative of cummax or cummin at X along Tangent: the transpose of cum_extreme_grad."""
    checks.axis("X", X, axis)
    return jax.jvp(_cum_extreme(computation, axis, reverse), (X,), (Tangent,))[1]


@cum_extreme_jvp.gradient
def _(g):
    x = g.input("X")
    if g.wants("Tangent"):
        g.call("cum_extreme_grad", x, g.out_grad("Out"), out=g.in_grad("Tangent"), **g.attrs)
    if g.in_grad("X"):
        g.call("fill_zeros_like", x, out=g.in_grad("X"))


# --- reductions over sliding windows ---

_WINDOW_ATTRS = {
    "computation": Attr("computation", "string", "sum", "sum, max or min",
                        where=one_of("sum", "max", "min")),
    "window_dimensions": Attr("window_dimensions", "ints", REQUIRED, "one size per dim of X",
                              where=positive),
    "window_strides": Attr("window_strides", "ints", (), "one per dim of X; empty: all 1",
                           where=positive),
    "padding": Attr("padding", "ints", (), "(low, high) for each dim of X, flattened; "
                                           "empty: none"),
    "base_dilation": Attr("base_dilation", "ints", (), "one per dim of X; empty: all 1",
                          where=positive),
    "window_dilation": Attr("window_dilation", "ints", (), "one per dim of X; empty: all 1",
                            where=positive),
}
_MONOIDS = {"sum": (lax.add, lambda dt: 0),
            "max": (lax.max, lambda dt: -np.inf if dt.kind == "f" else np.iinfo(dt).min),
            "min": (lax.min, lambda dt: np.inf if dt.kind == "f" else np.iinfo(dt).max)}


def _window_geometry(X, window_dimensions, window_strides, padding, base_dilation,
                     window_dilation):
    """The attributes as `lax.reduce_window` takes them, checked against X's rank."""
    n = X.ndim
    ones = (1,) * n
    geometry = (tuple(window_dimensions), tuple(window_strides) or ones,
                tuple(zip(padding[::2], padding[1::2])) or ((0, 0),) * n,
                tuple(base_dilation) or ones, tuple(window_dilation) or ones)
    if any(len(part) != n for part in geometry):
        raise ShapeError(f"window attributes must hold one entry per dim of X "
                         f"{checks.typed(X)} (padding: two), got {[list(p) for p in geometry]}",
                         slot="X")
    return geometry


@op("reduce_window", inputs=[In("X", "number")], outputs=[Out("Out")], attrs=_WINDOW_ATTRS)
def reduce_window(X, *, computation, **geometry):
    """Sum, max or min of X over sliding windows (`lax.reduce_window`), in X's dtype; a max
    or min ignores padding. Gradients of max and min go to the first extreme of each window."""
    window, strides, pads, base, dilation = _window_geometry(X, **geometry)
    fn, init = _MONOIDS[computation]
    return lax.reduce_window(X, np.array(init(np.dtype(X.dtype)), X.dtype), fn, window, strides,
                             pads, base, dilation)


@reduce_window.gradient
def _(g):
    g.call("reduce_window_grad", g.input("X"), g.out_grad("Out"), out=g.in_grad("X"), **g.attrs)


@op("reduce_window_grad", inputs=[In("X", "float"), In("OutGrad", "float")],
    outputs=[Out("Out")], attrs=_WINDOW_ATTRS, same_dtype=("X", "OutGrad"))
def reduce_window_grad(X, OutGrad, **attrs):
    """Gradient of reduce_window's X from the gradient of its Out (linear in OutGrad)."""
    return local_vjp(lambda x: reduce_window.lower(x, **attrs), (X,), OutGrad)[0]


@reduce_window_grad.gradient
def _(g):
    x = g.input("X")
    if g.wants("OutGrad"):
        g.call("reduce_window_jvp", x, g.out_grad("Out"), out=g.in_grad("OutGrad"), **g.attrs)
    if g.in_grad("X"):
        g.call("fill_zeros_like", x, out=g.in_grad("X"))


@op("reduce_window_jvp", inputs=[In("X", "float"), In("Tangent", "float")],
    outputs=[Out("Out")], attrs=_WINDOW_ATTRS, same_dtype=("X", "Tangent"))
def reduce_window_jvp(X, Tangent, **attrs):
    """Derivative of reduce_window at X along Tangent: the transpose of reduce_window_grad."""
    return jax.jvp(lambda x: reduce_window.lower(x, **attrs), (X,), (Tangent,))[1]


@reduce_window_jvp.gradient
def _(g):
    x = g.input("X")
    if g.wants("Tangent"):
        g.call("reduce_window_grad", x, g.out_grad("Out"), out=g.in_grad("Tangent"), **g.attrs)
    if g.in_grad("X"):
        g.call("fill_zeros_like", x, out=g.in_grad("X"))
