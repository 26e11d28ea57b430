"""Suite-wide setup: no test writes into the user's real compilation cache.

The variable is set before any test imports progdesc, and the subprocesses and
notebook kernels that tests start inherit it. Tests of the cache itself turn it
back on in their own subprocesses, at a temporary directory.
"""
import os

os.environ["PROGDESC_COMPILATION_CACHE"] = "0"
# The suite compiles thousands of tiny programs once each, and XLA's CPU backend spends most
# of that in LLVM's optimizer. At level 0 it compiles them a third faster into code that
# computes the same numbers (XLA keeps fast-math off at every level; the HLO passes are
# unchanged). Set before JAX is imported; subprocesses and notebook kernels inherit it.
os.environ["XLA_FLAGS"] = " ".join(
    [os.environ.get("XLA_FLAGS", ""), "--xla_backend_optimization_level=0"]).strip()

# off the CPU, float32 products in float32 for every test (an autouse session fixture)
from backend_precision import float32_products_off_the_cpu  # noqa: E402,F401

pytest_plugins = ["browser"]  # tests/browser.py: headless Chromium fixtures


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


LONGEST_FILES = ("test_op_table.py", "test_notebooks.py", "test_onnx_node_suite.py",
                 "test_distributed_devices.py", "test_cli.py", "test_multihost.py",
                 "test_onnx_fixtures.py", "test_from_flax.py", "test_from_jax_random.py",
                 "test_precision.py", "test_as_jax.py", "test_user_errors.py")
"""The test files that took longest in CI's selection (2 cores, 2026-11-27), longest first."""


def pytest_collection_modifyitems(items):
    """Longest files first: `-n 2 --dist loadfile` hands whole files to the two workers in
    collection order, and a long file handed out last keeps one worker busy while the
    other has nothing left (the order within a file is kept)."""
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    position = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (rank.get(item.path.name, len(rank)), position[id(item)]))
