"""grid_sample: PaddlePaddle's grid_sampler on 4-D inputs (spatial transformers, optical
flow warping): Out[n, c, i, j] samples X[n, c] at the point Grid[n, i, j] = (x, y), given
in [-1, 1] over the width and height of X.

A point is unnormalized to pixel coordinates: (g + 1) / 2 * (size - 1) with
`align_corners`, else (g + 1) / 2 * size - 0.5. `padding_mode` then maps it: zeros
leaves it (pixels outside X read 0), border clips it into [0, size - 1], reflection
mirrors it at the border (at the pixel centres with align_corners, else at the pixel
edges) and clips. bilinear mode weights the 4 pixels around the point by their
distances, a pixel outside X counting 0; nearest mode reads the pixel at the rounded
point (halves to even), 0 outside X. (Compared with PaddlePaddle 3.3's CPU kernel,
gradients included: its derivative of a clip is 1 on the bound itself.)

It differentiates once, through `grid_sample_grad` (`jax.vjp` of the same rule): the
gradient of X scatters Out's gradient with the sampling weights, that of Grid is the
weights' slopes (0 where padding clipped the point, and for nearest).
"""
import jax.numpy as jnp

from lowering import checks
from lowering.constraints import one_of
from lowering.errors import ShapeError
from lowering.ops.collective import local_vjp
from lowering.registry import Attr, In, Out, op

_ATTRS = {
    "mode": Attr("mode", "string", "bilinear", where=one_of("bilinear", "nearest")),
    "padding_mode": Attr("padding_mode", "string", "zeros", "how points outside X are read",
                         where=one_of("zeros", "border", "reflection")),
    "align_corners": Attr("align_corners", "bool", True,
                          "-1 and 1 are the centres of the corner pixels (else their edges)"),
}
_INPUTS = [In("X", "float", doc="[N, C, H, W]"),
           In("Grid", "float", doc="[N, H', W', 2]: (x, y) points in [-1, 1]")]


def _check(X, Grid):
    checks.rank("X", X, 4, "N, C, H, W")
    checks.rank("Grid", Grid, 4, "N, H', W', 2")
    checks.dim("Grid", Grid, 0, X.shape[0], "the batch of X")
    checks.dim("Grid", Grid, 3, 2, "an (x, y) point")
    if not all(isinstance(n, int) for n in X.shape[2:]):
        raise ShapeError(f"the H and W of X {checks.typed(X)} must be known", slot="X")


def _clip(x, top):
    """x limited to [0, top], its derivative 1 on the bounds themselves (as PaddlePaddle's)."""
    return jnp.where(x < 0, 0, jnp.where(x > top, top, x)).astype(x.dtype)


def _pixels(g, size, align_corners, padding_mode):
    """Grid coordinates along one axis -> pixel coordinates, mapped by the padding mode."""
    top = size - 1
    if align_corners:
        x = (g + 1) * (top * 0.5)
    else:
        x = (g + 1) * (size * 0.5) - 0.5
    if padding_mode == "border":
        return _clip(x, top)
    if padding_mode == "reflection":
        if align_corners:
            if top == 0:
                return jnp.zeros_like(x)
            span, shifted = 2 * top, jnp.abs(x)
        else:
            span, shifted = 2 * size, jnp.abs(x + 0.5)
        extra = shifted - jnp.floor(shifted / span) * span
        x = jnp.where(extra <= span - extra, extra, span - extra)
        return x if align_corners else _clip(x - 0.5, top)
    return x


def _read(flat, xi, yi, height, width):
    """flat [N, C, H * W] at integer-valued pixel coordinates [N, H', W'] (0 outside)."""
    inside = (xi >= 0) & (xi <= width - 1) & (yi >= 0) & (yi <= height - 1)
    index = (jnp.clip(yi, 0, height - 1) * width + jnp.clip(xi, 0, width - 1)).astype(jnp.int32)
    n, c = flat.shape[:2]
    picked = jnp.take_along_axis(flat, index.reshape(n, 1, -1), axis=2)
    return jnp.where(inside.reshape(n, 1, -1), picked, 0).reshape((n, c) + xi.shape[1:])


@op("grid_sample", inputs=_INPUTS, outputs=[Out("Out", doc="[N, C, H', W']")], attrs=_ATTRS,
    same_dtype=("X", "Grid"))
def grid_sample(X, Grid, *, mode, padding_mode, align_corners):
    """X sampled at the points of Grid, as PaddlePaddle's grid_sampler does (4-D X)."""
    _check(X, Grid)
    height, width = X.shape[2:]
    x = _pixels(Grid[..., 0], width, align_corners, padding_mode)
    y = _pixels(Grid[..., 1], height, align_corners, padding_mode)
    flat = X.reshape(X.shape[:2] + (-1,))
    if mode == "nearest":
        return _read(flat, jnp.round(x), jnp.round(y), height, width)
    west, north = jnp.floor(x), jnp.floor(y)
    dw, dn = (x - west)[:, None], (y - north)[:, None]
    de, ds = (west + 1 - x)[:, None], (north + 1 - y)[:, None]
    return (_read(flat, west, north, height, width) * de * ds
            + _read(flat, west + 1, north, height, width) * dw * ds
            + _read(flat, west, north + 1, height, width) * de * dn
            + _read(flat, west + 1, north + 1, height, width) * dw * dn)


@grid_sample.gradient
def _(g):
    g.op("grid_sample_grad", {"X": g.input("X"), "Grid": g.input("Grid"),
                              "OutGrad": g.out_grad("Out")},
         {"XGrad": g.in_grad("X"), "GridGrad": g.in_grad("Grid")}, **g.attrs)


@op("grid_sample_grad", inputs=_INPUTS + [In("OutGrad", "float", doc="[N, C, H', W']")],
    outputs=[Out("XGrad", optional=True), Out("GridGrad", optional=True)], attrs=_ATTRS,
    same_dtype=("X", "Grid", "OutGrad"))
def grid_sample_grad(X, Grid, OutGrad, **attrs):
    """Gradients of grid_sample's X and Grid from that of its Out.

    No gradient maker: grid_sample differentiates once (append_backward names this op
    when asked for a second order)."""
    return local_vjp(lambda x, grid: grid_sample.lower(x, grid, **attrs), (X, Grid), OutGrad)
