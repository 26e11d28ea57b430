"""A lost process in a multi-process run: a DistributedError naming it, and a controlled exit.

After `initialize`, a daemon thread asks the coordinator every so often which processes
are alive (the coordinator counts one lost once its heartbeats have stopped for the
heartbeat timeout). When one is lost, or the coordinator itself is gone:

- the next collective of a survivor fails (JAX raises a bare runtime error from gloo or
  NCCL); `raising()` around progdesc's calls turns it into DistributedError naming the
  lost processes, waiting up to the heartbeat timeout for the coordinator to name them;
- the run is marked failed: at exit, the process ends with status 1 at once, skipping
  JAX's shutdown barrier (which would wait for the lost process, then abort);
- a survivor that has not raised the error a heartbeat timeout after the loss was
  noticed (busy elsewhere, or blocked) prints it and ends with status 1.

Losing process 0, whose process serves the coordinator, is noticed by jaxlib's client
first: it ends the process from its own thread at once, through `std::terminate` (with
the error callback `initialize` installs, jaxlib fails to call it and throws). A terminate
handler installed by `watch` turns that into the same message and status 1 (no abort).
"""
import atexit
import contextlib
import ctypes
import ctypes.util
import os
import sys
import threading
import time

import jax

from lowering.errors import DistributedError

EXIT_STATUS = 1
# words of the runtime errors of a failed exchange between processes (gloo, NCCL, gRPC)
_COMMUNICATION = ("gloo", "nccl", "connection", "peer", "socket", "collective", "unavailable",
                  "deadline")
_run = None          # the one _Run of this process, once `watch` started it


class _Run:
    def __init__(self, client, count, me, heartbeat_timeout):
        self.client, self.count, self.me = client, count, me
        self.heartbeat_timeout = heartbeat_timeout
        self.lock = threading.Lock()
        self.lost = None           # sorted ranks, once a loss is known
        self.raised = False        # whether DistributedError reached the user's code

    def ask(self):
        """The ranks the coordinator counts lost ([0] when it cannot be reached), or []."""
        try:
            alive = self.client.get_live_nodes(list(range(self.count)))
        except Exception:  # noqa: BLE001  (jaxlib raises its own runtime error types)
            return [0] if self.me != 0 else []
        return sorted(set(range(self.count)) - set(alive))

    def fail(self, lost):
        with self.lock:
            if self.lost is None:
                self.lost = lost
            return self.lost

    def error(self, detail=None):
        """The DistributedError naming the lost processes."""
        names = ", ".join(map(str, self.lost))
        who = f"process {names}" if len(self.lost) == 1 else f"processes {names}"
        coordinator = " (the coordinator)" if 0 in self.lost else ""
        text = (f"{who}{coordinator} of the {self.count}-process run was lost; process "
                f"{self.me} cannot go on and exits with status {EXIT_STATUS}")
        return DistributedError(text + (f" ({detail})" if detail else ""))


def watch(client, count, me, heartbeat_timeout):
    """Start watching the run's processes (called by `initialize` once it joined)."""
    global _run
    _run = _Run(client, count, me, heartbeat_timeout)
    atexit.register(_exit_if_failed)   # runs before JAX's shutdown (atexit runs LIFO)
    _end_on_terminate(_run)
    threading.Thread(target=_watch, args=(_run,), name="progdesc-peers", daemon=True).start()


_TERMINATE_HANDLER = ctypes.CFUNCTYPE(None)
_on_terminate = None     # the installed handler (kept alive: C++ holds a pointer to it)


def _end_on_terminate(run):
    """Make `std::terminate` (how jaxlib ends a process whose coordinator is gone) print the
    DistributedError and end with status EXIT_STATUS instead of aborting. Where the C++
    runtime cannot be found, the abort stays."""
    global _on_terminate
    library = ctypes.util.find_library("stdc++")
    try:
        set_terminate = getattr(ctypes.CDLL(library), "_ZSt13set_terminatePFvvE")
    except (OSError, AttributeError, TypeError):
        return

    def terminated():
        if run.lost is None and run.me != 0:
            run.lost = [0]
        if run.lost:
            error = run.error("jaxlib stopped the run: the coordinator cannot be reached")
        else:
            error = "the C++ runtime ended the run (std::terminate)"
        with contextlib.suppress(OSError):
            os.write(2, f"progdesc.DistributedError: {error}\n".encode())
        os._exit(EXIT_STATUS)

    _on_terminate = _TERMINATE_HANDLER(terminated)
    set_terminate.restype = ctypes.c_void_p
    set_terminate.argtypes = [_TERMINATE_HANDLER]
    set_terminate(_on_terminate)


def _watch(run):
    interval = max(0.2, run.heartbeat_timeout / 10)
    while run.lost is None:
        time.sleep(interval)
        lost = run.ask()
        if lost:
            run.fail(lost)
    time.sleep(run.heartbeat_timeout)      # time for the user's code to meet the error
    if not run.raised:
        print(f"progdesc.DistributedError: {run.error()}", file=sys.stderr, flush=True)
        _end()


def _exit_if_failed():
    if _run is not None and _run.lost is not None:
        _end()


def _end():
    """End the process now, status EXIT_STATUS: JAX's shutdown would wait for the lost
    process, then abort."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(EXIT_STATUS)


def failed():
    """The lost ranks if this process's run lost a process, else None."""
    return None if _run is None else _run.lost


@contextlib.contextmanager
def raising():
    """Around progdesc's calls that run or read collectives: a runtime error caused by a
    lost process becomes DistributedError naming it; other errors pass unchanged."""
    run = _run
    if run is None:
        yield
        return
    if run.lost is not None:
        run.raised = True
        raise run.error()
    try:
        yield
    except jax.errors.JaxRuntimeError as e:
        talking = any(word in str(e).lower() for word in _COMMUNICATION)
        lost = run.lost or (_wait_for_loss(run) if talking else run.ask())
        if not lost:
            raise
        run.fail(lost)
        run.raised = True
        raise run.error(str(e).splitlines()[0][:200]) from None


def _wait_for_loss(run):
    """The lost ranks, asking the coordinator until it counts one lost (at most a heartbeat
    timeout and a bit: it notices only then), or [] if none is."""
    deadline = time.monotonic() + run.heartbeat_timeout + 2
    while True:
        lost = run.lost or run.ask()
        if lost or time.monotonic() > deadline:
            return lost
        time.sleep(0.1)
