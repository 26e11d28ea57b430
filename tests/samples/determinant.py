"""Samples of lowering/ops/determinant.py (well-conditioned matrices: identity plus noise)."""
import numpy as np

from op_table import Invalid, Sample, rand, spec


def _matrices(*shape, seed=0):
    return (np.eye(shape[-1], dtype=np.float32) * 2 + rand(*shape, seed=seed)).astype(np.float32)


def _det(X):
    return np.linalg.det(X).astype(X.dtype)


def _inv(X):
    return np.linalg.inv(X).astype(X.dtype)


SAMPLES = [   # batched first (an unknown batch dim), then one matrix ('fixed_dims')
    Sample("det", {"X": _matrices(2, 4, 4, seed=1)}, _det, name="batched", rtol=1e-4),
    Sample("det", {"X": _matrices(3, 3)}, _det, name="fixed_dims", rtol=1e-4, symbolic=False),
    Sample("matrix_inverse", {"X": _matrices(2, 3, 3, seed=2)}, _inv, name="batched",
           rtol=1e-4, atol=1e-5),
    Sample("matrix_inverse", {"X": _matrices(3, 3)}, _inv, name="fixed_dims", rtol=1e-4,
           atol=1e-5, symbolic=False),
]

INVALID = [
    Invalid("det", {"X": spec(2, 3)}, ("X", "square", "[2, 3]")),
    Invalid("matrix_inverse", {"X": spec(3)}, ("X", "rank 2")),
]
