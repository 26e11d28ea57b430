"""Scope semantics (seed 001): parent lookup, shadowing, lazy creation, threads."""
import threading

import numpy as np
import pytest

import progdesc as pd


def test_lookup_walks_to_the_parent_and_kids_shadow():
    root = pd.Scope()
    root.set("w", np.ones(3))
    kid = root.new_scope()
    assert np.array_equal(np.asarray(kid.get("w")), np.ones(3))
    kid.var("w").set(np.zeros(3))          # a local variable shadows the parent's
    assert np.array_equal(np.asarray(kid.get("w")), np.zeros(3))
    assert np.array_equal(np.asarray(root.get("w")), np.ones(3))
    assert kid.local_var_names() == ["w"]


def test_set_updates_where_the_variable_lives():
    root = pd.Scope()
    root.set("w", np.ones(2))
    kid = root.new_scope()
    kid.set("w", np.full(2, 5.0))
    assert np.asarray(root.get("w")).tolist() == [5.0, 5.0]
    assert kid.local_var_names() == []


def test_var_is_created_on_first_access_and_find_var_does_not_create():
    s = pd.Scope()
    assert s.find_var("x") is None
    v = s.var("x")
    assert v.value is None and s.find_var("x") is v
    assert "x" not in s                     # declared but holding no value yet
    with pytest.raises(pd.ScopeError, match="'x'"):
        v.get()
    with pytest.raises(pd.ScopeError, match="'y'"):
        s.get("y")


def test_drop_kids():
    root = pd.Scope()
    root.new_scope(), root.new_scope()
    assert len(root.kids) == 2
    root.drop_kids()
    assert root.kids == []


def test_scope_guard_switches_global_scope():
    s = pd.Scope()
    with pd.scope_guard(s):
        assert pd.global_scope() is s
    assert pd.global_scope() is not s


def test_concurrent_access_from_8_threads():
    root = pd.Scope()
    kids = [root.new_scope() for _ in range(8)]
    errors = []

    def work(t):
        try:
            for i in range(200):
                root.var(f"shared_{i % 10}")
                kids[t].set(f"own_{t}_{i}", np.full(1, t))
                root.new_scope()
                assert np.asarray(kids[t].get(f"own_{t}_{i}"))[0] == t
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    assert sorted(root.local_var_names()) == sorted(f"shared_{i}" for i in range(10))
    assert all(len(k.local_var_names()) == 200 for k in kids)
    assert len(root.kids) == 8 + 8 * 200
