"""The program builder: guards, names, cloning, bytes and text, printing, validation errors."""
import numpy as np
import pytest

import progdesc as pd
from progdesc import ops


def small_program():
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 3])
        y = pd.data("y", [3])
        z = ops.mul(ops.add(x, y), x)
    return main, x, y, z


def test_program_guard_leaves_default_programs_alone():
    before = len(pd.default_main_program().global_block().desc.ops)
    for _ in range(3):  # a notebook cell run three times
        small_program()
    assert len(pd.default_main_program().global_block().desc.ops) == before


def test_ops_fill_output_shapes_and_dtypes():
    main, x, y, z = small_program()
    assert x.shape == (-1, 3) and x.dtype == "float32"
    assert z.shape == (-1, 3) and z.dtype == "float32"
    assert [o.type for o in main.global_block().ops] == ["add", "mul"]


def test_unique_names_are_per_program_and_stable():
    a, *_ = small_program()
    b, *_ = small_program()
    names = lambda p: [o.output("Out")[0] for o in p.global_block().ops]  # noqa: E731
    assert names(a) == names(b) == ["add_0.out", "mul_0.out"]


def test_clone_is_deep():
    main, *_ = small_program()
    copy = main.clone()
    with pd.program_guard(copy):
        ops.add(copy.global_block().var("x"), copy.global_block().var("x"))
    assert len(copy.global_block().ops) == 3 and len(main.global_block().ops) == 2


def test_bytes_and_text_round_trip():
    main, *_ = small_program()
    data = main.to_bytes()
    again = pd.Program.from_bytes(data)
    assert again.to_bytes() == data
    assert pd.Program.from_text(main.to_text()).to_bytes() == data
    assert "callsite" not in pd.Program.from_bytes(main.to_bytes(strip_callsites=True)).to_text()


def test_print_shows_one_line_per_op_with_shapes():
    main, *_ = small_program()
    text = str(main)
    assert "add_0.out: float32[-1, 3] = add(X=x, Y=y)" in text
    assert "mul_0.out: float32[-1, 3] = mul(X=add_0.out, Y=x)" in text
    assert "data  x: float32[-1, 3]" in text


def test_print_shows_non_default_attributes():
    main = pd.Program()
    with pd.program_guard(main):
        x = pd.data("x", [2])
        ops.scale(x, scale=2.0)
    assert "scale(X=x) {scale=2}" in str(main)


# --- errors a user can cause ---

def test_unknown_op_type_names_the_op_and_line():
    main = pd.Program()
    with pytest.raises(pd.UnknownOpError) as e:
        main.global_block().append_op("no_such_op", {})
    msg = str(e.value)
    assert "'no_such_op'" in msg and "op #0" in msg and "test_program.py:" in msg


def test_extra_and_missing_slots():
    main = pd.Program()
    with pd.program_guard(main):
        x = pd.data("x", [2])
        with pytest.raises(pd.ProgramError, match="'Z' is not an input slot"):
            main.global_block().append_op("add", {"X": x, "Y": x, "Z": x})
        with pytest.raises(pd.ProgramError, match="required input slot 'Y'"):
            main.global_block().append_op("add", {"X": x})


def test_attribute_of_the_wrong_type_or_undeclared():
    main = pd.Program()
    with pd.program_guard(main):
        x = pd.data("x", [2])
        with pytest.raises(pd.AttributeTypeError, match="'scale' expects float, got str"):
            ops.scale(x, scale="big")
        with pytest.raises(pd.AttributeTypeError, match="'alpha' is not declared by 'scale'"):
            main.global_block().append_op("scale", {"X": x}, attrs={"alpha": 1.0})


def test_attribute_checks_hold_for_equal_values_of_another_type():
    main = pd.Program()
    with pd.program_guard(main):
        x = pd.data("x", [2])
        ops.scale(x, scale=1.0)                        # 1.0 == True: checked values are cached
        with pytest.raises(pd.AttributeTypeError, match="'scale' expects float, got bool"):
            ops.scale(x, scale=True)
        ops.reshape(x, shape=[1, 2])
        with pytest.raises(pd.AttributeTypeError, match="'shape' expects int, got float"):
            ops.reshape(x, shape=[1.0, 2.0])
        y = ops.scale(x, scale=2)                      # an int for a float attribute is converted
        assert main.global_block().ops[-1].attr("scale") == 2.0 and y.shape == (2,)


def test_dtype_mismatch_names_both_slots():
    main = pd.Program()
    with pd.program_guard(main):
        x = pd.data("x", [2])
        i = pd.data("i", [2], "int64")
        with pytest.raises(pd.ProgramError, match="slot 'X' is float32 but slot 'Y' is int64"):
            ops.add(x, i)


def test_variable_used_before_defined():
    main = pd.Program()
    with pytest.raises(pd.ProgramError, match="variable 'ghost': is used before it is defined"):
        main.global_block().append_op("neg", {"X": "ghost"})


def test_incompatible_shapes_are_a_shape_error_naming_the_op():
    main = pd.Program()
    with pd.program_guard(main):
        a, b = pd.data("a", [2, 3]), pd.data("b", [4])
        with pytest.raises(pd.ShapeError, match="op #0 'add'"):
            ops.add(a, b)


def test_bytes_that_are_not_a_program():
    with pytest.raises(pd.FormatError, match="not a valid ProgramDesc"):
        pd.Program.from_bytes(b"\xff\xff\xff garbage")
    with pytest.raises(pd.FormatError, match="not a valid ProgramDesc"):
        pd.Program.from_text("blocks { nonsense: 1 }")


def test_loaded_program_is_validated_against_the_registry():
    main, *_ = small_program()
    main.desc.blocks[0].ops[1].type = "mystery"
    with pytest.raises(pd.UnknownOpError, match="op #1 'mystery'"):
        pd.Program.from_bytes(main.to_bytes())
    main, *_ = small_program()
    main.desc.format_version = 99
    with pytest.raises(pd.FormatError, match="format version 99"):
        pd.Program.from_bytes(main.to_bytes())


def test_variable_operators_build_ops():
    main = pd.Program()
    with pd.program_guard(main):
        x = pd.data("x", [3])
        y = (x + 1.0) * 2.0 - x / x
    exe = pd.Executor()
    out, = exe.run(main, feed={"x": np.array([1.0, 2.0, 3.0])}, fetch_list=[y],
                   scope=pd.Scope())
    np.testing.assert_allclose(out, [3.0, 5.0, 7.0])
