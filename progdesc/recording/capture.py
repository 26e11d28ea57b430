"""`capture(fn, *example_inputs)`: record a Python function of data variables as a program."""
import inspect

import numpy as np

from lowering import dtypes
from lowering.errors import ProgramError
from progdesc.callsites import user_callsite
from progdesc.framework import Program, Variable, data, program_guard
from progdesc.recording.mode import eager


class Captured(tuple):
    """What `capture` recorded: `(program, feed_names, fetch_vars)`, the program, the names
    to feed it by and the Variables it returns (to fetch), also as attributes, and
    `startup_program`, the program holding its parameters' initializers."""

    def __new__(cls, program, feed_names, fetch_vars, startup_program):
        captured = super().__new__(cls, (program, feed_names, fetch_vars))
        captured.startup_program = startup_program
        return captured

    program = property(lambda self: self[0])
    feed_names = property(lambda self: self[1])
    fetch_vars = property(lambda self: self[2])


def capture(fn, *example_inputs, program=None, startup_program=None):
    """Run `fn` once in eager mode on data variables holding `example_inputs`; returns
    `(program, feed_names, fetch_vars)`, a `Captured` whose `startup_program` holds the
    parameters' initializers.

    Each example input (an array) becomes a data variable named after `fn`'s parameter
    (`input_<i>` for `*args`), of the input's dtype (float64 arrays become float32) and
    shape with the leading dim unknown, so the program takes any batch size. `fn` returns
    a Variable or a tuple or list of them: the fetch variables. Ops append to `program`
    and parameters' initializers to `startup_program` (fresh programs by default); the
    parameters are initialised in the current Scope. While `fn` runs, turning a value
    into a Python bool, int or float is a RecordingError naming the line: use the
    control-flow ops (`pd.control_flow`) for decisions the program must keep.
    """
    program = Program() if program is None else program
    startup_program = Program() if startup_program is None else startup_program
    names = input_names(fn, len(example_inputs))
    with program_guard(program, startup_program), eager.capturing():
        inputs = []
        for name, example in zip(names, example_inputs):
            array = np.asarray(example)
            dtype = np.float32 if array.dtype == np.float64 else array.dtype
            shape = [None, *array.shape[1:]] if array.ndim else []
            inputs.append(data(name, shape, dtypes.name_of(dtype), value=array))
        result = fn(*inputs)
    return Captured(program, names, _fetch_vars(result), startup_program)


def input_names(fn, n):
    """Names of the data variables for `n` inputs: `fn`'s positional parameter names."""
    names = []
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = []
    for p in params:
        if p.kind is p.VAR_POSITIONAL:
            break
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            names.append(p.name)
    names = names[:n]
    return names + [f"input_{i}" for i in range(len(names), n)]


def _fetch_vars(result):
    """The Variables `fn` returned, as a list."""
    values = list(result) if isinstance(result, (tuple, list)) else [result]
    for v in values:
        if not isinstance(v, Variable):
            raise ProgramError(f"the captured function must return Variables, got "
                               f"{type(v).__name__}", callsite=user_callsite())
    return values
