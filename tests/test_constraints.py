"""Attribute values are checked against what they mean, not only their type: when an op is
appended, when a program is loaded, and for custom ops declaring `where=`."""
import re

import numpy as np
import pytest

import progdesc as pd
from lowering import progdesc_pb2 as pb
from lowering import registry
from progdesc import custom_op, layers, ops


def _forged(op_type, inputs, attr, value, **attrs):
    """Bytes of a program holding one `op_type` op whose `attr` was edited to `value`, as a
    stranger could write it."""
    main = pd.Program()
    with pd.program_guard(main):
        main.global_block().append_op(op_type, inputs(), attrs=attrs)
    desc = pb.ProgramDesc()
    desc.CopyFrom(main.desc)
    attribute = desc.blocks[0].ops[-1].attrs[attr]
    attribute.Clear()
    registry.encode_attr(registry.get(op_type).attr(attr), value, attribute)
    return desc.SerializeToString()


@pytest.mark.parametrize("op_type, inputs, attr, value, message", [
    ("dropout", lambda: {"X": pd.data("x", [None, 4])}, "dropout_prob", 1.5,
     "attribute dropout_prob=1.5 must be in [0, 1]"),
    ("pool2d", lambda: {"X": pd.data("x", [None, 3, 8, 8])}, "ksize", (2, 0),
     "attribute ksize=[2, 0] must hold elements > 0"),
    ("pool2d", lambda: {"X": pd.data("x", [None, 3, 8, 8])}, "pooling_type", "mean",
     "attribute pooling_type='mean' must be one of 'max', 'avg'"),
    ("layer_norm", lambda: {"X": pd.data("x", [None, 4])}, "epsilon", -0.5,
     "attribute epsilon=-0.5 must be >= 0"),
])
def test_a_value_out_of_its_meaning_is_refused_when_built_and_when_loaded(
        op_type, inputs, attr, value, message):
    good = {"ksize": [2, 2]} if op_type == "pool2d" else {}
    data = _forged(op_type, inputs, attr, value, **good)
    with pytest.raises(pd.AttributeValueError, match=rf"op #0 '{op_type}'.*{_escaped(message)}"):
        pd.Program.from_bytes(data)
    main = pd.Program()
    with pd.program_guard(main), pytest.raises(pd.AttributeValueError,
                                                match=_escaped(message)):
        main.global_block().append_op(op_type, inputs(), attrs={**good, attr: value})
    assert not main.global_block().desc.ops   # nothing appended


def _escaped(text):
    return re.escape(text)


def test_dropout_of_probability_one_still_drops_everything():
    x = np.arange(1.0, 9.0, dtype="float32").reshape(2, 4)
    main = pd.Program()
    with pd.program_guard(main):
        y = layers.dropout(pd.data("x", [None, 4]), 1.0)
    got, = pd.Executor().run(main, feed={"x": x}, fetch_list=[y], scope=pd.Scope())
    np.testing.assert_array_equal(got, np.zeros_like(x))


def test_a_custom_op_states_its_constraint_once():
    @custom_op.op("clipped_power_c", inputs=[custom_op.In("X", "float")],
                  outputs=[custom_op.Out("Out")],
                  attrs={"p": custom_op.Attr("p", "float", 2.0, where=custom_op.positive),
                         "mode": custom_op.Attr("mode", "string", "abs",
                                                where=custom_op.one_of("abs", "sign"))})
    def clipped_power_c(X, *, p, mode):
        return abs(X) ** p
    try:
        main = pd.Program()
        with pd.program_guard(main):
            x = pd.data("x", [3])
            ops.clipped_power_c(x, p=3.0)
            with pytest.raises(pd.AttributeValueError, match=r"attribute p=0.0 must be > 0"):
                ops.clipped_power_c(x, p=0.0)
            with pytest.raises(pd.AttributeValueError, match=r"mode='both' must be one of"):
                ops.clipped_power_c(x, mode="both")
    finally:
        custom_op.unregister("clipped_power_c")


def test_declared_shapes_must_be_whole_sizes():
    with pd.program_guard(pd.Program()):
        with pytest.raises(pd.ProgramError, match=r"variable 'x'.*shape must hold sizes"):
            pd.data("x", [None, 2.5])
        with pytest.raises(pd.ProgramError, match=r"variable 'y'.*shape must hold sizes"):
            pd.data("y", [-2, 3])


def test_comparison_operators_append_comparison_ops():
    x_value = np.array([[1.0, 3.0, 5.0]], "float32")
    y_value = np.array([[2.0, 3.0, 4.0]], "float32")
    main = pd.Program()
    with pd.program_guard(main):
        x, y = pd.data("x", [None, 3]), pd.data("y", [None, 3])
        results = [x < 3, x <= 3, 3 < x, x > y, x >= y]
    assert [main.global_block().desc.ops[i].type for i in (1, 3, 5, 6, 7)] == [
        "less_than", "less_equal", "greater_than", "greater_than", "greater_equal"]
    got = pd.Executor().run(main, feed={"x": x_value, "y": y_value}, fetch_list=results,
                            scope=pd.Scope())
    want = [x_value < 3, x_value <= 3, 3 < x_value, x_value > y_value, x_value >= y_value]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
