"""`progdesc launch`: N processes started with what initialize() reads, their output, signals,
and restarts from the last checkpoint after a failure.

Every case runs the real command in a subprocess (`python -m progdesc launch`). The
launcher's mechanics are checked on small Python scripts that do not start JAX (fast);
training is checked on tests/launch_worker.py, two processes of one CPU device each,
against the same MLP trained on one device in this process.
"""
import os
import platform
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import progdesc as pd
from progdesc import distributed as dist
from progdesc.distributed.launch import Launcher

from launch_worker import STEPS, batch
from multihost_worker import mlp_program
from test_cli import in_process

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT = 240


def environment():
    return dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu",
                XLA_FLAGS="--xla_force_host_platform_device_count=1")


def launch(*args, **popen):
    """`progdesc launch ARGS` started (a Popen, stdout and stderr piped as text)."""
    return subprocess.Popen([sys.executable, "-m", "progdesc", "launch", *map(str, args)],
                            cwd=ROOT, env=environment(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **popen)


def finish(proc):
    """(returncode, stdout, stderr) of a launcher, killed (with its processes) if it hangs."""
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"progdesc launch did not end within {TIMEOUT} s:\n{out}\n{err}")
    return proc.returncode, out, err


def alive(pid):
    """Whether process `pid` still runs (a zombie waiting for its reaper does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_gone(pids, seconds=10):
    deadline = time.monotonic() + seconds
    while any(map(alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [pid for pid in pids if alive(pid)]


# Each process records its pid and that of a child it starts (sleep 60), then process 1
# exits with status 3 (or with the status argv[2] names) and process 0 sleeps: the launcher
# must stop it and its child. With argv[2] "term", both wait for SIGTERM, SIGINT or SIGHUP
# and say so; with "ok", both end at once with status 0.
SCRIPT = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    out, how = sys.argv[1], sys.argv[2]
    rank, count = int(os.environ["PROGDESC_PROCESS_ID"]), os.environ["PROGDESC_NUM_PROCESSES"]
    restart = os.environ["PROGDESC_RESTART_COUNT"]
    child = subprocess.Popen(["sleep", "60"])
    print(f"rank {rank} of {count} at {os.environ['PROGDESC_COORDINATOR']}, restart {restart}",
          flush=True)
    print(f"rank {rank} on stderr", file=sys.stderr, flush=True)
    if how == "term":
        def stop(signum, frame):
            print(f"rank {rank} got {signal.Signals(signum).name}", flush=True)
            sys.exit(0)
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, stop)
    with open(os.path.join(out, f"pids-{restart}-{rank}"), "w") as f:
        f.write(f"{os.getpid()} {child.pid}")
    if how == "ok":
        child.kill()
        sys.exit(0)
    if rank == 1 and how != "term":
        time.sleep(0.3)
        sys.exit(int(how))
    time.sleep(60)
""")


def pids(directory):
    return [int(p) for name in sorted(os.listdir(directory)) if name.startswith("pids-")
            for p in (directory / name).read_text().split()]



def test_a_failure_restarts_all_then_ends_with_its_status_and_no_process_left(tmp_path,
                                                                               capsys):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    (tmp_path / "out").mkdir()
    code, out, err = in_process(capsys, "launch", "--nprocs", 2, "--max-restarts", 1,
                                "--stop-timeout", 5, script, tmp_path / "out", 3)
    assert code == 3, err
    lines = err.strip().splitlines()
    assert ("progdesc launch: process 1 of 2 exited with status 3; stopped the others, starting "
            "all 2 again (restart 1 of 1)") in lines, err
    assert lines[-1] == ("progdesc launch: process 1 of 2 exited with status 3; no restart left "
                         "(--max-restarts 1): the job failed with status 3"), err
    # every process of both starts got the launcher's variables, its output prefixed by rank
    for restart in (0, 1):
        for rank in (0, 1):
            assert f"[{rank}] rank {rank} of 2 at 127.0.0.1:" in out
            assert f"restart {restart}\n" in out
            assert f"[{rank}] rank {rank} on stderr" in err
    assert len(pids(tmp_path / "out")) == 8          # 2 starts x 2 processes x (itself, child)
    assert wait_gone(pids(tmp_path / "out")) == []   # all stopped, their children too


@pytest.mark.parametrize("signum", [signal.SIGTERM,
                                    pytest.param(signal.SIGINT, marks=pytest.mark.slow),
                                    pytest.param(signal.SIGHUP, marks=pytest.mark.slow)])
def test_a_signal_to_the_launcher_reaches_every_process_and_stops_them(tmp_path, signum):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    (tmp_path / "out").mkdir()
    proc = launch("--nprocs", 2, "--max-restarts", 3, script, tmp_path / "out", "term")
    deadline = time.monotonic() + 60
    while len(pids(tmp_path / "out")) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signum)
    code, out, err = finish(proc)
    name = signal.Signals(signum).name
    assert code == 128 + signum, err
    assert f"[0] rank 0 got {name}" in out and f"[1] rank 1 got {name}" in out, out
    assert "restart 1" not in out                    # a signal is no failure: no restart
    assert err.strip().splitlines()[-1] == f"progdesc launch: got {name}: stopped all 2 processes"
    assert wait_gone(pids(tmp_path / "out")) == []


def wait_for_pids(directory, count):
    deadline = time.monotonic() + 60
    while len(pids(directory)) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    return pids(directory)


def test_a_launcher_killed_outright_takes_its_processes_with_it(tmp_path):
    """SIGKILL to the launcher (the OOM killer, a scheduler): its processes and what they
    started (the script's `sleep 60`) end too."""
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    (tmp_path / "out").mkdir()
    proc = launch("--nprocs", 2, script, tmp_path / "out", "term")
    started = wait_for_pids(tmp_path / "out", 4)
    try:
        proc.kill()
        proc.communicate()
        assert wait_gone(started) == []
    finally:
        for pid in started:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_process_started_as_a_signal_comes_gets_it_too(tmp_path, capsys, monkeypatch):
    """SIGTERM reaches the launcher after process 1 is started but before the launcher holds
    it: it still gets SIGTERM (then SIGKILL only after --stop-timeout, 60 s here)."""
    from progdesc.distributed import launch as launch_module
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    (tmp_path / "out").mkdir()
    started = []

    class Popen(subprocess.Popen):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            started.append(self)
            if len(started) == 2:
                os.kill(os.getpid(), signal.SIGTERM)     # its handler runs before we return
    monkeypatch.setattr(launch_module.subprocess, "Popen", Popen)
    launcher = Launcher([sys.executable, str(script), str(tmp_path / "out"), "term"], 2,
                        stop_timeout=60, env=environment())
    assert launcher.run() == 128 + signal.SIGTERM
    capsys.readouterr()
    # killed by SIGTERM before its handler was set, or ended by its handler: not by SIGKILL
    assert [p.returncode for p in started] in ([-signal.SIGTERM, -signal.SIGTERM],
                                               [0, -signal.SIGTERM], [-signal.SIGTERM, 0], [0, 0])


def test_a_job_whose_processes_all_end_well_exits_0(tmp_path, capsys):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    (tmp_path / "out").mkdir()
    code, out, err = in_process(capsys, "launch", "--nprocs", 3, script, tmp_path / "out", "ok")
    assert code == 0, err
    assert sorted(os.listdir(tmp_path / "out")) == ["pids-0-0", "pids-0-1", "pids-0-2"]
    assert "progdesc launch:" not in err
    code, out, err = in_process(capsys, "launch", "--nprocs", 2, "-m", "platform")   # a module
    assert code == 0, err
    assert sorted(out.splitlines()) == sorted(f"[{r}] {platform.platform()}" for r in (0, 1))


def one_device_params():
    """The reference: the plain MLP trained on one device on the STEPS global batches."""
    main, startup, _, _ = mlp_program()
    exe, scope = pd.Executor(), pd.Scope()
    exe.run(startup, scope=scope)
    for step in range(STEPS):
        x, y = batch(step)
        exe.run(main, feed={"x": x, "y": y}, scope=scope)
    return {p.name: np.asarray(scope.get(p.name)) for p in main.all_parameters()}


def start_training(out_dir, *args, max_restarts=1):
    """tests/launch_worker.py started in 2 processes under the launcher (a Popen)."""
    out_dir.mkdir()
    return launch("--nprocs", 2, "--max-restarts", max_restarts, "--stop-timeout", 1,
                  os.path.join(ROOT, "tests", "launch_worker.py"), out_dir, *args)


def train(out_dir, *args, max_restarts=1):
    """Run tests/launch_worker.py in 2 processes under the launcher: (code, stdout, stderr)."""
    return finish(start_training(out_dir, *args, max_restarts=max_restarts))


def starts(out_dir):
    """{(restart, rank): the step that start began at}."""
    return {tuple(map(int, name[6:-4].split("-"))): int((out_dir / name).read_text())
            for name in os.listdir(out_dir) if name.startswith("start-")}


def final_params(out_dir):
    first, second = (np.load(out_dir / f"final-{rank}.npz") for rank in (0, 1))
    for name in first.files:
        np.testing.assert_array_equal(first[name], second[name], err_msg=name)
    return dict(first)


def test_a_killed_process_restarts_the_job_from_its_last_checkpoint(tmp_path, capsys):
    """Process 1 kills itself (SIGKILL) before step 3 of 6 on the first start; with one
    restart allowed, both start again, resume from the checkpoint of step 2, and end with
    the parameters of the whole training on one device."""
    reference = {}
    thread = threading.Thread(target=lambda: reference.update(one_device_params()))
    thread.start()                       # while the launcher runs (in this process)
    (tmp_path / "run").mkdir()
    command = [sys.executable, os.path.join(ROOT, "tests", "launch_worker.py"),
               tmp_path / "run", "--kill-rank", "1", "--kill-step", "3"]
    code = Launcher(command, 2, max_restarts=1, stop_timeout=1, env=environment()).run()
    thread.join()
    out, err = capsys.readouterr()
    want = reference
    assert code == 0, err
    assert ("progdesc launch: process 1 of 2 was killed by SIGKILL; stopped the others, "
            "starting all 2 again (restart 1 of 1)") in err
    assert starts(tmp_path / "run") == {(0, 0): 0, (0, 1): 0, (1, 0): 2, (1, 1): 2}
    assert "[1] step 2 done" in out and "[1] step 5 done" in out
    got = final_params(tmp_path / "run")
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.slow
def test_a_restarted_job_ends_bit_exactly_as_an_uninterrupted_one(tmp_path):
    code, _, err = train(tmp_path / "whole")
    assert code == 0, err
    assert starts(tmp_path / "whole") == {(0, 0): 0, (0, 1): 0}
    code, _, err = train(tmp_path / "restarted", "--kill-rank", 0, "--kill-step", 5)
    assert code == 0, err
    assert starts(tmp_path / "restarted")[1, 0] == 4
    whole, restarted = final_params(tmp_path / "whole"), final_params(tmp_path / "restarted")
    for name, value in whole.items():
        np.testing.assert_array_equal(restarted[name], value, err_msg=name)


@pytest.mark.slow
def test_without_restarts_a_killed_process_fails_the_job_naming_it(tmp_path):
    code, out, err = train(tmp_path / "run", "--kill-rank", 1, "--kill-step", 1, max_restarts=0)
    assert code == 128 + signal.SIGKILL, err
    assert err.strip().splitlines()[-1] == (
        "progdesc launch: process 1 of 2 was killed by SIGKILL; no restart left "
        "(--max-restarts 0): the job failed with status 137")
    assert not (tmp_path / "run" / "final-0.npz").exists()


def test_bad_arguments_are_one_line_errors_naming_the_command(tmp_path, capsys):
    script = tmp_path / "job.py"
    script.write_text("pass\n")
    cases = [
        (("--nprocs", 0, script), "argument --nprocs: must be an int >= 1, got '0'"),
        (("--nprocs", "two", script), "argument --nprocs: must be an int >= 1, got 'two'"),
        (("--nprocs", 2, "--max-restarts", -1, script),
         "argument --max-restarts: must be an int >= 0, got '-1'"),
        ((script,), "the following arguments are required: --nprocs"),
        (("--nprocs", 2, tmp_path / "missing.py"), f"no script '{tmp_path / 'missing.py'}'"),
    ]
    for args, message in cases:
        code, _, err = in_process(capsys, "launch", *args)
        line, = err.strip().splitlines()
        assert code == 2 and line.startswith("progdesc launch: error: "), err
        assert message in line, line
    code, out, _ = in_process(capsys, "--help")
    assert code == 0 and "launch" in out


def test_the_resume_helpers_find_the_latest_checkpoint(tmp_path, monkeypatch):
    assert dist.latest_checkpoint(tmp_path / "none") == (0, None)
    for step in (2, 10, 4):
        (tmp_path / os.path.basename(dist.checkpoint_path(tmp_path, step))).write_bytes(b"")
    (tmp_path / "step-000000099.safetensors.tmp").write_bytes(b"")   # not a checkpoint name
    assert dist.latest_checkpoint(tmp_path) == (10, dist.checkpoint_path(tmp_path, 10))
    monkeypatch.delenv("PROGDESC_RESTART_COUNT", raising=False)
    assert dist.restart_count() == 0
    monkeypatch.setenv("PROGDESC_RESTART_COUNT", "2")
    assert dist.restart_count() == 2
    with pytest.raises(ValueError, match="step must be an int >= 0"):
        dist.checkpoint_path(tmp_path, -1)
