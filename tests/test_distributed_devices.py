"""progdesc.distributed on four devices: data parallel, sharded layouts, checkpoints across
layouts, bad input.

The cases need four devices. Run from the suite, `test_on_four_host_devices` runs this
file again in one subprocess with four forced CPU devices
(XLA_FLAGS=--xla_force_host_platform_device_count=4), where the cases run and the test
runs nothing; the reference everywhere is the same program run on one device without a
mesh (itself checked against Flax + optax in test_training.py).
"""

import jax
import numpy as np
import pytest

import progdesc as pd
from progdesc import ParamAttr, layers, ops
from progdesc.distributed import Mesh
from progdesc.optimizer import SGD, Adam
from forced_devices import SELECTIONS, four_devices, run_on_four_host_devices


@pytest.mark.parametrize("selection", SELECTIONS)
def test_on_four_host_devices(selection):
    run_on_four_host_devices(__file__, selection)


# --- models ---

def _mlp(shard_params=False):
    w = ParamAttr(sharding=("data", None)) if shard_params else None
    b = ParamAttr(sharding=("data",)) if shard_params else None
    x = pd.data("x", [-1, 64])
    label = pd.data("label", [-1, 1], "int64")
    h = layers.fc(x, 128, act="relu", param_attr=w, bias_attr=b)
    h = layers.fc(h, 128, act="relu", param_attr=w, bias_attr=b)
    logits = layers.fc(h, 12, param_attr=w, bias_attr=b)
    loss = ops.mean(layers.softmax_with_cross_entropy(logits, label))
    hits = ops.equal(ops.argmax(logits, axis=-1, dtype="int64"), ops.squeeze(label, axes=[-1]))
    correct = ops.reduce_sum(ops.cast(hits, dtype="int32"))
    return x, label, logits, loss, layers.accuracy(logits, label), correct


def _cnn(sync):
    x = pd.data("x", [-1, 3, 8, 8])
    label = pd.data("label", [-1, 1], "int64")
    # no conv bias: batch_norm cancels it, its gradient is rounding noise that Adam amplifies
    h = layers.conv2d(x, 8, 3, padding=1, bias_attr=False)
    h = layers.batch_norm(h, act="relu", sync_axis="data" if sync else "")
    h = layers.pool2d(h, 2)
    logits = layers.fc(h, 10)
    loss = ops.mean(layers.softmax_with_cross_entropy(logits, label))
    return x, label, logits, loss


def _batch(n=16, image=False, seed=0):
    rng = np.random.default_rng(seed)
    shape = (n, 3, 8, 8) if image else (n, 64)
    return rng.normal(size=shape).astype("float32"), rng.integers(0, 10, (n, 1))


def _train(model, mesh=None, data_parallel=False, steps=5, batch=None, scope=None,
           fetch_logits=False):
    """Build `model`, train it `steps` Adam steps on one batch; returns (persistables, last
    fetched values, main program, scope)."""
    main, startup = pd.Program(random_seed=3), pd.Program(random_seed=3)
    with pd.program_guard(main, startup):
        x, label, logits, loss, *metrics = model()
        Adam(1e-2).minimize(loss, data_parallel=data_parallel)
    exe = pd.Executor(mesh=mesh)
    fresh = scope is None
    scope = scope or pd.Scope()
    if fresh:
        exe.run(startup, scope=scope)
    bx, by = batch if batch is not None else _batch()
    fetched = None
    for _ in range(steps):
        fetched = exe.run(main, feed={x: bx, label: by},
                          fetch_list=[loss, logits, *metrics] if fetch_logits else [loss],
                          scope=scope)
    return _persistables(main, scope), fetched, main, scope


def _persistables(program, scope):
    return {v.name: np.asarray(scope.get(v.name)) for v in program.list_vars()
            if v.desc.persistable and v.name in scope and v.name != "@RNG_STATE@"}


def _assert_close(got, want, atol=1e-5):
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_allclose(got[name], want[name], atol=atol, rtol=1e-5, err_msg=name)


# --- data parallel ---

@four_devices
def test_data_parallel_mlp_matches_one_device():
    want, (loss1, logits1, acc1, correct1), _, _ = _train(_mlp, fetch_logits=True)
    got, (loss4, logits4, acc4, correct4), main, scope = _train(
        _mlp, Mesh({"data": 4}), data_parallel=True, fetch_logits=True)
    _assert_close(got, want)
    # the loss comes back as the mean over the global batch, logits as one global array,
    # a float metric averaged and an integer count summed over the devices
    np.testing.assert_allclose(loss4, loss1, rtol=1e-5)
    assert logits4.shape == (16, 12)
    np.testing.assert_allclose(logits4, logits1, atol=1e-5)
    np.testing.assert_allclose(acc4, acc1, rtol=1e-6)
    assert correct4 == correct1 == round(float(acc1) * 16) and correct1 > 0
    # parameters stay replicated on the four devices
    w = scope.get("fc_0.w_0")
    assert len(w.sharding.device_set) == 4 and w.sharding.is_fully_replicated


@four_devices
def test_data_parallel_cnn_with_synchronised_batch_norm_matches_one_device():
    batch = _batch(image=True)
    want, _, _, _ = _train(lambda: _cnn(sync=True), batch=batch)
    got, _, _, _ = _train(lambda: _cnn(sync=True), Mesh({"data": 4}), data_parallel=True,
                          batch=batch)
    _assert_close(got, want)   # running mean and variance included: global-batch statistics


def _gather_conv_window():
    """Ops whose gradient ops are lowered through jax.vjp (gather_general, conv_general_dilated,
    reduce_window, as from_jax makes them), fed by parameters."""
    ids = pd.data("ids", [-1, 3, 1], "int32")
    label = pd.data("label", [-1, 1], "int64")
    table = pd.create_parameter([10, 4], attr="table")
    rows = ops.gather_general(table, ids, offset_dims=[2], collapsed_slice_dims=[0],
                              start_index_map=[0], slice_sizes=[1, 4], mode="clip")
    kernel = pd.create_parameter([2, 1, 2, 2], attr="kernel")
    h = ops.conv_general_dilated(ops.reshape(rows, shape=[-1, 1, 3, 4]), kernel,
                                 lhs_spec=[0, 1, 2, 3], rhs_spec=[0, 1, 2, 3],
                                 out_spec=[0, 1, 2, 3])
    h = ops.reduce_window(h, computation="max", window_dimensions=[1, 1, 2, 2])
    logits = layers.fc(ops.reshape(h, shape=[-1, 4]), 5)
    return ids, label, logits, ops.mean(layers.softmax_with_cross_entropy(logits, label))


@four_devices
def test_gradients_lowered_through_vjp_are_per_device_parts():
    # SGD, not Adam: Adam's update hardly changes when every gradient is scaled by 4
    def train(mesh):
        main, startup = pd.Program(random_seed=3), pd.Program(random_seed=3)
        with pd.program_guard(main, startup):
            ids, label, _, loss = _gather_conv_window()
            SGD(0.5).minimize(loss, data_parallel=mesh is not None)
        exe, scope = pd.Executor(mesh=mesh), pd.Scope()
        exe.run(startup, scope=scope)
        rng = np.random.default_rng(0)
        feed = {ids: rng.integers(0, 10, (8, 3, 1)).astype(np.int32),
                label: rng.integers(0, 5, (8, 1))}
        for _ in range(3):
            exe.run(main, feed=feed, fetch_list=[loss], scope=scope)
        return _persistables(main, scope)

    _assert_close(train(Mesh({"data": 4})), train(None))


def _train_fp16(mesh, batch):
    """Two float16 steps with dynamic loss scaling; (persistables, found_inf per step)."""
    main, startup = pd.Program(random_seed=3), pd.Program(random_seed=3)
    with pd.program_guard(main, startup):
        x, label, _, loss, *_ = _mlp()
        opt = pd.amp.decorate(SGD(0.1), dtype="float16")
        opt.minimize(loss, data_parallel=mesh is not None)
    exe, scope = pd.Executor(mesh=mesh), pd.Scope()
    exe.run(startup, scope=scope)
    before = _persistables(main, scope)
    found = []
    for bx, by in batch:
        found.append(bool(exe.run(main, feed={x: bx, label: by},
                                  fetch_list=[opt.loss_scaler.found_inf], scope=scope)[0]))
    return before, _persistables(main, scope), found, scope


@four_devices
def test_float16_data_parallel_skips_a_step_on_every_device_when_one_overflows():
    good = _batch()
    bad = (good[0].copy(), good[1])
    bad[0][13] = 6e4            # row 13 is on the fourth device: its float16 gradients overflow
    _, got, found4, _ = _train_fp16(Mesh({"data": 4}), [bad, good])
    _, want, found1, _ = _train_fp16(None, [bad, good])
    assert found4 == found1 == [True, False]
    _assert_close(got, want)
    start, _, _, scope = _train_fp16(Mesh({"data": 4}), [bad])
    for name in [n for n in start if n.endswith((".w_0", ".b_0"))]:
        shards = scope.get(name).addressable_shards
        assert len(shards) == 4
        for shard in shards:   # the bad step changed no parameter, on any device
            np.testing.assert_array_equal(np.asarray(shard.data), start[name], err_msg=name)


@four_devices
@pytest.mark.slow
def test_unsynchronised_batch_norm_uses_per_device_statistics():
    batch = _batch(image=True)
    want, _, _, _ = _train(lambda: _cnn(sync=True), Mesh({"data": 4}), data_parallel=True,
                           batch=batch, steps=1)
    got, _, _, _ = _train(lambda: _cnn(sync=False), Mesh({"data": 4}), data_parallel=True,
                          batch=batch, steps=1)
    # per-device batches of 4 normalise differently: the updated weights differ
    assert not np.allclose(got["conv2d_0.w_0"], want["conv2d_0.w_0"], atol=1e-6)
    # the running mean is averaged over the devices: the mean of the four local means is
    # the global mean, so it agrees with the synchronised run
    np.testing.assert_allclose(got["batch_norm_0.w_1"], want["batch_norm_0.w_1"], atol=1e-6)


@four_devices
@pytest.mark.slow
def test_data_parallel_runs_several_steps_in_one_call():
    want, _, _, _ = _train(_mlp, steps=3)
    main, startup = pd.Program(random_seed=3), pd.Program(random_seed=3)
    with pd.program_guard(main, startup):
        x, label, _, loss, *_ = _mlp()
        Adam(1e-2).minimize(loss, data_parallel=True)
    exe, scope = pd.Executor(mesh=Mesh({"data": 4})), pd.Scope()
    exe.run(startup, scope=scope)
    bx, by = _batch()
    losses, = exe.run(main, feed={x: np.stack([bx] * 3), label: np.stack([by] * 3)},
                      fetch_list=[loss], scope=scope, steps=3)
    assert losses.shape == (3,)
    _assert_close(_persistables(main, scope), want)


# --- sharded layouts ---

@four_devices
def test_fsdp_matches_one_device_with_a_quarter_of_the_argument_bytes():
    want, _, _, _ = _train(lambda: _mlp(shard_params=True))   # no mesh: annotations unused
    exe_scope = {}
    for n in (1, 4):
        mesh = Mesh({"data": n})
        main, startup = pd.Program(random_seed=3), pd.Program(random_seed=3)
        with pd.program_guard(main, startup):
            x, label, _, loss, *_ = _mlp(shard_params=True)
            Adam(1e-2).minimize(loss)
        exe, scope = pd.Executor(mesh=mesh), pd.Scope()
        exe.run(startup, scope=scope)
        bx, by = _batch()
        for _ in range(5):
            exe.run(main, feed={x: bx, label: by}, fetch_list=[loss], scope=scope)
        exe_scope[n] = exe, main, scope
    exe4, main4, scope4 = exe_scope[4]
    _assert_close(_persistables(main4, scope4), want)
    moment = scope4.get("fc_0.w_0.moment1")   # optimizer state follows its parameter
    assert tuple(moment.sharding.spec) == ("data", None)
    assert moment.addressable_shards[0].data.shape == (16, 128)

    def argument_bytes(exe, main):
        (entry,) = [e for e in exe._entries.values() if e.fetch_names]
        return entry.compiled.memory_analysis().argument_size_in_bytes

    ratio = argument_bytes(exe4, main4) / argument_bytes(*exe_scope[1][:2])
    assert 0.24 < ratio < 0.27, ratio


@four_devices
@pytest.mark.slow
def test_tensor_parallel_on_a_two_by_two_mesh_matches_one_device():
    def model(parallel):
        x = pd.data("x", [-1, 64])
        label = pd.data("label", [-1, 1], "int64")
        cols = ParamAttr(sharding=(None, "model")) if parallel else None
        rows = ParamAttr(sharding=("model", None)) if parallel else None
        h = layers.fc(x, 128, act="relu", param_attr=cols,
                      bias_attr=ParamAttr(sharding=("model",)) if parallel else None)
        logits = layers.fc(h, 12, param_attr=rows)
        loss = ops.mean(layers.softmax_with_cross_entropy(logits, label))
        return x, label, logits, loss

    want, _, _, _ = _train(lambda: model(False))
    got, _, main, scope = _train(lambda: model(True), Mesh({"data": 2, "model": 2}))
    _assert_close(got, want)
    assert tuple(scope.get("fc_0.w_0").sharding.spec) == (None, "model")


# --- checkpoints across layouts ---

@four_devices
def test_checkpoint_of_a_sharded_run_loads_into_one_and_two_devices(tmp_path):
    _, _, main, scope4 = _train(lambda: _mlp(shard_params=True), Mesh({"data": 4}), steps=2)
    saved = _persistables(main, scope4)
    path = str(tmp_path / "ckpt.safetensors")
    pd.io.save_checkpoint(path, main, scope4)
    after = {}
    for n in (1, 2, 4):
        scope = pd.Scope()
        pd.io.load_checkpoint(path, main, scope)
        for name, value in saved.items():   # identical values, whatever the layout saved
            np.testing.assert_array_equal(np.asarray(scope.get(name)), value, err_msg=name)
        mesh = None if n == 1 else Mesh({"data": n})
        after[n], _, _, _ = _train(lambda: _mlp(shard_params=True), mesh, steps=1, scope=scope)
    _assert_close(after[1], after[4])
    _assert_close(after[2], after[4])


@four_devices
@pytest.mark.slow
def test_one_scope_moves_between_layouts():
    want, _, _, _ = _train(lambda: _mlp(shard_params=True), steps=4)
    main, startup = pd.Program(random_seed=3), pd.Program(random_seed=3)
    with pd.program_guard(main, startup):
        x, label, _, loss, *_ = _mlp(shard_params=True)
        Adam(1e-2).minimize(loss)
    four, two, scope = Mesh({"data": 4}), Mesh({"data": 2}), pd.Scope()
    four, two = pd.Executor(mesh=four), pd.Executor(mesh=two)
    four.run(startup, scope=scope)
    feed = dict(zip((x, label), _batch()))
    four.run(main, feed=feed, fetch_list=[loss], scope=scope)
    four.run(main, feed=feed, fetch_list=[loss], scope=scope)
    two.run(main, feed=feed, fetch_list=[loss], scope=scope)
    assert len(scope.get("fc_0.w_0").sharding.device_set) == 2
    four.run(main, feed=feed, fetch_list=[loss], scope=scope)  # and back, on its fast path
    assert len(scope.get("fc_0.w_0").sharding.device_set) == 4
    _assert_close(_persistables(main, scope), want)


# --- bad input ---

def _dp_program(model=_mlp):
    main, startup = pd.Program(random_seed=3), pd.Program(random_seed=3)
    with pd.program_guard(main, startup):
        x, label, _, loss, *_ = model()
        Adam(1e-2).minimize(loss, data_parallel=True)
    return main, startup, x, label, loss


@four_devices
def test_a_batch_that_does_not_divide_by_the_data_axis_is_a_feed_error():
    main, startup, x, label, loss = _dp_program()
    exe, scope = pd.Executor(mesh=Mesh({"data": 4})), pd.Scope()
    exe.run(startup, scope=scope)
    before = _persistables(main, scope)
    bx, by = _batch(10)
    with pytest.raises(pd.FeedError) as info:
        exe.run(main, feed={x: bx, label: by}, fetch_list=[loss], scope=scope)
    assert "a fed batch of 10 does not divide by the 4 devices of mesh axis 'data'" in str(
        info.value)
    assert info.value.var in ("x", "label")
    _assert_close(_persistables(main, scope), before, atol=0)


@four_devices
@pytest.mark.parametrize("spec, expect", [
    (("model", None), "names mesh axis 'model', which the mesh {'data': 4} does not have"),
    ((None, "data"), "splits dim 1 of size 6 over mesh axis 'data' of size 4, which does not "
                     "divide it"),
])
def test_a_sharding_that_does_not_fit_the_mesh_is_an_error_naming_the_variable(spec, expect):
    main, startup = pd.Program(random_seed=3), pd.Program(random_seed=3)
    with pd.program_guard(main, startup):
        x = pd.data("x", [-1, 8])
        y = layers.fc(x, 6, param_attr=ParamAttr(name="w", sharding=spec))
        loss = ops.mean(y)
    exe, scope = pd.Executor(mesh=Mesh({"data": 4})), pd.Scope()
    with pytest.raises(pd.ProgramError) as info:
        exe.run(startup, scope=scope)   # compiling the startup program already refuses it
    assert info.value.var == "w" and expect in str(info.value)
    assert "w" not in scope


@four_devices
def test_a_data_parallel_program_needs_the_data_axis_and_replicated_state():
    main, startup, x, label, loss = _dp_program()
    exe, scope = pd.Executor(mesh=Mesh({"batch": 4})), pd.Scope()
    exe.run(startup, scope=scope)   # no collectives: it runs
    with pytest.raises(pd.ProgramError, match="has no data axis 'data'"):
        exe.run(main, feed=dict(zip((x, label), _batch())), fetch_list=[loss], scope=scope)
    exe = pd.Executor(mesh=Mesh({"batch": 4}, data_axis="batch"))
    with pytest.raises(pd.ProgramError, match="communicates over mesh axis 'data', but runs "
                                              "data parallel over the mesh's data axis 'batch'"):
        exe.run(main, feed=dict(zip((x, label), _batch())), fetch_list=[loss], scope=scope)
    main, startup, x, label, loss = _dp_program(lambda: _mlp(shard_params=True))
    exe, scope = pd.Executor(mesh=Mesh({"data": 4})), pd.Scope()
    exe.run(startup, scope=scope)
    with pytest.raises(pd.ProgramError, match="keeps every persistable replicated") as info:
        exe.run(main, feed=dict(zip((x, label), _batch())), fetch_list=[loss], scope=scope)
    assert info.value.var == "fc_0.w_0"


@four_devices
def test_each_device_draws_its_own_dropout_mask_and_the_rng_state_advances_as_on_one():
    states = {}
    for mesh in (None, Mesh({"data": 4})):
        main, startup = pd.Program(random_seed=5), pd.Program(random_seed=5)
        with pd.program_guard(main, startup):
            x = pd.data("x", [-1, 64])
            y = layers.dropout(layers.fc(x, 64), 0.5)
            Adam(1e-2).minimize(ops.mean(y), data_parallel=True)
        exe, scope = pd.Executor(mesh=mesh), pd.Scope()
        exe.run(startup, scope=scope)
        same_rows = np.tile(np.ones((2, 64), "float32"), (4, 1))   # every device gets these
        out, = exe.run(main, feed={x: same_rows}, fetch_list=[y], scope=scope)
        states[mesh is None] = np.asarray(scope.get("@RNG_STATE@"))
    shares = (out == 0).reshape(4, 2, 64)
    assert len({share.tobytes() for share in shares}) == 4
    np.testing.assert_array_equal(states[False], states[True])


# --- collectives of an imported function (from_jax's axis_names) ---

@four_devices
def test_imported_collectives_reduce_across_the_devices_of_the_mapped_axis():
    from flax import linen as nn
    from jax import lax

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.BatchNorm(use_running_average=False, axis_name="batch", momentum=0.5)(
                nn.Dense(6)(x))
            return nn.Dense(2)(x) - lax.pmean(x.mean(), "batch")

    x = np.random.default_rng(4).normal(size=(16, 4)).astype(np.float32)
    net = Net()
    shards = x.reshape(4, 4, 4)   # what each of the four devices gets
    variables = jax.vmap(lambda v: net.init(jax.random.key(0), v), axis_name="batch")(shards)
    variables = jax.tree_util.tree_map(lambda v: v[0], variables)
    want, updates = jax.vmap(lambda v: net.apply(variables, v, mutable=["batch_stats"]),
                             axis_name="batch")(shards)
    scope = pd.Scope()
    program, _, fetch = pd.from_flax(net, variables, x, scope=scope,
                                     axis_names={"batch": "data"})
    got, = pd.Executor(mesh=Mesh({"data": 4})).run(program, feed={"x": x}, fetch_list=fetch,
                                                   scope=scope)
    np.testing.assert_allclose(got, np.asarray(want).reshape(16, 2), rtol=1e-5, atol=1e-5)
    mean = updates["batch_stats"]["BatchNorm_0"]["mean"][0]   # the same on every device
    np.testing.assert_allclose(scope.get("BatchNorm_0.mean"), mean, rtol=1e-5, atol=1e-6)
