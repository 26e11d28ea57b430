"""Samples of lowering/ops/init.py (random: checked by their statistics)."""
import numpy as np

from op_table import Invalid, Sample


def _moments(mean, std, bound=None, shape=(64, 64)):
    def check(outputs, inputs):
        out = outputs["Out"][0]
        assert out.shape == shape and out.dtype == np.float32
        assert abs(out.mean() - mean) < 0.1 * max(std, 1e-3) + 0.02
        assert abs(out.std() - std) < 0.1 * std
        if bound is not None:
            assert np.all(np.abs(out - mean) <= bound + 1e-6)
    return check


SAMPLES = [
    Sample("truncated_gaussian_random", {}, attrs={"shape": [64, 64], "std": 0.5, "mean": 1.0},
           # truncation at 2 std leaves 0.8796 of the std
           check=_moments(1.0, 0.5 * 0.8796, bound=1.0)),
    Sample("variance_scaling_random", {}, name="glorot_uniform",
           attrs={"shape": [64, 64], "mode": "fan_avg", "distribution": "uniform"},
           check=_moments(0.0, np.sqrt(1 / 64), bound=np.sqrt(3 / 64))),
    Sample("variance_scaling_random", {}, name="he_normal",
           attrs={"shape": [64, 64], "scale": 2.0, "distribution": "normal"},
           check=_moments(0.0, np.sqrt(2 / 64))),
    Sample("variance_scaling_random", {}, name="conv_fan_in",
           attrs={"shape": [32, 16, 3, 3], "scale": 2.0, "distribution": "normal",
                  "in_axis": 1, "out_axis": 0},
           check=_moments(0.0, np.sqrt(2 / (16 * 9)), shape=(32, 16, 3, 3))),
]

INVALID = [
    Invalid("variance_scaling_random", {}, attrs={"shape": [2, 3], "dtype": "int32"},
            name="int", expect=["attribute dtype='int32' must be a float type"]),
]
