"""`import progdesc` loads no optional package, and every public name still resolves.

The checks run in one fresh interpreter (a module already imported by another test would
hide a lazy one), in the order a user meets them: a bare `import progdesc`, a first
training step (which loads optax), explicit imports of the lazy submodules, then every
public name. No timing is asserted here: bench/import_time.py measures it.
"""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# loaded on first use only (Flax by progdesc.flax / from_flax, optax by the optimizer ops'
# lowering, jax.extend by from_jax and export checks, the others by their front ends)
OPTIONAL = ("flax", "optax", "sklearn", "scipy", "matplotlib", "onnx", "onnxruntime",
            "jax.extend", "torch", "paddle", "progdesc.interop.from_jax",
            "progdesc.interop.from_flax", "progdesc.export", "progdesc.onnx", "progdesc.paddle")

# packages whose __all__ is the public API (progdesc.onnx and progdesc.paddle need the onnx
# package or none: both are importable here)
PACKAGES = ("progdesc", "progdesc.amp", "progdesc.control_flow", "progdesc.custom_op",
            "progdesc.debug", "progdesc.display", "progdesc.distributed", "progdesc.flax",
            "progdesc.interop", "progdesc.onnx", "progdesc.paddle", "progdesc.recording",
            "progdesc.translate")


_SCRIPT = f"""
import importlib, json, sys
import progdesc as pd
report = {{"loaded": [m for m in {OPTIONAL!r} if m in sys.modules]}}

# a first Adam step: optax loads when the optimizer's rule first runs
main, startup = pd.Program(), pd.Program()
with pd.program_guard(main, startup):
    w = pd.create_parameter([3], "float32", attr="w",
                            default_initializer=pd.initializer.Constant(1.0))
    loss = pd.ops.reduce_sum(w * w)
    pd.optimizer.Adam(0.1).minimize(loss)
exe, scope = pd.Executor(), pd.Scope()
exe.run(startup, scope=scope)
exe.run(main, scope=scope, fetch_list=[loss])
report["optax_after_step"] = "optax" in sys.modules
report["w"] = scope.get("w").tolist()

# importing a submodule named as its package's function must leave the function there
import progdesc.interop.as_jax, progdesc.interop.from_jax, progdesc.interop.from_flax
from progdesc.interop import as_jax, from_flax, from_jax
report["kinds"] = [type(f).__name__ for f in (as_jax, from_flax, from_jax, pd.as_jax,
                                              pd.from_flax, pd.from_jax, pd.export)]

missing = [n for n in pd.__all__ if getattr(pd, n, None) is None]
missing += [n for n in ("interop", "translate", "export_check", "__version__")
            if not hasattr(pd, n)]
for package in {PACKAGES!r}:
    module = importlib.import_module(package)
    missing += [package + "." + n for n in module.__all__ if getattr(module, n, None) is None]
report["missing"] = missing
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def fresh():
    """What the script above saw, in a fresh interpreter."""
    env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_import_progdesc_loads_no_optional_package(fresh):
    assert fresh["loaded"] == []


def test_an_optimizer_still_trains_with_optax_loaded_on_first_use(fresh):
    """Adam's first step: m / sqrt(v) after bias correction is g / |g|, so each weight
    moves by the learning rate against its gradient's sign: 1 - 0.1."""
    assert fresh["optax_after_step"]
    assert all(abs(v - 0.9) < 1e-5 for v in fresh["w"]), fresh["w"]


def test_lazy_names_are_the_functions_after_their_modules_are_imported(fresh):
    """Importing the submodule `progdesc.interop.from_jax` must not turn the package's
    `from_jax` (a function of the same name) into the module."""
    assert fresh["kinds"] == ["function"] * 6 + ["module"]


def test_every_public_name_resolves_after_a_bare_import(fresh):
    """`pd.X` for each X of each package's __all__, and the names `import progdesc` used to
    bind before they were lazy."""
    assert fresh["missing"] == []
