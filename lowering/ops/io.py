"""feed and fetch: how values get into a compiled program and results get out (seed 004).

The Executor inserts them into its cached clone of a program; the lowering
pass binds the feed list to the values passed in and collects the fetch list.
"""
from lowering.constraints import non_negative
from lowering.registry import Attr, In, Out, op

_COL = Attr("col", "int", 0, "the column", where=non_negative)


@op("feed", inputs=[In("X")], outputs=[Out("Out")], attrs={"col": _COL}, differentiable=False)
def feed(X, *, col):
    """Column `col` of the feed list `X`."""
    return X[col]


@op("fetch", inputs=[In("X")], outputs=[Out("Out")], attrs={"col": _COL}, differentiable=False)
def fetch(X, *, col):
    """Put `X` in column `col` of the fetch list `Out`."""
    return X
