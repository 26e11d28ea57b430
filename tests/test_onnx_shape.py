"""ONNX shape ops and the folding of shapes at import (progdesc.onnx.rules_shape,
rules_index, folding, symbolic), against NumPy.

The models are built with onnx.helper the way exporters write them: inputs with symbolic
'batch' and 'seq' dims, their sizes read with Shape -> Gather -> Unsqueeze -> Concat into
Reshape targets, batch*seq products, ConstantOfShape of a shape, Range(0, seq) for
positions, an Expand of a causal mask. Each runs at two batch sizes and two sequence
lengths, and is compiled by `progdesc.export` with its dims symbolic.
"""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import progdesc as pd
from lowering.errors import FeedError, UnsupportedOpError
from progdesc import onnx as ponnx
from progdesc.onnx import symbolic

D, HEADS = 8, 2
BUFFER = np.tril(np.ones((16, 16), np.float32))[None, None]


def _model(nodes, inputs, outputs, initializers=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _const(name, value):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(
        np.asarray(value), name))


def _ints(name, values):
    return _const(name, np.asarray(values, dtype=np.int64))


def _gpt_like():
    """x [batch, seq, D] -> (the attention-like reshapes of x @ w, positions added, a causal
    mask expanded to [batch, 1, seq, seq], ones of x's first two dims)."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((D, D)).astype(np.float32)
    pos = rng.standard_normal((16, D)).astype(np.float32)
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        _ints("i0", 0), _ints("i1", 1), _ints("ax0", [0]),
        helper.make_node("Gather", ["shape", "i0"], ["b"], axis=0),
        helper.make_node("Gather", ["shape", "i1"], ["s"], axis=0),
        helper.make_node("Unsqueeze", ["b", "ax0"], ["b1"]),
        helper.make_node("Unsqueeze", ["s", "ax0"], ["s1"]),
        # [batch*seq, D] @ w, and back to [batch, seq, HEADS, D/HEADS]
        helper.make_node("Mul", ["b", "s"], ["bs"]),
        helper.make_node("Unsqueeze", ["bs", "ax0"], ["bs1"]),
        _ints("d", [D]), _ints("heads", [HEADS, D // HEADS]),
        helper.make_node("Concat", ["bs1", "d"], ["flat_shape"], axis=0),
        helper.make_node("Reshape", ["x", "flat_shape"], ["flat"]),
        helper.make_node("MatMul", ["flat", "w"], ["proj"]),
        helper.make_node("Concat", ["b1", "s1", "heads"], ["split_shape"], axis=0),
        helper.make_node("Reshape", ["proj", "split_shape"], ["split"]),
        helper.make_node("Transpose", ["split"], ["heads_first"], perm=[0, 2, 1, 3]),
        # positions: Range(0, seq) looked up in a table, added to x
        _ints("zero", 0), _ints("one", 1),
        helper.make_node("Range", ["zero", "s", "one"], ["positions"]),
        helper.make_node("Gather", ["pos", "positions"], ["pos_emb"], axis=0),
        helper.make_node("Add", ["x", "pos_emb"], ["with_pos"]),
        # a causal mask [seq, seq] of 0 and -1e9, expanded to [batch, 1, seq, seq]
        helper.make_node("Concat", ["s1", "s1"], ["ss_shape"], axis=0),
        helper.make_node("ConstantOfShape", ["ss_shape"], ["ss_ones"],
                         value=numpy_helper.from_array(np.ones(1, np.float32))),
        helper.make_node("Trilu", ["ss_ones"], ["lower"], upper=0),
        _const("one_f", np.float32(1)), _const("big", np.float32(1e9)),
        helper.make_node("Sub", ["lower", "one_f"], ["below"]),
        helper.make_node("Mul", ["below", "big"], ["mask"]),
        _ints("one1", [1]),
        helper.make_node("Concat", ["b1", "one1", "s1", "s1"], ["mask_shape"], axis=0),
        helper.make_node("Expand", ["mask", "mask_shape"], ["mask4"]),
        # ones of [batch, seq]
        helper.make_node("Concat", ["b1", "s1"], ["bs_shape"], axis=0),
        helper.make_node("ConstantOfShape", ["bs_shape"], ["ones"],
                         value=numpy_helper.from_array(np.ones(1, np.float32))),
        # a causal buffer [1, 1, 16, 16] cut to [1, 1, seq, seq] (bias[:, :, s-s:s, :s])
        helper.make_node("Sub", ["s", "s"], ["none"]),
        helper.make_node("Unsqueeze", ["none", "ax0"], ["none1"]),
        _ints("zero1", [0]), _ints("axes23", [2, 3]),
        helper.make_node("Concat", ["none1", "zero1"], ["cut_starts"], axis=0),
        helper.make_node("Concat", ["s1", "s1"], ["cut_ends"], axis=0),
        helper.make_node("Slice", ["buffer", "cut_starts", "cut_ends", "axes23"], ["causal"]),
        # the sequence from its second element, and its last element
        _ints("end", [2 ** 62]), _ints("ax1", [1]), _ints("minus1", [-1]),
        helper.make_node("Slice", ["x", "one1", "end", "ax1"], ["tail"]),
        helper.make_node("Sub", ["s1", "one1"], ["s_minus_1"]),
        helper.make_node("Slice", ["x", "s_minus_1", "end", "ax1"], ["last"]),
    ]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
               for n in ("heads_first", "with_pos", "mask4", "ones", "causal", "tail", "last")]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", D])
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(pos, "pos"),
             numpy_helper.from_array(BUFFER, "buffer")]
    return _model(nodes, [x], outputs, inits), w, pos


def _gpt_like_reference(x, w, pos):
    b, s, _ = x.shape
    heads = (x.reshape(b * s, D) @ w).reshape(b, s, HEADS, D // HEADS).transpose(0, 2, 1, 3)
    mask = np.where(np.arange(s)[None, :] <= np.arange(s)[:, None], 0, -1e9).astype(np.float32)
    return [heads, x + pos[:s], np.broadcast_to(mask, (b, 1, s, s)),
            np.ones((b, s), np.float32), BUFFER[:, :, :s, :s], x[:, 1:], x[:, -1:]]


SIZES = [(2, 3), (5, 7)]


def test_exporter_shape_patterns_keep_batch_and_seq_symbolic():
    model, w, pos = _gpt_like()
    scope = pd.Scope()
    program, feeds, fetches = ponnx.load(model, scope)
    assert program.global_block().var("x").shape == (-1, -1, D)
    exe = pd.Executor()
    rng = np.random.default_rng(1)
    for b, s in SIZES:
        x = rng.standard_normal((b, s, D)).astype(np.float32)
        got = exe.run(program, feed={"x": x}, fetch_list=fetches, scope=scope)
        for g, want in zip(got, _gpt_like_reference(x, w, pos)):
            np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-5)


def test_symbolic_dims_survive_export(tmp_path):
    model, w, pos = _gpt_like()
    scope = pd.Scope()
    program, feeds, fetches = ponnx.load(model, scope)
    path = str(tmp_path / "model.pdx")
    # the causal buffer holds 16 positions: the model is valid for seq <= 16 only
    header = pd.export.export_compiled(path, program, feeds, fetches, scope=scope,
                                       batch_polymorphic={"x": ("batch", "seq", None)},
                                       dim_constraints=["seq <= 16"])
    assert header["feeds"][0]["shape"][:2] == ["batch", "seq"]
    assert header["fetches"][2]["shape"] == ["batch", 1, "seq", "seq"]
    assert header["fetches"][4]["shape"] == [1, 1, "seq", "seq"]
    served = pd.export.load_compiled(path)
    with pytest.raises(FeedError, match="rejected the inputs"):
        served(np.zeros((1, 17, D), np.float32))
    rng = np.random.default_rng(2)
    for b, s in SIZES:
        x = rng.standard_normal((b, s, D)).astype(np.float32)
        for g, want in zip(served(x), _gpt_like_reference(x, w, pos)):
            np.testing.assert_allclose(np.asarray(g), want, rtol=1e-5, atol=1e-5)


def test_gradients_flow_through_symbolic_reshapes_and_slices():
    """One SGD step on loss = sum(heads_first * r) + sum(causal): w moves by -lr * the
    NumPy gradient (flat.T @ r as [batch*seq, D]); the sliced float buffer is trained too."""
    model, w, pos = _gpt_like()
    scope = pd.Scope()
    program, feeds, fetches = ponnx.load(model, scope)
    startup = pd.Program()
    with pd.program_guard(program, startup):
        r = pd.data("r", [-1, HEADS, -1, D // HEADS], "float32")
        loss = pd.ops.add(pd.ops.reduce_sum(pd.ops.mul(fetches[0], r)),
                          pd.ops.reduce_sum(fetches[4]))
        pd.optimizer.SGD(0.5).minimize(loss)
    exe = pd.Executor()
    exe.run(startup, scope=scope)
    rng = np.random.default_rng(3)
    b, s = 3, 5
    x = rng.standard_normal((b, s, D)).astype(np.float32)
    rv = rng.standard_normal((b, HEADS, s, D // HEADS)).astype(np.float32)
    exe.run(program, feed={"x": x, "r": rv}, fetch_list=[loss], scope=scope)
    grad = x.reshape(b * s, D).T @ rv.transpose(0, 2, 1, 3).reshape(b * s, D)
    np.testing.assert_allclose(scope.get("w"), w - 0.5 * grad, rtol=1e-4, atol=1e-4)
    moved = BUFFER.copy()
    moved[:, :, :s, :s] -= 0.5
    np.testing.assert_allclose(scope.get("buffer"), moved, rtol=1e-6)


def _one_input(nodes, x_dims, out_dtype=TensorProto.FLOAT, inits=(), extra_inputs=()):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, x_dims)
    out = helper.make_tensor_value_info("y", out_dtype, None)
    return _model(nodes, [x, *extra_inputs], [out], inits)


def test_shapes_from_run_time_values_are_refused_naming_the_node():
    n = helper.make_tensor_value_info("n", TensorProto.INT64, [2])
    model = _one_input([helper.make_node("Reshape", ["x", "n"], ["y"], name="by_value")],
                       ["batch", 4], extra_inputs=[n])
    with pytest.raises(UnsupportedOpError, match="'Reshape' at node 'by_value'.*target shape"):
        ponnx.load(model, pd.Scope())
    # seq // 2 is no polynomial in seq: refused, not guessed
    nodes = [helper.make_node("Shape", ["x"], ["shape"]), _ints("i1", [1]), _ints("two", [2]),
             helper.make_node("Gather", ["shape", "i1"], ["s"]),
             helper.make_node("Div", ["s", "two"], ["half"]),
             helper.make_node("Slice", ["x", "half", "i1", "i1"], ["y"], name="halves")]
    with pytest.raises(UnsupportedOpError, match="'Slice' at node 'halves'"):
        ponnx.load(_one_input(nodes, ["batch", "seq"]), pd.Scope())
    nodes = [helper.make_node("NonZero", ["x"], ["y"], name="nz")]
    with pytest.raises(UnsupportedOpError, match="'NonZero' at node 'nz'.*depends on the values"):
        ponnx.load(_one_input(nodes, [3], TensorProto.INT64), pd.Scope())


def test_constants_fold_and_float_initializers_stay_trainable():
    """NonZero of a constant is folded; an int initializer giving a shape is no parameter;
    a float initializer added to x stays a trainable parameter (folding never reads it)."""
    values = np.array([[1, 0], [0, 3]], np.float32)
    nodes = [helper.make_node("NonZero", ["c"], ["nz"]),
             helper.make_node("Shape", ["nz"], ["nz_shape"]),      # [2, 2]: a constant
             helper.make_node("Reshape", ["x", "shape"], ["flat"]),
             helper.make_node("Add", ["flat", "bias"], ["sum"]),
             helper.make_node("Reshape", ["sum", "nz_shape"], ["y"])]
    inits = [numpy_helper.from_array(values, "c"),
             numpy_helper.from_array(np.array([-1], np.int64), "shape"),
             numpy_helper.from_array(np.arange(4, dtype=np.float32), "bias")]
    scope = pd.Scope()
    program, feeds, fetches = ponnx.load(_one_input(nodes, [2, 2], inits=inits), scope)
    block = program.global_block()
    assert not block.var("bias").stop_gradient
    assert block.find_var("shape") is None or block.var("shape").stop_gradient
    x = np.arange(4, dtype=np.float32).reshape(2, 2)
    got, = pd.Executor().run(program, feed={"x": x}, fetch_list=fetches, scope=scope)
    np.testing.assert_allclose(got, (x.reshape(-1) + np.arange(4)).reshape(2, 2))


def _r(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _i(values):
    return np.asarray(values, dtype=np.int64)


# (op type, attributes, fed inputs, initializers (in the node's input order after them), opset)
NODES = {
    "gather_negative_2d": ("Gather", {"axis": 1}, [_r(3, 4)], [_i([[0, -1], [-2, 1]])], 17),
    "gather_scalar": ("Gather", {}, [_r(3, 4)], [_i(-1)], 17),
    "gather_elements": ("GatherElements", {"axis": 1}, [_r(3, 4)],
                        [_i([[0, -1], [3, 1], [-4, 2]])], 17),
    "gathernd_batch": ("GatherND", {"batch_dims": 1}, [_r(2, 3, 4)],
                       [_i([[[1], [-1]], [[0], [2]]])], 17),
    "gathernd_points": ("GatherND", {}, [_r(3, 4)], [_i([[0, 1], [2, -1]])], 17),
    "scatter_elements_add": ("ScatterElements", {"axis": 1, "reduction": "add"}, [_r(3, 4)],
                             [_i([[0, 0], [-1, 2], [1, 1]]), _r(3, 2, seed=1)], 17),
    "scatter_elements_set": ("ScatterElements", {"axis": 0}, [_r(3, 4)],
                             [_i([[2, 0, 1, -1]]), _r(1, 4, seed=1)], 17),
    "scatternd_add": ("ScatterND", {"reduction": "add"}, [_r(4, 3)], [_i([[1], [1], [-1]]),
                                                                       _r(3, 3, seed=1)], 17),
    "pad_reflect_axes": ("Pad", {"mode": "reflect"}, [_r(3, 4)], [_i([1, 2]), None, _i([1])],
                         18),
    "pad_edge": ("Pad", {"mode": "edge"}, [_r(3, 4)], [_i([1, 0, 2, 3])], 17),
    "pad_wrap": ("Pad", {"mode": "wrap"}, [_r(3, 4)], [_i([0, 5, 1, 0])], 19),
    "pad_constant_value": ("Pad", {}, [_r(3, 4)], [_i([1, 0, 0, 2]),
                                                      np.float32(2.5)], 17),
    "onehot_axis0": ("OneHot", {"axis": 0}, [_i([[1, -1], [0, 7]])],
                     [np.float32(4), np.array([-1, 3], np.float32)], 17),
    "depth_to_space_crd": ("DepthToSpace", {"blocksize": 2, "mode": "CRD"}, [_r(1, 8, 2, 3)],
                           [], 17),
    "space_to_depth": ("SpaceToDepth", {"blocksize": 2}, [_r(2, 1, 4, 6)], [], 17),
    "trilu_k": ("Trilu", {"upper": 0}, [_r(2, 4, 5)], [_i(-1)], 17),
    "split_num_outputs": ("Split", {"axis": 1, "num_outputs": 3}, [_r(2, 7)], [], 18),
    "split_sizes": ("Split", {}, [_r(6, 2)], [_i([1, 0, 5])], 17),
    "slice_negative_steps": ("Slice", {}, [_r(5, 6)], [_i([-1, 100]), _i([-100, 1]),
                                                       _i([0, 1]), _i([-2, -3])], 17),
    "flatten_0": ("Flatten", {"axis": 0}, [_r(2, 3, 4)], [], 17),
    "squeeze": ("Squeeze", {}, [_r(1, 3, 1)], [_i([-1])], 17),
    "unsqueeze": ("Unsqueeze", {}, [_r(3, 4)], [_i([-1, 0])], 17),
    "tile": ("Tile", {}, [_r(2, 3)], [_i([2, 1])], 17),
    "expand_both_ways": ("Expand", {}, [_r(3, 1)], [_i([2, 1, 4])], 17),
    "eye_like": ("EyeLike", {"k": 1}, [_r(3, 4)], [], 17),
    "reshape_allowzero": ("Reshape", {"allowzero": 1}, [_r(0, 3)], [_i([3, 0])], 17),
    "size": ("Size", {}, [_r(2, 5)], [], 17),
    "shape_start_end": ("Shape", {"start": -2, "end": 10}, [_r(2, 5, 3)], [], 17),
    "unique_unsorted": ("Unique", {"sorted": 0}, [], [np.array([2, 1, 1, 3, 2], np.float32)],
                        17),
    "range_float": ("Range", {}, [], [np.float32(1), np.float32(2), np.float32(0.3)], 17),
}


@pytest.mark.parametrize("case", sorted(NODES))
def test_node_against_the_onnx_reference(case):
    """One node, its first inputs fed and the others initializers, against ONNX's own
    reference implementation (onnx.reference)."""
    from onnx.reference import ReferenceEvaluator
    op_type, attrs, fed, inits, opset = NODES[case]
    names = [f"in{i}" for i in range(len(fed) + len(inits))]
    given = [n if v is not None else "" for n, v in zip(names, fed + inits)]
    outputs = {"Split": 3, "Unique": 4}.get(op_type, 1)
    node = helper.make_node(op_type, given, [f"out{k}" for k in range(outputs)], **attrs)
    inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
              for n, v in zip(names, fed)]
    initializers = [numpy_helper.from_array(np.asarray(v), n)
                    for n, v in zip(names[len(fed):], inits) if v is not None]
    outs = [helper.make_tensor_value_info(f"out{k}", TensorProto.UNDEFINED, None)
            for k in range(outputs)]
    model = _model([node], inputs, outs, initializers, opset=opset)
    feed = dict(zip(names, fed))
    want = ReferenceEvaluator(model).run(None, feed)
    scope = pd.Scope()
    program, feeds, fetches = ponnx.load(model, scope)
    got = pd.Executor().run(program, feed=feed, fetch_list=fetches, scope=scope)
    assert len(got) == len(want) == outputs
    for g, w in zip(got, want):
        assert np.shape(g) == np.shape(w)
        np.testing.assert_allclose(np.asarray(g).astype(w.dtype), w, rtol=1e-6, atol=1e-6)


def test_sizes_are_polynomials_in_the_symbolic_dims():
    b, s = symbolic.symbol("batch"), symbolic.symbol("seq")
    assert (b * s) // s == b and (4 * b * s) // 4 == b * s
    assert s - s == 0 and (b + 1) - b == 1 and str(2 * b * s - 1) == "2*batch*seq - 1"
    assert symbolic.compare(b, -1) == 1 and symbolic.compare(b * s + 1, 1) == 1
    for undecided in (lambda: symbolic.compare(b, s), lambda: b // 2, lambda: b // s,
                      lambda: symbolic.compare(b - s, 0)):
        with pytest.raises(symbolic.Undecided):
            undecided()


def test_exporter_expand_and_flatten_patterns_fold_symbolically():
    """TorchScript's expand: Where(Equal(shape, -1), ones, shape) of Shape(x); Max of a
    shape; a flatten of the last dims by ReduceProd of a Slice of Shape; Cast to int32."""
    bias = np.arange(D, dtype=np.float32).reshape(1, 1, D)
    nodes = [
        helper.make_node("Shape", ["x"], ["shp"]),
        helper.make_node("Shape", ["shp"], ["rank"]),
        helper.make_node("ConstantOfShape", ["rank"], ["ones"],
                         value=numpy_helper.from_array(np.ones(1, np.int64))),
        _ints("minus1", -1),
        helper.make_node("Mul", ["ones", "minus1"], ["neg"]),
        helper.make_node("Equal", ["shp", "neg"], ["eq"]),
        helper.make_node("Where", ["eq", "ones", "shp"], ["target"]),
        helper.make_node("Max", ["ones", "target"], ["target_max"]),
        helper.make_node("Cast", ["target_max"], ["target32"], to=TensorProto.INT32),
        helper.make_node("Cast", ["target32"], ["target64"], to=TensorProto.INT64),
        helper.make_node("Abs", ["target64"], ["target_abs"]),
        helper.make_node("Expand", ["bias", "target_abs"], ["expanded"]),
        _ints("one1", [1]), _ints("three1", [3]), _ints("zero1", [0]),
        helper.make_node("Slice", ["shp", "one1", "three1"], ["inner"]),
        helper.make_node("ReduceProd", ["inner"], ["inner_size"], keepdims=1),
        helper.make_node("Slice", ["shp", "zero1", "one1"], ["outer"]),
        helper.make_node("Concat", ["outer", "inner_size"], ["flat_shape"], axis=0),
        helper.make_node("Reshape", ["expanded", "flat_shape"], ["y"]),
        # rows = batch * seq computed in floats: Cast, Mul, Floor, Cast back
        helper.make_node("Cast", ["shp"], ["shp_f"], to=TensorProto.FLOAT),
        helper.make_node("ReduceProd", ["shp_f"], ["all_f"], axes=[0], keepdims=1),
        _const("d_f", np.array([D], np.float32)),
        helper.make_node("Div", ["all_f", "d_f"], ["rows_f"]),
        helper.make_node("Floor", ["rows_f"], ["rows_floor"]),
        helper.make_node("Cast", ["rows_floor"], ["rows"], to=TensorProto.INT64),
        _ints("d", [D]),
        helper.make_node("Concat", ["rows", "d"], ["rows_shape"], axis=0),
        helper.make_node("Reshape", ["x", "rows_shape"], ["z"]),
        # bias [1, D] tiled seq times down and twice across
        helper.make_node("Squeeze", ["bias", "zero1"], ["bias2"]),
        _ints("i1", [1]), _ints("two1", [2]),
        helper.make_node("Gather", ["shp", "i1"], ["seq1"]),
        helper.make_node("Concat", ["seq1", "two1"], ["reps"], axis=0),
        helper.make_node("Tile", ["bias2", "reps"], ["tiled"]),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", D])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
            for n in ("y", "z", "tiled")]
    model = _model(nodes, [x], outs, [numpy_helper.from_array(bias, "bias")], opset=17)
    scope = pd.Scope()
    program, feeds, fetches = ponnx.load(model, scope)
    assert fetches[0].shape == (-1, -1) and fetches[1].shape == (-1, D)
    for b, s in SIZES:
        xv = np.arange(b * s * D, dtype=np.float32).reshape(b, s, D)
        got = pd.Executor().run(program, feed={"x": xv}, fetch_list=fetches, scope=scope)
        np.testing.assert_array_equal(got[0], np.broadcast_to(bias, (b, s, D)).reshape(b, -1))
        np.testing.assert_array_equal(got[1], xv.reshape(b * s, D))
        np.testing.assert_array_equal(got[2], np.tile(bias[0], (s, 2)))


def test_folding_at_import_matches_the_onnx_reference():
    """Nodes of constants computed by progdesc.onnx.folding (no program runs them): Slice's
    clamping on a grid of starts, ends and steps, Flatten's axes, Expand, integer Div."""
    import itertools

    from onnx.reference import ReferenceEvaluator
    from progdesc.onnx import folding
    x = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    cases = [("Slice", [x, _i([s]), _i([e]), _i([2]), _i([k])], {})
             for s, e, k in itertools.product([-7, -1, 0, 2, 9, 2 ** 62], [-9, -1, 0, 3, 2 ** 62],
                                               [-2, -1, 1, 3])]
    cases += [("Flatten", [x], {"axis": a}) for a in (-3, -1, 0, 2, 3)]
    cases += [("Expand", [np.ones((3, 1), np.float32), _i([2, 1, 4])], {}),
              ("Div", [_i([7, -7, 6]), _i([2, 2, -4])], {}),
              ("Gather", [_i([5, 6, 7]), _i([[-1, 0]])], {})]
    for op_type, inputs, attrs in cases:
        names = [f"in{k}" for k in range(len(inputs))]
        model = _model([helper.make_node(op_type, names, ["y"], **attrs)], [],
                       [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)],
                       [numpy_helper.from_array(v, n) for n, v in zip(names, inputs)])
        want, = ReferenceEvaluator(model).run(None, {})
        got, = folding.fold(op_type, inputs, attrs)
        assert got.shape == want.shape and np.array_equal(got, want), (op_type, inputs[1:])



def test_a_float_initializer_that_gives_a_length_is_frozen_not_folded_away():
    """Range(2 * start, 7, 1), start a float initializer: the length is computed at import
    from it (so it is no longer trained); added to x, `bias` stays trainable."""
    nodes = [_const("two", np.float32(2)), _const("limit", np.float32(7)),
             _const("one", np.float32(1)),
             helper.make_node("Mul", ["start", "two"], ["first"]),
             helper.make_node("Range", ["first", "limit", "one"], ["steps"]),
             helper.make_node("Add", ["x", "bias"], ["shifted"]),
             helper.make_node("Add", ["shifted", "steps"], ["y"])]
    inits = [numpy_helper.from_array(np.float32(1), "start"),
             numpy_helper.from_array(np.ones(5, np.float32), "bias")]
    scope = pd.Scope()
    program, feeds, fetches = ponnx.load(_one_input(nodes, [5], inits=inits), scope)
    block = program.global_block()
    assert block.var("start").stop_gradient and not block.var("bias").stop_gradient
    got, = pd.Executor().run(program, feed={"x": np.zeros(5, np.float32)}, fetch_list=fetches,
                             scope=scope)
    np.testing.assert_array_equal(got, np.arange(2, 7) + 1)
