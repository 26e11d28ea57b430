"""Data and tensor parallel at once, on a 2x2 mesh of four forced host devices.

The cases need four devices: `test_on_four_host_devices` runs this file again in one
subprocess with XLA_FLAGS=--xla_force_host_platform_device_count=4 (as
tests/test_distributed_devices.py does). The reference everywhere is the same program run
on one device without a mesh, where every collective is the identity (itself the plain
model: tests/test_tensor_parallel.py), and for the collectives themselves NumPy.
"""

import numpy as np
import pytest

import progdesc as pd
from bench import workloads as W
from progdesc import io, layers, ops
from progdesc.distributed import Mesh, sharding_of
from progdesc.optimizer import SGD, Adam
from progdesc.param import create_global_var
from forced_devices import SELECTIONS, four_devices, run_on_four_host_devices


@pytest.mark.parametrize("selection", SELECTIONS)
def test_on_four_host_devices(selection):
    run_on_four_host_devices(__file__, selection)


def _mesh():
    return Mesh({"data": 2, "model": 2})


def _layout(value):
    """The PartitionSpec of a laid-out array, one entry per dim."""
    spec = tuple(value.sharding.spec)
    return spec + (None,) * (value.ndim - len(spec))


def _persistables(program, scope):
    return {v.name: np.asarray(scope.get(v.name)) for v in program.list_vars()
            if v.desc.persistable and v.name in scope and v.name != "@RNG_STATE@"}


def _run(main, startup, feeds, fetch, exe=None, scope=None):
    """Train `main` one step per feed on Executor `exe` (default: one device, no mesh);
    (losses, persistables, scope)."""
    exe = exe or pd.Executor()
    if scope is None:
        scope = pd.Scope()
        exe.run(startup, scope=scope)
    losses = [float(exe.run(main, feed=f, fetch_list=[fetch], scope=scope)[0]) for f in feeds]
    return losses, _persistables(main, scope), scope


def _assert_close(got, want, skip=(), atol=1e-5):
    assert got.keys() == want.keys()
    for name in want:
        if name not in skip:
            np.testing.assert_allclose(got[name], want[name], atol=atol, rtol=1e-5,
                                       err_msg=name)


def _transformer_feeds(steps=3):
    return [{"x": x, "label": y} for x, y in W.make_batches(SPEC, steps, batch=8)]


@pytest.fixture(scope="module")
def transformer_runs():
    """The bench transformer, data and tensor parallel, trained 3 Adam steps on one device
    and on the 2x2 mesh."""
    runs = {}
    main, startup, _, _, loss = W.build_progdesc(SPEC, tensor_parallel=True, data_parallel=True)
    for name, mesh in (("one", None), ("2x2", _mesh())):
        runs[name] = (*_run(main, startup, _transformer_feeds(), loss, pd.Executor(mesh=mesh)),
                      main)
    return runs


@four_devices
@pytest.mark.slow   # in CI: the MLP's column-row pairs on the mesh, the heads split below
def test_the_bench_transformer_on_a_2x2_mesh_trains_like_one_device(transformer_runs):
    losses1, want, _, _ = transformer_runs["one"]
    losses4, got, scope, main = transformer_runs["2x2"]
    np.testing.assert_allclose(losses4, losses1, rtol=1e-5)
    assert losses4[-1] < losses4[0]
    # a key projection's bias moves every score of a query alike, which softmax cancels: its
    # exact gradient is zero, and Adam scales the rounding noise left in its place to steps
    # of up to the learning rate, in whatever direction the noise has on each layout
    keys = {n for n in want if ".attn.key.b_0" in n}
    _assert_close(got, want, skip=keys)
    for name in keys:
        np.testing.assert_allclose(got[name], want[name], atol=3 * W.ADAM_LR)
    # split parameters (and their Adam moments) are laid out over "model", the rest replicated
    w = scope.get("transformer_encoder_0.ffn1.w_0")
    assert _layout(w) == (None, "model") and w.shape == (16, 32)
    assert _layout(scope.get("transformer_encoder_0.ffn1.w_0.moment1")) == \
        (None, "model")
    assert _layout(scope.get("transformer_encoder_0.attn.output.w_0")) == \
        ("model", None)
    assert scope.get("transformer_encoder_0.norm1.w_0").sharding.is_fully_replicated


@four_devices
@pytest.mark.slow
def test_a_loaded_program_trains_on_the_2x2_mesh_as_it_was_saved(transformer_runs, tmp_path):
    _, want, _, main = transformer_runs["2x2"]
    _, startup, _, _, loss = W.build_progdesc(SPEC, tensor_parallel=True, data_parallel=True)
    path = str(tmp_path / "main.pdmodel")
    io.save_program(main, path)
    _, got, _ = _run(io.load_program(path), startup, _transformer_feeds(), loss.name,
                     pd.Executor(mesh=_mesh()))
    _assert_close(got, want, atol=1e-6)


def _mlp():
    """Column-row fc pairs, twice, then a replicated head."""
    x = pd.data("x", [-1, 12])
    label = pd.data("label", [-1, 1], "int64")
    h = x
    for _ in range(2):
        h = layers.fc(h, 16, act="tanh", tensor_parallel="column")
        h = layers.fc(h, 12, act="tanh", tensor_parallel="row")
    logits = layers.fc(h, 5)
    return x, label, ops.mean(layers.softmax_with_cross_entropy(logits, label))


def _build(model, **minimize):
    main, startup = pd.Program(random_seed=4), pd.Program(random_seed=4)
    with pd.program_guard(main, startup):
        x, label, loss = model()
        Adam(1e-2).minimize(loss, **minimize)
    return main, startup, x, label, loss


def _mlp_feeds(steps, seed=0):
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(size=(8, 12)).astype("float32"),
             "label": rng.integers(0, 5, (8, 1))} for _ in range(steps)]


@pytest.fixture(scope="module")
def mlp():
    """The MLP's programs and an Executor for each layout (each compiles once)."""
    main, startup, _, _, loss = _build(_mlp, data_parallel=True)
    return main, startup, loss, pd.Executor(), pd.Executor(mesh=_mesh())


@four_devices
def test_an_mlp_of_column_and_row_fc_pairs_on_a_2x2_mesh_trains_like_one_device(mlp):
    main, startup, loss, one, mesh = mlp
    losses1, want, _ = _run(main, startup, _mlp_feeds(4), loss, one)
    losses4, got, _ = _run(main, startup, _mlp_feeds(4), loss, mesh)
    np.testing.assert_allclose(losses4, losses1, rtol=1e-5)
    _assert_close(got, want)


@four_devices
def test_a_checkpoint_of_a_2x2_run_holds_whole_parameters_and_loads_either_way(mlp, tmp_path):
    main, startup, loss, one, mesh = mlp
    feeds = _mlp_feeds(4)
    _, want, _ = _run(main, startup, feeds, loss, one)           # four steps on one device
    _, saved, scope = _run(main, startup, feeds[:2], loss, mesh)  # two on the mesh
    path = str(tmp_path / "ckpt.safetensors")
    io.save_checkpoint(path, main, scope)
    assert saved["fc_0.w_0"].shape == (12, 16) and saved["fc_1.w_0"].shape == (16, 12)
    restored = pd.Scope()
    io.load_checkpoint(path, main, restored)                      # 2x2 -> one device
    for name, value in saved.items():
        np.testing.assert_array_equal(np.asarray(restored.get(name)), value, err_msg=name)
    _, got, restored = _run(main, startup, feeds[2:], loss, one, scope=restored)
    _assert_close(got, want)
    io.save_checkpoint(path, main, restored)                      # one device -> 2x2
    back = pd.Scope()
    io.load_checkpoint(path, main, back)
    _, again, back = _run(main, startup, feeds[:1], loss, mesh, scope=back)
    assert _layout(back.get("fc_0.w_0")) == (None, "model")
    _, want_again, _ = _run(main, startup, feeds[:1], loss, one, scope=restored)
    _assert_close(again, want_again)


def _embedding_model(split):
    ids = pd.data("ids", [-1, 5], "int64")
    label = pd.data("label", [-1, 1], "int64")
    emb = layers.embedding(ids, size=[12, 8], tensor_parallel=split)
    h = layers.fc(ops.reduce_mean(emb, axis=[1]), 16, act="relu", tensor_parallel="column")
    logits = layers.fc(h, 4, tensor_parallel="row")
    return ids, label, ops.mean(layers.softmax_with_cross_entropy(logits, label))


@four_devices
@pytest.mark.slow   # in CI: c_embedding and c_concat against NumPy on the mesh, below
@pytest.mark.parametrize("split", ["vocab", "hidden"])
def test_a_split_embedding_on_a_2x2_mesh_trains_like_one_device(split):
    main, startup, _, _, loss = _build(lambda: _embedding_model(split), data_parallel=True)
    rng = np.random.default_rng(1)
    feeds = [{"ids": rng.integers(0, 12, (8, 5)), "label": rng.integers(0, 4, (8, 1))}
             for _ in range(3)]
    losses1, want, _ = _run(main, startup, feeds, loss)
    losses4, got, scope = _run(main, startup, feeds, loss, pd.Executor(mesh=_mesh()))
    np.testing.assert_allclose(losses4, losses1, rtol=1e-5)
    _assert_close(got, want)
    spec = ("model", None) if split == "vocab" else (None, "model")
    assert _layout(scope.get("embedding_0.w_0")) == spec


@four_devices
@pytest.mark.slow
def test_tensor_parallel_alone_on_a_model_axis_of_four():
    main, startup, _, _, loss = _build(_mlp)                # no data axis: no c_allreduce
    losses1, want, _ = _run(main, startup, _mlp_feeds(3), loss)
    losses4, got, _ = _run(main, startup, _mlp_feeds(3), loss,
                           pd.Executor(mesh=Mesh({"model": 4})))
    np.testing.assert_allclose(losses4, losses1, rtol=1e-5)
    _assert_close(got, want)


@four_devices
def test_the_collectives_on_the_model_axis_against_numpy():
    """c_split gives device i the i-th slice, c_concat joins them in device order, and
    c_embedding + mp_allreduce_sum is the lookup in the whole table."""
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [-1, 8])
        ids = pd.data("ids", [-1, 3], "int64")
        table = pd.data("table", [12, 4])
        index = ops.cast(ops.c_axis_index(axis_name="model"), dtype="float32")
        # slice i scaled by i + 1, then joined: tells the slices' order apart
        part = ops.mul(ops.c_split(x, axis_name="model"), ops.scale(index, bias=1.0))
        joined = ops.c_concat(part, axis_name="model")
        # this device's rows of the table, as a vocab-parallel layer holds them
        rows = ops.c_split(ops.transpose(table, perm=[1, 0]), axis_name="model")
        looked = ops.mp_allreduce_sum(ops.c_embedding(ops.transpose(rows, perm=[1, 0]), ids,
                                                      axis_name="model"), axis_name="model")
        ops.c_allreduce(ops.reduce_sum(x), axis_name="data")   # makes it run on the mesh
    rng = np.random.default_rng(2)
    xv = rng.normal(size=(4, 8)).astype("float32")
    idv = rng.integers(0, 12, (4, 3))
    tv = rng.normal(size=(12, 4)).astype("float32")
    got_joined, got_looked = pd.Executor(mesh=Mesh({"data": 2, "model": 2})).run(
        main, feed={"x": xv, "ids": idv, "table": tv}, fetch_list=[joined, looked])
    np.testing.assert_allclose(got_joined, np.concatenate([xv[:, :4], 2 * xv[:, 4:]], 1),
                               rtol=1e-6)
    np.testing.assert_allclose(got_looked, tv[idv], rtol=1e-6)


@four_devices
def test_the_gradients_of_c_split_and_c_concat_on_the_model_axis_against_numpy():
    """loss = sum((c_concat(c_split(w) * (i + 1)))^2) on device i of "model": w's gradient
    (c_concat of the slices' gradients, through c_split's gradient c_split) is 2 w m^2 with
    m 1 on the first half of the columns and 2 on the second."""
    main, startup = pd.Program(), pd.Program()
    wv = np.random.default_rng(3).normal(size=(3, 8)).astype("float32")
    with pd.program_guard(main, startup):
        w = pd.data("w", [3, 8])   # no batch dim: every device is fed it whole
        w.stop_gradient = False
        index = ops.cast(ops.c_axis_index(axis_name="model"), dtype="float32")
        part = ops.mul(ops.c_split(w, axis_name="model"), ops.scale(index, bias=1.0))
        joined = ops.c_concat(part, axis_name="model")
        loss = ops.reduce_sum(ops.mul(joined, joined))
        grad, = pd.gradients([loss], [w])
        ops.c_allreduce(loss, axis_name="data")   # makes it run on the mesh
    got, = pd.Executor(mesh=_mesh()).run(main, feed={"w": wv}, fetch_list=[grad])
    m = np.repeat([1.0, 2.0], 4)
    np.testing.assert_allclose(got, 2 * wv * m ** 2, rtol=1e-6)


@four_devices
def test_bad_layouts_are_errors_naming_what_is_wrong(mlp):
    main, startup, loss, _, exe = mlp
    with pytest.raises(pd.ProgramError, match="names mesh axis 'model', which the mesh") as info:
        pd.Executor(mesh=Mesh({"data": 4})).run(startup, scope=pd.Scope())
    assert info.value.var == "fc_0.w_0"
    scope = pd.Scope()
    exe.run(startup, scope=scope)
    before = _persistables(main, scope)
    split = main.global_block().var("fc_0.out")   # a column layer's output: a slice a device
    with pytest.raises(pd.ProgramError, match="split over mesh axis 'model'") as info:
        exe.run(main, feed=_mlp_feeds(1)[0], fetch_list=[loss, split], scope=scope)
    assert info.value.var == "fc_0.out"
    _assert_close(_persistables(main, scope), before, atol=0)   # the scope as it was


def _slice_loss():
    """A column fc's split output reduced without a row fc: each device's own loss."""
    x = pd.data("x", [-1, 4])
    return ops.mean(ops.square(layers.fc(x, 8, tensor_parallel="column")))


def _softmax_loss():
    """Softmax over a column fc's slice of the features: each device normalizes its own."""
    x = pd.data("x", [-1, 4])
    h = ops.softmax(layers.fc(x, 8, tensor_parallel="column"))
    return ops.mean(ops.square(h))


def _slice_state():
    """No loss: a replicated persistable (no annotation) written from a split value."""
    x = pd.data("x", [-1, 4])
    total = create_global_var("total", [], 0.0)
    h = layers.fc(x, 8, tensor_parallel="column")
    pd.default_main_program().global_block().append_op(
        "reduce_sum", {"X": [h]}, {"Out": [total]}, {})
    return total


@four_devices
@pytest.mark.parametrize("model, fetched, var, what", [
    (_slice_loss, True, "mean_0.out", "the loss"),
    (_slice_loss, False, "mean_0.out", "the loss"),      # not fetched: still the loss
    (_softmax_loss, True, "mean_0.out", "the loss"),
    (_slice_state, False, "total", "the persistable"),
])
def test_a_value_that_differs_over_the_model_axis_is_an_error_naming_it(model, fetched, var,
                                                                          what):
    """One device gives the whole layer's loss; on the mesh each device would take its own
    slice's (device 0's, before: the wrong loss and weights, no error)."""
    main, startup = pd.Program(random_seed=1), pd.Program(random_seed=1)
    with pd.program_guard(main, startup):
        out = model()
        if var == "mean_0.out":
            SGD(0.1).minimize(out, data_parallel=True)
    scope = pd.Scope()
    pd.Executor().run(startup, scope=scope)
    before = _persistables(main, scope)
    feed = {"x": np.random.default_rng(0).normal(size=(8, 4)).astype("float32")}
    with pytest.raises(pd.ProgramError, match=f"{what}.* differs between the devices of mesh "
                       "axis 'model'") as info:
        pd.Executor(mesh=_mesh()).run(main, feed=feed, fetch_list=[out] if fetched else [],
                                      scope=scope)
    assert info.value.var == var
    # the op it differs from: the column fc's product with its slice of W
    assert (info.value.op_type, info.value.op_index) == ("matmul", 1)
    _assert_close(_persistables(main, scope), before, atol=0)   # the scope as it was


@four_devices
def test_heads_that_do_not_divide_by_the_model_axis_are_an_error_naming_them():
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [-1, 5, 12])
        loss = ops.mean(layers.multi_head_attention(x, num_heads=3, tensor_parallel=True))
        SGD(0.1).minimize(loss, data_parallel=True)
    scope = pd.Scope()
    pd.Executor().run(startup, scope=scope)
    with pytest.raises(pd.ProgramError, match="num_heads=3 heads over mesh axis 'model' of "
                       "size 2, which does not divide them") as info:
        pd.Executor(mesh=_mesh()).run(main, feed={"x": np.ones((2, 5, 12), "float32")},
                                      fetch_list=[loss], scope=scope)
    assert (info.value.op_type, info.value.op_index) == ("reshape", 3)
    # a mesh without the model axis: it needs one (no data_axis can stand for it)
    with pytest.raises(pd.ProgramError, match=r"layers split over mesh axis 'model' \(tensor "
                       r"parallel\), but the mesh \{'data': 4\} has no axis 'model'"):
        pd.Executor(mesh=Mesh({"data": 4})).run(
            main, feed={"x": np.ones((4, 5, 12), "float32")}, fetch_list=[loss], scope=scope)
