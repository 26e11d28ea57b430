"""tests/backend_precision.py: off the CPU the suite's float32 products are float32, here and
in the processes tests start (through the environment); on the CPU JAX's setting is left
alone."""
import contextlib
import os

import jax
import jax.numpy as jnp

from backend_precision import PRECISION_VARIABLE, pin_float32_products


def _dot_precision():
    """The precision of a float32 dot as JAX lowers it now, e.g. "DEFAULT"."""
    text = jax.jit(lambda a: a @ a).lower(jnp.ones((2, 2), jnp.float32)).as_text()
    line = next(line for line in text.splitlines() if "dot_general" in line)
    return line.split("precision = [")[1].split(",")[0]


@contextlib.contextmanager
def _restored(monkeypatch):
    """Starting from JAX's matmul precision unset, and the variable too; both as they were
    (the suite's own pin included), afterwards."""
    before = jax.config.jax_default_matmul_precision
    monkeypatch.delenv(PRECISION_VARIABLE, raising=False)
    jax.config.update("jax_default_matmul_precision", None)
    try:
        yield
    finally:
        jax.config.update("jax_default_matmul_precision", before)


def test_off_the_cpu_products_are_highest_here_and_in_children(monkeypatch):
    with _restored(monkeypatch):
        assert pin_float32_products("gpu")
        assert _dot_precision() == "HIGHEST"
        assert os.environ[PRECISION_VARIABLE] == "highest"   # inherited by children


def test_on_the_cpu_nothing_changes(monkeypatch):
    with _restored(monkeypatch):
        assert not pin_float32_products("cpu")
        assert _dot_precision() == "DEFAULT"
        assert PRECISION_VARIABLE not in os.environ


def test_a_precision_set_in_the_environment_is_kept(monkeypatch):
    with _restored(monkeypatch):
        monkeypatch.setenv(PRECISION_VARIABLE, "high")
        assert pin_float32_products("tpu")
        assert _dot_precision() == "HIGH"
