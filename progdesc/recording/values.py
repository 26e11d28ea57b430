"""What a Variable's value is, outside the compiled path: reading it, turning it into a
Python number, previewing it.

Reading a value (`var.numpy()`, `repr`) never changes the program. Turning one into a
Python `bool`, `int` or `float` lets Python decide something the program cannot see:
inside `capture` that is a `RecordingError` naming the line; in plain eager mode `bool`
and `int` give the value with a `RecordingWarning` (the recorded program keeps the branch
this value took), `float` gives it silently (it is what printing a loss does).
"""
import warnings

import numpy as np

from lowering import dtypes
from lowering.errors import RecordingError
from progdesc.callsites import user_callsite, user_stacklevel
from progdesc.recording.mode import eager
from progdesc.recording.runner import values_of
from progdesc.scope import global_scope


class RecordingWarning(UserWarning):
    """A Python decision taken on a value in eager mode: the program keeps only its outcome."""


def value_of(var):
    """The value `var` holds (a jax array), or None: an ordinary variable's from its
    program's eager values, a persistable's from the current Scope."""
    if var.persistable:
        holder = global_scope().find_var(var.name)
        return None if holder is None else holder.value
    return values_of(var.block.program).get(var.name)


def numpy_of(var):
    """`var`'s value as a NumPy array; RecordingError if it has none."""
    value = value_of(var)
    if value is None:
        raise _no_value(var)
    return np.asarray(value)


_HOW = {
    bool: ("bool", "a Python `if`, `while`, `and`, `or` or `not` on a value would record only "
           "the branch this example takes: record both with pd.control_flow.cond, switch or "
           "while_loop"),
    int: ("int", "`range(n)`, an index or a size taken from a value would freeze this "
          "example's number into the program: loop with pd.control_flow.while_loop or scan, "
          "or pass the number as a Python int"),
    float: ("float", "the program cannot hand a Python number back to your code: read the "
            "value for display with .numpy(), or return the Variable and fetch it"),
}


def to_python(var, convert):
    """`convert(value)` (bool, int or float) of a one-element Variable, as the module
    docstring describes for capture and plain eager mode."""
    what, how = _HOW[convert]
    if eager.recording:
        raise RecordingError(f"{what}() of a value while {eager.recording}: {how}",
                             var=var.name, callsite=user_callsite())
    array = numpy_of(var)
    if array.size != 1:
        raise RecordingError(f"{what}() needs a value of one element, this one has shape "
                             f"{list(array.shape)}", var=var.name, callsite=user_callsite())
    if convert is not float and eager.active:
        warnings.warn(f"{what}() of variable '{var.name}' in eager mode at {user_callsite()}: "
                      f"{how}", RecordingWarning, stacklevel=user_stacklevel())
    return convert(array.reshape(()).item())


def _no_value(var):
    return RecordingError(
        "has no value: it stands for a value computed when the program runs. Fetch it with "
        "Executor.run(..., fetch_list=[...]), or build the program under pd.eager() to see "
        "values as you go", var=var.name, callsite=user_callsite())


def preview(var):
    """' = [8, 16] [0.1234, -0.2, ...] min -0.9 max 0.8 mean 0.01': a one-line preview of
    `var`'s value for its repr (the whole value when it is small), '' if it has none."""
    value = value_of(var)
    if value is None:
        return ""
    array = np.asarray(value)
    if array.size <= _PREVIEW:
        return " = " + np.array2string(array, precision=4, separator=", ").replace("\n", "")
    flat = array.reshape(-1)
    shown = ", ".join(f"{v:.4g}" for v in flat[:_PREVIEW].tolist())
    text = f" = {list(array.shape)} [{shown}, ...]"
    if dtypes.kind_of(array.dtype) != "bool":
        text += f" min {flat.min():.4g} max {flat.max():.4g} mean {flat.mean():.4g}"
    return text


_PREVIEW = 6
