"""Ops of the com.microsoft domain that exporters commonly emit."""
from progdesc.onnx.table import RULES
from progdesc.translate import Unsupported  # noqa: F401
