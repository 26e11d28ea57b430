"""Mutated programs, checkpoints, model directories and .pdx files: refused cleanly or harmless.

A few dozen reproducible cases per loader (tests/fuzz_targets.py); `make fuzz`
runs the same targets for 100,000 cases with a time limit on each. The targets
that go past the integrity checks (tests/fuzz_deep.py) may crash the process,
so their few cases here run in worker processes of bench/fuzz.py, all in one
run shared by the tests below it.
"""
import faulthandler
import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings

import fuzz_deep
import fuzz_targets

TARGETS = fuzz_targets.targets()
IN_PROCESS = sorted(n for n, t in TARGETS.items() if not t.isolated)
ISOLATED = sorted(n for n, t in TARGETS.items() if t.isolated)
CASES_PER_TARGET = 50
DEEP_CASES_PER_TARGET = 4
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def watchdog():
    """A hung loader ends this process with every thread's traceback instead of blocking CI."""
    faulthandler.dump_traceback_later(600, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


@pytest.mark.parametrize("name", IN_PROCESS)
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


# --- the deeper kinds, in worker processes ---

def _soak(targets, cases, given=None, timeout=15.0, jobs=2, selftest=False):
    """A finished bench.fuzz Soak of `targets` (names): `cases` random ones and `given` ones."""
    sys.path.insert(0, ROOT)
    try:
        from bench import fuzz
    finally:
        sys.path.remove(ROOT)
    every = fuzz_targets.targets(selftest)
    soak = fuzz.Soak({n: every[n] for n in targets}, cases, jobs, timeout, 0,
                     selftest=selftest, given=given)
    soak.run(report_every=3600)
    return soak


def _given(labels):
    found = {}
    for label in labels:
        name, case = fuzz_deep.KNOWN[label]
        found.setdefault(name, []).append(case)
    return found


FAST_KNOWN = ("huge random shape", "checksum downgrade", "checksum downgrade of a model")


SELFTEST = ["ok", "abort", "untyped", "typed"]


@pytest.fixture(scope="module")
def deep_soak():
    """One run of a few seeded cases of every deeper target, the known cases, and cases of
    the harness's own that end as each outcome (an abort among them)."""
    return _soak(ISOLATED, DEEP_CASES_PER_TARGET * len(ISOLATED),
                 {**_given(FAST_KNOWN), "selftest": SELFTEST}, timeout=30.0, selftest=True)


def _findings(soak, name, case=None):
    return [f for f in soak.findings if f[0] == name and (case is None or f[3] == repr(case))]


@pytest.mark.parametrize("name", ISOLATED)
def test_deeper_cases_are_refused_with_a_typed_error_and_change_nothing(deep_soak, name):
    tried = sum(deep_soak.counts[name].values())
    assert tried >= DEEP_CASES_PER_TARGET
    assert not _findings(deep_soak, name), _findings(deep_soak, name)


@pytest.mark.parametrize("label", FAST_KNOWN)
def test_cases_of_issue_22_are_refused(deep_soak, label):
    name, case = fuzz_deep.KNOWN[label]
    assert not _findings(deep_soak, name, case)


def test_a_worker_killed_by_a_signal_is_a_crash_and_the_run_goes_on(deep_soak):
    assert deep_soak.counts["selftest"] == {"loaded": 1, "crash": 1, "error": 1, "refused": 1}
    text = deep_soak.summary(1.0)
    row = next(line.split() for line in text.splitlines() if line.startswith("selftest "))
    assert row == ["selftest", "4", "1", "1", "1", "0", "0", "0", "1"]
    assert "selftest: crash: worker killed by SIGABRT\n    seed given, case: 'abort'" in text


@pytest.mark.slow
@pytest.mark.parametrize("label", ["huge gaussian shape", "huge fill_constant"])
def test_slower_cases_of_issue_22_are_refused(label):
    soak = _soak([], 0, _given([label]), jobs=1)
    assert not soak.findings, soak.findings


@pytest.mark.slow
def test_a_hang_and_a_segfault_are_counted_and_the_run_goes_on():
    soak = _soak([], 0, {"selftest": ["hang", "segv", "ok"]}, timeout=3.0, jobs=1,
                 selftest=True)
    assert soak.counts["selftest"] == {"hang": 1, "crash": 1, "loaded": 1}
    assert "selftest: crash: worker killed by SIGSEGV" in soak.summary(1.0)
