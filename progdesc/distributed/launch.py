"""`progdesc launch`: start N processes of a training script on this host, restart them all
when one fails.

Each process gets, in its environment, what `progdesc.distributed.initialize()` reads when
called without arguments (environments.py): the coordinator (127.0.0.1 and a port free at
the start of each attempt), the process count and its rank, and the restart count
(`resume.RESTART_COUNT`). Each process runs in its own process group, so that stopping it
stops what it started too. Its output reaches the launcher's stdout and stderr line by
line, each line prefixed by `[rank]`.

When a process exits with a non-zero status or is killed by a signal, the launcher stops
the others (SIGTERM to their groups, SIGKILL `FAILED_GRACE` seconds later: they are stuck in
collectives that will not complete, and JAX's runtime takes SIGTERM as a preemption notice
and goes on) and starts all of them again, at most `max_restarts` times; the script resumes
from its last checkpoint (progdesc/distributed/resume.py). When no restart is left it
returns the failed process's status (128 + the signal's number for a signal). SIGINT,
SIGTERM and SIGHUP sent to the launcher go to every process; the launcher then stops them
all (SIGKILL after `stop_timeout` seconds), restarts none, and returns 128 + the signal's
number.

A launcher killed outright (SIGKILL: the OOM killer, a scheduler) cannot stop anything
itself: its guard process kills the groups then, and on Linux the kernel kills the processes
too (launch_guard.py).
"""
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from progdesc.distributed import environments, launch_guard, resume

_POLL = 0.05            # seconds between looks at the processes
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
FAILED_GRACE = 2.0      # seconds between SIGTERM and SIGKILL for the survivors of a failure


def free_port(first=None, last=65535):
    """A TCP port free on every address of this host now (the coordinator listens on all):
    one the system picks, or with `first` the lowest free in [first, last] (None if none)."""
    for port in [0] if first is None else range(first, last + 1):
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                if first is None:
                    raise
                continue
            return s.getsockname()[1]
    return None


def describe(code):
    """A returncode in words: 'exited with status 3', 'was killed by SIGKILL'."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}"
    return f"exited with status {code}"


def exit_status(code):
    """The launcher's exit status for a process's returncode (128 + n for signal n)."""
    return 128 - code if code < 0 else code


class Launcher:
    """Runs `command` (a list: the program and its arguments) in `nprocs` processes."""

    def __init__(self, command, nprocs, max_restarts=0, stop_timeout=10.0, env=None):
        self.command, self.nprocs = list(command), nprocs
        self.max_restarts, self.stop_timeout = max_restarts, stop_timeout
        self.env = dict(os.environ if env is None else env)
        self.procs = []
        self.pumps = []
        self.signalled = None        # the signal number that asked us to stop
        self.told = set()            # pids whose group got a signal from us
        self.guard = None
        self.write_lock = threading.Lock()

    def say(self, message):
        """A line of the launcher's own on its stderr."""
        with self.write_lock:
            sys.stderr.write(f"progdesc launch: {message}\n")
            sys.stderr.flush()

    def run(self):
        """Run the job to its end; returns the exit status (0 when every process ended with 0)."""
        previous = {s: signal.signal(s, self._forward) for s in _FORWARDED}
        try:
            self.guard = launch_guard.Guard()
            attempt = 0
            while True:
                failed = self._attempt(attempt)
                if self.signalled is not None:
                    self.say(f"got {signal.Signals(self.signalled).name}: stopped all "
                             f"{self.nprocs} processes")
                    return 128 + self.signalled
                if failed is None:
                    return 0
                rank, code = failed
                what = f"process {rank} of {self.nprocs} {describe(code)}"
                if attempt == self.max_restarts:
                    self.say(f"{what}; no restart left (--max-restarts {self.max_restarts}): "
                             f"the job failed with status {exit_status(code)}")
                    return exit_status(code)
                attempt += 1
                self.say(f"{what}; stopped the others, starting all {self.nprocs} again "
                         f"(restart {attempt} of {self.max_restarts})")
        finally:
            if self.guard is not None:
                self.guard.close()
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _attempt(self, attempt):
        """Start every process, wait for them; None if all ended with 0, else (rank,
        returncode) of the first that failed (the others are then stopped)."""
        coordinator = f"127.0.0.1:{free_port()}"
        self.procs, self.pumps, self.told = [], [], set()
        try:
            for rank in range(self.nprocs):
                if self.signalled is not None:
                    break
                self._start(rank, coordinator, attempt)
            failed = None
            while self.signalled is None:
                codes = [p.poll() for p in self.procs]
                failed = next(((r, c) for r, c in enumerate(codes) if c not in (None, 0)), None)
                if failed is not None or all(c == 0 for c in codes):
                    break
                time.sleep(_POLL)
            return failed
        finally:
            self._stop_all()

    def _start(self, rank, coordinator, attempt):
        env = dict(self.env, PYTHONUNBUFFERED="1", **{
            environments.COORDINATOR: coordinator,
            environments.NUM_PROCESSES: str(self.nprocs),
            environments.PROCESS_ID: str(rank),
            resume.RESTART_COUNT: str(attempt)})
        proc = subprocess.Popen(launch_guard.dying_with_launcher(self.command), env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
        self.procs.append(proc)
        self.guard.watch(proc.pid)
        for source, sink in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr)):
            pump = threading.Thread(target=self._pump, args=(source, sink, f"[{rank}] "),
                                    daemon=True)
            pump.start()
            self.pumps.append(pump)

    def _pump(self, source, sink, prefix):
        """Copy `source`'s lines to `sink`, each after `prefix`, until it closes."""
        with source:
            for line in iter(source.readline, b""):
                text = prefix + line.decode(errors="replace")
                with self.write_lock:
                    sink.write(text if text.endswith("\n") else text + "\n")
                    sink.flush()

    def _forward(self, signum, _frame):
        """The launcher's handler of SIGINT, SIGTERM and SIGHUP: pass it to every process; a
        second one kills them."""
        again = self.signalled is not None
        self.signalled = signum
        for proc in self.procs:
            _signal_group(proc, signal.SIGKILL if again else signum)
            self.told.add(proc.pid)

    def _stop_all(self):
        """Stop every process still running, and what each started: the signal the launcher
        got (else SIGTERM) to each not told yet, SIGKILL after stop_timeout (FAILED_GRACE at
        most when no signal asked); wait until their output is copied."""
        running = [p for p in self.procs if p.poll() is None]
        for proc in running:
            if proc.pid not in self.told:    # a process started as the signal came
                _signal_group(proc, self.signalled or signal.SIGTERM)
                self.told.add(proc.pid)
        grace = self.stop_timeout if self.signalled else min(self.stop_timeout, FAILED_GRACE)
        deadline = time.monotonic() + grace
        while any(p.poll() is None for p in running) and time.monotonic() < deadline:
            time.sleep(_POLL)
        for proc in self.procs:
            _signal_group(proc, signal.SIGKILL)   # what is left, and what it started
            proc.wait()
            self.guard.forget(proc.pid)
        for pump in self.pumps:
            pump.join(timeout=5)     # a grandchild that left the group may hold the pipe


def _signal_group(proc, signum):
    """Send `signum` to the process group of `proc` (its own, from start_new_session)."""
    try:
        os.killpg(proc.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def launch(command, nprocs, max_restarts=0, stop_timeout=10.0):
    """Run `command` in `nprocs` processes on this host as `progdesc launch` does; returns
    the exit status."""
    return Launcher(command, nprocs, max_restarts, stop_timeout).run()
