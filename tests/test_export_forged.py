"""Forged `.pdx` files, re-signed so they pass the digests, crash nothing: refused or run.

The 60 files of tests/pdx_forgery.py are loaded and called in a subprocess, so
a segfault or an abort shows as a signal, not as the death of pytest.
"""
import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

import progdesc as pd
import pdx_forgery
from progdesc import export, export_check, jax_compat
from test_export import expected, feeds, model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Forgeries that may pass the loader: bytes that no check can tell from a valid
# program's (a flipped constant, a location string), or an equivalent module.
MAY_LOAD = ("module bytes flipped", "flatbuffer bytes flipped", "module as text")

RUNNER = textwrap.dedent("""
    import json, sys
    import numpy as np
    import progdesc as pd
    from progdesc import export
    feeds = dict(np.load(sys.argv[1]))
    for path in sys.argv[2:]:
        print(json.dumps({"start": path}), flush=True)
        out = {"path": path}
        try:
            model = export.load_compiled(path)
            out["at"] = "call"
            results = model(**feeds)
            out["results"] = [[str(r.dtype), list(r.shape)] for r in results]
            out["values"] = [r.tolist() for r in results]
        except Exception as e:
            out.update(error=type(e).__name__, typed=isinstance(e, pd.ProgdescError),
                       message=str(e)[:300])
            out.setdefault("at", "load")
        print(json.dumps(out), flush=True)
""")


def run_forged(paths, feeds_npz, cwd=ROOT, timeout=120):
    """{path: outcome} of loading and calling each file; a death by signal or a hang
    (no end within `timeout` s) is the outcome of the file that was running.

    All files run in one process; after a death the rest run in a new one."""
    outcomes, todo = {}, list(paths)
    env = dict(os.environ, PYTHONPATH=cwd)
    while todo:
        try:
            proc = subprocess.run([sys.executable, "-c", RUNNER, feeds_npz, *todo], cwd=cwd,
                                  env=env, capture_output=True, text=True, timeout=timeout)
            stdout, status = proc.stdout, proc.returncode
        except subprocess.TimeoutExpired as e:
            stdout, status = (e.stdout or b"").decode(), "hung"
        lines = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
        started = [line["start"] for line in lines if "start" in line]
        outcomes.update((line["path"], line) for line in lines if "path" in line)
        if status == 0:
            break
        if not started or started[-1] in outcomes:        # died outside any file
            raise AssertionError(f"runner failed ({status}): {stdout[-2000:]}")
        outcomes[started[-1]] = {"path": started[-1], "died": status}
        todo = todo[todo.index(started[-1]) + 1:]
    return outcomes


@pytest.fixture(scope="module")
def forged(tmp_path_factory):
    built = main, scope, exe, out, pred = model()
    work = tmp_path_factory.mktemp("forged")
    original = work / "original.pdx"
    export.export_compiled(original, main, ["x", "ids"], [out, pred], scope)
    names = {str(original): "original"}
    for i, (name, blob) in enumerate(pdx_forgery.forge(original.read_bytes(), seed=0)):
        path = work / f"{i:02d}.pdx"
        path.write_bytes(blob)
        names[str(path)] = name
    np.savez(work / "feeds.npz", **feeds(3))
    return names, str(work / "feeds.npz"), expected(*built, 3)


def test_sixty_forged_files_crash_nothing(forged):
    names, feeds_npz, (want_out, want_pred) = forged
    outcomes = run_forged(list(names), feeds_npz)
    bad = []
    for path, name in names.items():
        got = outcomes[path]
        if "died" in got:
            bad.append(f"{name}: the process died or hung (status {got['died']})")
        elif "error" in got and not got["typed"]:
            bad.append(f"{name}: untyped {got['error']} at {got['at']}: {got['message']}")
        elif "error" in got and got["at"] == "load" and got["error"] != "FormatError":
            bad.append(f"{name}: {got['error']} at load, not FormatError")
        elif "error" not in got and got["results"] != [["float32", [3, 3]], ["int32", [3]]]:
            bad.append(f"{name}: loaded, and returned {got['results']}")
        elif "error" not in got and not name.startswith(MAY_LOAD) and name != "original":
            bad.append(f"{name}: loaded and ran")
    assert not bad, "\n".join(bad)
    control = outcomes[next(iter(names))]
    np.testing.assert_allclose(control["values"][0], want_out, rtol=1e-6, atol=1e-6)
    assert np.array_equal(control["values"][1], want_pred)


def test_a_failure_inside_the_program_is_typed(forged, tmp_path):
    """What XLA raises at call (here: a module using dims it says it does not) is a
    CompiledCallError naming the file and the inputs."""
    names, _, _ = forged
    original = next(iter(names))
    header, payload = export.split_compiled(open(original, "rb").read())
    broken = jax.export.deserialize(bytearray(payload))
    broken = dataclasses.replace(broken, uses_global_constants=False)
    model_ = export.CompiledModel(header, broken, path=original)
    with pytest.raises(pd.CompiledCallError, match=r"original\.pdx.*x: float32\[3, 4\]") as e:
        model_(**feeds(3))
    assert "JaxRuntimeError" in str(e.value)


def test_digests_are_recomputed_by_pack_compiled(forged):
    names, _, _ = forged
    data = open(next(iter(names)), "rb").read()
    assert export.pack_compiled(*export.split_compiled(data)) == data
    header, payload = export.split_compiled(data)
    edited = export.pack_compiled({**header, "precision": "default"}, payload)
    assert export.read_compiled(edited)[0]["precision"] == "default"


def test_custom_call_allowlist_is_jax_own():
    """The allowlist is JAX's list of stable targets: if JAX moves it, this says so."""
    assert export_check.stable_targets_and_note()[1] == "", (
        "JAX moved its list of stable custom-call targets: update "
        "progdesc.jax_compat.stable_custom_call_targets")
    assert export_check.jax_stable_custom_call_targets() == (
        jax_compat.stable_custom_call_targets())
    cpu = export_check.allowed_custom_call_targets(("cpu",))
    assert {"shape_assertion", "Sharding", "lapack_sgetrf_ffi"} <= cpu
    assert not {"cusolver_getrf_ffi", "hipsolver_getrf_ffi", "Qr", "tpu_custom_call"} & cpu
    gpu = export_check.allowed_custom_call_targets(("cuda",))
    assert "cusolver_getrf_ffi" in gpu and "mosaic_gpu_v2" not in gpu
