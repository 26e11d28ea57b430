"""progdesc.onnx.Backend: ONNX's backend API (onnx.backend.base) over the importer.
References: NumPy, and the element types the ONNX graphs declare."""
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx.backend import base

from lowering.errors import FeedError, UnsupportedOpError
from progdesc.onnx import Backend, BackendRep
from progdesc.onnx import backend
from progdesc.onnx.backend import jax_device


def _model(nodes, inputs, outputs, initializers=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _info(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _gemm_model(opset=17, elem=TensorProto.DOUBLE, bias=1.0):
    b = onnx.numpy_helper.from_array(np.full((4,), bias, np.float32).astype(
        helper.tensor_dtype_to_np_dtype(elem)), "b")
    return _model([helper.make_node("Gemm", ["x", "w", "b"], ["y"])],
                  [_info("x", elem, ["batch", 3]), _info("w", elem, [3, 4])],
                  [_info("y", elem, ["batch", 4])], [b], opset)


def test_the_classes_are_onnx_backend_ones():
    assert issubclass(Backend, base.Backend)
    assert issubclass(BackendRep, base.BackendRep)


def test_run_model_gives_the_declared_dtype_and_numpy_values():
    rng = np.random.default_rng(0)
    x, w = rng.normal(size=(2, 3)), rng.normal(size=(3, 4))
    y, = Backend.run_model(_gemm_model(), [x, w])
    assert y.dtype == np.float64   # computed in float32: x64 is off
    np.testing.assert_allclose(y, x @ w + 1.0, rtol=1e-5)


def test_prepare_once_run_at_several_sizes_by_list_or_dict():
    rep = Backend.prepare(_gemm_model(elem=TensorProto.FLOAT), "CPU")
    assert rep.input_names == ["x", "w"]
    w = np.eye(3, 4, dtype=np.float32)
    for batch in (1, 5):
        x = np.arange(batch * 3, dtype=np.float32).reshape(batch, 3)
        out = rep.run({"x": x, "w": w})
        np.testing.assert_allclose(out.y, x @ w + 1.0)
        np.testing.assert_allclose(out["y"], rep.run([x, w])[0])


def test_each_prepared_model_has_its_own_scope():
    one = Backend.prepare(_gemm_model(elem=TensorProto.FLOAT, bias=1.0))
    two = Backend.prepare(_gemm_model(elem=TensorProto.FLOAT, bias=5.0))
    x, w = np.zeros((1, 3), np.float32), np.zeros((3, 4), np.float32)
    assert one.run([x, w])[0][0, 0] == 1.0 and two.run([x, w])[0][0, 0] == 5.0
    assert one.scope is not two.scope


def test_wrong_inputs_are_refused_by_name():
    rep = Backend.prepare(_gemm_model(elem=TensorProto.FLOAT))
    with pytest.raises(FeedError, match="takes 2 input"):
        rep.run([np.zeros((1, 3), np.float32)])
    with pytest.raises(FeedError, match="no input named 'z'"):
        rep.run({"z": np.zeros(1)})


def test_run_node_types_from_the_inputs():
    x = np.array([[-1.0, 2.0]], np.float64)
    out = Backend.run_node(helper.make_node("Gemm", ["a", "b"], ["c"], transB=1), [x, x])
    assert out.c.dtype == np.float64
    np.testing.assert_allclose(out.c, x @ x.T)
    out = Backend.run_node(helper.make_node("TopK", ["x", "k"], ["v", "i"]),
                           [np.array([3.0, 1.0, 2.0], np.float32), np.array([2], np.int64)],
                           outputs_info=[(np.float32, (2,)), (np.int64, (2,))])
    np.testing.assert_array_equal(out.v, [3.0, 2.0])
    assert out.i.dtype == np.int64 and list(out.i) == [0, 2]


def test_inputs_the_translation_needs_are_bound_per_value(monkeypatch):
    # TopK's K fed as an input: translated once per value of K, outputs of each size
    model = _model([helper.make_node("TopK", ["x", "k"], ["v", "i"], largest=0)],
                   [_info("x", TensorProto.FLOAT, [5]), _info("k", TensorProto.INT64, [1])],
                   [_info("v", TensorProto.FLOAT, None), _info("i", TensorProto.INT64, None)])
    rep = Backend.prepare(model)
    assert rep.bound_inputs == ("k",)
    x = np.array([4.0, -1.0, 3.0, 0.5, 2.0], np.float32)
    for k in (1, 3, 1):
        v, i = rep.run([x, np.array([k], np.int64)])
        np.testing.assert_array_equal(i, np.argsort(x, kind="stable")[:k])
        np.testing.assert_array_equal(v, np.sort(x)[:k])
    assert len(rep._bound) == 2
    # only the most recently used translations are kept, and each value still runs right
    monkeypatch.setattr(backend, "MAX_BOUND_TRANSLATIONS", 2)
    for k in (2, 4, 5, 1, 4):
        v, _ = rep.run([x, np.array([k], np.int64)])
        np.testing.assert_array_equal(v, np.sort(x)[:k])
        assert len(rep._bound) <= 2


def test_an_untranslatable_model_is_refused_at_prepare():
    model = _model([helper.make_node("NonMaxSuppression", ["b", "s"], ["y"])],
                   [_info("b", TensorProto.FLOAT, [1, 2, 4]),
                    _info("s", TensorProto.FLOAT, [1, 1, 2])],
                   [_info("y", TensorProto.INT64, None)])
    with pytest.raises(UnsupportedOpError, match="NonMaxSuppression.*run-time shape"):
        Backend.prepare(model)
    assert not Backend.is_compatible(_model([helper.make_node("NoSuchOp", ["x"], ["y"])],
                                            [_info("x", TensorProto.FLOAT, [1])],
                                            [_info("y", TensorProto.FLOAT, [1])]))
    assert Backend.is_compatible(_gemm_model())


def test_an_old_opset_is_upgraded_by_onnx():
    a = np.array([[1, 2], [3, 4]], np.uint8)
    model = _model([helper.make_node("MatMulInteger", ["a", "b"], ["y"])],
                   [_info("a", TensorProto.UINT8, [2, 2]), _info("b", TensorProto.UINT8, [2, 2])],
                   [_info("y", TensorProto.INT32, [2, 2])], opset=10)
    y, = Backend.run_model(model, [a, a])
    np.testing.assert_array_equal(y, a.astype(np.int32) @ a.astype(np.int32))


def test_devices():
    assert Backend.supports_device("CPU") and Backend.supports_device("cpu:0")
    assert not Backend.supports_device("FPGA") and not Backend.supports_device("CPU:x")
    assert not Backend.supports_device("CPU:999")
    with pytest.raises(ValueError, match="not a device name"):
        jax_device("FPGA")
    assert jax_device("CPU").platform == "cpu"


def test_importing_progdesc_onnx_leaves_the_backend_unloaded():
    code = ("import sys, progdesc.onnx; print('progdesc.onnx.backend' in sys.modules, "
            "'onnx.backend.base' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["False", "False"]
