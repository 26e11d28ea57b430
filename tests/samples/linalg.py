"""Samples of lowering/ops/linalg.py.

With an unknown batch dim every top-rank input's first dim becomes the same
symbolic dim; 2-D products whose contracted dims are not both first dims
cannot trace that way, so they are `symbolic=False` ('fixed_dims').
"""
import numpy as np

from lowering.errors import ProgramError
from op_table import Invalid, Sample, rand, spec


def _matmul(X, Y, transpose_x=False, transpose_y=False, alpha=1.0):
    if transpose_x and X.ndim >= 2:
        X = np.swapaxes(X, -1, -2)
    if transpose_y and Y.ndim >= 2:
        Y = np.swapaxes(Y, -1, -2)
    return (alpha * np.matmul(X, Y)).astype(X.dtype)


def _mm(x_shape, y_shape, name, symbolic=True, **attrs):
    return Sample("matmul", {"X": rand(*x_shape), "Y": rand(*y_shape, seed=1)}, _matmul,
                  attrs=attrs, name=name, symbolic=symbolic)


SAMPLES = [
    _mm((3, 4), (4, 5), "2d_fixed_dims", symbolic=False),
    _mm((4, 3), (4, 5), "2d_tx", transpose_x=True),
    _mm((3, 4), (5, 4), "2d_ty", transpose_y=True),
    _mm((4, 3), (5, 4), "2d_tx_ty_fixed_dims", symbolic=False, transpose_x=True,
        transpose_y=True),
    _mm((2, 3, 4), (2, 4, 5), "batched"),
    _mm((2, 4, 3), (2, 4, 5), "batched_tx", transpose_x=True),
    _mm((2, 3, 4), (2, 5, 4), "batched_ty", transpose_y=True),
    _mm((2, 4, 3), (2, 5, 4), "batched_tx_ty", transpose_x=True, transpose_y=True),
    _mm((2, 3, 4, 5), (5, 6), "bcast_batch_y_2d"),
    _mm((4, 5), (2, 3, 5, 6), "bcast_batch_x_2d"),
    _mm((2, 1, 3, 4), (3, 4, 2), "bcast_batch_both"),
    _mm((2, 3, 5, 4), (6, 5), "bcast_batch_tx_ty", transpose_x=True, transpose_y=True),
    _mm((3, 4), (4, 5), "alpha_fixed_dims", symbolic=False, alpha=0.5),
    _mm((2, 3, 4), (4, 5), "alpha_bcast", alpha=-2.0),
    _mm((4,), (4, 5), "vec_mat_fixed_dims", symbolic=False),
    _mm((3, 4), (4,), "mat_vec"),
    _mm((4,), (4,), "vec_vec"),
    _mm((4,), (2, 4, 5), "vec_batched"),
    _mm((2, 3, 4), (4,), "batched_vec"),
    _mm((4,), (5, 4), "vec_mat_ty_ignored_on_vec", transpose_x=True, transpose_y=True),
    _mm((2, 4, 3), (4,), "batched_tx_vec_alpha", transpose_x=True, transpose_y=True,
        alpha=3.0),
    Sample("matmul", {"X": np.arange(6, dtype=np.int32).reshape(2, 3),
                      "Y": np.arange(3, dtype=np.int32)}, _matmul, name="int32"),
]

INVALID = [
    Invalid("matmul", {"X": spec(4, 5), "Y": spec(3, 6)}, name="contracted_dims",
            expect=["dim 0 of Y float32[3, 6] must be 5",
                    "matmul contracts it with dim 1 of X float32[4, 5]", "got 3"]),
    Invalid("matmul", {"X": spec(-1, 4, 5), "Y": spec(6, 4)}, attrs={"transpose_y": True},
            name="transposed", expect=["dim 1 of Y float32[6, 4] must be 5", "got 4"]),
    Invalid("matmul", {"X": spec(), "Y": spec(3)}, name="scalar",
            expect=["X must have rank 1 or more, got float32[]"]),
    Invalid("matmul", {"X": spec(4, 5), "Y": spec(5, 6, dtype="float64")}, name="dtypes_differ",
            error=ProgramError, expect=["slot 'X' is float32 but slot 'Y' is float64"]),
]


# --- dot_general ---

def _dot_general_ref(X, Y, lhs_contracting=(), rhs_contracting=(), lhs_batch=(), rhs_batch=()):
    """np.einsum with letters chosen from the dimension numbers."""
    letters = iter("abcdefghijklmnop")
    x_sub, y_sub = [None] * X.ndim, [None] * Y.ndim
    for a, b in zip(lhs_batch, rhs_batch):
        x_sub[a] = y_sub[b] = next(letters)
    for a, b in zip(lhs_contracting, rhs_contracting):
        x_sub[a] = y_sub[b] = next(letters)
    x_free = [i for i in range(X.ndim) if x_sub[i] is None]
    for i in x_free:
        x_sub[i] = next(letters)
    y_free = [i for i in range(Y.ndim) if y_sub[i] is None]
    for i in y_free:
        y_sub[i] = next(letters)
    out = ([x_sub[a] for a in lhs_batch] + [x_sub[i] for i in x_free]
           + [y_sub[i] for i in y_free])
    spec_ = f"{''.join(x_sub)},{''.join(y_sub)}->{''.join(out)}"
    return np.einsum(spec_, X.astype(np.float64), Y.astype(np.float64)).astype(X.dtype)


def _dg(x_shape, y_shape, name, symbolic=True, **attrs):
    return Sample("dot_general", {"X": rand(*x_shape), "Y": rand(*y_shape, seed=1)},
                  _dot_general_ref, attrs=attrs, name=name, symbolic=symbolic, atol=1e-5)


DOT_GENERAL = [
    _dg((3, 4), (4, 5), "matmul_fixed_dims", symbolic=False,
        lhs_contracting=[1], rhs_contracting=[0]),
    _dg((4, 3), (4, 5), "contract_first", lhs_contracting=[0], rhs_contracting=[0]),
    _dg((2, 3, 4), (2, 4, 5), "batched", lhs_contracting=[2], rhs_contracting=[1],
        lhs_batch=[0], rhs_batch=[0]),
    # attention logits: batch and heads pair up, the head size is contracted
    _dg((2, 5, 2, 3), (2, 4, 2, 3), "two_batch_dims", lhs_contracting=[3], rhs_contracting=[3],
        lhs_batch=[0, 2], rhs_batch=[0, 2]),
    _dg((2, 3, 4), (3, 5, 4), "two_contracted_unsorted_fixed_dims", symbolic=False,
        lhs_contracting=[2, 1], rhs_contracting=[2, 0]),
    _dg((3,), (3,), "vectors_inner", lhs_contracting=[0], rhs_contracting=[0]),
    _dg((3, 2), (4,), "outer_fixed_dims", symbolic=False),
]
SAMPLES += DOT_GENERAL
INVALID += [
    Invalid("dot_general", {"X": spec(3, 4), "Y": spec(5, 6)}, name="contracted_dims_differ",
            attrs={"lhs_contracting": [1], "rhs_contracting": [0]},
            expect=["dim 0 of Y float32[5, 6] must be 4",
                    "dot_general pairs it with dim 1 of X float32[3, 4]"]),
    Invalid("dot_general", {"X": spec(3, 4), "Y": spec(4, 6)}, name="unpaired",
            attrs={"lhs_contracting": [1], "rhs_contracting": []},
            expect=["1 lhs_contracting axes but 0 rhs_contracting axes"]),
]
