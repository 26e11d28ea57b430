"""interpolate: PaddlePaddle's resizing ops of version 2 (linear_interp_v2,
bilinear_interp_v2, trilinear_interp_v2, bicubic_interp_v2, nearest_interp_v2).

X has 1, 2 or 3 spatial dims (W; H, W; D, H, W) after N, C ("NCHW" layout, for any rank)
or before C ("NHWC"). The output size along each is int(in * scale) when `scale` holds
one value per spatial dim, else out_d / out_h / out_w. Along each axis, output index k
reads the input at ratio * k, where the ratio is (in - 1) / (out - 1) with
`align_corners`, else 1 / scale when a scale is given, else in / out. A 1-long output
has ratio 0, but for linear and trilinear without align_corners. The ratio is a float32,
as PaddlePaddle computes it; so are positions and weights, but for linear and bicubic,
which have X's precision. (These details are those of PaddlePaddle 3.3's CPU kernels,
whose outputs this op was compared with: equal to float32 rounding, but for float64
trilinear half-pixel ones, which differ by up to 4e-7 where its kernel rounds
differently.)

- nearest (2 or 3 spatial dims): input index floor(ratio * k), or round-half-up(ratio * k)
  with align_corners.
- linear, bilinear, trilinear (1, 2, 3 spatial dims): with align_mode 0 and not
  align_corners, half-pixel centres: source position max(ratio * (k + 0.5) - 0.5, 0);
  otherwise ratio * k. The low neighbour is that position truncated (at least 0), the
  high one the next index (at most in - 1), weighted by the fraction between them.
- bicubic (2 spatial dims): source position ratio * k with align_corners, else
  ratio * (k + 0.5) - 0.5 (not clamped); the four neighbours floor(position) - 1 ...
  floor(position) + 2, clamped to the input, weighted by Keys' cubic convolution with
  A = -0.75, computed in X's precision.

An output of the input's own size is the input unchanged. The positions are fixed by the
shapes, so the op is, along each axis in turn, a gather (nearest) or a weighted sum of
gathers: linear in X. It differentiates through `interpolate_grad` (`jax.vjp` of the
rule), whose gradient is interpolate again.
"""
import jax.numpy as jnp
import numpy as np

from lowering import checks, sizes
from lowering.constraints import between, one_of, positive
from lowering.errors import ShapeError
from lowering.ops.collective import local_vjp
from lowering.registry import Attr, In, Out, op

_ATTRS = {
    "data_layout": Attr("data_layout", "string", "NCHW",
                        "NCHW: channels before the spatial dims (any rank); NHWC: after",
                        where=one_of("NCHW", "NHWC")),
    "out_d": Attr("out_d", "int", -1, "output depth (3 spatial dims) when `scale` is empty"),
    "out_h": Attr("out_h", "int", -1, "output height (2 or 3 spatial dims) when `scale` is "
                                      "empty"),
    "out_w": Attr("out_w", "int", -1, "output width when `scale` is empty"),
    "scale": Attr("scale", "floats", (), "one per spatial dim: output size int(in * scale) "
                                         "and ratio 1 / scale; empty: the out_ sizes",
                  where=positive),
    "interp_method": Attr("interp_method", "string", "bilinear",
                          "nearest, linear (1 spatial dim), bilinear (2), trilinear (3) or "
                          "bicubic (2)",
                          where=one_of("nearest", "linear", "bilinear", "trilinear", "bicubic")),
    "align_corners": Attr("align_corners", "bool", True,
                          "the corner pixels of input and output coincide"),
    "align_mode": Attr("align_mode", "int", 1, "(tri/bi)linear without align_corners: 0 "
                                               "half-pixel centres, 1 asymmetric (k * ratio)",
                       where=between(0, 1)),
}
# interp_method -> the numbers of spatial dims it resizes
_SPATIAL = {"nearest": (2, 3), "linear": (1,), "bilinear": (2,), "trilinear": (3,),
            "bicubic": (2,)}
_KEYS_A = -0.75


def _sizes(X, data_layout, out_d, out_h, out_w, scale, interp_method):
    """(spatial axes, input sizes, output sizes, per-axis scales or Nones), checked."""
    spatial = X.ndim - 2
    if spatial not in _SPATIAL[interp_method]:
        ranks = " or ".join(str(n + 2) for n in _SPATIAL[interp_method])
        raise ShapeError(f"X must have rank {ranks} for interp_method {interp_method!r} "
                         f"(N, C and {' or '.join(map(str, _SPATIAL[interp_method]))} spatial "
                         f"dims), got {checks.typed(X)}", slot="X")
    axes = tuple(range(2, X.ndim)) if data_layout == "NCHW" else tuple(range(1, X.ndim - 1))
    sizes_in = [X.shape[a] for a in axes]
    if any(not isinstance(n, int) for n in sizes_in):
        raise ShapeError(f"the spatial dims of X {checks.typed(X)} ({data_layout}) must be "
                         "known", slot="X")
    if len(scale) not in (0, spatial):
        raise ShapeError(f"attribute scale={list(scale)} must hold one value per spatial dim "
                         f"of X {checks.typed(X)}, or nothing", slot="X")
    if scale:
        sizes_out = [int(np.float32(n) * np.float32(s)) for n, s in zip(sizes_in, scale)]
        why = f"scale={list(scale)}"
    else:
        named = list(zip("dhw", (out_d, out_h, out_w)))[3 - spatial:]
        sizes_out = [v for _, v in named]
        why = ", ".join(f"out_{k}={v}" for k, v in named)
    if min(sizes_out) < 1:
        raise ShapeError(f"the output of X {checks.typed(X)} would be {sizes_out} "
                         f"({data_layout}, {why}); each size must be at least 1", slot="X")
    dims = list(X.shape)
    for axis, n in zip(axes, sizes_out):
        dims[axis] = n
    too_big = sizes.oversized(dims, X.dtype)   # before the index tables are built
    if too_big:
        raise ShapeError(f"the output of X {checks.typed(X)} ({why}) is too large: {too_big}",
                         slot="X")
    return axes, sizes_in, sizes_out, (tuple(scale) or (None,) * spatial)


def _ratio(n_in, n_out, scale, align_corners, single_is_zero):
    """The float32 step in input coordinates per output index."""
    if n_out <= 1 and (align_corners or single_is_zero):
        return np.float32(0)
    if align_corners:
        return np.float32(n_in - 1) / np.float32(n_out - 1)
    if scale is not None:
        return np.float32(1.0 / np.float64(np.float32(scale)))
    return np.float32(n_in) / np.float32(n_out)


def _keys(t, dtype):
    """Keys' cubic convolution weights of the 4 neighbours at fraction t (A = -0.75)."""
    a = dtype.type(_KEYS_A)

    def near(x):     # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):      # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    one = dtype.type(1)
    return [far(t + one), near(t), near(one - t), far(one - t + one)]


def _plan(n_in, n_out, scale, method, align_corners, align_mode, dtype):
    """Per output index along one axis: [(input indices, weights or None), ...], the
    output being the sum over the list of the weighted gathers."""
    # As PaddlePaddle 3.3's CPU kernels: nearest, bilinear and bicubic zero the ratio of
    # a 1-long output, linear and trilinear do not; linear and bicubic positions have
    # X's precision, the others are float32.
    ratio = _ratio(n_in, n_out, scale, align_corners,
                   single_is_zero=method not in ("linear", "trilinear"))
    wide = method in ("linear", "bicubic") and dtype == np.float64
    precision = np.dtype(np.float64 if wide else np.float32)
    k = np.arange(n_out)
    scaled = (ratio * k.astype(np.float32)).astype(precision)  # float32 products
    centred = np.float64(ratio) * (k + 0.5) - 0.5               # double, as in C
    if method == "nearest":
        picked = (scaled.astype(np.float64) + 0.5) if align_corners else scaled
        return [(np.minimum(picked.astype(np.int64), n_in - 1), None)]
    if method == "bicubic":
        pos = (scaled if align_corners else centred).astype(precision)
        base = np.floor(pos.astype(np.float32)).astype(np.int64)
        weights = _keys(pos - base.astype(precision), precision)
        return [(np.clip(base + i - 1, 0, n_in - 1), w) for i, w in enumerate(weights)]
    if align_mode == 0 and not align_corners:
        low = np.maximum(centred.astype(np.int64), 0)           # truncation toward 0
        frac = np.maximum(centred.astype(precision), precision.type(0)) - low.astype(precision)
    else:
        low = np.maximum(scaled.astype(np.int64), 0)
        frac = scaled - low.astype(precision)
    frac = frac.astype(precision)
    return [(low, precision.type(1) - frac), (np.minimum(low + 1, n_in - 1), frac)]


def _along(x, axis, plan):
    """Resize `x` along `axis` by the plan of one axis."""
    shape = [1] * x.ndim
    shape[axis] = -1
    out = None
    for index, weight in plan:
        term = jnp.take(x, index, axis=axis)
        if weight is not None:
            term = term * weight.reshape(shape).astype(x.dtype)
        out = term if out is None else out + term
    return out


@op("interpolate", inputs=[In("X", "float", doc="[N, C, (D,) (H,) W] (NCHW) or "
                                                "[N, (D,) (H,) W, C] (NHWC)")],
    outputs=[Out("Out")], attrs=_ATTRS)
def interpolate(X, *, data_layout, out_d, out_h, out_w, scale, interp_method, align_corners,
                align_mode):
    """Resize the spatial dims of `X` as PaddlePaddle's *_interp_v2 ops do: nearest,
    linear, bilinear, trilinear or bicubic interpolation."""
    axes, sizes_in, sizes_out, scales = _sizes(X, data_layout, out_d, out_h, out_w, scale,
                                               interp_method)
    if sizes_in == sizes_out:
        return X
    out = X
    for axis, n_in, n_out, s in zip(axes, sizes_in, sizes_out, scales):
        out = _along(out, axis, _plan(n_in, n_out, s, interp_method, align_corners,
                                      align_mode, np.dtype(X.dtype)))
    return out


@interpolate.gradient
def _(g):
    g.call("interpolate_grad", g.input("X"), g.out_grad("Out"), out=g.in_grad("X"), **g.attrs)


@op("interpolate_grad", inputs=[In("X", "float"), In("OutGrad", "float")], outputs=[Out("Out")],
    attrs=_ATTRS, same_dtype=("X", "OutGrad"))
def interpolate_grad(X, OutGrad, **attrs):
    """Gradient of interpolate's X from that of its Out (the transposed resize; X gives
    only the shape)."""
    return local_vjp(lambda x: interpolate.lower(x, **attrs), (X,), OutGrad)[0]


@interpolate_grad.gradient
def _(g):
    x = g.input("X")
    if g.wants("OutGrad"):
        g.call("interpolate", g.out_grad("Out"), out=g.in_grad("OutGrad"), **g.attrs)
    if g.wants("X"):
        g.call("fill_zeros_like", x, out=g.in_grad("X"))
