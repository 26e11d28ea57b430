"""ONNX shape ops and the folding of shapes at import (progdesc.onnx.rules_shape,
rules_index, folding, symbolic), against NumPy.

The models are built with onnx.helper the way exporters write them: inputs with symbolic
'batch' and 'seq' dims, their sizes read with Shape -> Gather -> Unsqueeze -> Concat into
Reshape targets, batch*seq products, ConstantOfShape of a shape, Range(0, seq) for
positions, an Expand of a causal mask. Each runs at two batch sizes and two sequence
lengths, and is compiled by `progdesc.export` with its dims symbolic.
"""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import progdesc as pd
from lowering.errors import UnsupportedOpError
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
    header = pd.export.export_compiled(path, program, feeds, fetches, scope=scope,
                                       batch_polymorphic={"x": ("batch", "seq", None)})
    assert header["feeds"][0]["shape"][:2] == ["batch", "seq"]
    assert header["fetches"][2]["shape"] == ["batch", 1, "seq", "seq"]
    assert header["fetches"][4]["shape"][2:] == ["min(seq, 16)"] * 2
    served = pd.export.load_compiled(path)
    rng = np.random.default_rng(2)
    for b, s in SIZES:
        x = rng.standard_normal((b, s, D)).astype(np.float32)
        for g, want in zip(served(x), _gpt_like_reference(x, w, pos)):
            np.testing.assert_allclose(np.asarray(g), want, rtol=1e-5, atol=1e-5)
