"""Whether ops run as they are appended: the `pd.eager` switch, and whether `capture` records.

`progdesc.framework` calls its `_op_hook` after every op it appends; this module sets
that hook to the eager runner while eager mode is on and back to None when it is off,
so building programs outside eager mode pays nothing for it.
"""
import contextlib

from progdesc import framework


class EagerMode:
    """`pd.eager`: run every op at once as it is appended to a program, keeping the program.

    `with pd.eager():` turns it on for a block of code, `pd.eager.enable()` until
    `pd.eager.disable()` (a whole notebook). While it is on, each op appended to the root
    block of a program also runs on the values of its inputs: data variables take the
    value given to `pd.data(..., value=array)`, parameters are initialised at once into the
    current Scope (as the startup program would initialise them), and every variable
    carries its value (`var.numpy()`, `float(var)`, a preview in its repr).
    """

    def __init__(self):
        self._enabled = False
        self._depth = 0        # nested `with pd.eager():` blocks
        self._recording = 0    # nested `capture` calls

    def __call__(self):
        """A context manager: eager mode inside the `with` block."""
        return self._on()

    @contextlib.contextmanager
    def _on(self):
        self._depth += 1
        self._sync()
        try:
            yield self
        finally:
            self._depth -= 1
            self._sync()

    def enable(self):
        """Turn eager mode on until `disable()` (for a whole notebook or script)."""
        self._enabled = True
        self._sync()

    def disable(self):
        """Turn off what `enable()` turned on (`with pd.eager():` blocks still apply)."""
        self._enabled = False
        self._sync()

    @property
    def active(self):
        """Whether ops run as they are appended now."""
        return self._enabled or self._depth > 0

    @property
    def recording(self):
        """Whether `capture` is recording now (converting a value to Python is an error)."""
        return self._recording > 0

    @contextlib.contextmanager
    def _capturing(self):
        self._recording += 1
        try:
            with self._on():
                yield
        finally:
            self._recording -= 1

    def _sync(self):
        from progdesc.recording.runner import run_op
        framework._op_hook = run_op if self.active else None

    def __repr__(self):
        return f"<pd.eager: {'on' if self.active else 'off'}>"


eager = EagerMode()
