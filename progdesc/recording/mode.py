"""Whether ops run as they are appended: the `pd.eager` switch, and whether `capture` records.

This module adds eager mode's listener to `progdesc.framework` (`add_listener`): told of
every op appended to any program, it runs the op when eager mode is on in the thread
that appends it, and keeps the values it computed in step with the program.

Eager mode belongs to the thread: `enable()` holds for the thread that calls it (every
later statement of a notebook), `with pd.eager():` and `capture` for the block's thread or
asyncio task (a `contextvars` variable); a new thread starts with eager mode off.
"""
import contextlib
import contextvars
import threading
import weakref

from progdesc import framework
from progdesc.recording.loops import set_eager_check, warn_training_loop
from progdesc.recording.runner import (drop_values, rename_values, run_op, set_data_value,
                                       snapshot_eager_state)
from progdesc.scope import global_scope

_depth = contextvars.ContextVar("progdesc_eager_depth", default=0)   # nested `with` blocks
_recording = contextvars.ContextVar("progdesc_eager_recording", default="")   # who records
_enabled = threading.local()        # .on: `enable()` in this thread
_keeping = weakref.WeakSet()        # startup programs whose ops skip state the Scope holds


class _EagerListener(framework.ProgramListener):
    """Runs each appended op while eager mode is on (in the appending thread or task)."""

    def op_appended(self, block, index, opdef, inputs, outputs, attrs):
        if _depth.get() or getattr(_enabled, "on", False):   # eager.active, inlined
            if _keeping and block.program in _keeping and _held(outputs):
                return   # a re-created initializer of state the Scope holds (pd.Model)
            run_op(block, index, opdef, inputs, outputs, attrs)

    def vars_renamed(self, block, renames):
        rename_values(block.program, renames)

    def vars_removed(self, program, names):
        drop_values(program, names)

    def data_value(self, var, value):
        set_data_value(var, value)

    def appending_whole(self, programs):
        return snapshot_eager_state(programs) if eager.active else None

    def training_step_appended(self, program, steps):
        warn_training_loop(program, steps)


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
        try:
            yield self
        finally:
            _depth.reset(token)

    def enable(self):
        """Turn eager mode on in this thread until `disable()` (for a whole notebook or
        script)."""
        _enabled.on = True

    def disable(self):
        """Turn off what `enable()` turned on in this thread (`with pd.eager():` blocks still
        apply)."""
        _enabled.on = False

    @property
    def active(self):
        """Whether ops run as they are appended now (in this thread or task)."""
        return _depth.get() > 0 or getattr(_enabled, "on", False)

    @property
    def recording(self):
        """What records now ('capture records', 'pd.Model records train_one_batch'), or ''
        (converting a value to Python is an error while something records)."""
        return _recording.get()

    @contextlib.contextmanager
    def capturing(self):
        """Inside, eager mode is on and `capture` records (`recording`)."""
        token = _recording.set("capture records")
        try:
            with self._on():
                yield
        finally:
            _recording.reset(token)

    @contextlib.contextmanager
    def recording_only(self, who):
        """Inside, ops are appended without running (eager mode off, even where `enable()`
        or an outer `with` turned it on) and `who` records (`recording`, e.g. 'pd.Model
        records train_one_batch'): a `pd.Model` records its graph-mode step so, converting a
        value to Python being an error as in `capture`."""
        depth, recording = _depth.set(0), _recording.set(who)
        was_on = getattr(_enabled, "on", False)
        _enabled.on = False
        try:
            yield
        finally:
            _enabled.on = was_on
            _recording.reset(recording)
            _depth.reset(depth)

    @contextlib.contextmanager
    def keeping_state(self, startup_program):
        """Inside, an op appended to `startup_program` in eager mode does not run when the
        current Scope already holds every variable it writes: a `pd.Model` records each
        eager step into fresh programs, whose initializers must not reset its parameters
        and optimizer state."""
        _keeping.add(startup_program)
        try:
            yield
        finally:
            _keeping.discard(startup_program)

    def __repr__(self):
        return f"<pd.eager: {'on' if self.active else 'off'}>"


def _held(out_map):
    """Whether the current Scope holds a value for every output of an op."""
    scope = global_scope()
    for names in out_map.values():
        for name in names:
            holder = scope.find_var(name)
            if holder is None or holder.current() is None:
                return False
    return True


eager = EagerMode()
set_eager_check(lambda: eager.active)

framework.add_listener(_EagerListener())
