"""The safe pickle walker (progdesc.paddle.pickles): Paddle's .pdparams/.pdopt files decode
to Paddle's values, and hostile or damaged pickles raise FormatError and execute nothing.

The pickles here are assembled opcode by opcode from pickletools' documentation (never
with the pickle module); the real ones are pfix's training fixtures, written by Paddle.
"""
import glob
import os
import random
import struct

import numpy as np
import pytest

from lowering.errors import FormatError
from progdesc.paddle import pickles

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "paddle")


from paddle_pickle_asm import (array, binint, dict_of, glob_, int1, proto, short_bytes,
                               stack_glob, tup, ustr)


# -- values ------------------------------------------------------------------------
@pytest.mark.parametrize("protocol", [2, 3])
@pytest.mark.parametrize("module", ["numpy.core.multiarray", "numpy._core.multiarray"])
def test_arrays_of_each_dtype_and_layout(protocol, module):
    arrays = {"f32": np.arange(6, dtype=np.float32).reshape(2, 3) / 7,
              "f64": np.linspace(-1, 1, 5), "i64": np.array([[-(2 ** 40), 3]]),
              "i32be": np.array([1, -2, 300], dtype=">i4"), "b": np.array([True, False]),
              "u16": np.array([65535, 1], dtype=np.uint16), "empty": np.zeros((0, 3), "f4"),
              "scalar0d": np.array(2.5, "f4")}
    data = proto(protocol) + dict_of(**{k: array(v, module, protocol)
                                       for k, v in arrays.items()}) + b"."
    got = pickles.loads(data)
    assert set(got) == set(arrays)
    for k, v in arrays.items():
        assert got[k].shape == v.shape and got[k].dtype == v.dtype.newbyteorder("="), k
        np.testing.assert_array_equal(got[k], v)
        assert got[k].flags.writeable


def test_fortran_order_and_nested_containers():
    fortran = array(np.arange(6.0).reshape(3, 2)).replace(b"\x89B", b"\x88B")
    data = (proto(3) + b"}(" + ustr("f") + fortran + ustr("n") + b"](" + int1(7)
            + b"G" + struct.pack(">d", 0.25) + b"N\x88" + ustr("s") + b")" + tup(int1(1))
            + b"e" + b"u.")
    got = pickles.loads(data)
    # NumPy's fortran flag: the same bytes read in column-major order
    np.testing.assert_array_equal(got["f"], np.arange(6.0).reshape((3, 2), order="F"))
    assert got["n"] == [7, 0.25, None, True, "s", (), (1,)]


# -- hostile pickles ---------------------------------------------------------------
def _refuses(data, opcode, tmp_path=None, at=None):
    with pytest.raises(FormatError) as e:
        pickles.loads(data, where="evil.pdparams")
    text = str(e.value)
    assert "evil.pdparams" in text and f"opcode {opcode}" in text, text
    if at is not None:
        assert f"byte {at}:" in text, text
    return text


def test_os_system_through_global_and_reduce_executes_nothing(tmp_path):
    target = tmp_path / "pwned"
    head = proto(2)
    data = head + glob_("os", "system") + tup(ustr(f"touch {target}")) + b"R."
    text = _refuses(data, "GLOBAL", at=len(head))
    assert "os.system" in text
    assert not target.exists()


def test_stack_global_of_eval_and_other_callables(tmp_path):
    target = tmp_path / "pwned"
    code = f"open({str(target)!r}, 'w').close()"
    for module, name in [("builtins", "eval"), ("builtins", "exec"), ("posix", "system"),
                         ("subprocess", "call"), ("builtins", "getattr"),
                         ("numpy", "load"), ("numpy.core.multiarray", "_reconstructx")]:
        data = proto(4) + stack_glob(module, name) + tup(ustr(code)) + b"R."
        assert f"{module}.{name}" in _refuses(data, "STACK_GLOBAL")
    assert not target.exists()


def test_inst_obj_newobj_persid_ext_and_buffers_are_refused(tmp_path):
    target = tmp_path / "pwned"
    cases = {
        "INST": b"(" + ustr(f"touch {target}") + b"ios\nsystem\n.",
        "OBJ": b"(" + glob_("numpy", "ndarray") + b"o.",
        "NEWOBJ": glob_("numpy", "ndarray") + b")\x81.",
        "NEWOBJ_EX": glob_("numpy", "ndarray") + b")}\x92.",
        "PERSID": b"Pfoo\n.", "BINPERSID": ustr("x") + b"Q.",
        "EXT1": b"\x82\x01.", "NEXT_BUFFER": b"\x97.", "STRING": b"S'a'\n.",
        "INT": b"I1\n.", "EMPTY_SET": b"\x8f.",
    }
    for name, body in cases.items():
        _refuses(proto(2) + body, name)
    assert not target.exists()


def test_reduce_and_build_outside_arrays_are_refused():
    ndarray = glob_("numpy", "ndarray")
    # REDUCE of an accepted global with other arguments
    _refuses(proto(2) + glob_("numpy", "dtype") + tup(ustr("O"), b"\x89", b"\x88") + b"R.",
             "REDUCE")
    _refuses(proto(2) + glob_("_codecs", "encode") + tup(ustr("a"), ustr("rot13")) + b"R.",
             "REDUCE")
    _refuses(proto(2) + glob_("numpy.core.multiarray", "_reconstruct")
             + tup(glob_("numpy", "dtype"), tup(int1(0)), short_bytes(b"b")) + b"R.", "REDUCE")
    _refuses(proto(2) + glob_("builtins", "bytes") + tup(int1(100)) + b"R.", "REDUCE")
    _refuses(proto(2) + ndarray + tup(tup(int1(2))) + b"R.", "REDUCE")
    # REDUCE of something that is not a global, BUILD on a dict, a global as the value
    _refuses(proto(2) + ustr("os") + b")R.", "REDUCE")
    _refuses(proto(2) + b"}" + tup(ustr("a")) + b"b.", "BUILD")
    _refuses(proto(2) + ndarray + b".", "STOP")
    # an array never built, or built twice
    recon = (glob_("numpy.core.multiarray", "_reconstruct")
             + tup(ndarray, tup(int1(0)), short_bytes(b"b")) + b"R")
    _refuses(proto(3) + recon + b".", "STOP")
    twice = array(np.zeros(2, "f4"), protocol=3)
    _refuses(proto(3) + twice + b"2" + tup(int1(1)) + b"b.", "BUILD")


def test_structured_and_object_dtypes_are_refused():
    dtype = glob_("numpy", "dtype") + tup(ustr("f4"), b"\x89", b"\x88") + b"R"
    fields = tup(int1(3), ustr("<"), b"N", tup(ustr("a")), b"}", binint(4), binint(4), int1(0))
    _refuses(proto(2) + dtype + fields + b"b.", "BUILD")
    for code in ("O", "V8", "U3", "S2", "M8"):
        _refuses(proto(2) + glob_("numpy", "dtype") + tup(ustr(code), b"\x89", b"\x88")
                 + b"R.", "REDUCE")


def test_array_sizes_are_checked_against_the_bytes_present():
    small = array(np.zeros(2, "f4"), protocol=3)
    huge = small.replace(tup(binint(2)), tup(binint(2 ** 30), binint(2 ** 30)))
    text = _refuses(proto(3) + huge + b".", "BUILD")
    assert "needs" in text and "holds 8" in text
    short = small.replace(tup(binint(2)), tup(binint(3)))
    _refuses(proto(3) + short + b".", "BUILD")
    negative = small.replace(tup(binint(2)), tup(binint(-2), binint(-1)))
    _refuses(proto(3) + negative + b".", "BUILD")
    many_dims = small.replace(tup(binint(2)), tup(*[int1(1)] * 40, binint(2)))
    _refuses(proto(3) + many_dims + b".", "BUILD")
    empty = array(np.zeros(0, "f4"), protocol=3)
    for dims in [(0, 2 ** 62), (0, 2 ** 70), (2 ** 40, 0, 2 ** 40)]:   # no bytes, huge extent
        body = empty.replace(tup(binint(0)), tup(*[
            b"\x8a\x09" + d.to_bytes(9, "little", signed=True) for d in dims]))
        _refuses(proto(3) + body + b".", "BUILD")


def test_lengths_past_the_end_fail_before_allocating():
    for body, name in [(b"\x8e" + struct.pack("<Q", 2 ** 62) + b"ab", "BINBYTES8"),
                       (b"X" + struct.pack("<I", 2 ** 31) + b"ab", "BINUNICODE"),
                       (b"\x8b" + struct.pack("<I", 2 ** 31) + b"ab", "LONG4"),
                       (b"\x95" + struct.pack("<Q", 2 ** 60), "FRAME"),
                       (b"j" + struct.pack("<I", 7), "LONG_BINGET")]:
        _refuses(proto(4) + body + b".", name)


def test_nesting_cycles_and_shared_containers():
    deep = proto(2) + b"]" * 100_000 + b"a" * 99_999 + b"."
    assert "deeper" in _refuses(deep, "STOP")
    marks = proto(2) + b"(" * 1000 + b"."
    _refuses(marks, "MARK")
    cycle = proto(2) + b"]q\x00h\x00a."          # a list appended to itself
    _refuses(cycle, "STOP")
    # a list holding the previous one twice, 60 times: 2 ** 60 paths, one pass each
    shared = proto(2) + b"]q\x00" + b"".join(
        b"0]h" + bytes([i]) + b"ah" + bytes([i]) + b"aq" + bytes([i + 1]) for i in range(60)) + b"."
    got = pickles.loads(shared)
    for _ in range(60):
        assert len(got) == 2 and got[0] is got[1]
        got = got[0]


def test_stream_structure_errors():
    _refuses(proto(2) + b"}." + b"extra", "STOP")
    _refuses(proto(2) + b"}}.", "STOP")
    _refuses(proto(2) + b"0.", "POP")
    _refuses(proto(2) + b"]}(" + b"]" + b"u.", "SETITEMS")
    _refuses(proto(2) + b"}" + b"]" + int1(1) + b"s.", "SETITEM")
    _refuses(proto(2) + b"}" + int1(1) + b"a.", "APPEND")
    _refuses(b"\x80\x07}.", "PROTO")
    with pytest.raises(FormatError, match="no STOP"):
        pickles.loads(proto(2) + b"}")


# -- Paddle's own files ------------------------------------------------------------
def _paddle_pickles():
    return sorted(glob.glob(os.path.join(FIXTURES, "train_*", "**", "*.pd*"), recursive=True)
                  + glob.glob(os.path.join(FIXTURES + "_training", "*", "*.pd*")))


def _pickle_files():
    return [p for p in _paddle_pickles() if p.endswith((".pdparams", ".pdopt"))]


needs_fixtures = pytest.mark.skipif(not _pickle_files(), reason="pfix's training fixtures absent")


@needs_fixtures
def test_truncations_and_byte_edits_of_paddles_files_raise_format_error_only():
    rng = random.Random(0)
    for path in _pickle_files()[:4]:
        data = open(path, "rb").read()
        pickles.loads(data)
        for cut in range(0, len(data), max(1, len(data) // 300)):
            with pytest.raises(FormatError):
                pickles.loads(data[:cut])
        for _ in range(300):
            edited = bytearray(data)
            for _ in range(rng.randint(1, 3)):
                edited[rng.randrange(len(data))] = rng.randrange(256)
            try:
                pickles.loads(bytes(edited))
            except FormatError:
                pass


VARIANTS = os.path.join(os.path.dirname(__file__), "fixtures", "paddle_training")


@pytest.mark.parametrize("variant", sorted(
    d for d in os.listdir(VARIANTS) if os.path.isdir(os.path.join(VARIANTS, d))))
def test_paddles_pickles_decode_to_the_values_paddle_held(variant):
    """Paddle 3 (NumPy 2: numpy._core) and Paddle 2.6 (NumPy 1: numpy.core) files against
    the arrays the fixture script read from Paddle's scope when it saved them."""
    d = os.path.join(VARIANTS, variant)
    with np.load(os.path.join(d, "state.npz"), allow_pickle=False) as held:
        held = dict(held)
    got = {**pickles.load(os.path.join(d, "model.pdparams")),
           **pickles.load(os.path.join(d, "model.pdopt"))}
    held = {k: v for k, v in held.items() if k not in ("x", "label")}   # PIR: feeds too
    assert sorted(got) == sorted(held)
    for name, value in got.items():
        assert value.dtype == held[name].dtype and value.shape == held[name].shape, name
        np.testing.assert_array_equal(value, held[name])
