"""progdesc.onnx.rules_extra: GridSample, AffineGrid, RoiAlign, DeformConv, Col2Im,
MaxUnpool, CenterCropPad, ReverseSequence, CumProd, BitCast, SwiGLU. References: NumPy
written from ONNX's operator specification, onnxruntime for the sampling ops, and central
differences for the gradients; ONNX's own expected outputs are checked by
tests/test_onnx_node_suite.py."""
import itertools

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from onnx_checks import directional_gradient_check  # noqa: E402
import progdesc  # noqa: E402
from lowering.errors import UnsupportedOpError  # noqa: E402
from progdesc import onnx as ponnx  # noqa: E402

F, I64 = TensorProto.FLOAT, TensorProto.INT64
_ELEM = {np.dtype(np.float32): F, np.dtype(np.int64): I64, np.dtype(np.int32): TensorProto.INT32,
         np.dtype(np.float16): TensorProto.FLOAT16, np.dtype(np.uint32): TensorProto.UINT32,
         np.dtype(np.bool_): TensorProto.BOOL, np.dtype(np.uint8): TensorProto.UINT8,
         np.dtype(np.float64): TensorProto.DOUBLE}


def _x(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _model(op, inputs, attrs=None, *, inits=(), opset=22, outputs=1):
    """A one-node model: `inputs` [(name, array)] graph inputs ('' for an absent one),
    `inits` [(name, array)] initializers; outputs y0.. of unknown dims."""
    names = [n for n, _ in inputs] + [n for n, _ in inits]
    node = helper.make_node(op, names, [f"y{i}" for i in range(outputs)], **(attrs or {}))
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, _ELEM[v.dtype], v.shape)
                      for n, v in inputs if n],
        [helper.make_tensor_value_info(f"y{i}", F, None) for i in range(outputs)],
        [numpy_helper.from_array(v, n) for n, v in inits])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=10)


def _ours(model, feed):
    scope = progdesc.Scope()
    program, feeds, fetches = ponnx.load(model, scope)
    return progdesc.Executor().run(program, feed=dict(zip(feeds, feed)), fetch_list=fetches,
                                   scope=scope)


def _run(op, inputs, attrs=None, **kw):
    model = _model(op, inputs, attrs, **kw)
    return _ours(model, [v for n, v in inputs if n])


def _onnxruntime(op, inputs, attrs=None, **kw):
    ort = pytest.importorskip("onnxruntime")
    model = _model(op, inputs, attrs, **kw)
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, {n: v for n, v in inputs if n})


# --- elementwise, scans, bits ---
@pytest.mark.parametrize("exclusive,reverse", list(itertools.product([0, 1], [0, 1])))
def test_cumprod(exclusive, reverse):
    x = np.array([[1, 2, 3, 4], [0.5, -1, 2, 3]], np.float32)
    y, = _run("CumProd", [("x", x)], {"exclusive": exclusive, "reverse": reverse},
              inits=[("axis", np.array(1, np.int64))], opset=26)
    z = x[:, ::-1] if reverse else x
    if exclusive:
        z = np.concatenate([np.ones((2, 1), np.float32), z[:, :-1]], axis=1)
    want = np.cumprod(z, axis=1)
    np.testing.assert_allclose(y, want[:, ::-1] if reverse else want, rtol=1e-6)


def test_swiglu():
    a, b = _x(3, 4), _x(3, 4, seed=1)
    for alpha in (1.0, 0.5):
        y, = _run("SwiGLU", [("a", a), ("b", b)], {"alpha": alpha}, opset=28)
        np.testing.assert_allclose(y, a / (1 + np.exp(-alpha * a)) * b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("x,to", [
    (np.array([1.5, -2.0, 0.0], np.float32), TensorProto.INT32),
    (np.array([1, 2 ** 31 + 5], np.uint32), TensorProto.INT32),
    (np.array([True, False, True]), TensorProto.UINT8)])
def test_bitcast(x, to):
    model = _model("BitCast", [("x", x)], {"to": to}, opset=26)
    model.graph.output[0].type.tensor_type.elem_type = to
    y, = _ours(model, [x])
    target = helper.tensor_dtype_to_np_dtype(to)
    want = x.astype(np.uint8) if x.dtype == np.bool_ else x.view(target)
    np.testing.assert_array_equal(y, want)


def test_bitcast_refuses_64_bit_types():
    with pytest.raises(UnsupportedOpError, match="64-bit types compute as 32 bits"):
        _run("BitCast", [("x", np.zeros(2, np.float64))], {"to": TensorProto.INT64}, opset=26)


@pytest.mark.parametrize("batch_axis,time_axis", [(0, 1), (1, 0)])
def test_reverse_sequence(batch_axis, time_axis):
    x = _x(4, 5) if batch_axis == 0 else _x(5, 4)
    lens = np.array([1, 5, 3, 0], np.int64)
    y, = _run("ReverseSequence", [("x", x), ("lens", lens)],
              {"batch_axis": batch_axis, "time_axis": time_axis}, opset=13)
    want = np.moveaxis(x, batch_axis, 0).copy()
    for b, n in enumerate(lens):
        want[b, :n] = want[b, :n][::-1]
    np.testing.assert_array_equal(y, np.moveaxis(want, 0, batch_axis))


# --- crops and scatters ---
def test_center_crop_pad():
    x = _x(7, 4, 3)
    y, = _run("CenterCropPad", [("x", x)], inits=[("s", np.array([4, 7, 3], np.int64))],
              opset=18)
    want = np.zeros((4, 7, 3), np.float32)
    want[:, 1:5] = x[1:5]   # 7 -> 4 from (7 - 4) // 2; 4 -> 7 with (7 - 4) // 2 before
    np.testing.assert_array_equal(y, want)


def _col2im_reference(cols, image, block, strides, dilations, pads):
    n, ck, _ = cols.shape
    rank = len(image)
    padded = [i + pads[d] + pads[d + rank] for d, i in enumerate(image)]
    counts = [(p - dilations[d] * (block[d] - 1) - 1) // strides[d] + 1
              for d, p in enumerate(padded)]
    kernel = int(np.prod(block))
    out = np.zeros((n, ck // kernel, *padded), cols.dtype)
    cols = cols.reshape(n, ck // kernel, kernel, -1)
    for k, tap in enumerate(np.ndindex(*block)):
        for b, where in enumerate(np.ndindex(*counts)):
            at = tuple(where[d] * strides[d] + tap[d] * dilations[d] for d in range(rank))
            out[(slice(None), slice(None)) + at] += cols[:, :, k, b]
    return out[(slice(None), slice(None)) + tuple(slice(pads[d], pads[d] + image[d])
                                                  for d in range(rank))]


def test_col2im_with_strides_dilations_and_pads():
    image, block = [5, 6], [2, 3]
    strides, dilations, pads = [2, 1], [1, 2], [1, 0, 1, 2]
    cols = _x(2, 3 * 6, 3 * 4)   # 3 channels; blocks: (7 - 2) // 2 + 1, (8 - 5) + 1
    y, = _run("Col2Im", [("x", cols)], {"strides": strides, "dilations": dilations,
                                        "pads": pads},
              inits=[("image", np.array(image, np.int64)),
                     ("block", np.array(block, np.int64))], opset=18)
    np.testing.assert_allclose(
        y, _col2im_reference(cols, image, block, strides, dilations, pads), rtol=1e-5)


def test_max_unpool_scatters_at_the_indices_then_pads_to_output_shape():
    x = _x(1, 2, 2, 2)
    indices = np.array([[[[0, 3], [9, 14]], [[16, 18], [24, 31]]]], np.int64)
    y, = _run("MaxUnpool", [("x", x), ("i", indices)], {"kernel_shape": [2, 2],
                                                          "strides": [2, 2]},
              inits=[("shape", np.array([1, 2, 5, 4], np.int64))])
    flat = np.zeros(32, np.float32)
    flat[indices.reshape(-1)] = x.reshape(-1)
    want = np.zeros((1, 2, 5, 4), np.float32)
    want[:, :, :4, :4] = flat.reshape(1, 2, 4, 4)
    np.testing.assert_array_equal(y, want)


# --- sampling, against onnxruntime ---
@pytest.mark.parametrize("mode,padding_mode,align_corners", [
    ("linear", "zeros", 0), ("linear", "border", 1), ("linear", "reflection", 0),
    ("nearest", "zeros", 1), ("nearest", "reflection", 1)])
def test_grid_sample(mode, padding_mode, align_corners):
    x, grid = _x(2, 3, 5, 6), 1.3 * _x(2, 4, 7, 2, seed=1)
    inputs, attrs = [("x", x), ("grid", grid)], {"mode": mode, "padding_mode": padding_mode,
                                                  "align_corners": align_corners}
    y, = _run("GridSample", inputs, attrs)
    want, = _onnxruntime("GridSample", inputs, attrs)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)


def test_grid_sample_refuses_cubic_and_5d():
    with pytest.raises(UnsupportedOpError, match="mode 'cubic'"):
        _run("GridSample", [("x", _x(1, 1, 3, 3)), ("g", _x(1, 2, 2, 2))], {"mode": "cubic"})
    with pytest.raises(UnsupportedOpError, match="a 5-D input"):
        _run("GridSample", [("x", _x(1, 1, 3, 3, 3)), ("g", _x(1, 2, 2, 2, 3))])


@pytest.mark.parametrize("align_corners", [0, 1])
@pytest.mark.parametrize("size", [[2, 3, 4, 5], [2, 3, 2, 4, 5]])
def test_affine_grid(size, align_corners):
    k = len(size) - 2
    theta = _x(2, k, k + 1)
    y, = _run("AffineGrid", [("theta", theta)], {"align_corners": align_corners},
              inits=[("size", np.array(size, np.int64))], opset=20)
    axes = [np.linspace(-1, 1, n) if align_corners else (2 * np.arange(n) + 1) / n - 1
            for n in size[2:]]
    mesh = np.meshgrid(*axes, indexing="ij")             # (z,) y, x of each point
    points = np.stack(list(mesh[::-1]) + [np.ones_like(mesh[0])], -1)   # (x, y[, z], 1)
    np.testing.assert_allclose(y, np.einsum("...j,nij->n...i", points, theta)
                               .reshape(2, *size[2:], k), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode,pool", [("half_pixel", "avg"), ("output_half_pixel", "avg"),
                                       ("half_pixel", "max")])
def test_roi_align(mode, pool):
    x = _x(2, 3, 8, 9)
    rois = np.array([[0.5, 1, 6, 7.5], [-3, 2, 3, 2.5], [2, 0, 9.5, 11]], np.float32)
    batch = np.array([1, 0, 1], np.int64)
    inputs = [("x", x), ("rois", rois), ("b", batch)]
    attrs = {"coordinate_transformation_mode": mode, "mode": pool, "output_height": 3,
             "output_width": 2, "sampling_ratio": 2, "spatial_scale": 0.9}
    y, = _run("RoiAlign", inputs, attrs, opset=16)
    want, = _onnxruntime("RoiAlign", inputs, attrs, opset=16)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)


def test_roi_align_refuses_adaptive_sampling():
    inputs = [("x", _x(1, 1, 4, 4)), ("r", _x(1, 4)), ("b", np.zeros(1, np.int64))]
    with pytest.raises(UnsupportedOpError, match="sampling_ratio 0"):
        _run("RoiAlign", inputs)


def test_deform_conv_with_mask_bias_and_groups():
    x, w = _x(2, 4, 5, 6), _x(6, 2, 2, 3, seed=1)
    offset, mask = _x(2, 2 * 2 * 6, 3, 1, seed=2), np.abs(_x(2, 2 * 6, 3, 1, seed=3))
    inputs = [("x", x), ("w", w), ("offset", offset), ("b", _x(6, seed=4)), ("mask", mask)]
    attrs = {"group": 2, "offset_group": 2, "pads": [1, 0, 1, 0], "strides": [2, 2],
             "dilations": [1, 2]}
    y, = _run("DeformConv", inputs, attrs)
    want, = _onnxruntime("DeformConv", inputs, attrs)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)


# --- gradients: <seed, d y / d p> against central differences ---
def test_gradients_through_sampling_ops():
    """AffineGrid -> GridSample -> DeformConv -> RoiAlign: theta, the filter and the
    offsets; the grid stays inside the image (no clipping kinks)."""
    nodes = [helper.make_node("AffineGrid", ["theta", "size"], ["grid"]),
             helper.make_node("GridSample", ["x", "grid"], ["s"]),
             helper.make_node("DeformConv", ["s", "w", "offset"], ["d"]),
             helper.make_node("RoiAlign", ["d", "rois", "b"], ["y"], output_height=2,
                              output_width=2, sampling_ratio=2)]
    theta = np.array([[[0.7, 0.1, 0.05], [-0.1, 0.6, 0.1]]], np.float32)
    directional_gradient_check(nodes, _x(1, 2, 6, 6),
                               {"theta": theta, "w": _x(3, 2, 2, 2, seed=1),
                                "offset": 0.3 * _x(1, 8, 4, 4, seed=2)},
                               [("size", np.array([1, 2, 5, 5], np.int64)),
                                ("rois", np.array([[0.3, 0.4, 3.1, 2.9]], np.float32)),
                                ("b", np.zeros(1, np.int64))])


def test_gradients_through_scatter_and_reordering_ops():
    """Col2Im, CenterCropPad, ReverseSequence, CumProd, SwiGLU, MaxUnpool on parameters."""
    nodes = [helper.make_node("Col2Im", ["cols", "image", "block"], ["c"], strides=[1, 2]),
             helper.make_node("CenterCropPad", ["c", "crop"], ["p"]),          # [1, 2, 4, 5]
             helper.make_node("Reshape", ["p", "flat"], ["r"]),               # [8, 5]
             helper.make_node("ReverseSequence", ["r", "lens"], ["q"], batch_axis=0,
                              time_axis=1),
             helper.make_node("CumProd", ["q", "axis"], ["cp"], exclusive=1),
             helper.make_node("SwiGLU", ["cp", "x"], ["sw"]),
             helper.make_node("Reshape", ["sw", "unflat"], ["u"]),            # [1, 2, 4, 5]
             helper.make_node("MaxUnpool", ["u", "idx"], ["y"], kernel_shape=[1, 1])]
    idx = np.random.default_rng(3).permutation(40).reshape(1, 2, 4, 5).astype(np.int64)
    directional_gradient_check(nodes, _x(8, 5, seed=4), {"cols": 0.8 * _x(1, 2 * 4, 3 * 2)},
                               [("image", np.array([4, 4], np.int64)),
                                ("block", np.array([2, 2], np.int64)),
                                ("crop", np.array([1, 2, 4, 5], np.int64)),
                                ("flat", np.array([8, 5], np.int64)),
                                ("lens", np.array([5, 2, 0, 3, 4, 1, 5, 5], np.int64)),
                                ("axis", np.array(1, np.int64)),
                                ("unflat", np.array([1, 2, 4, 5], np.int64)), ("idx", idx)],
                               opset=28)


# --- Slice with a run-time start (progdesc.onnx.run_time_bounds) ---
def _window_loop(first, length):
    """A Loop that adds x[i + first : i + first + length] to its carried value at each
    iteration i and stacks the windows (its scan output)."""
    k = numpy_helper.from_array
    body = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["c_out"]),
         helper.make_node("Constant", [], ["first"], value=k(np.array(first, np.int64))),
         helper.make_node("Constant", [], ["len"], value=k(np.array(length, np.int64))),
         helper.make_node("Add", ["i", "first"], ["s"]),
         helper.make_node("Add", ["s", "len"], ["e"]),
         helper.make_node("Unsqueeze", ["s", "zero"], ["starts"]),
         helper.make_node("Unsqueeze", ["e", "zero"], ["ends"]),
         helper.make_node("Slice", ["data", "starts", "ends"], ["w"]),
         helper.make_node("Add", ["acc", "w"], ["acc_out"]),
         helper.make_node("Identity", ["w"], ["w_out"])],
        "body", [helper.make_tensor_value_info("i", I64, []),
                 helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("acc", F, [length])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", F, [length]),
         helper.make_tensor_value_info("w_out", F, [length])])
    loop = helper.make_node("Loop", ["trips", "", "x"], ["total", "windows"], body=body)
    return [loop]


def _run_window_loop(first, length, trips, data):
    nodes = _window_loop(first, length)
    graph = helper.make_graph(
        nodes + [helper.make_node("Identity", ["total"], ["y0"])], "g",
        [helper.make_tensor_value_info("trips", I64, []),
         helper.make_tensor_value_info("x", F, [length])],
        [helper.make_tensor_value_info("y0", F, None),
         helper.make_tensor_value_info("windows", F, None)],
        [numpy_helper.from_array(data, "data"), numpy_helper.from_array(np.array([0], np.int64),
                                                                       "zero")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              ir_version=10)
    return ponnx.Backend.run_model(model, [np.array(trips, np.int64),
                                           np.zeros(length, np.float32)])


@pytest.mark.parametrize("first,trips", [(0, 5), (1, 3), (-6, 4)])
def test_loop_slices_at_its_iteration_number(first, trips):
    """The trip count a graph input (the backend binds it); negative starts (with
    negative ends) count from the end as in ONNX."""
    data = np.arange(10, 16, dtype=np.float32)
    total, windows = _run_window_loop(first, 2, trips, data)
    want = np.stack([data[i + first:i + first + 2] for i in range(trips)])
    np.testing.assert_array_equal(windows, want)
    np.testing.assert_array_equal(total, want.sum(0))


def test_run_time_start_refuses_a_window_larger_than_the_dim():
    with pytest.raises(UnsupportedOpError, match="a window of 7"):
        _run_window_loop(0, 7, 2, np.zeros(6, np.float32))


def test_gradient_through_a_run_time_slice_in_a_loop():
    nodes = _window_loop(1, 3)
    nodes.append(helper.make_node("Mul", ["windows", "windows"], ["y"]))
    directional_gradient_check(nodes, np.zeros(3, np.float32), {"data": _x(7)},
                               [("trips", np.array(4, np.int64)),
                                ("zero", np.array([0], np.int64))],
                               opset=13)
