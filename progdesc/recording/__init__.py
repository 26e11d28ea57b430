"""Eager mode that records: ops run at once as they are appended, and the program stays.

`pd.eager` turns it on (`with pd.eager():`, `pd.eager.enable()`), `pd.capture(fn, *inputs)`
records a Python function into a program, `pd.Model` records a training step written
as eager code on its first call and replays it compiled; values are read with
`var.numpy()`. The
recorded program is an ordinary one: run it compiled with an Executor, differentiate,
train, save or export it.
"""
from progdesc.recording.capture import Captured, capture
from progdesc.recording.mode import eager
from progdesc.recording.model import Model
from progdesc.constants import LargeConstantWarning
from progdesc.recording.loops import EagerLoopWarning
from progdesc.recording.values import RecordingWarning

__all__ = ["Captured", "capture", "eager", "Model", "EagerLoopWarning", "LargeConstantWarning",
           "RecordingWarning"]
