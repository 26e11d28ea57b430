"""Whether ops run as they are appended: the `pd.eager` switch, and whether `capture` records.

`progdesc.framework` calls its `_op_hook` after every op it appends; this module sets
that hook while eager mode is on in some thread and back to None when it is off
everywhere, so building programs outside eager mode pays nothing for it.

Eager mode belongs to the thread: `enable()` holds for the thread that calls it (every
later statement of a notebook), `with pd.eager():` and `capture` for the block's thread or
asyncio task (a `contextvars` variable); a new thread starts with eager mode off.
"""
import contextlib
import contextvars
import threading

from progdesc import framework
from progdesc.recording.runner import run_op

_depth = contextvars.ContextVar("progdesc_eager_depth", default=0)   # nested `with` blocks
_recording = contextvars.ContextVar("progdesc_eager_recording", default=0)   # `capture`s
_enabled = threading.local()        # .on: `enable()` in this thread
_users = [0]                        # threads and blocks with eager mode on, in the process
_users_lock = threading.Lock()


def _use(delta):
    """Count eager mode turned on (+1) or off (-1) somewhere; the hook runs while any is on."""
    with _users_lock:
        _users[0] += delta
        framework._op_hook = _run_if_eager if _users[0] > 0 else None


def _run_if_eager(*args):
    """framework's op hook: run the op if eager mode is on in this thread or task."""
    if eager.active:
        run_op(*args)


class EagerMode:
    """`pd.eager`: run every op at once as it is appended to a program, keeping the program.

    `with pd.eager():` turns it on for a block of code, `pd.eager.enable()` until
    `pd.eager.disable()` (a whole notebook). While it is on, each op appended to the root
    block of a program also runs on the values of its inputs: data variables take the
    value given to `pd.data(..., value=array)`, parameters are initialised at once into the
    current Scope (as the startup program would initialise them), and every variable
    carries its value (`var.numpy()`, `float(var)`, a preview in its repr). It is on or off
    per thread (see the module docstring).
    """

    def __call__(self):
        """A context manager: eager mode inside the `with` block."""
        return self._on()

    @contextlib.contextmanager
    def _on(self):
        token = _depth.set(_depth.get() + 1)
        _use(+1)
        try:
            yield self
        finally:
            _depth.reset(token)
            _use(-1)

    def enable(self):
        """Turn eager mode on in this thread until `disable()` (for a whole notebook or
        script)."""
        if not getattr(_enabled, "on", False):
            _enabled.on = True
            _use(+1)

    def disable(self):
        """Turn off what `enable()` turned on in this thread (`with pd.eager():` blocks still
        apply)."""
        if getattr(_enabled, "on", False):
            _enabled.on = False
            _use(-1)

    @property
    def active(self):
        """Whether ops run as they are appended now (in this thread or task)."""
        return _depth.get() > 0 or getattr(_enabled, "on", False)

    @property
    def recording(self):
        """Whether `capture` is recording now (converting a value to Python is an error)."""
        return _recording.get() > 0

    @contextlib.contextmanager
    def _capturing(self):
        token = _recording.set(_recording.get() + 1)
        try:
            with self._on():
                yield
        finally:
            _recording.reset(token)

    def __repr__(self):
        return f"<pd.eager: {'on' if self.active else 'off'}>"


eager = EagerMode()
