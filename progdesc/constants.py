"""NumPy and JAX arrays written into a program as constants.

Program builders (ops, layers, eager mode) call `constant`: an `assign_value` op whose
attributes hold the elements, so the program carries them. Importers of foreign programs
call `imported_constant`, the same op with one size rule: an array too large to belong in
a program (more than LARGE_CONSTANT elements) goes to the Scope with the imported
parameters instead, and one whose elements are all equal costs a `fill_constant`.
"""
import hashlib
import warnings

import numpy as np

from lowering import dtypes
from lowering.ops.constant import constant_attrs
from progdesc.callsites import user_callsite, user_stacklevel

LARGE_CONSTANT = 4096
"""NumPy arrays with more elements than this written as constants get a warning."""


class LargeConstantWarning(UserWarning):
    """A large NumPy array written into a program as a constant."""


def constant(block, array, like=None):
    """A Variable of `block` holding NumPy/JAX `array`, made by an `assign_value` op.

    Float64 arrays become float32 (as JAX does by default); `like` (a dtype name) gives
    the constant that dtype instead when it is of the same kind, as a Python scalar
    takes the dtype of the Variable it meets. Arrays of more than LARGE_CONSTANT elements
    get a LargeConstantWarning: the program stores every element.
    """
    array = np.asarray(array)
    if array.dtype == np.float64:
        array = array.astype(np.float32)
    if like is not None and dtypes.kind_of(like) == dtypes.kind_of(array.dtype):
        array = array.astype(dtypes.to_numpy(like))
    if array.size > LARGE_CONSTANT:
        warnings.warn(f"a NumPy array of shape {list(array.shape)} ({array.size} elements) is "
                      f"written into the program as a constant at {user_callsite()}; feed it "
                      "instead (pd.data(name, shape, value=array)) or make it a parameter",
                      LargeConstantWarning, stacklevel=user_stacklevel())
    op = block.append_op("assign_value", attrs=constant_attrs(array))
    return block.var(op.desc.outputs[0].arguments[0])


def imported_constant(block, array, values, *, name=None, callsite=""):
    """A Variable holding `array` (of its own dtype) in a program translated from another
    format, whose importer puts `values` (a dict: name -> array) into the Scope with the
    parameters it imports.

    - All elements equal (and exact as the float32 `value` attribute): a `fill_constant`
      op in `block`, whatever the size.
    - At most LARGE_CONSTANT elements: an `assign_value` op in `block`, as `constant`.
    - Larger: a persistable, non-trainable variable of the global block named after a
      hash of its contents (`const_3f2a...`, so that programs sharing a Scope never
      overwrite each other's), its value put into `values`.

    `name` and `callsite` are those of the op made (see `Block.append_op`).
    """
    array = np.asarray(array)
    flat = array.reshape(-1)
    first = flat[0].item() if flat.size else 0
    if (flat.size == 0 or np.all(flat == flat[0])) and _fits_float32(first):
        op = block.append_op("fill_constant", attrs={
            "shape": list(array.shape), "dtype": dtypes.name_of(array.dtype),
            "value": float(first)}, name=name, callsite=callsite)
    elif array.size <= LARGE_CONSTANT:
        op = block.append_op("assign_value", attrs=constant_attrs(array), name=name,
                             callsite=callsite)
    else:
        digest = hashlib.sha256(array.dtype.str.encode() + str(array.shape).encode()
                                + array.tobytes()).hexdigest()
        var = block.program.global_block().create_var(
            f"const_{digest[:12]}", array.shape, array.dtype, persistable=True,
            stop_gradient=True)
        values[var.name] = array
        return var
    return block.var(op.desc.outputs[0].arguments[0])


def _fits_float32(value):
    """Whether a Python number survives the float32 `value` attribute of fill_constant."""
    return float(np.float32(value)) == value or bool(np.isnan(value))   # compared exactly
