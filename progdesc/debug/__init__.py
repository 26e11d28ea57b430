"""Debugging programs: `Executor(check_numerics=True)` runs a program op by op, uncompiled,
and raises `NumericsError` naming the first op that produces a NaN or Inf (numerics);
the error's summaries of the values involved are made in report."""
from progdesc.debug.numerics import run_checked
from progdesc.debug.report import OpRef, ValueSummary

__all__ = ["OpRef", "ValueSummary", "run_checked"]
