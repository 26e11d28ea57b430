"""Float32 products in float32 on every backend, for the whole suite.

The suite's references (NumPy, Paddle's and PyTorch's recorded outputs, onnxruntime, optax)
compute float32 matmuls and convolutions in float32, and its tolerances (1e-5 mostly) say
so. JAX's default on NVIDIA GPUs is TF32 (10 mantissa bits), on TPUs one bfloat16 pass:
there, 113 of the 133 failures of the suite's first GPU run (H100, 2026-11-27) were such
products missing a float32 tolerance by 1e-5 to 2e-3 (bench/RESULTS.md, "GPU (H100)").
So off the CPU the suite asks JAX for "highest" before any test traces, in this process
and, through the environment, in the subprocesses and notebook kernels that tests start.
On the CPU nothing changes: "highest" is what the CPU computes anyway, and the tests of
the "default" precision policy (tests/test_precision.py) see JAX's setting unset there.
"""
import os

import jax
import pytest

PRECISION_VARIABLE = "JAX_DEFAULT_MATMUL_PRECISION"


def pin_float32_products(backend):
    """Ask JAX for "highest" float32 matmul precision when `backend` (a name as
    `jax.default_backend()` gives it) is not "cpu", here and in child processes.
    Returns whether it did. A precision the caller set in the environment is kept."""
    if backend == "cpu":
        return False
    precision = os.environ.setdefault(PRECISION_VARIABLE, "highest")
    jax.config.update("jax_default_matmul_precision", precision)
    return True


@pytest.fixture(autouse=True, scope="session")
def float32_products_off_the_cpu():
    """Session-wide: `pin_float32_products` for the backend the tests run on."""
    pin_float32_products(jax.default_backend())
    yield
