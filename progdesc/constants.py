"""NumPy and JAX arrays written into a program as constants (`assign_value` ops)."""
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
