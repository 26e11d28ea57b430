"""A lone int where an op wants a list of axes or a shape, and `ops.mean(x, axis=...)`.

Values against NumPy; what the program stores read back from its serialized bytes.
"""
import numpy as np
import pytest

import progdesc as pd
from lowering import progdesc_pb2 as pb
from lowering.registry import Attr
from progdesc import ops

X = np.random.default_rng(0).normal(size=(3, 4, 5)).astype(np.float32)
POSITIVE = np.abs(X) + 0.5

# op -> its NumPy reference of (x, axis, keepdims)
REDUCTIONS = {"reduce_sum": np.sum, "reduce_mean": np.mean, "reduce_max": np.max,
              "reduce_min": np.min, "reduce_prod": np.prod, "mean": np.mean}


@pytest.fixture(scope="module")
def reduced():
    """Every reduction over axis=1 and axis=-1 (a lone int), kept and not, and `mean`
    without an axis, run once: {(op, axis, keep_dim): (value, the op's stored axis)}."""
    main, startup = pd.Program(), pd.Program()
    fetched, stored = {}, {}
    with pd.program_guard(main, startup):
        x = pd.data("x", [3, 4, 5])
        for name in REDUCTIONS:
            for axis in (1, -1, np.int64(2)):
                for keep in (False, True):
                    out = getattr(ops, name)(x, axis=axis, keep_dim=keep)
                    fetched[name, int(axis), keep] = out
        fetched["mean", None, False] = ops.mean(x)
    program = pd.Program.from_bytes(main.to_bytes())
    for op_desc in program.desc.blocks[0].ops:
        if op_desc.type in REDUCTIONS:
            out_name = op_desc.outputs[0].arguments[0]
            stored[out_name] = op_desc.attrs["axis"]
    keys = list(fetched)
    values = pd.Executor().run(main, feed={"x": POSITIVE}, fetch_list=[fetched[k] for k in keys],
                               scope=pd.Scope())
    return {k: (v, stored[fetched[k].name]) for k, v in zip(keys, values)}


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_a_lone_int_axis_reduces_as_numpy_does(reduced, name):
    for axis in (1, -1, 2):
        for keep in (False, True):
            value, stored = reduced[name, axis, keep]
            np.testing.assert_allclose(value, REDUCTIONS[name](POSITIVE, axis=axis, keepdims=keep),
                                       rtol=1e-5)
            # the program holds a list of ints, as if [axis] had been written
            assert stored.WhichOneof("value") == "ints"
            assert list(stored.ints.values) == [axis]


def test_mean_without_axis_is_still_the_mean_of_everything(reduced):
    value, stored = reduced["mean", None, False]
    assert value.shape == ()
    np.testing.assert_allclose(value, POSITIVE.mean(), rtol=1e-6)
    assert list(stored.ints.values) == []


def test_mean_signature_offers_axis_and_keep_dim():
    import inspect
    params = inspect.signature(ops.mean).parameters
    assert params["axis"].default == () and params["keep_dim"].default is False
    assert "axis: ints (or one int)" in ops.mean.__doc__


@pytest.mark.parametrize("bad", [True, 1.0, "1", np.float32(1), None])
def test_bools_floats_and_strings_are_still_refused(bad):
    with pd.program_guard(pd.Program(), pd.Program()):
        x = pd.data("x", [3, 4])
        with pytest.raises(pd.AttributeTypeError, match=r"attribute 'axis' expects ints or one int"):
            ops.reduce_sum(x, axis=bad)


def test_a_lone_int_is_not_taken_for_per_dimension_sizes():
    """conv2d's strides=2 could mean [2, 2]; a one-element list would be a guess."""
    with pd.program_guard(pd.Program(), pd.Program()):
        x, w = pd.data("x", [1, 3, 8, 8]), pd.data("w", [4, 3, 3, 3])
        with pytest.raises(pd.AttributeTypeError, match=r"'strides' expects ints, got int 2"):
            ops.conv2d(x, w, strides=2)


def test_other_axis_and_shape_attributes_take_a_lone_int():
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [3, 1, 5])
        outs = [ops.squeeze(x, axes=1), ops.unsqueeze(x, axes=0), ops.reshape(x, shape=-1),
                ops.slice(x, axes=2, starts=1, ends=4),
                ops.fill_constant(shape=4, dtype="float32", value=2.0)]
    xv = np.arange(15, dtype=np.float32).reshape(3, 1, 5)
    got = pd.Executor().run(main, feed={"x": xv}, fetch_list=outs, scope=pd.Scope())
    expected = [np.squeeze(xv, 1), xv[None], xv.reshape(-1), xv[:, :, 1:4],
                np.full(4, 2.0, np.float32)]
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(g, e)


def test_lone_int_is_only_for_lists_of_ints():
    with pytest.raises(ValueError, match="lone_int is for 'ints'"):
        Attr("k", "int", 0, lone_int=True)


def test_an_ints_attribute_in_a_file_is_not_loosened():
    """A file's `axis` stored as one int (not a list) is still refused when loaded."""
    main = pd.Program()
    with pd.program_guard(main, pd.Program()):
        ops.reduce_sum(pd.data("x", [3, 4]), axis=1)
    desc = pb.ProgramDesc.FromString(main.to_bytes())
    op_desc = next(o for o in desc.blocks[0].ops if o.type == "reduce_sum")
    op_desc.attrs["axis"].i = 1
    with pytest.raises(pd.AttributeTypeError, match="'axis' expects ints"):
        pd.Program.from_bytes(desc.SerializeToString())
