"""Element types: the proto enum, NumPy dtypes and their readable names."""
import numpy as np
import ml_dtypes

from lowering import progdesc_pb2 as pb
from lowering.errors import ProgramError

_BY_NAME = {
    "bool": (pb.BOOL, np.dtype(np.bool_)),
    "int8": (pb.INT8, np.dtype(np.int8)),
    "int16": (pb.INT16, np.dtype(np.int16)),
    "int32": (pb.INT32, np.dtype(np.int32)),
    "int64": (pb.INT64, np.dtype(np.int64)),
    "uint8": (pb.UINT8, np.dtype(np.uint8)),
    "uint32": (pb.UINT32, np.dtype(np.uint32)),
    "float16": (pb.FLOAT16, np.dtype(np.float16)),
    "bfloat16": (pb.BFLOAT16, np.dtype(ml_dtypes.bfloat16)),
    "float32": (pb.FLOAT32, np.dtype(np.float32)),
    "float64": (pb.FLOAT64, np.dtype(np.float64)),
}
_NAME_BY_ENUM = {enum: name for name, (enum, _) in _BY_NAME.items()}
_NAME_BY_NP = {dt: name for name, (_, dt) in _BY_NAME.items()}

DTYPE_NAMES = tuple(_BY_NAME)


def name_of(dtype):
    """Readable name ('float32') of a dtype given as name, NumPy/JAX dtype or proto enum."""
    if dtype.__class__ is int and dtype in _NAME_BY_ENUM:   # the proto enum, most often
        return _NAME_BY_ENUM[dtype]
    if isinstance(dtype, str) and dtype in _BY_NAME:
        return dtype
    if isinstance(dtype, int) and not isinstance(dtype, bool) and dtype in _NAME_BY_ENUM:
        return _NAME_BY_ENUM[dtype]
    try:
        return _NAME_BY_NP[np.dtype(dtype)]
    except (TypeError, KeyError):
        raise ProgramError(f"unsupported dtype {dtype!r}; expected one of {', '.join(DTYPE_NAMES)}") from None


def to_enum(dtype):
    """Proto enum value of a dtype."""
    return _BY_NAME[name_of(dtype)][0]


def to_numpy(dtype):
    """NumPy dtype of a dtype given in any accepted spelling."""
    return _BY_NAME[name_of(dtype)][1]


def _kind(dt):
    if dt == np.bool_:
        return "bool"
    return "int" if np.issubdtype(dt, np.integer) else "float"


_KIND_BY_NAME = {name: _kind(dt) for name, (_, dt) in _BY_NAME.items()}


def kind_of(dtype):
    """'float', 'int' or 'bool': the family a dtype belongs to."""
    kind = _KIND_BY_NAME.get(dtype) if isinstance(dtype, str) else None
    return kind or _KIND_BY_NAME[name_of(dtype)]
