"""Suite-wide setup: no test writes into the user's real compilation cache.

The variable is set before any test imports progdesc, and the subprocesses and
notebook kernels that tests start inherit it. Tests of the cache itself turn it
back on in their own subprocesses, at a temporary directory.
"""
import os

os.environ["PROGDESC_COMPILATION_CACHE"] = "0"


def pytest_collection_finish(session):
    """JAX's 64-bit switch is global: a test module that turns it on when imported changes
    every test of the run (it did once). Tests turn it on inside `jax.enable_x64(True)`."""
    import jax
    if jax.config.jax_enable_x64:
        raise RuntimeError("a test module turned jax_enable_x64 on when it was imported; "
                           "use `with jax.enable_x64(True):` inside the test instead")


def pytest_terminal_summary(terminalreporter):
    """The pass rates of ONNX's node suite (tests/test_onnx_node_suite.py), where it ran
    (its last test records them, in whichever worker ran it)."""
    for reports in list(terminalreporter.stats.values()):
        for report in reports:
            if getattr(report, "when", None) != "call":
                continue
            for key, value in getattr(report, "user_properties", ()):
                if key == "onnx_node_suite":
                    terminalreporter.write_line(value)
