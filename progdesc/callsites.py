"""Which line of the user's code made something: 'train.py:12', 'In[3]:2' in a notebook.

Errors, warnings and every OpDesc name the user's line, not progdesc's: the innermost
frame whose code is outside progdesc and lowering (and outside the functions progdesc
compiles itself, those of `progdesc.ops`). Under the `progdesc` command the command line
is the user's input: the frames that started the command (a console script, runpy) are not
searched (`command_frame`).
"""
import contextlib
import contextvars
import os
import sys

from lowering import registry

PACKAGE_DIRS = tuple(os.path.dirname(os.path.abspath(m)) + os.sep for m in (
    __file__, registry.__file__))
"""The directories of progdesc's and lowering's code (with a trailing separator)."""
GENERATED_PREFIX = "<progdesc."
"""How the file names of code progdesc compiles itself begin (the functions of progdesc.ops)."""

_COMMAND = contextvars.ContextVar("progdesc_command_frame", default=None)

_USER_FILES = {}   # code file name -> its base name, "" (progdesc's or lowering's code) or _CELL
_CELL = object()   # an IPython cell: named by its execution count, which a rerun changes


def is_internal(path):
    """Whether code file `path` is progdesc's or lowering's (or code progdesc generated)."""
    return path.startswith(GENERATED_PREFIX) or os.path.abspath(path).startswith(PACKAGE_DIRS)


@contextlib.contextmanager
def command_frame(frame):
    """Within it, no frame from `frame` (the `progdesc` command's entry) outwards is the
    user's: errors name the command's arguments, not the script that launched it."""
    token = _COMMAND.set(frame)
    try:
        yield
    finally:
        _COMMAND.reset(token)


def user_callsite():
    """'file:line' of the innermost frame outside progdesc and lowering ('In[3]:2' in a cell)."""
    frame, stop, known = sys._getframe(1), _COMMAND.get(), _USER_FILES.get
    while frame is not None and frame is not stop:
        shown = known(frame.f_code.co_filename)
        if shown != "":   # not a file known to be progdesc's
            if shown is not None and shown is not _CELL:   # a user's file seen before
                return f"{shown}:{frame.f_lineno}"
            site = _site_of(frame)
            if site:
                return site
        frame = frame.f_back
    return ""


def user_call():
    """'minimize called at train.py:7': the progdesc function the user's code called, and the
    line of that call (as `user_callsite` names it); '' when no frame is the user's."""
    frame, called, stop = sys._getframe(1), None, _COMMAND.get()
    while frame is not None and frame is not stop:
        site = _site_of(frame)
        if site:
            return f"{called} called at {site}" if called else site
        called = frame.f_code.co_qualname.removesuffix(".__init__")   # a class: its name
        frame = frame.f_back
    return ""


def user_stacklevel():
    """The `stacklevel` that makes `warnings.warn`, called by the caller of this function,
    name the user's line (the first frame outside progdesc), so that Python's
    once-per-line filter applies to the user's lines."""
    frame, level = sys._getframe(2), 2
    while frame is not None and is_internal(frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    return level


def _site_of(frame):
    """'file:line' of `frame` if its code is the user's, else ''."""
    path = frame.f_code.co_filename
    shown = _USER_FILES.get(path)
    if shown is None:
        shown = "" if is_internal(path) else _CELL if cell_name(path) else os.path.basename(path)
        _USER_FILES[path] = shown
    if shown is _CELL:
        shown = cell_name(path) or os.path.basename(path)
    return f"{shown}:{frame.f_lineno}" if shown else ""


def cell_name(path):
    """'In[3]' for code compiled from an IPython cell, as IPython's tracebacks name it;
    None for any other file."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    named = getattr(getattr(shell, "compile", None), "format_code_name", None)
    label = named(path) if named is not None else None
    return label[1] if label else None
