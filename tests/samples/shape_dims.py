"""Samples of lowering/ops/shape_dims.py."""
import numpy as np

from op_table import Invalid, Sample, rand, spec

SAMPLES = [
    # [6, 4] -> [Like0.dim0, Like1.dim0 * 2, -1]: the dims of others, a product, one inferred
    Sample("reshape_dims", {"X": rand(6, 4), "Like": [rand(2, 5), rand(3, seed=1)]},
           lambda X, Like, shape, dims: X.reshape(2, 6, 2),
           {"shape": [0, 0, -1], "dims": [0, 1, 1, 0, 0, 1, 2, 1, 1, 0]}, name="product"),
    # a sum: dim 1 is Like0.dim1 - 1 (a constant term beside the computed one)
    Sample("reshape_dims", {"X": rand(2, 4, 3), "Like": [rand(1, 5)]},
           lambda X, Like, shape, dims: X.reshape(2, 4, 3),
           {"shape": [2, -1, 3], "dims": [1, 1, 1, 0, 1]}, name="sum"),
    Sample("broadcast_dims", {"X": rand(1, 3), "Like": [rand(4, 2)]},
           lambda X, Like, shape, dims: np.broadcast_to(X, (2, 4, 3)),
           {"shape": [0, 0, -1], "dims": [0, 1, 1, 0, 1, 1, 1, 1, 0, 0]}),
    Sample("broadcast_dims", {"X": rand(3, 1)},
           lambda X, shape: np.broadcast_to(X, (2, 3, 5)),
           {"shape": [2, -1, 5]}, name="constant"),
]

INVALID = [
    Invalid("reshape_dims", {"X": spec(6, 4), "Like": [spec(2, 5)]},
            attrs={"shape": [0, -1], "dims": [0, 1, 1, 1, 0]}, name="like_index",
            expect=["reads Like[1] of 1"]),
    Invalid("broadcast_dims", {"X": spec(2, 3)}, attrs={"shape": [-1, 4, 5]},
            name="no_dim_to_keep", expect=["-1 at dim 0", "has no dim of X"]),
]

SAMPLES += [
    # X[1 : Like.dim0 + 1] along 0 (clamped to X's 5), X[::2] along 1
    Sample("slice_dims", {"X": rand(5, 6), "Like": [rand(3, 2)]},
           lambda X, Like, **a: X[1:4, ::2],
           {"axes": [0, 1], "starts": [1, 0], "ends": [1, 2 ** 31 - 1], "strides": [1, 2],
            "dims": [2, 1, 1, 0, 0]}),
    Sample("slice_dims", {"X": rand(5, 6), "Like": [rand(9, 2)]},
           lambda X, Like, **a: X[-3:], {"axes": [0], "starts": [-3], "ends": [0],
                                         "dims": [1, 1, 1, 0, 0]}, name="clamped"),
    Sample("slice_dims", {"X": rand(5, 6)}, lambda X, **a: X[:, 4:0:-2],
           {"axes": [1], "starts": [4], "ends": [0], "strides": [-2]}, name="negative_stride"),
    Sample("slice_dims_grad", {"X": rand(5, 6), "Like": [rand(3, 2)], "OutGrad": rand(3, 6)},
           lambda X, Like, OutGrad, **a: np.pad(OutGrad, ((1, 1), (0, 0))),
           {"axes": [0], "starts": [1], "ends": [1], "dims": [1, 1, 1, 0, 0]}),
]
