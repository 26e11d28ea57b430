"""Pipeline parallel on 2 and 4 devices: training equals one device, each device holds only
its stage's state, checkpoints load on one device, the transfer op under shard_map, bad input.

The cases need four devices: run from the suite, `test_on_four_host_devices` runs this file
again in a subprocess with four forced CPU devices, as tests/test_distributed_devices.py
does. The reference is the same model built without stages, run on one device without a
mesh (itself checked against Flax + optax in test_training.py).
"""
import os
import re

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import progdesc as pd
from lowering.errors import FeedError, ProgramError
from progdesc import distributed as dist
from progdesc import layers, ops
from progdesc.distributed import Mesh
from progdesc.optimizer import Adam, ClipGradByGlobalNorm
from forced_devices import SELECTIONS, four_devices, run_on_four_host_devices

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("selection", SELECTIONS)
def test_on_four_host_devices(selection):
    run_on_four_host_devices(__file__, selection)


# --- models: `stage(k)` opens the stage of the k-th of `n` pieces, or nothing ---

def _stager(stages, n):
    """stage(k): the context of piece k of n on `stages` stages (None: no stages at all)."""
    import contextlib
    if stages is None:
        return lambda k: contextlib.nullcontext()
    return lambda k: dist.pipeline_stage(k * stages // n)


def _mlp(stages):
    stage = _stager(stages, 4)
    x = pd.data("x", [-1, 12])
    label = pd.data("label", [-1, 1], "int64")
    h = x
    for k in range(3):
        with stage(k):
            h = layers.fc(h, 32, act="relu")
    with stage(3):
        logits = layers.fc(h, 5)
        loss = ops.mean(layers.softmax_with_cross_entropy(logits, label))
        correct = ops.reduce_sum(ops.cast(ops.equal(
            ops.argmax(logits, axis=-1, dtype="int64"), ops.squeeze(label, axes=[-1])),
            dtype="int32"))
    return x, label, loss, [logits, correct]


def _transformer(stages, n_layers=4):
    """The bench's transformer (bench/workloads.py) in a small config: post-norm encoder
    layers, mean pooling, a classifier; stages by layer ranges, the head on the last."""
    stage = _stager(stages, n_layers)
    x = pd.data("x", [-1, 6, 16])
    label = pd.data("label", [-1, 1], "int64")
    h = x
    for k in range(n_layers):
        with stage(k):
            h = layers.transformer_encoder_layer(h, 2, 32, dropout_rate=0.0,
                                                 activation="gelu", is_test=True)
    with stage(n_layers - 1):
        logits = layers.fc(ops.reduce_mean(h, axis=[1]), 10)
        loss = ops.mean(layers.softmax_with_cross_entropy(logits, label))
    return x, label, loss, []


def _batch(model, n=16, seed=0):
    rng = np.random.default_rng(seed)
    shape = (n, 12) if model is _mlp else (n, 6, 16)
    return rng.normal(size=shape).astype("float32"), rng.integers(0, 5, (n, 1))


def _build(model, stages=None, micro_batches=4, schedule="gpipe"):
    main, startup = pd.Program(random_seed=3), pd.Program(random_seed=3)
    with pd.program_guard(main, startup):
        x, label, loss, extra = model(stages)
        if stages is not None:
            dist.pipeline(main, micro_batches, schedule)
        Adam(1e-2).minimize(loss)
    return main, startup, x, label, loss, extra


def _train(model, stages=None, steps=3, schedule="gpipe", micro_batches=4, scope=None,
           fetch_extra=False):
    """(persistables, losses per step, last extra fetches, program, scope) after `steps`
    Adam steps on one batch; on a mesh of `stages` pipe devices when `stages` is given."""
    main, startup, x, label, loss, extra = _build(model, stages, micro_batches, schedule)
    if scope is None:
        scope = pd.Scope()
        pd.Executor().run(startup, scope=scope)
    exe = pd.Executor(mesh=None if stages is None else Mesh({"pipe": stages}))
    bx, by = _batch(model)
    losses, fetched = [], None
    for _ in range(steps):
        fetched = exe.run(main, feed={x: bx, label: by},
                          fetch_list=[loss, *extra] if fetch_extra else [loss], scope=scope)
        losses.append(float(fetched[0]))
    return _persistables(main, scope), losses, fetched[1:], main, scope


def _persistables(program, scope):
    return {v.name: np.asarray(scope.get(v.name)) for v in program.list_vars()
            if v.desc.persistable and v.name in scope}


def _assert_close(got, want, atol=1e-5):
    assert got.keys() == want.keys()
    for name in want:
        if name.endswith(_NOISE):
            continue
        np.testing.assert_allclose(got[name], want[name], atol=atol, rtol=1e-5, err_msg=name)


# A key projection's bias adds the same amount to every score of a softmax row, so its
# gradient is zero but for rounding, which Adam scales up to full-size steps: it (and its
# moments) differ between any two orders of summation, one device or many.
_NOISE = (".key.b_0", ".key.b_0.moment1", ".key.b_0.moment2")
_ONE = {}
_FOUR_STAGES = {}   # (stages, schedule) -> (program, scope) a test trained, for the next


def _one_device(model):
    if model not in _ONE:
        _ONE[model] = _train(model, fetch_extra=True)
    return _ONE[model]


# --- training equals one device ---

@four_devices
@pytest.mark.parametrize("stages,schedule", [
    (4, "gpipe"),
    pytest.param(2, "gpipe", marks=pytest.mark.slow),
    pytest.param(2, "1f1b", marks=pytest.mark.slow),
    pytest.param(4, "1f1b", marks=pytest.mark.slow)])
def test_mlp_pipeline_trains_like_one_device(stages, schedule):
    want, want_losses, (logits1, correct1), _, _ = _one_device(_mlp)
    got, losses, (logits, correct), main, scope = _train(_mlp, stages, schedule=schedule,
                                                         fetch_extra=True)
    _FOUR_STAGES.setdefault((stages, schedule), (main, scope))
    _assert_close(got, want)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
    # per-example logits come back as one array over the batch, a count summed
    np.testing.assert_allclose(logits, logits1, atol=1e-5)
    assert correct == correct1
    # each parameter and its Adam moments live on its stage's device only
    devices = jax.devices()[:stages]
    for name in ("fc_0.w_0", "fc_0.w_0.moment1", "fc_3.b_0", "fc_3.b_0.moment2"):
        stage = int(name[3]) * stages // 4
        assert scope.get(name).devices() == {devices[stage]}, name


def _transformer2(stages):
    return _transformer(stages, n_layers=2)


@four_devices
@pytest.mark.parametrize("model,stages,schedule", [
    (_transformer2, 2, "1f1b"),
    pytest.param(_transformer, 2, "gpipe", marks=pytest.mark.slow),
    pytest.param(_transformer, 4, "gpipe", marks=pytest.mark.slow),
    pytest.param(_transformer, 4, "1f1b", marks=pytest.mark.slow)])
def test_transformer_pipeline_trains_like_one_device(model, stages, schedule):
    want, want_losses, _, _, _ = _one_device(model)
    got, losses, _, _, _ = _train(model, stages, schedule=schedule)
    _assert_close(got, want)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5)


@four_devices
def test_a_four_stage_checkpoint_loads_and_trains_on_one_device(tmp_path):
    main, scope4 = _FOUR_STAGES.get((4, "gpipe")) or _train(_mlp, 4)[3:]
    path = str(tmp_path / "ckpt.safetensors")
    pd.io.save_checkpoint(path, main, scope4)
    scope = pd.Scope()
    pd.io.load_checkpoint(path, main, scope)
    for name, value in _persistables(main, scope4).items():
        np.testing.assert_array_equal(np.asarray(scope.get(name)), value, err_msg=name)
    after1, _, _, _, _ = _train(_mlp, None, steps=1, scope=scope)   # one device, no mesh
    after4, _, _, _, _ = _train(_mlp, 4, steps=1, scope=scope4)
    _assert_close(after1, after4)


@four_devices
@pytest.mark.slow
def test_several_steps_in_one_call_match_one_call_each():
    want, want_losses, _, _, _ = _train(_mlp, 2, steps=3)
    main, startup, x, label, loss, _ = _build(_mlp, 2)
    scope = pd.Scope()
    pd.Executor().run(startup, scope=scope)
    bx, by = _batch(_mlp)
    (losses,) = pd.Executor(mesh=Mesh({"pipe": 2})).run(
        main, feed={x: np.stack([bx] * 3), label: np.stack([by] * 3)}, fetch_list=[loss],
        scope=scope, steps=3)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-6)
    _assert_close(_persistables(main, scope), want, atol=1e-6)


@four_devices
@pytest.mark.slow
def test_the_readme_example_as_written_trains_like_one_device():
    readme = open(os.path.join(ROOT, "README.md")).read()
    section = readme[readme.index("### Pipelines"):]
    code = re.findall(r"```python\n(.*?)```", section, re.S)[0]
    bx, by = _batch(_mlp)
    got = []
    for mesh in (True, False):
        main, startup = pd.Program(random_seed=3), pd.Program(random_seed=3)
        with pd.program_guard(main, startup):
            x = pd.data("x", [-1, 12])
            label = pd.data("label", [-1, 1], "int64")
            names = dict(pd=pd, layers=layers, ops=ops, Adam=Adam, x=x, label=label, main=main)
            exec(code, names)   # noqa: S102  (the README's own code)
        exe = names["exe"] if mesh else pd.Executor()
        scope = pd.Scope()
        pd.Executor().run(startup, scope=scope)
        for _ in range(2):
            exe.run(main, feed={x: bx, label: by}, fetch_list=[names["loss"]], scope=scope)
        got.append(_persistables(main, scope))
    _assert_close(*got)


@four_devices
@pytest.mark.slow
def test_a_test_clone_runs_forward_only_through_the_stages():
    main, startup, x, label, loss, (logits, _) = _build(_mlp, 2)
    test = main.clone(for_test=True)
    scope = pd.Scope()
    pd.Executor().run(startup, scope=scope)
    feed = dict(zip((x, label), _batch(_mlp)))
    want = pd.Executor().run(test, feed=feed, fetch_list=[logits, loss], scope=scope)
    got = pd.Executor(mesh=Mesh({"pipe": 2})).run(test, feed=feed, fetch_list=[logits, loss],
                                                  scope=scope)
    np.testing.assert_allclose(got[0], want[0], atol=1e-6)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-6)


# --- the transfer op on a mapped axis ---

@four_devices
def test_c_ppermute_moves_values_one_stage_on_and_its_gradient_back():
    from lowering import registry
    mesh = Mesh({"pipe": 4})
    lower = registry.get("c_ppermute").lower
    x = np.arange(4 * 3, dtype="float32").reshape(4, 3) + 1
    got = _mapped(lambda v: lower(X=v, axis_name="pipe", shift=1), x, mesh)
    want = np.concatenate([np.zeros((1, 3), "float32"), x[:-1]])   # device i gets i - 1's
    np.testing.assert_array_equal(got, want)
    # the gradient maker's op (read from a program's backward pass) is JAX's vjp of it
    main = pd.Program()
    with pd.program_guard(main, pd.Program()):
        v = pd.data("v", [4, 3])
        v.stop_gradient = False
        out = main.global_block().create_var(name="moved", shape=[4, 3], dtype="float32")
        main.global_block().append_op("c_ppermute", {"X": v}, {"Out": out}, {"shift": 1})
        pd.gradients(ops.reduce_sum(out), [v])
    (grad_op,) = [op for op in main.global_block().ops
                  if op.type == "c_ppermute" and op.desc.role != 0]
    cot = np.random.default_rng(0).normal(size=(4, 3)).astype("float32")
    back = _mapped(lambda c: lower(X=c, axis_name="pipe", shift=grad_op.attr("shift")), cot,
                   mesh)

    def vjp(value, c):
        return jax.vjp(lambda u: lower(X=u, axis_name="pipe", shift=1), value)[1](c)[0]
    ref = jax.jit(jax.shard_map(vjp, mesh=mesh.jax_mesh, in_specs=(P("pipe"), P("pipe")),
                                out_specs=P("pipe")))(x, cot)
    np.testing.assert_allclose(back, ref, rtol=1e-6)


def _mapped(fn, value, mesh):
    return jax.jit(jax.shard_map(fn, mesh=mesh.jax_mesh, in_specs=P("pipe"),
                                 out_specs=P("pipe")))(value)


# --- bad input ---

@four_devices
def test_a_mesh_that_does_not_fit_and_a_batch_that_does_not_split_are_errors():
    main, startup, x, label, loss, _ = _build(_mlp, 2)
    scope = pd.Scope()
    pd.Executor().run(startup, scope=scope)
    before = _persistables(main, scope)
    bx, by = _batch(_mlp)
    for mesh in (Mesh({"pipe": 4}), Mesh({"data": 2}), Mesh({"pipe": 2, "data": 2})):
        with pytest.raises(ProgramError, match="pipe"):
            pd.Executor(mesh=mesh).run(main, feed={x: bx, label: by}, fetch_list=[loss],
                                       scope=scope)
    with pytest.raises(FeedError, match="micro-batches") as e:
        pd.Executor(mesh=Mesh({"pipe": 2})).run(main, feed={x: bx[:6], label: by[:6]},
                                                fetch_list=[loss], scope=scope)
    assert e.value.var == "x"
    _assert_close(_persistables(main, scope), before, atol=0)   # nothing written
    # clipping by the global norm reads every stage's gradients: refused, naming the op
    clipped = pd.Program()
    with pd.program_guard(clipped, pd.Program()):
        cx, clabel, closs, _ = _mlp(2)
        dist.pipeline(clipped, 2)
        Adam(1e-2, grad_clip=ClipGradByGlobalNorm(1.0)).minimize(closs)
    with pytest.raises(ProgramError, match="stages \\[0, 1\\]") as e:
        pd.Executor(mesh=Mesh({"pipe": 2})).run(clipped, feed={cx: bx, clabel: by},
                                                fetch_list=[closs], scope=pd.Scope())
    assert e.value.op_type is not None
    # stages marked, the pass forgotten: not silently run whole on every device
    plain = pd.Program()
    with pd.program_guard(plain, pd.Program()):
        v = pd.data("v", [-1, 4])
        with dist.pipeline_stage(1):
            out = ops.scale(v, scale=2.0)
    with pytest.raises(ProgramError, match="not a pipeline"):
        pd.Executor(mesh=Mesh({"pipe": 2})).run(plain, feed={v: np.ones((2, 4), "f")},
                                                fetch_list=[out])
