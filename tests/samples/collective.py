"""Samples of lowering/ops/collective.py.

The op table runs on one device, outside any mapped axis: there `c_allreduce` is the
reduction over a single device, the identity (its mapped behaviour is tested on four
devices in tests/test_distributed.py).
"""
from op_table import Sample, rand


def _one_device(X, reduce_type="mean", axis_name="data"):
    return X


SAMPLES = [
    Sample("c_allreduce", {"X": rand(3, 4)}, _one_device, name="mean"),
    Sample("c_allreduce", {"X": rand(2, 3, dtype="float64")}, _one_device,
           {"reduce_type": "sum", "axis_name": "batch"}, name="sum_float64"),
    Sample("c_allreduce", {"X": rand(5)}, _one_device, {"reduce_type": "max"},
           name="max_no_grad", grad=False),
]

