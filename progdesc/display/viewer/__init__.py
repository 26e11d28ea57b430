"""The interactive program viewer: layers as nested groups, pan, zoom, search, a side panel.

`Viewer(program)` holds the program's view model (`model.py`) and writes the
page that draws it (`page.py`, with `viewer.js` and `viewer.css`): Jupyter
shows it inline (`_repr_html_`), `save("x.html")` writes a standalone page.
Both carry everything they need (no network, no server).
"""
import os

from progdesc.atomic import atomic_write
from progdesc.display.viewer.model import view_model

__all__ = ["VIEWER_OPTIONS", "Viewer", "view_model"]

VIEWER_OPTIONS = frozenset({"scope", "title", "fetch"})
"""The keyword options `Viewer` (and `view_model`) take."""


class Viewer:
    """An interactive view of `program`; the options are `view_model`'s (`scope`, `title`,
    `fetch`). `model` is the view model (a JSON-ready dict)."""

    def __init__(self, program, **options):
        self.program = program
        self.model = view_model(program, **options)

    def __repr__(self):
        return (f"<Viewer {self.model['title']}: {len(self.model['nodes'])} nodes, "
                f"{len(self.model['groups'])} groups>")

    def html(self, standalone=True):
        """The viewer's HTML: a whole page (`standalone`), else a fragment for a notebook."""
        from progdesc.display.viewer.page import viewer_html
        return viewer_html(self.model, standalone=standalone)

    def _repr_html_(self):
        return self.html(standalone=False)

    def save(self, path):
        """Write the standalone page to `path` atomically (the old file stays whole if it
        fails); returns `path`."""
        atomic_write(os.fspath(path), self.html(standalone=True))
        return path
