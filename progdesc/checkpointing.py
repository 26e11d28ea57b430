"""Checkpoints written in the background while training goes on.

`progdesc.io.save_checkpoint(..., background=True)` (and the two multi-process saves of
`progdesc.distributed`) take what they save at the call, then hand the writing to a
thread and return a `PendingSave`. The rules, the same for all three:

- **Values**: those of the step that asked. The call takes the Scope's arrays under the
  Scope's lock (a run holds it from reading state to writing back, so no run is half
  done) and keeps them: arrays handed out of a Scope stay valid, because the next run
  copies a handed-out buffer on its device before donating it (progdesc.scope). That one
  device copy of the updated state, on the first run after the call, is what training
  pays; the transfer to the host, the checksums and the file go on in the thread.
- **Files**: written exactly as a blocking save writes them (same bytes, checksums,
  atomic rename of progdesc.atomic): a crash mid-save leaves the previous checkpoint.
- **One save in flight per path**: a save (background or not) to a path whose background
  save is still running first waits for it, so saves land in the order they were asked.
- **Errors are never lost**: a failed background save raises its error (`SaveError` for
  a file that cannot be written) from its `PendingSave.wait()`; if nobody waited, the next
  checkpoint save of the process raises it, before saving anything; if none comes, it is
  printed to stderr at exit.
- **Exit waits**: the writer threads are not daemons, so the interpreter finishes a save
  in flight before it exits (not when killed, or ended by `os._exit`).

Across processes, each writer publishes "written" or its error in the run's key-value
store (jax.distributed's coordinator) when done, and every process's `PendingSave`
finishes once all the parts of the checkpoint are written, raising the error of any
process that failed.
"""
import atexit
import os
import sys
import threading
import time

from lowering.errors import SaveError

_lock = threading.Lock()
_in_flight = {}          # absolute path -> its PendingSave, until it is finished
_unreported = []         # failed PendingSaves whose error no one has seen yet
_sequence = [0]          # background saves across processes so far (the same on every one)


class PendingSave:
    """A checkpoint being written in the background: `done()` polls, `wait()` blocks."""

    def __init__(self, path, write):
        self.path = os.fspath(path)
        self._write = write
        self._error = None
        self._thread = threading.Thread(target=self._run, name="progdesc-checkpoint",
                                        daemon=False)

    def _run(self):
        try:
            self._write()
        except BaseException as e:  # noqa: BLE001  (raised again by wait, or the next save)
            self._error = e
            with _lock:
                _unreported.append(self)
        finally:
            self._write = None       # drop the snapshot's arrays as soon as they are written
            with _lock:
                if _in_flight.get(_key(self.path)) is self:
                    del _in_flight[_key(self.path)]

    def done(self):
        """Whether the save has finished (written, or failed)."""
        return not self._thread.is_alive()

    def wait(self):
        """Block until the checkpoint is written; raise the error if writing it failed."""
        self._thread.join()
        if self._error is not None:
            with _lock:
                if self in _unreported:
                    _unreported.remove(self)
            raise self._error

    def __repr__(self):
        state = ("writing" if not self.done() else
                 "failed" if self._error is not None else "written")
        return f"<PendingSave '{self.path}': {state}>"


def _key(path):
    return os.path.abspath(os.fspath(path))


def before_save(path):
    """Called first by every checkpoint save: raise the error of an earlier background save
    that no one has seen, then wait for the background save in flight to `path`, if any."""
    with _lock:
        failed = _unreported.pop(0) if _unreported else None
    if failed is not None:
        raise failed._error
    wait_for(path)


def wait_for(path, raising=True):
    """Wait for the background save in flight to `path` in this process, if any; its error
    is raised unless not `raising` (a load: the previous file is still there to read)."""
    with _lock:
        pending = _in_flight.get(_key(path))
    if pending is not None:
        if raising:
            pending.wait()
        else:
            pending._thread.join()


def submit(path, write):
    """Run `write()` (which writes `path`) in a writer thread; returns its PendingSave."""
    pending, key = PendingSave(path, write), _key(path)
    while True:   # another thread may have started a save of `path` since before_save
        with _lock:
            previous = _in_flight.get(key)
            if previous is None or previous.done():
                _in_flight[key] = pending
                break
        previous._thread.join()
    pending._thread.start()
    return pending


def submit_across(path, write, writers, what):
    """`submit` for a save of a multi-process run: after `write()`, this process publishes
    its outcome if it is one of `writers` (process indices), then waits for the other
    writers' (a one-process run: plain `submit`). `what` names the checkpoint in errors."""
    import jax
    if jax.process_count() == 1:
        return submit(path, write)
    sequence, me = next_sequence(), jax.process_index()

    def write_and_wait():
        error = None
        try:
            write()
        except BaseException as e:  # noqa: BLE001  (raised below, after telling the others)
            error = e
        if me in writers:
            publish(sequence, me, error)
        if error is not None:
            raise error
        await_peers(sequence, [p for p in writers if p != me], what)

    return submit(path, write_and_wait)


def next_sequence():
    """The number of this background save among this process's multi-process ones: the
    same on every process, as every process makes the same saves in the same order."""
    with _lock:
        _sequence[0] += 1
        return _sequence[0]


def _store():
    from progdesc import jax_compat
    return jax_compat.distributed_state().client


def _kv_key(sequence, process):
    return f"progdesc/checkpoint/{sequence}/{process}"


def publish(sequence, process, error):
    """Tell the other processes that this one's part of save `sequence` is written (error
    None) or failed."""
    detail = "written" if error is None else f"failed: {type(error).__name__}: {error}"
    _store().key_value_set(_kv_key(sequence, process), detail)


def await_peers(sequence, processes, what):
    """Wait until each of `processes` published its part of save `sequence`; SaveError
    naming the first that failed, DistributedError if one is lost while waiting."""
    from progdesc.distributed import peers
    store = _store()
    for process in processes:
        while True:
            try:
                detail = store.blocking_key_value_get(_kv_key(sequence, process), 1000)
                break
            except Exception:  # noqa: BLE001  (jaxlib's own error type: the wait timed out)
                if peers._run is not None and peers._run.lost is not None:
                    raise peers._run.error(f"while waiting for {what}") from None
                time.sleep(0.01)
        if detail != "written":
            raise SaveError(f"process {process} could not write its part of {what}: "
                            f"{detail.removeprefix('failed: ')}")


def _report_at_exit():
    """At exit (the writer threads already joined): print errors that no one has seen."""
    with _lock:
        failed, _unreported[:] = list(_unreported), []
    for pending in failed:
        print(f"progdesc: the background checkpoint save of '{pending.path}' failed and no "
              f"one waited for it: {type(pending._error).__name__}: {pending._error}",
              file=sys.stderr, flush=True)


atexit.register(_report_at_exit)

