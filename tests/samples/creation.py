"""Samples of lowering/ops/creation.py."""
import numpy as np

from op_table import Invalid, Sample, rand, spec


def _fill(shape, dtype="float32", value=0.0):
    return np.full(shape, value, dtype=dtype)


def _zeros_like(X):
    return np.zeros_like(X)


def _random_check(shape, dtype, mean, std, low=None, high=None):
    """check= for a random op: shape, dtype, range, and mean/std within a generous tolerance."""
    def check(outputs, inputs):
        (out,) = outputs["Out"]
        assert out.shape == tuple(shape) and out.dtype == np.dtype(dtype), (out.shape, out.dtype)
        assert np.all(np.isfinite(out))
        if low is not None:
            assert out.min() >= low and out.max() < high, (out.min(), out.max())
        assert abs(out.mean() - mean) < 0.1 * std, out.mean()
        assert abs(out.std() - std) < 0.1 * std, out.std()
    return check


SAMPLES = [
    Sample("fill_constant", {}, _fill, attrs={"shape": [2, 3]}, name="default_zeros"),
    Sample("fill_constant", {}, _fill, attrs={"shape": [2, 3], "value": 1.5}, name="float32"),
    Sample("fill_constant", {}, _fill, attrs={"shape": [4], "dtype": "int32", "value": 7.0},
           name="int32"),
    Sample("fill_constant", {}, _fill, attrs={"shape": [], "dtype": "float64", "value": -2.5},
           name="scalar_float64"),
    Sample("fill_constant", {}, _fill, attrs={"shape": [2, 2], "dtype": "bool", "value": 1.0},
           name="bool"),
    Sample("fill_zeros_like", {"X": rand(3, 4)}, _zeros_like, name="float32"),
    Sample("fill_zeros_like", {"X": np.arange(6, dtype=np.int64).reshape(2, 3)}, _zeros_like,
           name="int64"),
    Sample("fill_zeros_like", {"X": np.array([True, False])}, _zeros_like, name="bool"),
    Sample("uniform_random", {}, attrs={"shape": [4000]},
           check=_random_check([4000], "float32", 0.0, 2 / np.sqrt(12), -1.0, 1.0),
           name="default"),
    Sample("uniform_random", {}, attrs={"shape": [50, 80], "dtype": "float64", "min": 2.0,
                                        "max": 5.0},
           check=_random_check([50, 80], "float64", 3.5, 3 / np.sqrt(12), 2.0, 5.0),
           name="range_float64"),
    Sample("gaussian_random", {}, attrs={"shape": [4000]},
           check=_random_check([4000], "float32", 0.0, 1.0), name="default"),
    Sample("gaussian_random", {}, attrs={"shape": [40, 100], "dtype": "float64", "mean": 3.0,
                                         "std": 0.5},
           check=_random_check([40, 100], "float64", 3.0, 0.5), name="mean_std_float64"),
]

INVALID = [
    Invalid("uniform_random", {}, attrs={"shape": [2, 3], "dtype": "int64"}, name="int",
            expect=["attribute dtype='int64' must be a float type"]),
    Invalid("dim_size", {"X": spec(3, 4)}, attrs={"axis": 2}, name="axis_out_of_range",
            expect=["attribute axis=2 is out of range for X"]),
]

SAMPLES += [
    Sample("dim_size", {"X": rand(3, 4)}, lambda X: np.int32(3), name="axis0"),
    Sample("dim_size", {"X": rand(3, 4)}, lambda X, axis, multiplier, dtype: np.float32(
        X.shape[axis] * multiplier), attrs={"axis": 1, "multiplier": 8, "dtype": "float32"},
        name="scaled_float32"),
]
SAMPLES += [
    Sample("iota", {}, lambda shape, dtype, dimension: np.broadcast_to(
        np.arange(3, dtype=dtype), (2, 3)),
        attrs={"shape": [2, 3], "dtype": "int32", "dimension": 1}, name="int32_dim1"),
    Sample("iota", {}, lambda shape, dtype, dimension: np.broadcast_to(
        np.arange(4, dtype=dtype)[:, None], (4, 2)),
        attrs={"shape": [4, 2], "dtype": "float32", "dimension": 0}, name="float32_dim0"),
]
