"""A test file's cases on four forced host CPU devices.

JAX fixes its device count when it starts, so a file whose cases need four devices runs
itself again in a subprocess with `XLA_FLAGS=--xla_force_host_platform_device_count=4`:
its `test_on_four_host_devices` calls `run_on_four_host_devices(__file__, selection)`, and
its cases carry `@four_devices`, which skips them in a process with fewer devices.
"""
import os
import re
import subprocess
import sys

import jax
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOUR = jax.device_count() >= 4
four_devices = pytest.mark.skipif(not FOUR, reason="run by test_on_four_host_devices")
SELECTIONS = ["not slow", pytest.param("slow", marks=pytest.mark.slow)]
"""`test_on_four_host_devices`'s parameters: the CI cases, and the long ones apart."""


def run_on_four_host_devices(test_file, selection):
    """Run the cases of `test_file` marked `selection` ("not slow" or "slow") in a
    subprocess with four forced CPU devices; fail with its output unless every one of them
    passed (the one skipped is the calling test itself, in the subprocess)."""
    if FOUR:
        pytest.skip("this process has four devices: the cases run in it")
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
               JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
    result = subprocess.run([sys.executable, "-m", "pytest", test_file, "-p",
                             "no:cacheprovider", "-m", selection], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert re.search(r"\d+ passed, 1 skipped", result.stdout), result.stdout[-3000:]
