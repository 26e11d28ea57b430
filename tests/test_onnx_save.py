"""progdesc.onnx.save: programs written as ONNX models run in onnxruntime to our Executor's
outputs, at two sizes of their symbolic dims from one file; ops with no ONNX form are all
named in one error and nothing is written."""
import os

import numpy as np
import pytest

import progdesc as pd
import progdesc.onnx
from lowering.errors import FeedError, UnsupportedOpError
from progdesc import control_flow as cf
from progdesc import layers, ops

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")


def _session(path_or_model):
    data = path_or_model.SerializeToString() if hasattr(path_or_model, "SerializeToString") \
        else os.fspath(path_or_model)
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"])


def _reference(exe, scope, program, feeds_at_sizes, fetches):
    """Our Executor's outputs of `program` in test mode for each feed dict."""
    test = program.clone(for_test=True)
    return [exe.run(test, feed=feed, fetch_list=fetches, scope=scope) for feed in feeds_at_sizes]


def _check_file(path, feeds_at_sizes, references, tol=2e-5):
    """ORT on the model file `path` gives the `references` for every feed dict."""
    session = _session(path)
    names = [i.name for i in session.get_inputs()]
    for feed, ours in zip(feeds_at_sizes, references):
        theirs = session.run(None, {n: feed[n] for n in names})
        assert len(theirs) == len(ours)
        for a, b in zip(ours, theirs):
            assert np.asarray(a).shape == b.shape
            np.testing.assert_allclose(np.asarray(b, np.float64), np.asarray(a, np.float64),
                                       rtol=tol, atol=tol)


def _dims(value_info):
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


@pytest.fixture(scope="module")
def exe():
    return pd.Executor()


@pytest.fixture(scope="module")
def mlp(exe):
    """A trained MLP: (program, scope, x data, output)."""
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 4])
        y = pd.data("y", [None, 1])
        out = layers.fc(layers.fc(layers.fc(x, 16, act="tanh"), 8, act="relu"), 1)
        loss = layers.mse_loss(out, y)
        pd.optimizer.Adam(0.01).minimize(loss)
    scope = pd.Scope()
    exe.run(startup, scope=scope)
    data = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
    for _ in range(5):
        exe.run(main, feed={"x": data, "y": data.sum(1, keepdims=True)}, fetch_list=[loss],
                scope=scope)
    return main, scope, data, out


def test_trained_mlp_runs_in_onnxruntime_at_two_batch_sizes(tmp_path, exe, mlp):
    main, scope, data, out = mlp
    feeds = [{"x": data[:3], "y": data[:3, :1]}, {"x": data[:11], "y": data[:11, :1]}]
    references = _reference(exe, scope, main, feeds, [out])
    for opset in (13, 17, 21):
        path = tmp_path / f"mlp{opset}.onnx"
        model = progdesc.onnx.save(main, path, ["x"], [out], opset=opset, scope=scope)
        assert model.opset_import[0].version == opset
        assert _dims(model.graph.input[0]) == ["batch", 4]
        assert [o.name for o in model.graph.output] == [out.name]
        # forward only: no optimizer state, no gradient ops; the trained weights themselves
        weights = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
        assert sorted(weights) == sorted(p.name for p in main.all_parameters())
        for name, value in weights.items():
            np.testing.assert_array_equal(value, np.asarray(scope.get(name)))
        _check_file(path, feeds, references)


def test_cnn_with_batch_norm_runs_with_its_running_statistics(tmp_path, exe):
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        img = pd.data("img", [None, 3, 10, 10])
        label = pd.data("label", [None, 1], dtype="int64")
        h = layers.batch_norm(layers.conv2d(img, 8, 3, padding=1), act="relu")
        h = layers.pool2d(h, 2, "max")
        h = layers.conv2d(h, 8, 3, stride=2, padding=1, groups=2, act="relu")
        h = layers.dropout(layers.pool2d(h, 3, "avg", pool_stride=1, pool_padding=1), 0.3)
        g = layers.pool2d(h, global_pooling=True, pool_type="avg")
        flat = ops.concat([ops.reshape(h, shape=[0, -1]), ops.reshape(g, shape=[0, -1])], axis=1)
        logits = layers.fc(flat, 5)
        prob = ops.softmax(logits)
        loss = ops.mean(layers.softmax_with_cross_entropy(logits, label))
        pd.optimizer.Adam(0.01).minimize(loss)
    scope = pd.Scope()
    exe.run(startup, scope=scope)
    rng = np.random.default_rng(1)
    images = (rng.normal(size=(16, 3, 10, 10)) * 2 + 1).astype("float32")
    labels = rng.integers(0, 5, size=(16, 1))
    exe.run(main, feed={"img": images, "label": labels}, fetch_list=[loss], scope=scope)
    norm = next(o for o in main.global_block().ops if o.type == "batch_norm")
    running_mean = norm.input("Mean")[0]
    assert np.abs(np.asarray(scope.get(running_mean))).max() > 0.01   # trained statistics
    path = tmp_path / "cnn.onnx"
    model = progdesc.onnx.save(main, path, ["img"], [prob], scope=scope)
    kinds = {n.op_type for n in model.graph.node}
    assert {"Conv", "BatchNormalization", "MaxPool", "AveragePool", "GlobalAveragePool"} <= kinds
    assert "Dropout" not in kinds
    feeds = [{"img": images[:1], "label": labels[:1]}, {"img": images[:6], "label": labels[:6]}]
    _check_file(path, feeds, _reference(exe, scope, main, feeds, [prob]))


def test_transformer_encoder_with_dynamic_batch_and_sequence(tmp_path, exe):
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        tokens = pd.data("tok", [None, None], dtype="int64")
        h = layers.embedding(tokens, size=[20, 16], padding_idx=0)
        h = layers.transformer_encoder_layer(h, num_heads=2, dim_feedforward=32, causal=True)
        h = layers.transformer_encoder_layer(h, num_heads=4, dim_feedforward=32,
                                             normalize_before=True, activation="relu")
        out = layers.fc(ops.reduce_mean(h, axis=[1]), 3)
    scope = pd.Scope()
    exe.run(startup, scope=scope)
    rng = np.random.default_rng(2)
    feeds = [{"tok": rng.integers(0, 20, size=(2, 5))}, {"tok": rng.integers(0, 20, size=(3, 9))}]
    references = _reference(exe, scope, main, feeds, [out])
    for opset in (13, 17, 20):
        path = tmp_path / f"encoder{opset}.onnx"
        model = progdesc.onnx.save(main, path, ["tok"], [out], opset=opset, scope=scope,
                                   dim_names={"tok": ("batch", "seq")})
        assert _dims(model.graph.input[0]) == ["batch", "seq"]
        kinds = {n.op_type for n in model.graph.node}
        assert ("LayerNormalization" in kinds) == (opset >= 17)
        assert ("Gelu" in kinds) == (opset >= 20)
        assert ("Trilu" in kinds) == (opset >= 14)
        _check_file(path, feeds, references)


def test_fused_attention_with_causal_and_padding_masks(tmp_path, exe):
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, None, 8])
        keep = pd.data("keep", [None, None])
        h = layers.transformer_encoder_layer(x, num_heads=2, dim_feedforward=16,
                                             dropout_rate=0.0, causal=True,
                                             key_padding_mask=keep)
    assert "scaled_dot_product_attention" in [o.type for o in main.global_block().ops]
    scope = pd.Scope()
    exe.run(startup, scope=scope)
    rng = np.random.default_rng(3)
    feeds = []
    for b, t in ((2, 3), (3, 6)):
        mask = (rng.random((b, t)) > 0.3).astype("float32")
        mask[:, 0] = 1
        feeds.append({"x": rng.normal(size=(b, t, 8)).astype("float32"), "keep": mask})
    references = _reference(exe, scope, main, feeds, [h])
    for opset in (13, 18):
        path = tmp_path / f"attention{opset}.onnx"
        progdesc.onnx.save(main, path, ["x", "keep"], [h], opset=opset, scope=scope)
        _check_file(path, feeds, references)


def test_shape_and_elementwise_ops(tmp_path, exe):
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 6, 4])
        ids = pd.data("ids", [None, 6], dtype="int64")
        p, q = ops.split(x, num=2, axis=2)
        r1, r2, r3 = ops.split(x, sections=[1, -1, 2], axis=1)
        c = ops.concat([p, q, x], axis=2)
        u = ops.squeeze(ops.unsqueeze(ops.transpose(c, perm=[0, 2, 1]), axes=[1]), axes=[1])
        e = ops.expand(ops.reduce_mean(x, axis=[1], keep_dim=True), shape=[-1, 6, 4])
        w = ops.where(ops.greater_than(x, e), ops.gelu(x, approximate=True), ops.silu(x))
        picked = ops.gather(x, ops.assign_value(shape=[2], dtype="int64", int_values=[0, 3]),
                            axis=1)
        count = ops.dim_size(x, axis=0, dtype="float32")
        outs = [
            ops.slice(x, axes=[1, 2], starts=[1, 0], ends=[2 ** 31 - 1, 3]),
            ops.slice(x, axes=[1], starts=[-1], ends=[-2 ** 31], strides=[-2]),
            r1, r2, r3, u, w, picked,
            ops.scale(ops.clip(w, min=-0.5, max=0.7), scale=2.0, bias=1.0),
            ops.scale(x, scale=3.0, bias=1.0, bias_after_scale=False),
            ops.div(ops.reduce_sum(x, axis=[0]), count),
            ops.add(ops.reshape_as(ops.reshape(x, shape=[0, -1]), x),
                    ops.fill_constant(shape=[4], dtype="float32", value=0.25)),
            ops.softmax(ops.log_softmax(layers.embedding(ids, size=[10, 4]), axis=-1), axis=1),
            ops.maximum(ops.reduce_max(x, axis=[2]), ops.reduce_min(x, axis=[2])),
            ops.add(ops.cast(ops.iota(shape=[6, 4], dtype="int32", dimension=1),
                             dtype="float32"), x),
            ops.stack([p, q], axis=1),
            ops.tril(x, diagonal=1), ops.triu(x),
            ops.cast(ops.argmax(x, axis=1), dtype="float32"),
            ops.cast(ops.reduce_any(ops.greater_than(x, e), axis=[2]), dtype="float32"),
            ops.hard_swish(x), ops.leaky_relu(x), ops.relu6(ops.scale(x, scale=5.0)),
            ops.softplus(x, beta=2.0), ops.mish(x), ops.rsqrt(ops.exp(x)),
            ops.cumsum(x, axis=1, reverse=True), ops.reduce_prod(x, axis=[1, 2]),
            ops.tile(p, reps=[1, 2, 1]), ops.expand_as(r1, x),
            ops.cast(ops.scale(ids, scale=0.5, bias=-1.5), dtype="float32"),   # toward 0
        ]
    scope = pd.Scope()
    exe.run(startup, scope=scope)
    rng = np.random.default_rng(4)
    feeds = [{"x": rng.normal(size=(b, 6, 4)).astype("float32"),
              "ids": rng.integers(0, 10, size=(b, 6))} for b in (2, 5)]
    references = _reference(exe, scope, main, feeds, outs)
    for opset in (13, 17, 18, 21):
        path = tmp_path / f"ops{opset}.onnx"
        progdesc.onnx.save(main, path, ["x", "ids"], outs, opset=opset, scope=scope)
        _check_file(path, feeds, references)


def test_round_trip_onnx_to_progdesc_to_onnx(tmp_path):
    """A model made with onnx.helper, loaded and saved again, computes what it computed."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(rng.normal(size=(8, 4)).astype("float32"), "W1"),
             numpy_helper.from_array(rng.normal(size=(8,)).astype("float32"), "b1"),
             numpy_helper.from_array(rng.normal(size=(8, 3)).astype("float32"), "W2")]
    constant = numpy_helper.from_array(np.float32([0.1, 0.2, 0.3]))
    nodes = [helper.make_node("Gemm", ["x", "W1", "b1"], ["g"], transB=1, alpha=0.5, beta=2.0),
             helper.make_node("Relu", ["g"], ["r"]),
             helper.make_node("Constant", [], ["c"], value=constant),
             helper.make_node("MatMul", ["r", "W2"], ["m"]),
             helper.make_node("Add", ["m", "c"], ["a"]),
             helper.make_node("Tanh", ["a"], ["t"]), helper.make_node("Sigmoid", ["a"], ["s"]),
             helper.make_node("Mul", ["t", "s"], ["p"]), helper.make_node("Sub", ["p", "c"], ["q"]),
             helper.make_node("Div", ["q", "s"], ["y"]),
             helper.make_node("Identity", ["y"], ["out"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 3])], initializer=inits)
    original = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    scope = pd.Scope()
    program, feeds, fetches = progdesc.onnx.load(original, scope)
    path = tmp_path / "again.onnx"
    again = progdesc.onnx.save(program, path, feeds, fetches, scope=scope)
    assert _dims(again.graph.input[0]) == ["batch", 4]
    before, after = _session(original), _session(path)
    for batch in (1, 6):
        x = rng.normal(size=(batch, 4)).astype("float32")
        np.testing.assert_allclose(after.run(None, {feeds[0]: x})[0],
                                   before.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)


def _program_with_unexportable_ops():
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 5, 4])
        a = ops.lgamma(ops.exp(x))
        which = ops.digamma(x)
        _, ys = cf.scan(lambda h, x_t: (ops.tanh(h), ops.atan2(x_t, h)),
                        ops.reduce_sum(x, axis=[1]), ops.transpose(x, perm=[1, 0, 2]))
        out = ops.add(ops.add(a, which), ops.transpose(ys, perm=[1, 0, 2]))
    scope = pd.Scope()
    pd.Executor().run(startup, scope=scope)
    return main, scope, out


def test_ops_with_no_onnx_form_are_named_in_one_error_and_nothing_is_written(tmp_path):
    main, scope, out = _program_with_unexportable_ops()
    types = [o.type for o in main.global_block().ops]
    scan = next(o for o in main.global_block().ops if o.type == "scan")
    step = main.block(scan.attr("block"))
    path = tmp_path / "model.onnx"
    with pytest.raises(UnsupportedOpError) as err:
        progdesc.onnx.save(main, path, ["x"], [out], scope=scope)
    found = [(t, b, i) for t, b, i, _, _ in err.value.places]
    assert found == [("lgamma", 0, types.index("lgamma")), ("digamma", 0, types.index("digamma")),
                     ("atan2", step.idx, [o.type for o in step.ops].index("atan2"))]
    for t, b, i in found:
        assert f"#{i} '{t}'" + (f" in block {b}" if b else "") in str(err.value)
    assert not path.exists() and os.listdir(tmp_path) == []
    path.write_bytes(b"previous")        # a failed save leaves the previous file as it was
    with pytest.raises(UnsupportedOpError):
        progdesc.onnx.save(main, path, ["x"], [out], scope=scope)
    assert path.read_bytes() == b"previous" and os.listdir(tmp_path) == ["model.onnx"]


def test_lstm_and_gru_classifier_as_onnx_scan(tmp_path, exe):
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        seq = pd.data("seq", [None, None, 4])
        lstm_out, (lstm_h, _) = layers.lstm(seq, 6)
        gru_out, gru_h = layers.gru(seq, 5, reverse=True)
        logits = layers.fc(ops.concat([lstm_h, gru_h, ops.reduce_mean(gru_out, axis=[1])],
                                      axis=1), 3)
    scope = pd.Scope()
    exe.run(startup, scope=scope)
    rng = np.random.default_rng(6)
    feeds = [{"seq": rng.normal(size=(b, t, 4)).astype("float32")} for b, t in ((1, 3), (4, 6))]
    references = _reference(exe, scope, main, feeds, [logits, lstm_out])
    path = tmp_path / "rnn.onnx"
    model = progdesc.onnx.save(main, path, ["seq"], [logits, lstm_out], scope=scope)
    assert [n.op_type for n in model.graph.node].count("Scan") == 2
    assert _dims(model.graph.input[0]) == ["batch", "seq_dim1", 4]
    _check_file(path, feeds, references)


def test_cond_switch_and_while_as_onnx_if_and_loop(tmp_path, exe):
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 3])
        positive = ops.greater_than(ops.reduce_sum(x), ops.fill_constant(shape=[], value=0.0))
        branch = cf.cond(positive, lambda: ops.tanh(x) * 2.0, lambda: x * x)
        a = ops.abs(x) + 1.0
        tol = ops.fill_constant(shape=[], value=1e-6)

        def far(r):
            return ops.greater_than(ops.reduce_max(ops.abs(r * r - a)), tol)

        root = cf.while_loop(far, lambda r: (r + a / r) * 0.5, a * 0.5 + 0.5)
        three_steps = cf.while_loop(far, lambda r: (r + a / r) * 0.5, a * 0.5 + 0.5,
                                    max_iters=3)
        which = pd.data("which", [], dtype="int32")
        chosen = cf.switch(which, [lambda: ops.exp(x), lambda: x * 3.0, lambda: ops.abs(x)])
        outs = [branch, root, three_steps, chosen]
    scope = pd.Scope()
    exe.run(startup, scope=scope)
    rng = np.random.default_rng(7)
    feeds = [{"x": (sign * np.abs(rng.normal(size=(n, 3)))).astype("float32"),
              "which": np.asarray(w, dtype="int32")}   # -1 and 7: clamped to the ends
             for sign, n, w in ((1, 2, -1), (1, 2, 1), (-1, 5, 2), (-1, 5, 7))]
    references = _reference(exe, scope, main, feeds, outs)
    np.testing.assert_allclose(references[0][1] ** 2, np.abs(feeds[0]["x"]) + 1, rtol=1e-5)
    path = tmp_path / "control.onnx"
    model = progdesc.onnx.save(main, path, ["x", "which"], outs, opset=13, scope=scope)
    assert {"If", "Loop"} <= {n.op_type for n in model.graph.node}
    _check_file(path, feeds, references)


def test_training_mode_ops_are_pruned_and_other_fetches_work(tmp_path, mlp):
    main, scope, _, out = mlp
    hidden = next(v for v in main.global_block().vars.values() if v.name.endswith("tanh_0.out")
                  or v.name.startswith("fc_0") and v.name.endswith(".out"))
    model = progdesc.onnx.to_onnx(main, ["x"], [hidden, out], scope=scope)
    assert [o.name for o in model.graph.output] == [hidden.name, out.name]
    assert len(model.graph.initializer) == 6


def test_dim_names(mlp):
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        a = pd.data("a", [None, 3])
        b = pd.data("b", [2, None])
        out = ops.add(ops.reduce_sum(a), ops.reduce_sum(b))
    model = progdesc.onnx.to_onnx(main, ["a", "b"], [out])
    assert [_dims(i) for i in model.graph.input] == [["a_dim0", 3], [2, "b_dim1"]]
    model = progdesc.onnx.to_onnx(main, ["a", "b"], [out], dim_names={"b": (None, "n")})
    assert [_dims(i) for i in model.graph.input] == [["a_dim0", 3], [2, "n"]]
    for bad in ({"c": ("n",)}, {"a": ("n",)}, {"a": ("n", "m")}, {"a": (3, None)}):
        with pytest.raises(FeedError):
            progdesc.onnx.to_onnx(main, ["a", "b"], [out], dim_names=bad)


def test_bad_arguments(mlp):
    main, scope, _, out = mlp
    with pytest.raises(ValueError, match="opset"):
        progdesc.onnx.to_onnx(main, ["x"], [out], opset=12, scope=scope)
    with pytest.raises(FeedError, match="nope"):
        progdesc.onnx.to_onnx(main, ["nope"], [out], scope=scope)
    with pytest.raises(FeedError, match="neither fed nor computed"):
        progdesc.onnx.to_onnx(main, [], [out], scope=scope)


def test_transposed_convolutions_top_k_padding_losses_and_products(tmp_path, exe):
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        img = pd.data("img", [None, 4, 5, 5])
        x = pd.data("x", [None, 6, 4])
        label = pd.data("label", [None, 6, 1], dtype="int64")
        w = pd.data("w", [4, 3, 3, 3])
        w2 = pd.data("w2", [4, 2, 2, 2])
        k = pd.data("k", [None, 4, 5])
        bits = pd.data("bits", [None, 3], dtype="int32")
        probs, loss = ops.softmax_with_cross_entropy(
            ops.transpose(x, perm=[0, 2, 1]), ops.transpose(label, perm=[0, 2, 1]),
            ignore_index=2, axis=1)
        outs = [
            ops.conv2d_transpose(img, w, strides=[2, 2], paddings=[1, 0, 1, 1],
                                 output_padding=[1, 0]),
            ops.conv2d_transpose(img, w2, strides=[2, 1], groups=2, dilations=[1, 2],
                                 paddings=[1, 1]),
            ops.conv2d_transpose(img, w, strides=[2, 2], paddings=[1, 1], output_size=[10, 10]),
            ops.conv2d_transpose(img, w, strides=[2, 2], padding_algorithm="SAME"),
            ops.top_k(x, k=2, axis=1)[0],
            ops.cast(ops.top_k(x, k=3, largest=False)[1], dtype="float32"),
            ops.rev(x, dimensions=[1, 2]),
            ops.pad(x, ops.fill_constant(shape=[], value=0.5),
                    padding_config=[0, 0, 0, 1, -1, 0, 2, 1, 0]),
            ops.border_pad(x, paddings=[0, 0, 2, 1, 1, 3], mode="reflect"),
            ops.border_pad(x, paddings=[0, 0, 2, 1, 1, 3], mode="replicate"),
            ops.cast(ops.bitwise_and(bits, ops.bitwise_not(ops.scale(bits, scale=3))),
                     dtype="float32"),
            ops.cbrt(x),
            ops.dot_general(x, k, lhs_contracting=[2], rhs_contracting=[1], lhs_batch=[0],
                            rhs_batch=[0]),
            ops.reduce_as(x, ops.fill_constant(shape=[6, 1], value=0.0)),
            probs, loss,
            ops.softmax_with_cross_entropy(x, ops.softmax(x * 2.0), soft_label=True)[1],
        ]
    scope = pd.Scope()
    exe.run(startup, scope=scope)
    rng = np.random.default_rng(8)
    feeds = [{"img": rng.normal(size=(b, 4, 5, 5)).astype("float32"),
              "x": rng.normal(size=(b, 6, 4)).astype("float32"),
              "label": rng.integers(0, 4, size=(b, 6, 1)),
              "w": rng.normal(size=(4, 3, 3, 3)).astype("float32"),
              "w2": rng.normal(size=(4, 2, 2, 2)).astype("float32"),
              "k": rng.normal(size=(b, 4, 5)).astype("float32"),
              "bits": rng.integers(-50, 50, size=(b, 3)).astype("int32")} for b in (1, 3)]
    assert any((f["label"] == 2).any() for f in feeds)   # ignored labels are in the data
    references = _reference(exe, scope, main, feeds, outs)
    path = tmp_path / "more.onnx"
    progdesc.onnx.save(main, path, list(feeds[0]), outs, opset=18, scope=scope)
    _check_file(path, feeds, references)
    with pytest.raises(UnsupportedOpError, match="bitwise_not.*needs opset 18"):
        progdesc.onnx.save(main, tmp_path / "old.onnx", list(feeds[0]), outs, opset=17,
                           scope=scope)


def test_general_convolution_and_window_reductions(tmp_path, exe):
    """conv_general_dilated and reduce_window (what imported convolutions and pools and
    from_jax programs hold) in other layouts than NCHW."""
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 7, 6, 3])                   # NHWC
        w = pd.data("w", [3, 3, 3, 4])                      # HWIO
        window = dict(window_dimensions=[1, 3, 2, 1], window_strides=[1, 2, 1, 1],
                      padding=[0, 0, 1, 1, 0, 1, 0, 0])
        outs = [
            ops.conv_general_dilated(x, w, window_strides=[2, 1], padding=[1, 1, 0, 2],
                                     rhs_dilation=[1, 2], lhs_spec=[0, 3, 1, 2],
                                     rhs_spec=[3, 2, 0, 1], out_spec=[0, 3, 1, 2]),
            ops.conv_general_dilated(ops.transpose(x, perm=[0, 3, 1, 2]),
                                     ops.transpose(w, perm=[3, 2, 0, 1]), lhs_spec=[0, 1, 2, 3],
                                     rhs_spec=[0, 1, 2, 3], out_spec=[0, 1, 2, 3]),
            ops.reduce_window(x, computation="max", **window),
            ops.reduce_window(x, computation="min", **window),
            ops.reduce_window(x, computation="sum", **window),
            ops.reduce_window(ops.transpose(x, perm=[0, 3, 1, 2]), computation="max",
                              window_dimensions=[1, 1, 2, 2], window_strides=[1, 1, 2, 2]),
        ]
    scope = pd.Scope()
    exe.run(startup, scope=scope)
    rng = np.random.default_rng(9)
    feeds = [{"x": rng.normal(size=(b, 7, 6, 3)).astype("float32"),
              "w": rng.normal(size=(3, 3, 3, 4)).astype("float32")} for b in (1, 3)]
    references = _reference(exe, scope, main, feeds, outs)
    path = tmp_path / "general.onnx"
    model = progdesc.onnx.save(main, path, ["x", "w"], outs, scope=scope)
    assert {"Conv", "MaxPool", "AveragePool"} <= {n.op_type for n in model.graph.node}
    _check_file(path, feeds, references)


def test_round_trip_of_an_imported_cnn():
    """Conv, BatchNormalization, MaxPool, Reshape, Gemm, Softmax: ONNX -> progdesc -> ONNX
    computes what the original computes (needs the importer's rows for them)."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(10)

    def normal(*shape):
        return rng.normal(size=shape).astype("float32")

    inits = [numpy_helper.from_array(v, n) for n, v in [
        ("W", normal(8, 3, 3, 3)), ("B", normal(8)), ("s", normal(8)), ("b", normal(8)),
        ("m", normal(8)), ("v", np.abs(normal(8)) + 0.5), ("shape", np.int64([0, -1])),
        ("G", normal(8 * 4 * 4, 5)), ("gb", normal(5))]]
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["n"],
                              epsilon=1e-3),
             helper.make_node("Relu", ["n"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Reshape", ["p", "shape"], ["f"]),
             helper.make_node("Gemm", ["f", "G", "gb"], ["g"]),
             helper.make_node("Softmax", ["g"], ["y"], axis=-1)]
    graph = helper.make_graph(
        nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])], initializer=inits)
    original = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    scope = pd.Scope()
    try:
        program, feeds, fetches = progdesc.onnx.load(original, scope)
    except UnsupportedOpError as e:
        pytest.skip(f"the importer lacks rows: {e}")
    again = progdesc.onnx.to_onnx(program, feeds, fetches, scope=scope)
    assert _dims(again.graph.input[0]) == ["batch", 3, 16, 16]
    before, after = _session(original), _session(again)
    for batch in (1, 5):
        x = normal(batch, 3, 16, 16)
        np.testing.assert_allclose(after.run(None, {feeds[0]: x})[0],
                                   before.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_an_output_the_onnx_form_does_not_compute_is_refused_when_read(tmp_path):
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 3])
        out, mask = ops.dropout(x, dropout_prob=0.5, is_test=True)
        used = ops.add(out, ops.cast(mask, dtype="float32"))
    with pytest.raises(UnsupportedOpError, match="'dropout_0.mask'.*fetch target is output Mask"):
        progdesc.onnx.to_onnx(main, ["x"], [mask])
    with pytest.raises(UnsupportedOpError, match=r"#\d 'cast'.*output Mask"):
        progdesc.onnx.to_onnx(main, ["x"], [used])
    model = progdesc.onnx.to_onnx(main, ["x"], [out])     # the output ONNX does compute
    x_value = np.random.default_rng(11).normal(size=(2, 3)).astype("float32")
    np.testing.assert_array_equal(_session(model).run(None, {"x": x_value})[0], x_value)


def test_shapes_computed_from_other_arrays_dims(tmp_path, exe):
    """reshape_dims, broadcast_dims and slice_dims (an imported model's run-time shapes)
    keep their symbolic dims in ONNX."""
    from lowering import registry
    if not registry.is_registered("reshape_dims"):
        pytest.skip("no reshape_dims op in this tree (lowering/ops/shape_dims.py)")
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, None, 8])
        flat = ops.reshape(x, shape=[-1, 8])
        outs = [
            ops.reshape_dims(flat, [x], shape=[0, 0, 2, 4],
                             dims=[0, 1, 1, 0, 0, 1, 1, 1, 0, 1]),       # [B, T, 2, 4]
            ops.broadcast_dims(ops.reduce_sum(x, axis=[0, 1]), [x], shape=[0, -1],
                               dims=[0, 2, 1, 0, 0]),                    # [2B, 8]
            ops.slice_dims(x, [x], axes=[1, 2], starts=[1, 2], ends=[-1, 8],
                           dims=[2, 1, 1, 0, 1]),                        # [:, 1:T-1, 2:]
        ]
    scope = pd.Scope()
    exe.run(startup, scope=scope)
    rng = np.random.default_rng(12)
    feeds = [{"x": rng.normal(size=(b, t, 8)).astype("float32")} for b, t in ((1, 3), (3, 6))]
    references = _reference(exe, scope, main, feeds, outs)
    for opset in (13, 17):
        path = tmp_path / f"dims{opset}.onnx"
        progdesc.onnx.save(main, path, ["x"], outs, opset=opset, scope=scope)
        _check_file(path, feeds, references)


def test_scalar_parameters_stay_scalars(tmp_path):
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 4])
        column = main.global_block().create_var("column", shape=(), dtype="int64",
                                                persistable=True)
        out = ops.gather(x, column, axis=1)
    assert out.shape == (-1,)
    scope = pd.Scope()
    scope.set("column", np.int64(2))
    model = progdesc.onnx.to_onnx(main, ["x"], [out], scope=scope)
    column_init, = [t for t in model.graph.initializer if t.name == "column"]
    assert list(column_init.dims) == []
    x_value = np.arange(12, dtype="float32").reshape(3, 4)
    np.testing.assert_array_equal(_session(model).run(None, {"x": x_value})[0], x_value[:, 2])
