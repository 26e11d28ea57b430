"""The JAX internals progdesc uses (progdesc/jax_compat.py), each on the installed JAX.

For each: (a) it resolves and does what progdesc relies on, checked against JAX's public
behaviour; (b) with it missing, the progdesc feature using it raises JaxCompatError
naming the internal, the JAX version and the feature, or falls back as documented.
A missing internal is simulated by a stand-in for its JAX module in `sys.modules`
(where jax_compat looks it up) that forwards everything else; JAX's own code keeps
the real module.
"""
import dataclasses
import importlib
import inspect
import os
import re
import subprocess
import sys
import threading
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend import mlir as jax_mlir
from jax.interpreters import mlir as jax_interp_mlir
from jaxlib.mlir.dialects import stablehlo

import progdesc as pd
from lowering.errors import JaxCompatError
from progdesc import compile_cache, export, export_check, jax_compat
from progdesc import distributed as dist

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MISSING = object()


def lacking(monkeypatch, module, **replaced):
    """JAX's `module`, as jax_compat finds it, with the names given MISSING removed and the
    others replaced."""
    real = importlib.import_module(module)

    class StandIn(types.ModuleType):
        def __getattr__(self, name):
            if replaced.get(name) is MISSING:
                raise AttributeError(f"module '{module}' has no attribute '{name}'")
            return replaced[name] if name in replaced else getattr(real, name)

    monkeypatch.setitem(sys.modules, module, StandIn(module))


def assert_names(error, internal, feature):
    assert error.internal == internal and error.jax_version == jax.__version__
    assert feature in error.feature
    for part in (internal, f"JAX {jax.__version__}", feature, "progdesc/jax_compat.py"):
        assert part in str(error)


# --- Compiled._call: the Executor's and eager mode's call ---

def test_compiled_call_is_the_compiled_functions_own_call():
    a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.full((2, 3), 0.5, np.float32)
    compiled = jax.jit(lambda x, y: x * y + 1.0).lower(a, b).compile()
    assert jax_compat.compiled_call(compiled) is compiled   # not called yet: the fallback
    np.testing.assert_array_equal(compiled(a, b), a * b + 1.0)
    call = jax_compat.compiled_call(compiled)
    assert call is not compiled, (
        "a jax.stages.Compiled has no callable `_call` after its first call: the Executor "
        "now calls it one Python frame slower; update progdesc/jax_compat.py (compiled_call)")
    np.testing.assert_array_equal(call(a, b), a * b + 1.0)


def test_without_compiled_call_the_compiled_function_itself_is_called(monkeypatch):
    def double(v):
        return v * 2
    assert jax_compat.compiled_call(double) is double
    calls = []
    monkeypatch.setattr(jax_compat, "compiled_call", lambda c: calls.append(c) or c)
    main = pd.Program()
    with pd.program_guard(main, pd.Program()):
        x = pd.data("x", [-1, 3], "float32")
        y = x * 2.0 + 1.0
    exe, scope, v = pd.Executor(), pd.Scope(), np.arange(6, dtype=np.float32).reshape(2, 3)
    for _ in range(2):   # compiled on the first run, called as it is on the second
        (got,) = exe.run(main, feed={"x": v}, fetch_list=[y], scope=scope)
        np.testing.assert_array_equal(got, v * 2.0 + 1.0)
    assert len(calls) == 1 and isinstance(calls[0], jax.stages.Compiled)


# --- JAX's stable custom-call targets: the .pdx loader's allowlist ---

STABLE = ("jax._src.export._export", "_CUSTOM_CALL_TARGETS_GUARANTEED_STABLE")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A .pdx of a small batch-polymorphic program, and a feed."""
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [-1, 4], "float32")
        y = pd.layers.fc(x, 3)
    scope = pd.Scope()
    pd.Executor().run(startup, scope=scope)
    path = tmp_path_factory.mktemp("pdx") / "fc.pdx"
    export.export_compiled(path, main, ["x"], [y], scope)
    return path, np.ones((2, 4), np.float32)


def module_text(path):
    _, payload = export.split_compiled(path.read_bytes())
    return jax.export.deserialize(bytearray(payload)).mlir_module()


def with_custom_call(path, target, to):
    """A copy of the .pdx `path` at `to` whose @main first calls the custom-call `target`."""
    header, payload = export.split_compiled(path.read_bytes())
    exported = jax.export.deserialize(bytearray(payload))
    with jax_interp_mlir.make_ir_context():
        text = str(jax_mlir.deserialize_portable_artifact(exported.mlir_module_serialized))
    at = text.index("\n", text.index("func.func public @main")) + 1
    text = (text[:at] + f"    stablehlo.custom_call @{target}() {{has_side_effect = true}} "
            ": () -> ()\n" + text[at:])
    module = stablehlo.serialize_portable_artifact_str(text, stablehlo.get_minimum_version())
    edited = dataclasses.replace(exported, mlir_module_serialized=module).serialize()
    to.write_bytes(export.pack_compiled(header, bytes(edited)))
    return to


def test_the_stable_targets_hold_those_progdesc_programs_use(exported):
    stable = jax_compat.stable_custom_call_targets()
    used = set(re.findall(r'custom_call @"?([\w.$]+)', module_text(exported[0])))
    assert "shape_assertion" in used        # the symbolic batch dim's checks
    assert used <= stable, f"JAX no longer lists {used - stable} as stable"
    assert {"lapack_sgetrf_ffi", "cusolver_getrf_ffi"} <= stable


def test_without_the_stable_targets_a_pdx_needing_them_is_refused_saying_why(
        monkeypatch, exported, tmp_path):
    path, x = exported
    lu = with_custom_call(path, "lapack_sgetrf_ffi", tmp_path / "lu.pdx")
    assert export.load_compiled(lu) is not None          # JAX's list has the target
    lacking(monkeypatch, STABLE[0], **{STABLE[1]: MISSING})
    with pytest.raises(JaxCompatError) as info:
        jax_compat.stable_custom_call_targets()
    assert_names(info.value, ".".join(STABLE), "checking the custom calls of a loaded .pdx")
    stable, note = export_check.stable_targets_and_note()
    assert "shape_assertion" in stable and "lapack_sgetrf_ffi" not in stable
    with pytest.raises(pd.FormatError) as refused:
        export.load_compiled(lu)
    assert "custom call to 'lapack_sgetrf_ffi'" in str(refused.value)
    assert note in str(refused.value)
    model = export.load_compiled(path)       # a file with only the fallback's targets loads
    (got,) = model(x)
    assert got.shape == (2, 3)


# --- JAX's persistent cache options, per thread: progdesc.compile_cache ---

def test_thread_cache_settings_hold_for_this_thread_only(tmp_path):
    mine, global_dir = str(tmp_path / "mine"), jax.config.jax_compilation_cache_dir
    seen = {}
    other = threading.Thread(target=lambda: seen.update(other=jax.config.jax_compilation_cache_dir))
    with jax_compat.thread_compilation_cache(cache_dir=mine, max_size=-1, min_compile_time=0.0):
        assert jax.config.jax_compilation_cache_dir == mine
        assert jax.config.jax_compilation_cache_max_size == -1
        assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.0
        assert jax_compat.global_compilation_cache_dir() == global_dir
        other.start()
        other.join()
    assert seen["other"] == global_dir
    assert jax.config.jax_compilation_cache_dir == global_dir


def test_without_thread_cache_settings_progdesc_compiles_uncached_with_a_warning(
        monkeypatch, tmp_path):
    lacking(monkeypatch, "jax._src.config", compilation_cache_dir=MISSING)
    with pytest.raises(JaxCompatError) as info:
        jax_compat.thread_compilation_cache(cache_dir=str(tmp_path))
    assert_names(info.value, "jax._src.config.compilation_cache_dir",
                 "progdesc's compilation cache")
    assert "uncached" in str(info.value)
    assert not compile_cache.thread_settings_supported()
    assert jax_compat.global_compilation_cache_dir() == jax.config.jax_compilation_cache_dir
    compile_cache.set_compilation_cache(tmp_path / "cache")
    try:
        with pytest.warns(RuntimeWarning, match="jax._src.config.compilation_cache_dir"):
            with compile_cache.compiling():
                compiled = jax.jit(lambda v: v * 3.0 - 1.0).lower(np.ones(2, np.float32)).compile()
        np.testing.assert_array_equal(compiled(np.ones(2, np.float32)), [2.0, 2.0])
    finally:
        compile_cache.configure_default()
    assert not (tmp_path / "cache").exists()   # nothing cached, JAX's settings untouched


# --- tracebacks with JAX's frames: from_jax's BatchPolymorphismError ---

def _jax_frames(fn):
    try:
        fn()
    except TypeError as e:
        tb, frames = e.__traceback__, 0
        while tb is not None:
            frames += "jax/_src/" in tb.tb_frame.f_code.co_filename.replace("\\", "/")
            tb = tb.tb_next
        return frames
    raise AssertionError("expected a TypeError")


def bad_reshape():
    jax.make_jaxpr(lambda v: jnp.reshape(v, (7,)))(np.ones(3))


def test_unfiltered_tracebacks_keep_jaxs_frames():
    with jax_compat.unfiltered_tracebacks():
        kept = _jax_frames(bad_reshape)
    assert kept > _jax_frames(bad_reshape), (
        "jax._src.config.traceback_filtering('off') no longer keeps JAX's frames: from_jax's "
        "BatchPolymorphismError may name less; update progdesc/jax_compat.py")


def test_without_traceback_filtering_from_jax_still_raises_its_typed_error(monkeypatch):
    lacking(monkeypatch, "jax._src.config", traceback_filtering=MISSING)
    filtered = _jax_frames(bad_reshape)
    with jax_compat.unfiltered_tracebacks():      # the fallback: a null context
        assert _jax_frames(bad_reshape) == filtered
    table = np.ones((3, 4), np.float32)
    with pytest.raises(pd.BatchPolymorphismError, match="cannot be traced with a symbolic"):
        pd.from_jax(lambda x: x * table, table)


# --- JAX's source path of jax.nn: from_jax turns jax.nn.relu into our relu op ---

def test_jax_nn_relu_comes_from_the_source_file_progdesc_matches():
    program, _, _ = pd.from_jax(jax.nn.relu, np.ones(3, np.float32), scope=pd.Scope())
    types_ = [op.type for op in program.global_block().ops]
    assert "relu" in types_, (
        f"jax.nn.relu no longer comes from {jax_compat.JAX_NN_SOURCE}: from_jax inlines it "
        "(its gradient at 0 then differs from JAX's); update progdesc/jax_compat.py "
        f"(JAX_NN_SOURCE). Ops: {types_}")


def test_a_relu_from_another_file_is_inlined_with_the_same_values():
    @jax.custom_jvp
    def relu(v):
        return jnp.maximum(v, 0.0)
    relu.defjvp(lambda primals, tangents: (relu(primals[0]), tangents[0]))
    x = np.array([-1.0, 0.0, 2.0], np.float32)
    scope = pd.Scope()
    program, feeds, fetches = pd.from_jax(relu, x, scope=scope)
    assert "relu" not in [op.type for op in program.global_block().ops]
    (got,) = pd.Executor().run(program, feed={feeds[0]: x}, fetch_list=fetches, scope=scope)
    np.testing.assert_array_equal(got, np.maximum(x, 0.0))


# --- JAX's distributed runtime: progdesc.distributed.initialize ---

FRESH = """
import jax
from progdesc import jax_compat
state = jax_compat.distributed_state()
print(jax_compat.backends_are_initialized(), state.client is None, state.service is None,
      jax.distributed.is_initialized())
jax.devices()
print(jax_compat.backends_are_initialized())
"""


def test_distributed_state_and_backends_in_a_fresh_process():
    out = subprocess.run([sys.executable, "-c", FRESH], cwd=ROOT, capture_output=True,
                         text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu"))
    assert out.stdout.split("\n")[:2] == ["False True True False", "True"], out.stderr[-2000:]


def test_distributed_clients_get_the_callback_while_it_is_active(monkeypatch):
    from jax._src import distributed   # the internals progdesc relies on, read here
    assert "_jax.get_distributed_runtime_client(" in inspect.getsource(
        distributed.State.initialize), "JAX makes its client another way: update jax_compat"
    assert "missed_heartbeat_callback" in distributed._jax.get_distributed_runtime_client.__doc__
    made = []
    monkeypatch.setattr(distributed._jax, "get_distributed_runtime_client",
                        lambda *a, **kw: made.append(kw))

    def callback(*_):
        pass
    with jax_compat.distributed_clients_calling(callback) as active:
        distributed._jax.get_distributed_runtime_client("127.0.0.1:1", 0)
    distributed._jax.get_distributed_runtime_client("127.0.0.1:1", 0)
    assert active and made == [{"missed_heartbeat_callback": callback}, {}]


def test_without_a_client_factory_jax_own_behaviour_stands(monkeypatch):
    lacking(monkeypatch, "jax._src.distributed", _jax=types.SimpleNamespace())
    with jax_compat.distributed_clients_calling(print) as active:
        assert not active


@pytest.mark.parametrize("module, replaced, internal", [
    ("jax._src.distributed", {"global_state": MISSING}, "jax._src.distributed.global_state"),
    ("jax._src.distributed", {"global_state": types.SimpleNamespace(client=None)},
     "jax._src.distributed.global_state.service"),
    ("jax._src.distributed",
     {"_jax": types.SimpleNamespace(DistributedRuntimeClient=type("Client", (), {}))},
     "jax._src.distributed._jax.DistributedRuntimeClient.get_live_nodes"),
    ("jax._src.xla_bridge", {"backends_are_initialized": MISSING},
     "jax._src.xla_bridge.backends_are_initialized"),
])
def test_without_the_distributed_internals_initialize_says_so(monkeypatch, module, replaced,
                                                               internal):
    lacking(monkeypatch, module, **replaced)
    with pytest.raises(JaxCompatError) as info:
        dist.initialize("127.0.0.1:1234", 2, 1)
    assert_names(info.value, internal, "progdesc.distributed.initialize")
    assert isinstance(info.value, pd.ProgdescError) and not jax.distributed.is_initialized()


# --- dce_jaxpr: from_jax removes dead equations before translating ---

def _with_dead_code(x):
    jax.lax.cumlogsumexp(x)   # computed, never used: a primitive progdesc does not translate
    return x * 2.0


def test_dead_code_removal_drops_unused_equations_and_keeps_the_signature():
    closed = jax.make_jaxpr(lambda x, y: (jnp.sin(x), jnp.exp(y) * 0.0 + 1.0, x + 1.0)[0::2])(
        np.ones(3, np.float32), np.ones(2, np.float32))
    pruned = jax_compat.dead_code_removed(closed)
    assert [e.primitive.name for e in pruned.jaxpr.eqns] == ["sin", "add"], (
        "jax.interpreters.partial_eval.dce_jaxpr no longer removes dead equations; "
        "update progdesc/jax_compat.py")
    assert len(pruned.jaxpr.invars) == 2 and len(pruned.jaxpr.outvars) == 2
    a, b = jax.core.eval_jaxpr(pruned.jaxpr, pruned.consts, np.float32([0.5] * 3), np.ones(2))
    np.testing.assert_allclose(a, np.sin(0.5) * np.ones(3), rtol=1e-6)
    np.testing.assert_allclose(b, 1.5 * np.ones(3), rtol=1e-6)
    scope = pd.Scope()
    program, feeds, fetches = pd.from_jax(_with_dead_code, np.ones(3, np.float32), scope=scope)
    (got,) = pd.Executor().run(program, feed={feeds[0]: np.float32([1, 2, 3])},
                               fetch_list=fetches, scope=scope)
    np.testing.assert_array_equal(got, np.float32([2, 4, 6]))


def test_without_dead_code_removal_dead_equations_are_translated_as_before(monkeypatch):
    lacking(monkeypatch, "jax.interpreters.partial_eval", dce_jaxpr=MISSING)
    closed = jax.make_jaxpr(lambda x: (jnp.sin(x), x)[1])(np.ones(3, np.float32))
    assert jax_compat.dead_code_removed(closed) is closed
    with pytest.raises(pd.UnsupportedPrimitiveError, match="'cumlogsumexp'"):
        pd.from_jax(_with_dead_code, np.ones(3, np.float32), scope=pd.Scope())


def test_dim_min_max_keeps_a_clamped_slice_symbolic():
    low, high = jax_compat.dim_min_max()
    assert (low(3, 5), high(3, 5)) == (3, 5)
    b, = jax.export.symbolic_shape("b")
    exported = jax.export.export(jax.jit(lambda x: x[:low(x.shape[0], 4)]))(
        jax.ShapeDtypeStruct((b,), np.float32))
    assert str(exported.out_avals[0].shape[0]) == "min(b, 4)"
    np.testing.assert_array_equal(exported.call(np.arange(6, dtype=np.float32)), np.arange(4))


def test_without_dim_min_max_ints_still_work_and_symbols_say_why(monkeypatch):
    lacking(monkeypatch, "jax._src.core", min_dim=MISSING)
    low, high = jax_compat.dim_min_max()
    assert (low(3, 5), high(3, 5)) == (3, 5)
    b, = jax.export.symbolic_shape("b")
    with pytest.raises(JaxCompatError, match="jax._src.core.min_dim"):
        low(b, 4)
