"""Samples of lowering/ops/grid_sample.py. The reference samples point by point from
PaddlePaddle's formulas; the gradient op's reference scatters Out's gradient with the same
weights (X) and takes central differences of the forward reference (Grid)."""
import math

import numpy as np

from op_table import Invalid, Sample, rand, spec


def _pixel(g, size, align_corners, padding_mode):
    top = size - 1
    x = (g + 1) / 2 * top if align_corners else (g + 1) / 2 * size - 0.5
    if padding_mode == "border":
        return min(max(x, 0.0), top)
    if padding_mode == "reflection":
        low, high = (0.0, float(top)) if align_corners else (-0.5, size - 0.5)
        if high == low:
            return 0.0
        span = high - low
        t = abs(x - low) % (2 * span)           # position in one back-and-forth period
        x = low + (t if t <= span else 2 * span - t)
        return x if align_corners else min(max(x, 0.0), top)
    return x


def _taps(H, W, gx, gy, mode="bilinear", padding_mode="zeros", align_corners=True):
    """[((row, col), weight)] of the pixels inside X that the point reads."""
    x = _pixel(gx, W, align_corners, padding_mode)
    y = _pixel(gy, H, align_corners, padding_mode)
    if mode == "nearest":
        corners = [((round(y), round(x)), 1.0)]          # Python rounds halves to even
    else:
        x0, y0 = math.floor(x), math.floor(y)
        corners = [((y0 + a, x0 + b), (1 - abs(y - y0 - a)) * (1 - abs(x - x0 - b)))
                   for a in (0, 1) for b in (0, 1)]
    return [(p, w) for p, w in corners if 0 <= p[0] < H and 0 <= p[1] < W]


def grid_sample_ref(X, Grid, mode="bilinear", padding_mode="zeros", align_corners=True):
    x, grid = X.astype(np.float64), Grid.astype(np.float64)
    N, C, H, W = x.shape
    out = np.zeros((N, C) + grid.shape[1:3])
    for n, i, j in np.ndindex(N, *grid.shape[1:3]):
        for (r, c), w in _taps(H, W, *grid[n, i, j], mode, padding_mode, align_corners):
            out[n, :, i, j] += w * x[n, :, r, c]
    return out.astype(X.dtype)


def grid_sample_grad_ref(X, Grid, OutGrad, **attrs):
    N, C, H, W = X.shape
    dy = OutGrad.astype(np.float64)
    dx = np.zeros(X.shape)
    for n, i, j in np.ndindex(N, *Grid.shape[1:3]):
        for (r, c), w in _taps(H, W, *Grid[n, i, j].astype(np.float64), **attrs):
            dx[n, :, r, c] += w * dy[n, :, i, j]
    dgrid, eps = np.zeros(Grid.shape), 1e-6
    for index in np.ndindex(*Grid.shape):
        moved = [Grid.astype(np.float64) for _ in range(2)]
        moved[0][index] += eps
        moved[1][index] -= eps
        plus, minus = (grid_sample_ref(X.astype(np.float64), m, **attrs) for m in moved)
        dgrid[index] = np.sum((plus - minus) * dy) / (2 * eps)
    return dx.astype(X.dtype), dgrid.astype(Grid.dtype)


def _grid(n, h, w, seed, spread=1.5):
    """Random points in [-spread, spread] (inside and outside X); none lies within a
    finite-difference step of a corner of the piecewise-linear sampling."""
    return rand(n, h, w, 2, low=-spread, high=spread, seed=seed)


def _gs(name, x, grid, **attrs):
    """A grid_sample sample and a grid_sample_grad sample, same geometry."""
    dy = rand(*grid_sample_ref(x, grid, **attrs).shape, dtype=x.dtype, seed=5)
    return [Sample("grid_sample", {"X": x, "Grid": grid}, grid_sample_ref, attrs, name=name,
                   atol=1e-5),
            # no gradient maker: grid_sample differentiates once
            Sample("grid_sample_grad", {"X": x, "Grid": grid, "OutGrad": dy},
                   grid_sample_grad_ref, attrs, name=f"{name}_differentiates_once",
                   atol=1e-5, rtol=1e-4, grad=False)]


SAMPLES = [
    *_gs("bilinear_zeros", rand(2, 2, 3, 4), _grid(2, 2, 3, 1)),
    *_gs("bilinear_zeros_edges", rand(1, 2, 4, 3), _grid(1, 3, 2, 2), align_corners=False),
    *_gs("bilinear_border", rand(1, 1, 3, 5), _grid(1, 3, 3, 3), padding_mode="border"),
    *_gs("bilinear_reflection", rand(1, 2, 4, 4), _grid(1, 2, 3, 4, spread=3.0),
         padding_mode="reflection"),
    *_gs("bilinear_reflection_edges", rand(1, 1, 3, 4), _grid(1, 3, 2, 5, spread=3.0),
         padding_mode="reflection", align_corners=False),
    *_gs("nearest_zeros", rand(2, 2, 4, 5), _grid(2, 3, 2, 6), mode="nearest",
         align_corners=False),
    *_gs("nearest_border", rand(1, 3, 3, 3), _grid(1, 2, 2, 7), mode="nearest",
         padding_mode="border"),
    *_gs("float64", rand(1, 2, 3, 3, dtype="float64"),
         rand(1, 2, 2, 2, dtype="float64", low=-1.2, high=1.2, seed=8)),
]

INVALID = [
    Invalid("grid_sample", {"X": spec(2, 3, 8, 8), "Grid": spec(2, 4, 4, 3)},
            name="point_size", expect=("Grid", "must be 2", "got 3", "float32[2, 4, 4, 3]")),
    Invalid("grid_sample", {"X": spec(2, 3, 8, 8), "Grid": spec(3, 4, 4, 2)},
            name="batch", expect=("Grid", "must be 2", "the batch of X")),
    Invalid("grid_sample", {"X": spec(3, 8, 8), "Grid": spec(3, 4, 4, 2)},
            name="rank", expect=("X", "rank 4", "float32[3, 8, 8]")),
]
