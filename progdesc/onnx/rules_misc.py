"""Everything else of the default domain: random ops, sequences, quantization, ..."""
from progdesc.onnx.table import RULES
from progdesc.translate import Unsupported  # noqa: F401
