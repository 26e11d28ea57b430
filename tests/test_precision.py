"""The precision policy: data in the program, kept by every copy of it, applied by the lowering
to every float32 dot and convolution (read here in the lowered StableHLO)."""
import re

import jax
import numpy as np
import pytest

import progdesc as pd
from lowering import progdesc_pb2 as pb
from lowering.lower import lower_block
from progdesc import cli, export, io, layers, ops
from progdesc.feeding import with_feed_fetch

_RNG = np.random.default_rng(0)
FEED = {"image": _RNG.normal(size=(2, 1, 6, 6)).astype(np.float32),
        "tokens": _RNG.normal(size=(2, 4, 8)).astype(np.float32)}


@pytest.fixture(autouse=True)
def _jaxs_own_setting_unset():
    """These tests are about what the "default" policy leaves to JAX: they see JAX's matmul
    precision unset, also where the suite pins it to "highest" (off the CPU:
    tests/backend_precision.py)."""
    with jax.default_matmul_precision(None):
        yield


def _model(precision="default"):
    """Convolution, matmul and attention, trained: their gradient ops hold dots and convs too."""
    main, startup = pd.Program(random_seed=1, precision=precision), pd.Program(random_seed=1)
    with pd.program_guard(main, startup):
        image = pd.data("image", [None, 1, 6, 6])
        tokens = pd.data("tokens", [None, 4, 8])
        h = layers.fc(layers.conv2d(image, 2, 3, act="relu"), 8)
        a = layers.multi_head_attention(tokens, num_heads=2, causal=True)
        loss = ops.add(ops.mean(h), ops.mean(a))
        pd.optimizer.SGD(0.1).minimize(loss)
    scope = pd.Scope()
    pd.Executor().run(startup, scope=scope)
    return main, loss, scope


def _stablehlo(program, loss, scope, precision=None):
    """The StableHLO text of one training step as the lowering pass builds it."""
    lowered = lower_block(with_feed_fetch(program, tuple(FEED), (loss.name,)), 0, precision)
    state = {n: scope.get(n) for n in lowered.reads}
    with jax.enable_x64(True):
        return jax.jit(lowered.fn).lower(tuple(FEED.values()), {}, state).as_text()


def _dots_and_convs(text):
    dots = re.findall(r"stablehlo\.dot_general .*", text)
    convs = re.findall(r"stablehlo\.convolution\(.*", text)
    # forward and gradient products: 19 dots, the convolution and its filter gradient
    assert len(dots) >= 15 and len(convs) >= 2, (len(dots), len(convs))
    return dots, convs


def _assert_all(text, level):
    dots, convs = _dots_and_convs(text)
    for line in dots:
        assert f"precision = [{level}, {level}]" in line, line
    for line in convs:
        assert (f"precision_config = [#stablehlo<precision {level}>, "
                f"#stablehlo<precision {level}>]") in line, line


def test_highest_reaches_every_dot_and_convolution_forward_and_backward():
    main, loss, scope = _model("highest")
    _assert_all(_stablehlo(main, loss, scope), "HIGHEST")


def test_default_leaves_every_dot_and_convolution_at_default():
    main, loss, scope = _model()
    text = _stablehlo(main, loss, scope)
    assert "HIGHEST" not in text
    _assert_all(text, "DEFAULT")


def test_default_follows_jaxs_own_setting():
    main, loss, scope = _model()
    with jax.default_matmul_precision("highest"):
        _assert_all(_stablehlo(main, loss, scope), "HIGHEST")


def test_an_explicit_precision_overrides_the_programs():
    main, loss, scope = _model("highest")
    assert "HIGHEST" not in _stablehlo(main, loss, scope, precision="default")
    main.precision = "default"
    _assert_all(_stablehlo(main, loss, scope, precision="highest"), "HIGHEST")


@pytest.fixture
def compiled_modules(tmp_path):
    """A function returning the text of every module JAX lowered since the fixture began."""
    before = jax.config.values["jax_dump_ir_to"]
    jax.config.update("jax_dump_ir_to", str(tmp_path))
    try:
        yield lambda: "\n".join(p.read_text() for p in sorted(tmp_path.glob("*.mlir")))
    finally:
        jax.config.update("jax_dump_ir_to", before)


@pytest.mark.parametrize("program_precision, executor_precision, level", [
    ("default", "highest", "HIGHEST"), ("highest", "default", "DEFAULT"),
    ("highest", None, "HIGHEST"), ("default", None, "DEFAULT"),
])
def test_executor_compiles_at_its_precision_or_the_programs(
        compiled_modules, program_precision, executor_precision, level):
    main, loss, scope = _model(program_precision)
    exe = pd.Executor(precision=executor_precision)
    exe.run(main, feed=FEED, fetch_list=[loss], scope=scope)
    _assert_all(compiled_modules(), level)


def test_changing_the_precision_recompiles():
    main, loss, scope = _model()
    exe = pd.Executor()
    exe.run(main, feed=FEED, fetch_list=[loss], scope=scope)
    exe.run(main, feed=FEED, fetch_list=[loss], scope=scope)
    assert exe.trace_count == 1
    main.precision = "highest"
    exe.run(main, feed=FEED, fetch_list=[loss], scope=scope)
    assert exe.trace_count == 2


def test_clone_save_load_and_inference_models_keep_it(tmp_path):
    main, loss, scope = _model("highest")
    assert main.clone().precision == main.clone(for_test=True).precision == "highest"
    assert pd.Program.from_bytes(main.to_bytes()).precision == "highest"
    assert pd.Program.from_text(main.to_text()).precision == "highest"
    io.save_program(main, tmp_path / "main.pb")
    assert io.load_program(tmp_path / "main.pb").precision == "highest"
    exe = pd.Executor()
    io.save_inference_model(tmp_path / "model", ["image", "tokens"], [loss], exe, main, scope)
    program, _, _ = io.load_inference_model(tmp_path / "model", exe, pd.Scope())
    assert program.precision == "highest"


def test_export_traces_it_into_the_artifact(tmp_path):
    main, loss, scope = _model("highest")
    header = export.export_compiled(tmp_path / "m.pdx", main, ["image", "tokens"], [loss], scope,
                                    platforms=(jax.export.default_export_platform(),))
    assert header["precision"] == "highest"
    text = str(export.load_compiled(tmp_path / "m.pdx").exported.mlir_module())
    dots = re.findall(r"stablehlo\.dot_general .*", text)
    assert dots and all("precision = [HIGHEST, HIGHEST]" in line for line in dots)
    assert "#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>" in text


def test_programs_without_the_field_read_as_default_and_bad_values_are_refused():
    old = pb.ProgramDesc(format_version=1)
    old.blocks.add(idx=0, parent_idx=-1)
    assert pd.Program.from_bytes(old.SerializeToString()).precision == "default"
    old.precision = 7   # written by a newer progdesc with a policy this one does not know
    with pytest.raises(pd.FormatError, match="precision 7"):
        pd.Program.from_bytes(old.SerializeToString())
    with pytest.raises(ValueError, match="precision must be one of"):
        pd.Program().precision = "fast"
    with pytest.raises(ValueError, match="precision must be one of"):
        pd.Executor(precision="float32")


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="what the README promises for CPUs")
def test_on_the_cpu_both_policies_give_the_same_numbers():
    results = []
    for precision in ("default", "highest"):
        main, loss, scope = _model()
        exe = pd.Executor(precision=precision)
        losses = [exe.run(main, feed=FEED, fetch_list=[loss], scope=scope)[0] for _ in range(3)]
        results.append((losses, np.asarray(scope.get("conv2d_0.w_0"))))
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_array_equal(results[0][1], results[1][1])


def test_print_html_and_progdesc_show_name_a_non_default_policy(tmp_path, capsys):
    main, startup = pd.Program(precision="highest"), pd.Program()
    with pd.program_guard(main, startup):
        out = layers.fc(pd.data("x", [None, 3]), 2)
    assert str(main).splitlines()[0] == "program (format 1, seed 0, precision highest)"
    assert "\u00b7 precision highest" in main.table()._repr_html_()
    scope = pd.Scope()
    pd.Executor().run(startup, scope=scope)
    export.export_compiled(tmp_path / "m.pdx", main, ["x"], [out], scope,
                           platforms=(jax.export.default_export_platform(),))
    io.save_program(main, tmp_path / "main.pb")
    for path in ("m.pdx", "main.pb"):
        assert cli.main(["show", str(tmp_path / path)]) == 0
    shown = capsys.readouterr().out
    assert "; precision: highest" in shown and "precision highest)" in shown
    main.precision = "default"
    assert str(main).splitlines()[0] == "program (format 1, seed 0)"
    assert "\u00b7 precision" not in main.table()._repr_html_()
