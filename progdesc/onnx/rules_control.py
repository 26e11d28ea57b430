"""Control flow: If, Loop, Scan."""
from progdesc.onnx.table import RULES
from progdesc.translate import Unsupported  # noqa: F401
