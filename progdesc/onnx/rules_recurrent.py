"""Recurrent nodes: LSTM, GRU, RNN."""
from progdesc.onnx.table import RULES
from progdesc.translate import Unsupported  # noqa: F401
