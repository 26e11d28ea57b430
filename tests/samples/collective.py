"""Samples of lowering/ops/collective.py.

The op table runs on one device, outside any mapped axis: there `c_allreduce` is the
reduction over a single device, the identity, an axis has size 1 and the device index 0
(their mapped behaviour is tested on four devices in tests/test_distributed_devices.py).
The tensor-parallel collectives are likewise the identity there, and `c_embedding` the
lookup in the whole table (mapped: tests/test_tensor_parallel_devices.py).
"""
import numpy as np
from op_table import Sample, rand


def _one_device(X, reduce_type="mean", axis_name="data"):
    return X


def _identity(X, axis_name="model"):
    return X


def _lookup(W, Ids, axis_name="model"):
    return W[Ids]


def _lookup_grad(W, Ids, OutGrad, axis_name="model"):
    dw = np.zeros(W.shape, OutGrad.dtype)
    for i, row in zip(Ids.reshape(-1), OutGrad.reshape(-1, W.shape[1])):
        dw[i] += row
    return dw


_IDS = np.array([[0, 5, 2], [5, 5, 1]], np.int64)

SAMPLES = [
    Sample("c_allreduce", {"X": rand(3, 4)}, _one_device, name="mean"),
    Sample("c_allreduce", {"X": rand(2, 3, dtype="float64")}, _one_device,
           {"reduce_type": "sum", "axis_name": "batch"}, name="sum_float64"),
    Sample("c_allreduce", {"X": rand(5)}, _one_device, {"reduce_type": "max"},
           name="max_no_grad", grad=False),
    Sample("c_axis_size", {}, lambda axis_name="data", dtype="int32": np.array(1, dtype),
           name="int32", grad=False),
    Sample("c_axis_size", {}, lambda axis_name="data", dtype="int32": np.array(1, dtype),
           {"dtype": "float32", "axis_name": "batch"}, name="float32", grad=False),
    Sample("c_axis_index", {}, lambda axis_name="data": np.array(0, "int32"),
           name="unmapped", grad=False),
    Sample("c_identity", {"X": rand(3, 4)}, _identity, name="one_device"),
    Sample("mp_allreduce_sum", {"X": rand(2, 3, 4, dtype="float64")}, _identity,
           {"axis_name": "mp"}, name="one_device_float64"),
    Sample("c_concat", {"X": rand(2, 6)}, _identity, name="one_device"),
    Sample("c_split", {"X": rand(4, 6)}, _identity, name="one_device"),
    Sample("c_embedding", {"W": rand(6, 4), "Ids": _IDS}, _lookup, name="repeated_ids"),
    Sample("c_embedding_grad", {"W": rand(6, 4), "Ids": _IDS, "OutGrad": rand(2, 3, 4, seed=1)},
           _lookup_grad, name="repeated_ids_static_ids", symbolic=False),
]


# pipeline transfers (progdesc/distributed/pipeline): on one device every stage is here
SAMPLES += [
    Sample("c_ppermute", {"X": rand(3, 4)}, lambda X, axis_name="pipe", shift=1: X,
           name="next_stage"),
    Sample("c_ppermute", {"X": rand(2, 5, dtype="float64")},
           lambda X, axis_name="pipe", shift=1: X, {"shift": -2}, name="gradient_back"),
    Sample("pipeline_schedule", {},
           lambda stages=1, micro_batches=1, schedule="gpipe", axis_name="pipe":
           np.array(micro_batches, "int32"),
           {"stages": 4, "micro_batches": 8, "schedule": "1f1b"}, name="four_stages",
           grad=False),
]
