"""The cheap append path (progdesc/op_plans.py) changes nothing but the cost: a program built
with op plans is byte for byte the one the general path builds, errors still come from the
general path's checks, and eager values stay NumPy's. No timings here: `python -m
bench.eager` measures the cost."""
import numpy as np
import pytest

import progdesc as pd
from lowering import progdesc_pb2 as pb
from progdesc import framework, layers, ops


def _build():
    """A program touching every kind of append: plain ops, attributes (lists too), `name=`,
    layers (prefixed names), a random op, a many-slot op, several outputs, int dtypes, a
    backward pass and an optimizer."""
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 4])
        y = pd.data("y", [None, 1])
        label = pd.data("label", [None, 1], "int64")
        for _ in range(2):   # each signature twice: the second append takes its plan
            h = ops.scale(ops.tanh(x), scale=2.0, bias=0.5)
            h = ops.reshape(h, shape=[-1, 2, 2], name="folded")
            h = ops.reshape(h, shape=[-1, 4])
            h = layers.dropout(layers.fc(h, 8, act="relu"), 0.1)
            parts = ops.split(h, num=2, axis=1)
            h = ops.concat([parts[0], parts[1]], axis=1) * 3 + h
            top = ops.argmax(h, axis=1)
            ops.cast(top, dtype="int32")
            loss = layers.mse_loss(layers.fc(h, 1), y) + ops.mean(ops.cast(label, dtype="float32"))
            main.global_block().append_op("sigmoid", {"X": loss}, role=pb.LOSS)   # a role
        pd.optimizer.Adam(0.01).minimize(loss)
    return main, startup


def test_programs_built_with_op_plans_equal_the_general_paths(monkeypatch):
    planned = [p.to_bytes() for p in _build()]
    planned_again = [p.to_bytes() for p in _build()]   # every plan warm now
    monkeypatch.setattr(framework.Block, "_signature", lambda *args: (None, None))
    general = [p.to_bytes() for p in _build()]
    assert planned == general and planned_again == general


def test_a_planned_op_records_the_users_line():
    main = pd.Program()
    with pd.program_guard(main, pd.Program()):
        x = pd.data("x", [None, 4])
        ops.tanh(x)
        ops.tanh(x)   # planned: its OpDesc written from the plan's bytes
    first, second = [op.callsite for op in main.global_block().ops]
    file, line = first.split(":")
    assert file == "test_eager_speed.py" and second == f"{file}:{int(line) + 1}"


def test_a_bad_op_fails_every_time_with_the_general_paths_error_and_is_taken_back():
    main = pd.Program()
    with pd.program_guard(main, pd.Program()):
        a = pd.data("a", [4], "float32")
        b = pd.data("b", [4], "int32")
        ops.add(a, a)
        ops.add(a, a)   # the float32 signature is planned
        n_ops, n_vars = len(main.global_block().desc.ops), len(main.global_block().desc.vars)
        for _ in range(2):   # a failed signature is never planned
            with pytest.raises(pd.ProgramError) as info:
                ops.add(a, b)
            assert "dtype mismatch" in str(info.value) and "'add'" in str(info.value)
            assert len(main.global_block().desc.ops) == n_ops
            assert len(main.global_block().desc.vars) == n_vars


def test_a_variable_of_another_program_takes_the_general_path_and_its_error():
    other = pd.Program()
    with pd.program_guard(other, pd.Program()):
        stray = pd.data("stray", [4])
    main = pd.Program()
    with pd.program_guard(main, pd.Program()):
        pd.data("x", [4])
        ops.tanh(main.global_block().var("x"))
        with pytest.raises(pd.ProgramError) as info:
            ops.tanh(stray)
    assert "'stray'" in str(info.value)


def test_planned_eager_ops_compute_numpys_values():
    start = np.linspace(-1, 1, 16, dtype=np.float32).reshape(4, 4)
    expected, got = start.astype(np.float64), None
    with pd.scope_guard(pd.Scope()), pd.program_guard(pd.Program(), pd.Program()), pd.eager():
        y = pd.data("x", [4, 4], value=start)
        c = ops.fill_constant(shape=[4, 4], value=0.25)
        for i in range(30):   # the chain of bench.eager: every op after the third is planned
            kind = i % 3
            y = ops.tanh(y) if kind == 0 else ops.scale(y, scale=1.5) if kind == 1 \
                else ops.add(y, c)
            expected = np.tanh(expected) if kind == 0 else expected * 1.5 if kind == 1 \
                else expected + 0.25
        got = y.numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_a_planned_eager_op_that_cannot_run_names_itself_and_is_taken_back():
    main = pd.Program()
    with pd.scope_guard(pd.Scope()), pd.program_guard(main, pd.Program()):
        x = pd.data("x", [4, 4], value=np.ones((4, 4), np.float32))
        outside = ops.tanh(ops.tanh(x))   # appended outside eager mode: no value; planned
        n_ops, n_vars = len(main.global_block().desc.ops), len(main.global_block().desc.vars)
        with pd.eager(), pytest.raises(pd.ProgramError) as info:
            ops.tanh(outside)   # the plan of tanh on float32[4, 4], run at once: fails
    text = str(info.value)
    assert f"op #{n_ops} 'tanh'" in text and outside.name in text
    assert "test_eager_speed.py:" in text and "ran outside eager mode" in text
    assert len(main.global_block().desc.ops) == n_ops
    assert len(main.global_block().desc.vars) == n_vars


def _read_midway():
    """Planned ops (their writes deferred) mixed with general appends, the program read
    between them in every way: a Variable's desc, a block's desc held across appends, the
    program's desc. Returns the program's bytes and what each read saw."""
    main = pd.Program()
    seen = []
    with pd.program_guard(main, pd.Program()):
        x = pd.data("x", [None, 4])
        a = ops.tanh(ops.tanh(x))            # the second tanh is planned
        seen.append((a.desc.name, list(a.desc.dims)))   # its VarDesc, read at once
        held = main.global_block().desc      # held while more ops are appended
        b = ops.scale(ops.scale(a, scale=0.5), scale=-0.0)   # -0.0 planned apart from 0.0
        main.global_block().append_op("sigmoid", {"X": b})   # the general path, after them
        c = ops.tanh(ops.tanh(b))
        seen.append(len(main.desc.blocks[0].ops))   # the program's desc
        seen.append([op.type for op in held.ops])   # the held desc sees every op now
        ops.scale(c, scale=0.0)
    return main.to_bytes(), seen


def test_ops_written_when_the_program_is_read_equal_the_general_paths(monkeypatch):
    planned, seen = _read_midway()
    assert seen == [("tanh_1.out", [-1, 4]), 7,
                    ["tanh", "tanh", "scale", "scale", "sigmoid", "tanh", "tanh"]]
    monkeypatch.setattr(framework.Block, "_signature", lambda *args: (None, None))
    assert (planned, seen) == _read_midway()
    scales = [op for op in pd.Program.from_bytes(planned).global_block().ops
              if op.type == "scale"]
    assert [str(op.attr("scale")) for op in scales] == ["0.5", "-0.0", "0.0"]


def test_an_op_a_listener_refuses_is_taken_back_before_it_is_written():
    class Refuse(framework.ProgramListener):
        def op_appended(self, block, index, opdef, inputs, outputs, attrs):
            raise RuntimeError(f"refused op #{index}")

    main = pd.Program()
    with pd.program_guard(main, pd.Program()):
        x = pd.data("x", [4])
        ops.tanh(ops.tanh(x))   # tanh on float32[4] is planned from here on
        before = main.to_bytes()
        stop = framework.add_listener(Refuse())
        try:
            with pytest.raises(RuntimeError, match="refused op #2"):
                ops.tanh(x)   # the planned op, refused before anything read the block
        finally:
            stop()
        assert main.to_bytes() == before
        assert [v for v in main.global_block().vars if v.startswith("tanh")] == \
            ["tanh_0.out", "tanh_1.out"]
        later = ops.tanh(x)   # appending goes on after the refused op
    assert main.global_block().ops[-1].output("Out") == [later.name]
