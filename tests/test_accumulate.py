"""Gradient accumulation (progdesc/distributed/accumulate.py): k runs on k micro-batches make
the update that one step on their whole batch makes.

References: the same MLP written in JAX, trained with optax (SGD, Adam) on the whole
batch, from the progdesc program's initial parameters; for AMP the loss-scale arithmetic
and the skipped update worked out by hand; for data parallel, the JAX reference on one
device, the accumulated program on four forced host devices (a subprocess with
XLA_FLAGS=--xla_force_host_platform_device_count=4, as tests/test_distributed_devices.py).
"""
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import progdesc as pd
from lowering.errors import ProgramError
from progdesc import amp, io, layers, ops
from progdesc.distributed import Mesh, accumulate_gradients
from progdesc.optimizer import SGD, Adam, ClipGradByGlobalNorm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PARAMS = ("fc_0.w_0", "fc_0.b_0", "fc_1.w_0", "fc_1.b_0")
K, BATCH, LR = 4, 32, 0.01
FOUR = jax.device_count() >= 4


def _batches(n, seed=0, batch=BATCH):
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(batch, 8)).astype("float32"), rng.integers(0, 3, (batch, 1)))
            for _ in range(n)]


def _build(optimizer, how="minimize", steps=K, data_parallel=False, dtype=None, **scaling):
    """(main, startup, loss, optimizer) of a 2-layer MLP trained by `optimizer`, accumulated
    over `steps` runs by minimize's argument ("minimize") or the pass ("pass")."""
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [-1, 8])
        label = pd.data("label", [-1, 1], "int64")
        h = layers.fc(x, 16, act="relu")
        loss = ops.mean(layers.softmax_with_cross_entropy(layers.fc(h, 3), label))
        if dtype:
            optimizer = amp.decorate(optimizer, dtype, **scaling)
        if how == "minimize":
            optimizer.minimize(loss, data_parallel=data_parallel, accumulate_steps=steps)
        else:
            optimizer.minimize(loss, data_parallel=data_parallel)
            accumulate_gradients(main, steps, startup)
    return main, startup, loss, optimizer


def _micro_batches(batches, k=K):
    """Each batch cut into k micro-batches, in order."""
    return [(x[i::k], y[i::k]) for x, y in batches for i in range(k)]


def _run(main, startup, feeds, exe=None, scope=None, fetch=()):
    exe, scope = exe or pd.Executor(), scope or pd.Scope()
    if "fc_0.w_0" not in scope:
        exe.run(startup, scope=scope)
    out = [exe.run(main, feed={"x": x, "label": y}, fetch_list=list(fetch), scope=scope)
           for x, y in feeds]
    return scope, out


def _values(scope, names=PARAMS):
    return {n: np.asarray(scope.get(n)) for n in names}


def _reference(initial, batches, tx):
    """The MLP in JAX, one optax step per whole batch, from `initial` parameters."""
    def loss_fn(p, x, y):
        h = jax.nn.relu(x @ p["fc_0.w_0"] + p["fc_0.b_0"])
        logits = h @ p["fc_1.w_0"] + p["fc_1.b_0"]
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y, axis=1))

    params = {n: jnp.asarray(v) for n, v in initial.items()}
    state = tx.init(params)
    for x, y in batches:
        updates, state = tx.update(jax.grad(loss_fn)(params, x, y), state, params)
        params = optax.apply_updates(params, updates)
    return {n: np.asarray(v) for n, v in params.items()}


def _initial(startup):
    exe, scope = pd.Executor(), pd.Scope()
    exe.run(startup, scope=scope)
    return _values(scope)


def _assert_close(got, want, atol=1e-6):
    for n in want:
        np.testing.assert_allclose(got[n], want[n], rtol=0, atol=atol, err_msg=n)


# --- k micro-batches make the step of their whole batch ---

@pytest.mark.parametrize("name,how", [("sgd", "pass"),   # SGD: Adam hides a wrong 1/k
                                      pytest.param("adam", "pass", marks=pytest.mark.slow),
                                      pytest.param("adam", "minimize", marks=pytest.mark.slow),
                                      pytest.param("sgd", "minimize", marks=pytest.mark.slow),
                                      pytest.param("clipped", "minimize",
                                                   marks=pytest.mark.slow)])
def test_micro_batches_make_the_whole_batch_step(name, how):
    make = {"sgd": (SGD, optax.sgd), "adam": (Adam, optax.adam),   # clipping: of the mean
            "clipped": (lambda lr: Adam(lr, grad_clip=ClipGradByGlobalNorm(0.05)),
                        lambda lr: optax.chain(optax.clip_by_global_norm(0.05), optax.adam(lr)))
            }[name]
    main, startup, _, _ = _build(make[0](LR), how)
    batches = _batches(3)
    scope, _ = _run(main, startup, _micro_batches(batches))
    want = _reference(_initial(startup), batches, make[1](LR))
    _assert_close(_values(scope), want)
    assert int(np.asarray(scope.get("@ACCUMULATE_STEP@")).item()) == 0
    if name != "sgd":   # Adam's step count (its bias correction) counts updates only
        assert int(np.asarray(scope.get("@LR_STEP@")).item()) == 3


def test_readme_example():
    section = open(os.path.join(ROOT, "README.md")).read().split("### Gradient accumulation")[1]
    example = re.findall(r"```python\n(.*?)```", section, re.S)[0]
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [-1, 8])
        label = pd.data("label", [-1, 1], "int64")
        loss = ops.mean(layers.softmax_with_cross_entropy(
            layers.fc(layers.fc(x, 16, act="relu"), 3), label))
    initial = _initial(startup)
    (x, y), = _batches(1, batch=128)
    scope = pd.Scope()
    with pd.program_guard(main, startup), pd.scope_guard(scope):
        exec(example, {"Adam": Adam, "loss": loss, "exe": pd.Executor(), "main": main,  # noqa: S102
                       "startup": startup, "x": x, "y": y})
    _assert_close(_values(scope), _reference(initial, [(x, y)], optax.adam(1e-3)))
    assert int(np.asarray(scope.get("@LR_STEP@")).item()) == 1


def test_parameters_change_only_on_the_kth_run_and_resume_mid_accumulation(tmp_path):
    main, startup, _, _ = _build(Adam(LR))
    feeds = _micro_batches(_batches(2))
    initial = _initial(startup)
    exe = pd.Executor()
    scope, _ = _run(main, startup, feeds[:K - 1], exe)
    for n, v in _values(scope).items():   # three runs in: nothing updated yet
        np.testing.assert_array_equal(v, initial[n])
    scope, _ = _run(main, startup, feeds[K - 1:K + 2], exe, scope)   # 2 runs into update 2
    path = str(tmp_path / "mid.safetensors")
    io.save_checkpoint(path, main, scope)
    uninterrupted, _ = _run(main, startup, feeds[K + 2:], exe, scope)
    resumed = pd.Scope()
    exe.run(startup, scope=resumed)
    io.load_checkpoint(path, main, resumed)
    resumed, _ = _run(main, startup, feeds[K + 2:], pd.Executor(), resumed)
    names = io.persistable_vars(main)
    assert "fc_0.w_0.accumulated_grad" in names and "@ACCUMULATE_STEP@" in names
    for n in names:
        np.testing.assert_array_equal(np.asarray(resumed.get(n)),
                                      np.asarray(uninterrupted.get(n)), err_msg=n)


# --- AMP: an overflow in any micro-batch skips the update ---

def test_amp_overflow_in_one_micro_batch_skips_the_update():
    init_scale = 2.0 ** 10
    main, startup, _, opt = _build(SGD(LR), dtype="float16", init_loss_scaling=init_scale,
                                   incr_every_n_steps=2, decr_every_n_nan_or_inf=1)
    scaler = opt.loss_scaler
    state = (scaler.scale.name, scaler.good_steps.name, scaler.bad_steps.name)
    batches = _batches(3, seed=1)
    feeds = _micro_batches(batches)
    bad_x = feeds[1][0].copy()
    bad_x[0, 0] = 1e5          # past float16's largest value: an inf in micro-batch 2 of 4
    feeds[1] = (bad_x, feeds[1][1])
    initial = _initial(startup)
    exe, scope = pd.Executor(), pd.Scope()
    exe.run(startup, scope=scope)
    history = []
    for i, feed in enumerate(feeds):
        _run(main, startup, [feed], exe, scope)
        if i % K == K - 1:
            history.append((_values(scope), [float(np.asarray(scope.get(n)).item())
                                             for n in state]))
    # update 1: skipped; the scale halves once (one bad step, not one per micro-batch)
    for n, v in history[0][0].items():
        np.testing.assert_array_equal(v, initial[n])
    assert history[0][1] == [init_scale / 2, 0, 0]
    # updates 2 and 3: SGD on the whole batch (float16 products: float16's tolerance); the
    # second good update in a row doubles the scale back, as for one big step each
    want = _reference(initial, batches[1:2], optax.sgd(LR))
    _assert_close(history[1][0], want, atol=2e-5)
    assert history[1][1] == [init_scale / 2, 1, 0]
    want = _reference(initial, batches[1:], optax.sgd(LR))
    _assert_close(history[2][0], want, atol=4e-5)
    assert history[2][1] == [init_scale, 0, 0]


# --- data parallel on four host devices ---

@pytest.mark.parametrize("selection", ["not slow", pytest.param("slow", marks=pytest.mark.slow)])
def test_data_parallel_on_four_host_devices(selection):
    if FOUR:
        pytest.skip("this process has four devices: the cases run in it")
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
               JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
    result = subprocess.run([sys.executable, "-m", "pytest", __file__, "-p",
                             "no:cacheprovider", "-k", "four_devices_case", "-m", selection],
                            env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0 and re.search(r"\b[1-9] passed", result.stdout), \
        result.stdout[-6000:] + result.stderr[-3000:]


four_devices = pytest.mark.skipif(not FOUR, reason="run by test_data_parallel_on_four_host_devices")


@four_devices
def test_data_parallel_four_devices_case():
    main, startup, _, _ = _build(Adam(LR), data_parallel=True, steps=2)
    assert sum(op.type == "c_allreduce" for op in main.global_block().ops) == len(PARAMS)
    batches = _batches(2)
    exe = pd.Executor(mesh=Mesh({"data": 4}))
    scope, _ = _run(main, startup, _micro_batches(batches, 2), exe)   # 16 rows: 4 a device
    _assert_close(_values(scope), _reference(_initial(startup), batches, optax.adam(LR)))


@four_devices
@pytest.mark.slow
def test_data_parallel_pass_after_accumulation_four_devices_case():
    """The data-parallel pass applied after accumulate_gradients all-reduces the mean of the
    buffer instead of each micro-batch's gradient: the same parameters."""
    from progdesc.distributed import data_parallel
    main, startup, _, _ = _build(Adam(LR), how="pass", steps=2)
    data_parallel(main)
    batches = _batches(2)
    scope, _ = _run(main, startup, _micro_batches(batches, 2), pd.Executor(mesh=Mesh({"data": 4})))
    _assert_close(_values(scope), _reference(_initial(startup), batches, optax.adam(LR)))


@four_devices
@pytest.mark.slow
def test_data_parallel_amp_four_devices_case():
    """float16 loss scaling, data parallel and accumulation together: an inf in the rows of
    one device in one micro-batch skips the update on every device."""
    main, startup, _, opt = _build(SGD(LR), data_parallel=True, steps=2, dtype="float16",
                                   init_loss_scaling=2.0 ** 10)
    batches = _batches(2, seed=2)
    feeds = _micro_batches(batches, 2)
    bad_x = feeds[1][0].copy()
    bad_x[0, 0] = 1e5          # device 0's rows of micro-batch 2 of update 1
    feeds[1] = (bad_x, feeds[1][1])
    initial = _initial(startup)
    exe = pd.Executor(mesh=Mesh({"data": 4}))
    scope, _ = _run(main, startup, feeds[:2], exe)
    for n, v in _values(scope).items():
        np.testing.assert_array_equal(v, initial[n])
    assert float(np.asarray(scope.get(opt.loss_scaler.scale.name)).item()) == 2.0 ** 9
    scope, _ = _run(main, startup, feeds[2:], exe, scope)
    _assert_close(_values(scope), _reference(initial, batches[1:], optax.sgd(LR)), atol=2e-5)


TWO_PROCESSES = """
import os, sys
import numpy as np
port, pid, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
from progdesc import distributed as dist
dist.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=pid)   # before any JAX call
sys.path.insert(0, "tests")
import progdesc as pd
import test_accumulate as T
main, startup, _, _ = T._build(T.Adam(T.LR), data_parallel=True, steps=2)
mesh = dist.Mesh({"data": 4})
exe, scope = pd.Executor(mesh=mesh), pd.Scope()
exe.run(startup, scope=scope)
initial = {n: dist.to_host(scope.get(n)) for n in T.PARAMS}
rows = slice(pid * T.BATCH // 4, (pid + 1) * T.BATCH // 4)   # half of each micro-batch
for x, y in T._micro_batches(T._batches(2), 2):
    exe.run(main, feed={"x": dist.global_batch(x[rows], mesh),
                        "label": dist.global_batch(y[rows], mesh)}, scope=scope)
np.savez(os.path.join(out, f"process-{pid}.npz"),
         **{n: dist.to_host(scope.get(n)) for n in T.PARAMS},
         **{"initial " + n: v for n, v in initial.items()})
"""


@pytest.mark.slow
def test_data_parallel_across_two_processes(tmp_path):
    from test_multihost import finish, free_port, start
    port = free_port()
    procs = [start(["-c", TWO_PROCESSES], port, pid, tmp_path, devices=2) for pid in (0, 1)]
    for code, out in finish(procs):
        assert code == 0, out[-4000:]
    for pid in (0, 1):
        saved = np.load(tmp_path / f"process-{pid}.npz")
        initial = {n: saved["initial " + n] for n in PARAMS}
        _assert_close({n: saved[n] for n in PARAMS},
                      _reference(initial, _batches(2), optax.adam(LR)))


# --- bad input: a typed error, the programs as they were ---

def _unchanged(main, startup):
    return main.desc.SerializeToString(), startup.desc.SerializeToString()


@pytest.mark.parametrize("steps", [0, -2, 2.0, "4", True, None])
def test_bad_step_counts_are_refused(steps):
    main, startup, loss, _ = _build(SGD(LR), steps=1)
    before = _unchanged(main, startup)
    with pytest.raises(ProgramError, match="accumulate_steps"):
        accumulate_gradients(main, steps, startup)
    fresh_main, fresh_startup = pd.Program(), pd.Program()
    with pd.program_guard(fresh_main, fresh_startup):
        x = pd.data("x", [-1, 8])
        fresh_loss = ops.mean(layers.fc(x, 1))
        fresh = _unchanged(fresh_main, fresh_startup)
        with pytest.raises(ProgramError, match="accumulate_steps"):
            SGD(LR).minimize(fresh_loss, accumulate_steps=steps)
    assert _unchanged(main, startup) == before
    assert _unchanged(fresh_main, fresh_startup) == fresh


def test_programs_the_pass_refuses():
    main, startup, loss, _ = _build(SGD(LR))
    before = _unchanged(main, startup)
    with pytest.raises(ProgramError, match="already accumulates"):
        accumulate_gradients(main, 2, startup)
    with pd.program_guard(main, startup), pytest.raises(ProgramError,
                                                        match="already accumulates"):
        SGD(LR).minimize(loss)   # an update after the pass would run on every micro-batch
    assert _unchanged(main, startup) == before

    forward, fstartup = pd.Program(), pd.Program()
    with pd.program_guard(forward, fstartup):
        loss = ops.mean(layers.fc(pd.data("x", [-1, 8]), 1))
    before = _unchanged(forward, fstartup)
    with pytest.raises(ProgramError, match="no parameter gradient"):
        accumulate_gradients(forward, 2, fstartup)
    assert _unchanged(forward, fstartup) == before

    with pd.program_guard(forward, fstartup):
        SGD(LR).minimize(loss)
    before = _unchanged(forward, fstartup)
    default_startup = _unchanged(pd.default_main_program(), pd.default_startup_program())
    with pytest.raises(ProgramError, match="needs startup_program="):
        accumulate_gradients(forward, 2)   # its initializers would go to a program never run
    assert _unchanged(forward, fstartup) == before
    assert _unchanged(pd.default_main_program(), pd.default_startup_program()) == default_startup

    with pd.program_guard(forward, fstartup):
        before = _unchanged(forward, fstartup)
        with pytest.raises(ProgramError, match="already has optimizer ops"):
            SGD(LR).minimize(loss, accumulate_steps=2)
    assert _unchanged(forward, fstartup) == before
