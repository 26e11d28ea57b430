"""Threads build programs at once, each in its own program_guard, and eager mode turned
on in one thread stays there (issue 22.8)."""
import sys
import threading

import numpy as np

import progdesc as pd
from progdesc import layers, ops
from progdesc.optimizer import SGD

X = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)
LABEL = np.array([[0], [1], [1], [0]], np.int64)


def _build():
    """(main, startup, loss) of a small classifier built in a program_guard."""
    main, startup = pd.Program(random_seed=3), pd.Program(random_seed=3)
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 3])
        label = pd.data("label", [None, 1], "int64")
        hidden = layers.fc(x, 8, act="relu")
        logits = layers.fc(hidden, 2)
        loss = ops.mean(layers.softmax_with_cross_entropy(logits, label))
        SGD(0.1).minimize(loss)
    return main, startup, loss


def _train(main, startup, loss):
    """The loss of the second step of `main` in a new scope."""
    exe, scope = pd.Executor(), pd.Scope()
    exe.run(startup, scope=scope)
    for _ in range(2):
        value, = exe.run(main, feed={"x": X, "label": LABEL}, fetch_list=[loss], scope=scope)
    return float(value)


def test_threads_building_programs_at_once_build_what_one_thread_builds():
    main, startup, loss = _build()
    expected = main.to_bytes(), startup.to_bytes(), _train(main, startup, loss)
    default_ops = len(pd.default_main_program().global_block().desc.ops)
    threads, rounds = 3, 10
    barrier, results, errors = threading.Barrier(threads), [], []
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)   # threads take turns often: builds overlap op by op

    def work():
        try:
            for k in range(rounds):
                barrier.wait(timeout=60)   # every thread starts each round together
                main, startup, loss = _build()
                trained = _train(main, startup, loss) if k == rounds - 1 else expected[2]
                results.append((main.to_bytes(), startup.to_bytes(), trained))
        except Exception as e:  # noqa: BLE001
            errors.append(e)
            barrier.abort()

    workers = [threading.Thread(target=work) for _ in range(threads)]
    try:
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    finally:
        sys.setswitchinterval(switch)
    assert not errors, errors
    assert len(results) == threads * rounds
    for main_bytes, startup_bytes, loss in results:
        assert main_bytes == expected[0] and startup_bytes == expected[1]
        assert loss == expected[2]
    assert len(pd.default_main_program().global_block().desc.ops) == default_ops


def test_program_guard_holds_for_its_own_thread_only():
    mine, inside, release = pd.Program(), threading.Event(), threading.Event()
    seen = {}

    def guarded():
        with pd.program_guard(mine):
            seen["guarded"] = pd.default_main_program()
            inside.set()
            release.wait(timeout=30)

    worker = threading.Thread(target=guarded)
    worker.start()
    assert inside.wait(timeout=30)
    seen["here"] = pd.default_main_program()
    other = threading.Thread(target=lambda: seen.update(fresh=pd.default_main_program()))
    other.start()
    other.join()
    release.set()
    worker.join()
    assert seen["guarded"] is mine
    assert seen["here"] is not mine and seen["fresh"] is seen["here"]   # the process default


def test_eager_mode_enabled_in_one_thread_does_not_reach_another():
    on, checked = threading.Event(), threading.Event()
    seen = {}

    def eager_thread():
        pd.eager.enable()
        try:
            main, startup = pd.Program(), pd.Program()
            with pd.program_guard(main, startup), pd.scope_guard(pd.Scope()):
                x = pd.data("x", [2], value=np.array([1.0, 2.0], np.float32))
                seen["eager value"] = ops.scale(x, scale=3.0).numpy()
            on.set()
            checked.wait(timeout=60)
        finally:
            pd.eager.disable()

    worker = threading.Thread(target=eager_thread)
    worker.start()
    assert on.wait(timeout=60)
    try:
        seen["active here"] = pd.eager.active
        main, startup = pd.Program(), pd.Program()
        with pd.program_guard(main, startup):
            x = pd.data("x", [2])          # no value: an eager op on it would fail
            y = ops.scale(x, scale=3.0)
        out, = pd.Executor().run(main, feed={"x": np.array([1.0, 4.0], np.float32)},
                                 fetch_list=[y], scope=pd.Scope())
    finally:
        checked.set()
        worker.join()
    np.testing.assert_array_equal(seen["eager value"], [3.0, 6.0])
    assert seen["active here"] is False
    np.testing.assert_array_equal(out, [3.0, 12.0])
