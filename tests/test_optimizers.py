"""Optimizers against optax: a few steps on a quadratic follow optax's trajectory.

Each test builds loss = sum over parameters of reduce_sum(square(p - target))
with progdesc, minimizes it, runs the main program a few times, and compares
the parameters after every run with the same optimizer written in optax.
"""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import progdesc as pd
from lowering import progdesc_pb2 as pb
from progdesc import lr as L
from progdesc import ops
from progdesc import optimizer as O
from progdesc.initializer import Constant
from progdesc.param import ParamAttr, create_parameter

SHAPES = {"w": (2, 3), "b": (3,)}
INIT = {"w": 0.5, "b": -0.25}
TARGETS = {"w": np.array([[-1.0, 0.0, 1.5], [2.0, -3.0, 0.25]], np.float32),
           "b": np.array([0.75, -1.5, 3.0], np.float32)}
STEPS = 6


def quadratic(params=("w",), attrs=None):
    """Parameters (Constant-initialized), their target feeds, and the loss, in the current programs."""
    terms = []
    for name in params:
        p = create_parameter(SHAPES[name], attr=ParamAttr(
            name=name, initializer=Constant(INIT[name]), **(attrs or {}).get(name, {})))
        t = pd.data(f"{name}_target", SHAPES[name])
        terms.append(ops.reduce_sum(ops.square(p - t)))
    return terms[0] if len(terms) == 1 else ops.sum(terms)


def train(make_opt, params=("w",), attrs=None, steps=STEPS, fetch_lr=False):
    """Minimize the quadratic; returns (per-run {param: value}, per-run lr, scope, main)."""
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        loss = quadratic(params, attrs)
        opt = make_opt()
        opt.minimize(loss)
    scope, exe = pd.Scope(), pd.Executor()
    exe.run(startup, scope=scope)
    feed = {f"{n}_target": TARGETS[n] for n in params}
    trajectory, rates = [], []
    for _ in range(steps):
        got = exe.run(main, feed=feed, fetch_list=[opt.lr_var] if fetch_lr else [], scope=scope)
        rates.extend(float(np.reshape(r, ())) for r in got)
        trajectory.append({n: np.asarray(scope.get(n)) for n in params})
    return trajectory, rates, scope, main


def reference(tx, params=("w",), steps=STEPS):
    """optax's trajectory on the same quadratic; returns (per-step params, final state)."""
    p = {n: jnp.full(SHAPES[n], INIT[n], jnp.float32) for n in params}

    def loss(p):
        return sum(jnp.sum(jnp.square(p[n] - TARGETS[n])) for n in params)

    state, trajectory = tx.init(p), []
    for _ in range(steps):
        updates, state = tx.update(jax.grad(loss)(p), state, p)
        p = optax.apply_updates(p, updates)
        trajectory.append({n: np.asarray(v) for n, v in p.items()})
    return trajectory, state


def assert_same_trajectory(got, want):
    assert len(got) == len(want)
    for step, (g, w) in enumerate(zip(got, want)):
        for name in w:
            np.testing.assert_allclose(g[name], w[name], rtol=1e-6, atol=1e-7,
                                       err_msg=f"{name} after step {step + 1}")


CASES = {
    "sgd": (lambda: O.SGD(0.1), optax.sgd(0.1)),
    "momentum": (lambda: O.Momentum(0.05, momentum=0.9), optax.sgd(0.05, momentum=0.9)),
    "nesterov": (lambda: O.Momentum(0.05, momentum=0.8, use_nesterov=True),
                 optax.sgd(0.05, momentum=0.8, nesterov=True)),
    "adam": (lambda: O.Adam(0.1), optax.adam(0.1)),
    "adam_betas": (lambda: O.Adam(0.05, beta1=0.5, beta2=0.9, epsilon=1e-6),
                   optax.adam(0.05, b1=0.5, b2=0.9, eps=1e-6)),
    "adamw": (lambda: O.AdamW(0.1, weight_decay=0.2), optax.adamw(0.1, weight_decay=0.2)),
    "rmsprop": (lambda: O.RMSProp(0.01, rho=0.9), optax.rmsprop(0.01, decay=0.9)),
    "rmsprop_centered": (lambda: O.RMSProp(0.01, rho=0.8, epsilon=1e-6, centered=True),
                         optax.rmsprop(0.01, decay=0.8, eps=1e-6, centered=True)),
    "rmsprop_momentum": (lambda: O.RMSProp(0.01, momentum=0.9),
                         optax.rmsprop(0.01, momentum=0.9)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_optimizer_follows_optax(case):
    make_opt, tx = CASES[case]
    got, _, _, _ = train(make_opt, params=("w", "b"))
    want, _ = reference(tx, params=("w", "b"))
    assert_same_trajectory(got, want)


def test_global_norm_clipping():
    make = lambda: O.Adam(0.1, grad_clip=O.ClipGradByGlobalNorm(1.0))  # noqa: E731
    got, _, _, _ = train(make, params=("w", "b"))
    want, _ = reference(optax.chain(optax.clip_by_global_norm(1.0), optax.adam(0.1)),
                        params=("w", "b"))
    assert_same_trajectory(got, want)


def test_l2_regularization_per_parameter_and_optimizer_wide():
    # w has its own coefficient (it overrides the optimizer's), b takes the optimizer's
    make = lambda: O.Momentum(0.05, momentum=0.9, weight_decay=0.05)  # noqa: E731
    got, _, _, _ = train(make, params=("w", "b"), attrs={"w": {"regularizer": 0.1}})
    tx = optax.chain(
        optax.add_decayed_weights(0.1, mask={"w": True, "b": False}),
        optax.add_decayed_weights(0.05, mask={"w": False, "b": True}),
        optax.sgd(0.05, momentum=0.9))
    want, _ = reference(tx, params=("w", "b"))
    assert_same_trajectory(got, want)


def test_adamw_keeps_l2_regularizer_separate_from_decoupled_decay():
    make = lambda: O.AdamW(0.1, weight_decay=0.1)  # noqa: E731
    got, _, _, _ = train(make, attrs={"w": {"regularizer": 0.2}})
    want, _ = reference(optax.chain(optax.add_decayed_weights(0.2),
                                    optax.adamw(0.1, weight_decay=0.1)))
    assert_same_trajectory(got, want)


def test_per_parameter_learning_rate():
    got, _, _, _ = train(lambda: O.SGD(0.1), params=("w", "b"),
                         attrs={"w": {"learning_rate": 0.5}})
    tx = optax.multi_transform({"w": optax.sgd(0.05), "b": optax.sgd(0.1)},
                               {"w": "w", "b": "b"})
    want, _ = reference(tx, params=("w", "b"))
    assert_same_trajectory(got, want)


SCHEDULES = {
    "exponential": (L.ExponentialDecay(0.1, 4, 0.5), optax.exponential_decay(0.1, 4, 0.5)),
    "step_decay": (L.StepDecay(0.1, 3, gamma=0.5),
                   optax.exponential_decay(0.1, 3, 0.5, staircase=True)),
    "cosine": (L.CosineDecay(0.1, 8, alpha=0.1), optax.cosine_decay_schedule(0.1, 8, 0.1)),
    "polynomial": (L.PolynomialDecay(0.1, 6, end_value=0.01, power=2.0),
                   optax.polynomial_schedule(0.1, 0.01, 2.0, 6)),
    "piecewise": (L.PiecewiseDecay([3, 7], [0.1, 0.05, 0.01]),
                  optax.piecewise_constant_schedule(0.1, {3: 0.5, 7: 0.2})),
    "warmup_cosine": (L.LinearWarmup(L.CosineDecay(0.1, 6), warmup_steps=3, start_value=0.01),
                      optax.join_schedules([optax.linear_schedule(0.01, 0.1, 3),
                                            optax.cosine_decay_schedule(0.1, 6)], [3])),
    "warmup_constant": (L.LinearWarmup(0.1, warmup_steps=4),
                        optax.join_schedules([optax.linear_schedule(0.0, 0.1, 4),
                                              optax.constant_schedule(0.1)], [4])),
}


@pytest.mark.parametrize("kind", list(SCHEDULES))
def test_schedule_drives_the_rate(kind):
    schedule, optax_schedule = SCHEDULES[kind]
    got, rates, _, _ = train(lambda: O.SGD(schedule), steps=10, fetch_lr=True)
    np.testing.assert_allclose(rates, [float(optax_schedule(k)) for k in range(10)],
                               rtol=1e-6, atol=1e-9)
    want, _ = reference(optax.sgd(optax_schedule), steps=10)
    assert_same_trajectory(got, want)


def test_adam_with_schedule():
    schedule = L.LinearWarmup(L.ExponentialDecay(0.1, 2, 0.7), warmup_steps=2)
    got, _, _, _ = train(lambda: O.Adam(schedule))
    optax_schedule = optax.join_schedules(
        [optax.linear_schedule(0.0, 0.1, 2), optax.exponential_decay(0.1, 2, 0.7)], [2])
    want, _ = reference(optax.adam(optax_schedule))
    assert_same_trajectory(got, want)


def test_optimizer_state_is_persistable_and_lives_in_the_scope():
    got, _, scope, main = train(lambda: O.Adam(0.1))
    block = main.global_block()
    for name in ("w.moment1", "w.moment2", O.STEP_VAR):
        var = block.var(name)
        assert var.persistable and not var.is_parameter and name in scope
    assert np.asarray(scope.get(O.STEP_VAR)).tolist() == [STEPS]
    _, state = reference(optax.adam(0.1))
    adam_state = state[0]
    np.testing.assert_allclose(np.asarray(scope.get("w.moment1")), adam_state.mu["w"],
                               rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.asarray(scope.get("w.moment2")), adam_state.nu["w"],
                               rtol=1e-6, atol=1e-7)


def test_minimize_returns_optimize_ops_and_params_grads():
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        loss = quadratic(("w", "b"))
        opt_ops, params_grads = O.Adam(L.CosineDecay(0.1, 5)).minimize(loss)
    assert sorted(p.name for p, _ in params_grads) == ["b", "w"]
    assert all(g.name == p.name + "@GRAD" for p, g in params_grads)
    assert [o.type for o in opt_ops].count("adam") == 2
    assert {o.role for o in opt_ops} == {"optimize", "lr_sched"}
    assert opt_ops[-1].type == "increment"
    test_program = main.clone(for_test=True)
    assert {o.role for o in test_program.global_block().ops} == {"forward"}


def test_step_counter_is_shared_and_incremented_once_per_run():
    """Two optimizers on disjoint parameters: each trains its own, one step counter."""
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        loss = quadratic(("w", "b"))
        O.Adam(0.1).minimize(loss, parameter_list=["w"])
        O.SGD(L.StepDecay(0.1, 2, 0.5)).minimize(loss, parameter_list=["b"])
    block_ops = main.global_block().ops
    increments = [o for o in block_ops if o.type == "increment"]
    assert len(increments) == 1 and block_ops[-1].type == "increment"
    scope, exe = pd.Scope(), pd.Executor()
    exe.run(startup, scope=scope)
    got = []
    for _ in range(STEPS):
        exe.run(main, feed={f"{n}_target": TARGETS[n] for n in ("w", "b")}, scope=scope)
        got.append({n: np.asarray(scope.get(n)) for n in ("w", "b")})
    tx = optax.multi_transform(
        {"w": optax.adam(0.1),
         "b": optax.sgd(optax.exponential_decay(0.1, 2, 0.5, staircase=True))},
        {"w": "w", "b": "b"})
    want, _ = reference(tx, params=("w", "b"))
    assert_same_trajectory(got, want)


def test_trained_program_survives_serialization():
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        loss = quadratic()
        O.RMSProp(L.CosineDecay(0.01, 4), momentum=0.5, centered=True,
                  grad_clip=O.ClipGradByGlobalNorm(2.0)).minimize(loss)
    runs = []
    for program in (main, pd.Program.from_bytes(main.to_bytes())):
        scope, exe = pd.Scope(), pd.Executor()
        exe.run(startup, scope=scope)
        for _ in range(3):
            exe.run(program, feed={"w_target": TARGETS["w"]}, scope=scope)
        runs.append(np.asarray(scope.get("w")))
    np.testing.assert_array_equal(runs[0], runs[1])


def test_nothing_trainable_raises_backward_error():
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [3])
        loss = ops.reduce_sum(ops.square(x))
        with pytest.raises(pd.BackwardError):
            O.SGD(0.1).minimize(loss)
        frozen = create_parameter([3], attr=ParamAttr(name="frozen", trainable=False,
                                                      initializer=Constant(1.0)))
        loss2 = ops.reduce_sum(ops.square(frozen - x))
        with pytest.raises(pd.BackwardError):
            O.Adam(0.1).minimize(loss2)


def test_invalid_schedules_are_rejected():
    with pytest.raises(ValueError):
        L.CosineDecay(0.1, 0)
    with pytest.raises(ValueError):
        L.PiecewiseDecay([5, 2], [1.0, 0.5, 0.1])
    with pytest.raises(TypeError):
        O.SGD("fast")
    main = pd.Program()
    step = main.global_block().create_var("step", [1], "int64", persistable=True)
    with pytest.raises(pd.ProgramError, match="unknown schedule kind"):
        main.global_block().append_op("lr_schedule", {"Step": step}, None, {"kind": "magic"})


def test_minimize_twice_on_the_same_parameters_raises_and_changes_nothing():
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        loss = quadratic(("w", "b"))
        O.SGD(0.1).minimize(loss)
        before, startup_before = main.to_bytes(), startup.to_bytes()
        with pytest.raises(pd.ProgramError, match=r"parameters w, b are already updated"):
            O.Adam(0.1).minimize(loss)
        with pytest.raises(pd.ProgramError, match=r"parameters b are already updated"):
            O.Adam(0.1).minimize(loss, parameter_list=["b"])
    assert main.to_bytes() == before and startup.to_bytes() == startup_before
    assert sorted(main.global_block().vars) == sorted(
        pd.Program.from_bytes(before).global_block().vars)
