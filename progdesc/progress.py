"""Progress bars drawn the way the place they run in can show them.

    for step in progress_bar(range(300), unit="step"): ...
    with progress_bar(total=steps, unit="step") as bar: ...; bar.update()

- a terminal: tqdm's bar, rewritten in place on its line;
- a Jupyter kernel with ipywidgets: tqdm's notebook widget;
- a Jupyter kernel without ipywidgets: tqdm's text line in one output (an IPython display
  handle) replaced in place, at most every `mininterval` seconds, and always at the end;
- anywhere else (a pipe, a log file): nothing, as tqdm does when stderr is not a terminal.
Every kind is a tqdm, with tqdm's arguments (`total`, `desc`, `unit`, `set_postfix`, ...).
"""
import io
import sys
import time

from tqdm import std


def in_kernel():
    """Whether this code runs in a Jupyter (IPython) kernel."""
    if "ipykernel" not in sys.modules or "IPython" not in sys.modules:
        return False
    shell = sys.modules["IPython"].get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def _has_widgets():
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    return True


class DisplayBar(std.tqdm):
    """tqdm's text line shown in one IPython display handle, replaced in place (throttled
    to one update per `mininterval` seconds, 0.5 by default; the last state always shown)."""

    monitor_interval = 0   # no tqdm monitor thread: it would display from another thread

    def __init__(self, *args, **kwargs):
        self._handle, self._shown_at = None, -float("inf")
        kwargs.setdefault("mininterval", 0.5)
        kwargs.setdefault("ascii", False)   # tqdm would pick "#" for a file with no encoding
        if kwargs.get("disable") is None:
            kwargs["disable"] = False   # tqdm's None would test the file below, not a display
        kwargs["file"] = io.StringIO()   # tqdm writes only its line ends there
        super().__init__(*args, **kwargs)

    def display(self, msg=None, pos=None):
        """Show `msg` (default: the bar) in this bar's output, unless one was shown less
        than `mininterval` ago and the bar is still running."""
        now = time.monotonic()
        closing = self.disable   # tqdm's close() disables the bar, then displays it
        if not closing and msg is None and now - self._shown_at < self.mininterval:
            return True
        from IPython.display import display
        bundle = {"text/plain": str(self) if msg is None else msg}
        if self._handle is None:
            self._handle = display(bundle, raw=True, display_id=True)
        else:
            self._handle.update(bundle, raw=True)
        self._shown_at = now
        return True


def bar_class():
    """The tqdm class that suits this process (see the module docstring)."""
    if in_kernel():
        if _has_widgets():
            from tqdm.notebook import tqdm as notebook_tqdm
            return notebook_tqdm
        return DisplayBar
    return std.tqdm


def progress_bar(iterable=None, *, disable=False, **kwargs):
    """A tqdm progress bar over `iterable` (or one updated by hand: `total=`) drawn as this
    process can show it (see the module docstring); tqdm's keyword arguments.
    `disable=True` draws nothing anywhere."""
    cls = bar_class()
    if disable:
        kwargs["disable"] = True
    elif cls is std.tqdm:
        kwargs["disable"] = None   # tqdm's test: no bar when stderr is not a terminal
    return cls(iterable, **kwargs)
