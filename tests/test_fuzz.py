"""Mutated programs, checkpoints, model directories and .pdx files: refused cleanly or harmless.

A few dozen reproducible cases per loader (tests/fuzz_targets.py); `make fuzz`
runs the same targets for 100,000 cases with a time limit on each.
"""
import faulthandler
import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings

import fuzz_targets

TARGETS = fuzz_targets.targets()
CASES_PER_TARGET = 50


@pytest.fixture(autouse=True)
def watchdog():
    """A hung loader ends this process with every thread's traceback instead of blocking CI."""
    faulthandler.dump_traceback_later(600, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_mutated_inputs_are_refused_with_a_typed_error_and_change_nothing(name):
    target = TARGETS[name]

    @settings(max_examples=4 * CASES_PER_TARGET if target.finite else CASES_PER_TARGET,
              deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(case=target.strategy())
    def check(case):
        outcome, detail = fuzz_targets.run_case(target, case)
        assert outcome in ("loaded", "refused"), f"{outcome}: {detail}"

    check()


def test_mutations_change_the_bytes_as_described():
    data = bytes(range(10))
    mutate = fuzz_targets.mutate
    assert mutate(data, [("flip", 3, 0)]) == data[:3] + b"\x02" + data[4:]
    assert mutate(data, [("byte", 0, 255)]) == b"\xff" + data[1:]
    assert mutate(data, [("delete", 2, 3)]) == data[:2] + data[5:]
    assert mutate(data, [("insert", 10, b"ab")]) == data + b"ab"
    assert mutate(data, [("duplicate", 8, 5)]) == data[:8] + data[8:] + data[8:]
    assert mutate(data, [("truncate", 4)]) == data[:4]
    assert mutate(data, [("byte", 13, 0)]) == data[:2] + b"\x00" + data[3:]   # 13 % (10 + 1)
    assert mutate(data, [("truncate", 5), ("insert", 0, b"z")]) == b"z" + data[:5]


@pytest.mark.slow
def test_the_soak_runner_prints_a_summary_per_target():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run(
        [sys.executable, "-m", "bench.fuzz", "--cases", "40", "--jobs", "1",
         "--only", "load_program", "load_checkpoint"], capture_output=True, text=True, cwd=root,
        env=dict(os.environ, PYTHONPATH=root), timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {line.split()[0]: line.split()[1:] for line in done.stdout.splitlines()
            if line.startswith(("load_program ", "load_checkpoint ", "all "))}
    assert rows["load_program"][0] == rows["load_checkpoint"][0] == "20"
    assert rows["all"][0] == "40" and rows["all"][3:] == ["0"] * 5    # no finding of any kind
    assert "40 cases in" in done.stdout and "0 finding(s)" in done.stdout
