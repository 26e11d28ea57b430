"""Values the Scope hands out stay valid (issue 22.5); runs on one Scope from several threads
lose no update, runs on different Scopes go on in parallel (issue 22.9)."""
import threading

import jax
import numpy as np
import pytest

import progdesc as pd
from progdesc import layers, ops
from progdesc.custom_op import In, Out, op, unregister
from progdesc.optimizer import SGD, STEP_VAR, Adam
from progdesc.initializer import Constant
from progdesc.param import create_parameter

X = np.arange(12, dtype=np.float32).reshape(4, 3) / 10


def _model(optimizer):
    main, startup = pd.Program(random_seed=1), pd.Program(random_seed=1)
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 3])
        loss = ops.mean(layers.fc(x, 1, bias_attr=False))
        optimizer.minimize(loss)
    main.loss = loss
    return main, startup


def _trained(main, startup, steps):
    """{persistable: value} after `steps` runs of `main` in a fresh scope (nothing held)."""
    exe, scope = pd.Executor(), pd.Scope()
    exe.run(startup, scope=scope)
    for _ in range(steps):
        exe.run(main, feed={"x": X}, scope=scope)
    return {n: np.asarray(scope.get(n)) for n in scope.local_var_names()}


def test_a_value_handed_out_stays_valid_after_a_run_updates_it():
    main, startup = _model(SGD(0.5))
    exe, scope = pd.Executor(), pd.Scope()
    exe.run(startup, scope=scope)
    exe.run(main, feed={"x": X}, scope=scope)     # compiled and hot: donation in place
    held = scope.get("fc_0.w_0")
    held_var = scope.find_var("fc_0.w_0").value
    snapshot = _trained(main, startup, 1)["fc_0.w_0"]   # (NumPy views of `held` would keep
    exe.run(main, feed={"x": X}, scope=scope)          # JAX from donating it)
    exe.run(main, feed={"x": X}, scope=scope)
    np.testing.assert_array_equal(np.asarray(held), snapshot)
    np.testing.assert_array_equal(np.asarray(held_var), snapshot)
    # loss = mean(x @ w): each SGD step subtracts lr * mean over the batch of x
    np.testing.assert_allclose(np.asarray(scope.get("fc_0.w_0")),
                               snapshot - 2 * 0.5 * X.mean(0)[:, None], rtol=1e-6)


def test_a_value_set_into_a_second_scope_stays_valid_in_both():
    main, startup = _model(Adam(0.1))
    exe, s1 = pd.Executor(), pd.Scope()
    exe.run(startup, scope=s1)
    before = _trained(main, startup, 0)   # not NumPy views of s1's arrays: they keep JAX
    s2 = pd.Scope()                       # from donating them
    for n in s1.local_var_names():
        s2.set(n, s1.get(n))
    for _ in range(3):
        exe.run(main, feed={"x": X}, scope=s2)
    for n, value in before.items():      # s1 still holds its values, unchanged
        np.testing.assert_array_equal(np.asarray(s1.get(n)), value)
    for n, value in _trained(main, startup, 3).items():
        np.testing.assert_array_equal(np.asarray(s2.get(n)), value)
    exe.run(main, feed={"x": X}, scope=s1)   # and s1 trains from its own values
    assert int(np.asarray(s1.get(STEP_VAR)).item()) == 1


def test_params_of_as_jax_stay_valid_while_the_scope_trains():
    main, startup = _model(SGD(0.5))
    exe, scope = pd.Executor(), pd.Scope()
    exe.run(startup, scope=scope)
    exe.run(main, feed={"x": X}, scope=scope)
    fn, params = pd.as_jax(main, ["x"], main.loss, scope)
    snapshot = _trained(main, startup, 1)
    exe.run(main, feed={"x": X}, scope=scope)
    for n, value in params.items():
        np.testing.assert_array_equal(np.asarray(value), snapshot[n])
    np.testing.assert_allclose(np.asarray(fn(params, X)), (X @ snapshot["fc_0.w_0"]).mean(),
                               rtol=1e-6)


@pytest.mark.parametrize("threads", [2, 4])
def test_runs_on_one_scope_from_several_threads_lose_no_update(threads):
    steps = 25
    main, startup = _model(Adam(0.05))
    exe, scope = pd.Executor(), pd.Scope()
    exe.run(startup, scope=scope)
    barrier, errors = threading.Barrier(threads), []

    def work():
        try:
            barrier.wait(timeout=60)
            for _ in range(steps):
                exe.run(main, feed={"x": X}, scope=scope)
                scope.get("fc_0.w_0")   # a value handed out between runs, as a logger would
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not errors, errors
    assert int(np.asarray(scope.get(STEP_VAR)).item()) == threads * steps
    for n, value in _trained(main, startup, threads * steps).items():
        np.testing.assert_array_equal(np.asarray(scope.get(n)), value, err_msg=n)


def test_runs_on_two_scopes_go_on_at_once():
    """Each run blocks in a host callback until the other thread's run is inside its own:
    runs serialized across scopes would break the barrier (timeout), not hang."""
    meet = threading.Barrier(2, timeout=30)

    def host_wait(x):
        meet.wait()
        return np.asarray(x)

    @op("test_meet_peer", inputs=[In("X", "float")], outputs=[Out("Out")])
    def _(X):
        return jax.pure_callback(host_wait, jax.ShapeDtypeStruct(X.shape, X.dtype), X)

    try:
        main, startup = pd.Program(), pd.Program()
        with pd.program_guard(main, startup):
            x = pd.data("x", [2])
            w = create_parameter([2], "float32", attr="w",   # state read from the scope
                                 default_initializer=Constant(0.5))
            y = ops.test_meet_peer(x + w)
        exe = pd.Executor()
        scopes = [pd.Scope(), pd.Scope()]
        results, errors = [None, None], []

        def work(k):
            try:
                exe.run(startup, scope=scopes[k])
                results[k] = exe.run(main, feed={"x": np.full(2, k, np.float32)},
                                     fetch_list=[y], scope=scopes[k])[0]
            except Exception as e:  # noqa: BLE001
                errors.append(e)

        workers = [threading.Thread(target=work, args=(k,)) for k in range(2)]
        for t in workers:
            t.start()
        for t in workers:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in workers), "runs on two scopes deadlocked"
        assert not errors, errors
        for k in range(2):
            np.testing.assert_allclose(results[k], k + np.asarray(scopes[k].get("w")))
    finally:
        unregister("test_meet_peer")
