"""Samples of lowering/ops/border_pad.py: the reference maps every output index to the input
index it copies, one dim at a time (PaddlePaddle's pad3d rules), and gathers; the gradient
reference scatters back through the same map."""
import numpy as np

from op_table import Invalid, Sample, rand, spec


def _source(j, n, mode):
    """The index of a dim of size n that output index j (in input coordinates) copies."""
    if mode == "replicate":
        return min(max(j, 0), n - 1)
    if mode == "circular":
        return j % n
    return -j if j < 0 else (2 * (n - 1) - j if j > n - 1 else j)


def _maps(X, paddings, mode):
    return [[_source(j, n, mode) for j in range(-lo, n + hi)]
            for n, lo, hi in zip(X.shape, paddings[::2], paddings[1::2])]


def border_pad_ref(X, paddings, mode="reflect"):
    return X[np.ix_(*_maps(X, paddings, mode))]


def border_pad_grad_ref(X, OutGrad, paddings, mode="reflect"):
    dx = np.zeros(X.shape)
    maps = _maps(X, paddings, mode)
    for out_index in np.ndindex(*OutGrad.shape):
        dx[tuple(m[j] for m, j in zip(maps, out_index))] += OutGrad[out_index]
    return dx.astype(X.dtype)


def _pad(name, x, **attrs):
    """A border_pad sample and a border_pad_grad sample (the gradient checks of the
    latter take OutGrad only: X gives the shape, its gradient is zero)."""
    dy = rand(*border_pad_ref(x, **attrs).shape, dtype=x.dtype, seed=5)
    return [Sample("border_pad", {"X": x}, border_pad_ref, attrs, name=name),
            Sample("border_pad_grad", {"X": x, "OutGrad": dy}, border_pad_grad_ref, attrs,
                   name=name, grad_slots=("OutGrad",))]


SAMPLES = [
    # pad3d's NCHW reflect padding (left 2, right 1, top 0, bottom 2)
    *_pad("reflect_nchw", rand(2, 2, 3, 4), paddings=[0, 0, 0, 0, 0, 2, 2, 1], mode="reflect"),
    *_pad("reflect_to_the_limit", rand(1, 4, 3), paddings=[0, 0, 3, 3, 2, 2], mode="reflect"),
    *_pad("replicate", rand(2, 3, 2), paddings=[0, 0, 2, 1, 3, 0], mode="replicate"),
    # circular padding wider than the dim wraps around more than once
    *_pad("circular_wraps_twice", rand(1, 2, 3), paddings=[0, 0, 1, 0, 4, 5], mode="circular"),
    *_pad("float64", rand(1, 3, 3, dtype="float64"), paddings=[0, 0, 1, 1, 1, 2],
          mode="reflect"),
    Sample("border_pad", {"X": np.arange(12, dtype="int32").reshape(3, 4)}, border_pad_ref,
           {"paddings": [1, 2, 0, 3], "mode": "replicate"}, name="int32"),
]

INVALID = [
    Invalid("border_pad", {"X": spec(2, 3, 4)}, attrs={"paddings": [0, 0, 1, 1]},
            name="paddings_per_dim", expect=("X", "paddings=[0, 0, 1, 1]", "3 dims",
                                             "float32[2, 3, 4]")),
    Invalid("border_pad", {"X": spec(2, 3, 4)}, attrs={"paddings": [0, 0, 0, 3, 0, 0]},
            name="reflect_too_wide", expect=("X", "reflect padding (0, 3) of dim 1",
                                             "float32[2, 3, 4]", "its size - 1")),
]
