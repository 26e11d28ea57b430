"""interpolate: PaddlePaddle's 2-D resizing (nearest_interp_v2, bilinear_interp_v2).

The output size is (int(H * scale_h), int(W * scale_w)) when `scale` holds two values,
else (out_h, out_w). Per spatial axis, output index k reads the input at
ratio * k, where the ratio is (in - 1) / (out - 1) with `align_corners`, else 1 / scale
when a scale is given, else in / out (0 when out is 1); it is a float32, as PaddlePaddle
computes it, and so are the positions and weights below.

- nearest: input index floor(ratio * k), or round-half-up(ratio * k) with align_corners.
- bilinear: with align_mode 0 and not align_corners, half-pixel centres: source
  position max(ratio * (k + 0.5) - 0.5, 0); otherwise ratio * k. The low neighbour
  is that position truncated (at least 0), the high one the next index (at most in - 1),
  weighted by the fraction between them.

An output of the input's own size is the input unchanged. The positions are fixed by the
shapes, so the op is a gather (nearest) or a weighted sum of two gathers per axis
(bilinear): linear in X. It differentiates through `interpolate_grad` (`jax.vjp` of
the rule), whose gradient is interpolate again.
"""
import jax.numpy as jnp
import numpy as np

from lowering import checks
from lowering.constraints import between, one_of, positive
from lowering.errors import ShapeError
from lowering.ops.collective import local_vjp
from lowering.registry import Attr, In, Out, op

_ATTRS = {
    "data_layout": Attr("data_layout", "string", "NCHW", "layout of X and Out",
                        where=one_of("NCHW", "NHWC")),
    "out_h": Attr("out_h", "int", -1, "output height when `scale` is empty"),
    "out_w": Attr("out_w", "int", -1, "output width when `scale` is empty"),
    "scale": Attr("scale", "floats", (), "(scale_h, scale_w): output size int(in * scale) "
                                         "and ratio 1 / scale; empty: out_h, out_w",
                  where=positive),
    "interp_method": Attr("interp_method", "string", "bilinear",
                          where=one_of("nearest", "bilinear")),
    "align_corners": Attr("align_corners", "bool", True,
                          "the corner pixels of input and output coincide"),
    "align_mode": Attr("align_mode", "int", 1, "bilinear without align_corners: 0 half-pixel "
                                               "centres, 1 asymmetric (k * ratio)",
                       where=between(0, 1)),
}


def _sizes(X, data_layout, out_h, out_w, scale):
    """(spatial axes, input sizes, output sizes, per-axis scales or None), checked."""
    checks.rank("X", X, 4, "N, C, H, W" if data_layout == "NCHW" else "N, H, W, C")
    axes = (2, 3) if data_layout == "NCHW" else (1, 2)
    sizes_in = [X.shape[a] for a in axes]
    if any(not isinstance(n, int) for n in sizes_in):
        raise ShapeError(f"the spatial dims of X {checks.typed(X)} ({data_layout}) must be "
                         "known", slot="X")
    if len(scale) not in (0, 2):
        raise ShapeError(f"attribute scale={list(scale)} must hold (scale_h, scale_w) or "
                         "nothing", slot="X")
    if scale:
        sizes_out = [int(np.float32(n) * np.float32(s)) for n, s in zip(sizes_in, scale)]
        why = f"scale={list(scale)}"
    else:
        sizes_out, why = [out_h, out_w], f"out_h={out_h}, out_w={out_w}"
    if min(sizes_out) < 1:
        raise ShapeError(f"the output of X {checks.typed(X)} would be {sizes_out} "
                         f"({data_layout}, {why}); each size must be at least 1", slot="X")
    return axes, sizes_in, sizes_out, (tuple(scale) or (None, None))


def _ratio(n_in, n_out, scale, align_corners):
    """The float32 step in input coordinates per output index."""
    if n_out <= 1:
        return np.float32(0)
    if align_corners:
        return np.float32(n_in - 1) / np.float32(n_out - 1)
    if scale is not None:
        return np.float32(1.0 / np.float64(np.float32(scale)))
    return np.float32(n_in) / np.float32(n_out)


def _plan(n_in, n_out, scale, method, align_corners, align_mode):
    """Per output index along one axis: (low index, high index, weight of high), or
    (index, None, None) for nearest."""
    ratio = _ratio(n_in, n_out, scale, align_corners)
    k = np.arange(n_out)
    scaled = ratio * k.astype(np.float32)                      # float32 products
    if method == "nearest":
        picked = (scaled.astype(np.float64) + 0.5) if align_corners else scaled
        return np.minimum(picked.astype(np.int64), n_in - 1), None, None
    centred = np.float64(ratio) * (k + 0.5) - 0.5               # double, as in C
    if align_mode == 0 and not align_corners:
        low = np.maximum(centred.astype(np.int64), 0)           # truncation toward 0
        frac = np.maximum(centred.astype(np.float32), np.float32(0)) - low.astype(np.float32)
    else:
        low = np.maximum(scaled.astype(np.int64), 0)
        frac = scaled - low.astype(np.float32)
    return low, np.minimum(low + 1, n_in - 1), frac.astype(np.float32)


def _along(x, axis, low, high, frac):
    """Resize `x` along `axis` by the plan of one axis."""
    if high is None:
        return jnp.take(x, low, axis=axis)
    shape = [1] * x.ndim
    shape[axis] = -1
    w_high = frac.reshape(shape)
    w_low = (np.float32(1) - frac).reshape(shape)
    return (jnp.take(x, low, axis=axis) * w_low.astype(x.dtype)
            + jnp.take(x, high, axis=axis) * w_high.astype(x.dtype))


@op("interpolate", inputs=[In("X", "float", doc="[N, C, H, W] (NCHW) or [N, H, W, C]")],
    outputs=[Out("Out")], attrs=_ATTRS)
def interpolate(X, *, data_layout, out_h, out_w, scale, interp_method, align_corners,
                align_mode):
    """Resize the H and W dims of `X` by nearest or bilinear interpolation, as
    PaddlePaddle's nearest_interp_v2 / bilinear_interp_v2 do."""
    axes, sizes_in, sizes_out, scales = _sizes(X, data_layout, out_h, out_w, scale)
    if sizes_in == sizes_out:
        return X
    out = X
    for axis, n_in, n_out, s in zip(axes, sizes_in, sizes_out, scales):
        out = _along(out, axis, *_plan(n_in, n_out, s, interp_method, align_corners,
                                       align_mode))
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
