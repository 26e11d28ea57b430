"""program.schedule(): the recorded order, the dependencies, the levels of independent ops.

The levels are checked against a brute-force reference (every pair of ops that
touch a common variable, one of them writing it, must sit in increasing
levels; an op sits right below one it conflicts with), and by running the ops
through the lowering's `run_step` in the scheduled order, each level shuffled,
against the recorded order.
"""
import itertools
import random

import jax
import numpy as np
import pytest

import progdesc as pd
from lowering.blocks import sub_block_indices
from lowering.lower import RNG_VAR, run_step, steps_of
from progdesc import control_flow as cf
from progdesc import layers, ops
from progdesc.feeding import with_feed_fetch
from progdesc.schedule import schedule
from source_lines import line_of
from test_backward import random_program


def _names(slots):
    return {n for s in slots for n in s.arguments}


def _outer_reads(desc, block_idx):
    """Every name the ops of block `block_idx` (and of its sub-blocks) read that the block
    does not declare."""
    declared = {v.name for v in desc.blocks[block_idx].vars}
    reads = set()
    for op_desc in desc.blocks[block_idx].ops:
        reads |= _names(op_desc.inputs)
        for sub in sub_block_indices(op_desc):
            reads |= _outer_reads(desc, sub)
    return reads - declared


def _effects(desc, op_desc):
    """(read, written) names of an op, the feed and fetch lists left out."""
    reads = _names(op_desc.inputs)
    for sub in sub_block_indices(op_desc):
        reads |= _outer_reads(desc, sub)
    lists = {"feed", "fetch"}
    return reads - lists, _names(op_desc.outputs) - lists


def _conflict(a, b):
    (ra, wa), (rb, wb) = a, b
    return bool(wa & rb or ra & wb or wa & wb)


def check_against_brute_force(desc, block_idx=0):
    """The schedule of a block against every pair of its ops; returns the schedule."""
    sched = schedule(desc, block_idx)
    ops_ = desc.blocks[block_idx].ops
    effects = [_effects(desc, o) for o in ops_]
    assert sched.fifo == tuple(range(len(ops_)))
    assert sorted(sched.order) == list(range(len(ops_)))
    level = {i: k for k, group in enumerate(sched.levels) for i in group}
    for i, j in itertools.combinations(range(len(ops_)), 2):
        if _conflict(effects[i], effects[j]):
            assert level[i] < level[j], (i, j)
    for group in sched.levels:
        for i, j in itertools.combinations(group, 2):
            assert not _conflict(effects[i], effects[j]), (i, j)
    for j, k in level.items():   # as early as possible: right below an op it conflicts with
        if k:
            assert any(level[i] == k - 1 and _conflict(effects[i], effects[j])
                       for i in range(j)), j
    return sched


def run_in_order(desc, order, feed, state):
    """Run the ops of `desc` (with feed/fetch ops) one by one in `order`; returns
    (fetched values, persistable values)."""
    steps = steps_of(desc)
    env = {**state, "feed": list(feed.values())}
    fetches = [None] * sum(s.opdef.type == "fetch" for s in steps)
    with jax.enable_x64(True):
        for i in order:
            run_step(steps[i], env, state.get(RNG_VAR), desc, fetches=fetches)
    persistable = {v.name for v in desc.blocks[0].vars if v.persistable}
    return [np.asarray(v) for v in fetches], {n: np.asarray(env[n]) for n in persistable
                                              if n in env}


def check_orders_agree(desc, feed, state, seed=0):
    """Running the scheduled order, each level shuffled, gives what the recorded order gives."""
    sched = check_against_brute_force(desc)
    rng = random.Random(seed)
    shuffled = [i for group in sched.levels for i in rng.sample(group, len(group))]
    want = run_in_order(desc, sched.fifo, feed, state)
    got = run_in_order(desc, shuffled, feed, state)
    for a, b in zip(want[0], got[0]):
        np.testing.assert_array_equal(a, b)
    assert want[1].keys() == got[1].keys()
    for name in want[1]:
        np.testing.assert_array_equal(want[1][name], got[1][name], err_msg=name)
    return sched


def test_independent_ops_share_a_level_and_the_join_comes_after_both():
    main = pd.Program()
    with pd.program_guard(main, pd.Program()):
        x = pd.data("x", [2, 3])
        a = ops.tanh(x)
        b = ops.exp(x)
        c = ops.add(a, b)
        ops.mean(c)
    sched = check_against_brute_force(main.desc)
    assert sched.levels == ((0, 1), (2,), (3,))
    assert [(d.before, d.kind, d.var) for d in sched.ops[2].after] == [
        (0, "reads", a.name), (1, "reads", b.name)]


def test_an_in_place_update_waits_for_the_readers_of_the_old_value():
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [4, 3])
        loss = ops.mean(layers.fc(x, 2))
        pd.optimizer.SGD(0.1).minimize(loss)
    sched = check_against_brute_force(main.desc)
    block = main.global_block()
    (matmul,) = [i for i, d in enumerate(block.desc.ops) if d.type == "matmul" and d.role == 0]
    for i, d in enumerate(block.desc.ops):
        if d.type == "sgd" and "fc_0.w_0" in _names(d.outputs):
            assert (matmul, "overwrites", "fc_0.w_0") in [
                (dep.before, dep.kind, dep.var) for dep in sched.ops[i].after]
    assert len(sched.levels) < len(block.desc.ops)   # something runs side by side


def test_feed_ops_are_independent_and_fetches_follow_their_producers():
    main = pd.Program()
    with pd.program_guard(main, pd.Program()):
        x, y = pd.data("x", [3]), pd.data("y", [3])
        s = ops.add(x, y)
        p = ops.mul(x, y)
    desc = with_feed_fetch(main, ("x", "y"), (s.name, p.name, "x"))
    sched = check_against_brute_force(desc)
    # feed x, feed y | fetch x, add, mul | fetch s, fetch p
    assert sched.levels == ((0, 1), (2, 3, 6), (4, 5))
    feed = {"x": np.arange(3.0, dtype=np.float32), "y": np.ones(3, np.float32)}
    check_orders_agree(desc, feed, {})


def test_an_op_with_a_sub_block_follows_what_its_branches_read():
    main = pd.Program()
    with pd.program_guard(main, pd.Program()):
        x = pd.data("x", [3])
        p = pd.data("p", [], "bool")
        outer = ops.exp(x)
        other = ops.tanh(x)
        out = cf.cond(p, lambda: outer * 2.0, lambda: outer + 1.0)
        ops.add(out, other)
    sched = check_against_brute_force(main.desc)
    cond_index = [d.type for d in main.global_block().desc.ops].index("cond")
    assert 0 in [d.before for d in sched.ops[cond_index].after]
    assert sched.ops[cond_index].level == 1 and sched.ops[1].level == 0
    desc = with_feed_fetch(main, ("x", "p"), (out.name,))
    check_orders_agree(desc, {"x": np.arange(3.0, dtype=np.float32), "p": np.array(True)}, {})


def test_a_scan_step_and_the_ops_around_it():
    main = pd.Program()
    with pd.program_guard(main, pd.Program()):
        xs = pd.data("xs", [4, 2])
        c0 = pd.data("c0", [2])
        w = ops.exp(c0)
        c, ys = cf.scan(lambda c, x: (c * w + x, ops.tanh(c)), c0, xs)
        loss = ops.reduce_sum(ys) + ops.reduce_sum(c)
        pd.gradients([loss], [xs, c0])
    check_against_brute_force(main.desc)
    for idx in range(1, len(main.blocks)):
        check_against_brute_force(main.desc, idx)


@pytest.mark.parametrize("batch", range(3))
def test_random_programs_with_backward_and_sgd(batch):
    for seed in range(batch * 10, batch * 10 + 10):
        main, params, feed, loss, state = random_program(seed)
        startup = pd.Program()
        try:
            with pd.program_guard(main, startup):
                pd.optimizer.SGD(0.1).minimize(loss)
        except pd.BackwardError:
            continue
        scope = pd.Scope()
        pd.Executor().run(startup, scope=scope)   # the learning rate
        state.update({n: scope.get(n) for n in scope.local_var_names()})
        desc = with_feed_fetch(main, tuple(feed), (loss.name,))
        check_orders_agree(desc, feed, state, seed)


def test_printed_shown_and_drawn():
    main = pd.Program()
    with pd.program_guard(main, pd.Program()):
        x = pd.data("x", [2])
        a = ops.tanh(x)
        b = ops.exp(x)   # the exp line
        ops.add(a, b)
    sched = main.schedule()
    text = str(sched)
    assert text.splitlines()[0] == ("schedule of block 0: 3 ops in 2 levels "
                                    "(at most 2 independent ops at once)")
    assert f"#1 exp  ({line_of(__file__, '# the exp line')})" in text
    assert f"#2 add after #0 (reads {a.name}), #1 (reads {b.name})" in text
    page = sched._repr_html_()
    assert page.count('class="pd-sched-op"') == 3 and "#2 add" in page
    assert sched.to_dot().count("->") == 2
    drawing = sched.render()
    assert drawing.format == "svg" and b"<svg" in drawing.data
