"""The public API front ends write programs with (issue 23): appending and inserting ops,
names, constants, sub-blocks, layers, editing a block's desc, and listeners. Values are
checked by running the programs and comparing with NumPy."""
import numpy as np
import pytest

import progdesc as pd
from lowering import progdesc_pb2 as pb
from progdesc import framework
from progdesc.constants import LargeConstantWarning, constant


def _run(main, feed, fetch, startup=None):
    exe, scope = pd.Executor(), pd.Scope()
    if startup is not None:
        exe.run(startup, scope=scope)
    return exe.run(main, feed=feed, fetch_list=fetch, scope=scope)


def test_append_op_returns_the_operator_and_its_fresh_outputs():
    main = pd.Program()
    with pd.program_guard(main, pd.Program()):
        x = pd.data("x", [2, 3])
        op = main.global_block().append_op("scale", {"X": x}, attrs={"scale": 3.0}, name="tripled")
    assert op.type == "scale" and op.input("X") == ["x"]
    out = main.global_block().var(op.output("Out")[0])
    assert out.name.startswith("tripled") and out.shape == (2, 3)
    value = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_allclose(_run(main, {"x": value}, [out])[0], 3 * value)


def test_insert_op_runs_before_the_op_at_its_index():
    main = pd.Program()
    with pd.program_guard(main, pd.Program()):
        x = pd.data("x", [3])
        block = main.global_block()
        block.create_var("t", [3])
        block.append_op("scale", {"X": "t"}, {"Out": "y"}, {"scale": 2.0})   # reads t ...
        block.insert_op(0, "scale", {"X": x}, {"Out": "t"}, {"bias": 1.0})   # ... made first
    assert [o.type for o in block.ops] == ["scale", "scale"] and block.ops[0].output("Out") == ["t"]
    value = np.array([1, 2, 3], np.float32)
    np.testing.assert_allclose(_run(main, {"x": value}, ["y"])[0], 2 * (value + 1))


def test_a_bad_op_names_itself_and_leaves_the_block_as_it_was():
    main = pd.Program()
    with pd.program_guard(main, pd.Program()):
        x = pd.data("x", [3])
    block = main.global_block()
    before = (len(block.desc.ops), len(block.desc.vars), main.version)
    with pytest.raises(pd.ProgramError, match=r"op #0 'scale', created at test_program_api.py:\d+: 'Y' is not an input slot"):
        block.append_op("scale", {"X": x, "Y": np.ones(3, np.float32)})
    assert (len(block.desc.ops), len(block.desc.vars)) == before[:2]   # no constant left


def test_remove_op_and_sync_after_editing_the_desc():
    main = pd.Program()
    with pd.program_guard(main, pd.Program()):
        x = pd.data("x", [3])
        y = pd.ops.scale(x, scale=2.0)
        pd.ops.scale(y, scale=5.0)
    block, version = main.global_block(), main.version
    block.remove_op(1)
    assert [o.type for o in block.ops] == ["scale"] and main.version > version
    # a front end retypes a variable in the desc directly, then syncs: views held stay valid
    held = block.var(y.name)
    block.desc.vars[-1].dims[:] = [3]
    del block.desc.vars[-1]
    block.sync()
    assert block.var(y.name) is held and held.shape == (3,)
    assert not block.has_var(f"{y.name}_never")


def test_unique_and_unused_names():
    main = pd.Program()
    with pd.program_guard(main, pd.Program()):
        pd.data("w", [1])
    assert [main.unique_name("w") for _ in range(2)] == ["w_0", "w_1"]
    block = main.global_block()
    assert block.unused_name("w") == "w_1"
    assert block.unused_name("fresh") == "fresh"
    block.create_var("v", [1]), block.create_var("v_1", [1])
    assert block.unused_name("v") == "v_2"
    loaded = pd.Program.from_bytes(main.to_bytes())   # a loaded program knows its names
    assert loaded.unique_name("v") == "v_0"
    loaded.global_block().create_var("w_0", [1])   # declared by name: never handed out
    assert loaded.unique_name("w") == "w_1"


def test_var_type_is_dims_and_dtype_and_names_a_missing_variable():
    main = pd.Program()
    with pd.program_guard(main, pd.Program()):
        pd.data("x", [None, 4], "int32")
    assert main.global_block().var_type("x") == ((-1, 4), "int32")
    with pytest.raises(pd.ProgramError, match="'nope'"):
        main.global_block().var_type("nope")


def test_sub_block_restores_the_current_block_even_on_error():
    main = pd.Program()
    with pytest.raises(RuntimeError):
        with main.sub_block() as block:
            assert main.current_block() is block and block.parent_idx == 0
            raise RuntimeError
    assert main.current_block().idx == 0 and len(main.blocks) == 2


def test_layer_scope_names_ops_after_the_layer():
    main = pd.Program()
    with pd.program_guard(main, pd.Program()):
        x = pd.data("x", [2])
        with main.layer_scope("gate") as outer:
            with main.layer_scope("inner") as inner:
                y = pd.ops.tanh(x)
        with main.layer_scope("gate", name="custom") as named:
            pass
    assert (outer, inner, named) == ("gate_0", "gate_0.inner_0", "custom")
    assert y.name.startswith("gate_0.inner_0.tanh")
    block = main.global_block()
    block.rename_output(y, inner)
    assert y.name == "gate_0.inner_0.out" and block.ops[-1].output("Out") == [y.name]


def test_constant_holds_the_array_in_the_program():
    main = pd.Program()
    array = np.arange(6, dtype=np.float64).reshape(2, 3)
    with pd.program_guard(main, pd.Program()):
        c = constant(main.global_block(), array)
        i = constant(main.global_block(), np.int32(7), like="int64")
    assert c.dtype == "float32" and c.shape == (2, 3) and i.dtype == "int64"
    got = _run(pd.Program.from_bytes(main.to_bytes()), {}, [c, i])
    np.testing.assert_array_equal(got[0], array.astype(np.float32))
    assert got[1] == 7
    with pytest.warns(LargeConstantWarning, match="test_program_api.py"):
        constant(main.global_block(), np.zeros(5000, np.float32))


class _Recorder(framework.ProgramListener):
    def __init__(self):
        self.events = []

    def op_appended(self, block, index, opdef, inputs, outputs, attrs):
        self.events.append(("op", opdef.type, index, inputs))
        if opdef.type == "relu":
            raise ValueError("this listener refuses relu")

    def vars_renamed(self, block, renames):
        self.events.append(("renamed", renames))

    def vars_removed(self, program, names):
        self.events.append(("removed", names))

    def data_value(self, var, value):
        self.events.append(("data", var.name, np.asarray(value).tolist()))

    def appending_whole(self, programs):
        self.events.append(("whole", len(programs)))
        return lambda: self.events.append(("undo",))


def test_a_listener_hears_every_change_and_can_refuse_an_op():
    recorder = _Recorder()
    stop = framework.add_listener(recorder)
    try:
        main = pd.Program()
        with pd.program_guard(main, pd.Program()):
            x = pd.data("x", [2], value=np.array([1.0, 2.0], np.float32))
            y = pd.ops.tanh(x)
            with pytest.raises(ValueError, match="refuses relu"):
                pd.ops.relu(y)
            assert [o.type for o in main.global_block().ops] == ["tanh"]   # taken back out
            with pytest.raises(pd.ProgramError):
                pd.layers.fc(x, size=0)
    finally:
        stop()
    with pd.program_guard(main, pd.Program()):
        pd.ops.tanh(x)   # stopped: no longer heard
    kinds = [e[0] for e in recorder.events]
    assert recorder.events[0] == ("data", "x", [1.0, 2.0])
    assert ("op", "tanh", 0, {"X": ["x"]}) in recorder.events
    assert ("op", "relu", 1, {"X": [y.name]}) in recorder.events
    assert kinds.count("whole") == 1 and kinds[-1] == "undo" and "removed" in kinds
    assert kinds.count("op") == 2
