"""Drawing a program: with Graphviz's `dot` when it is installed, else with the SVG layout here.

Both draw the same `Graph` (graph.py). Programs with more than
`MAX_NODES` nodes are drawn one node per layer unless `collapse` is given,
and the drawing says so.
"""
import shutil
import subprocess

from lowering.errors import ProgdescError
from progdesc.display.graph import build_graph, graph_dot
from progdesc.display.svg import graph_svg

__all__ = ["MAX_NODES", "Drawing", "RenderError", "program_svg", "render"]

MAX_NODES = 600
"""Above this many nodes (ops and variables), `render` and `program_svg` collapse by default."""


class RenderError(ProgdescError, RuntimeError):
    """A program could not be drawn (Graphviz asked for but missing or failing); the DOT text
    is in `.dot`."""

    def __init__(self, message, dot):
        super().__init__(message)
        self.dot = dot


class Drawing:
    """A drawn program: `data` (bytes) in `format`, made by `engine` ('graphviz' or 'python').

    Jupyter shows it (`_repr_svg_` / `_repr_png_`); `note` says when the
    drawing was collapsed to one node per layer because the program is large.
    """

    def __init__(self, data, format, engine, note=""):
        self.data, self.format, self.engine, self.note = data, format, engine, note

    def __bytes__(self):
        return self.data

    def __repr__(self):
        return f"<Drawing {self.format}, {len(self.data)} bytes, by {self.engine}>"

    def _repr_svg_(self):
        return self.data.decode("utf-8") if self.format == "svg" else None

    def _repr_png_(self):
        return self.data if self.format == "png" else None

    def save(self, path):
        """Write the drawing to `path`; returns `path`."""
        with open(path, "wb") as f:
            f.write(self.data)
        return path


def _graph(program, collapse, options):
    """The graph to draw and a note: collapsed when `collapse` is None and it is large."""
    if collapse is None:
        graph = build_graph(program, False, **options)
        if len(graph.nodes) <= MAX_NODES:
            return graph, ""
        n_ops = sum(n.kind == "op" for n in graph.nodes.values())
        return build_graph(program, True, **options), (
            f"{n_ops} ops: drawn one node per layer; render(collapse=False) draws every op")
    return build_graph(program, collapse, **options), ""


def program_svg(program, collapse=None, **options):
    """SVG text of `program`'s graph, laid out in Python (no Graphviz needed).

    The options are `program_dot`'s (`show_backward`, `show_optimizer`,
    `show_shapes`). `collapse=None` draws every op unless the graph has
    more than `MAX_NODES` nodes; then one node per layer, with a note
    saying so at the top of the drawing.
    """
    graph, note = _graph(program, collapse, options)
    return graph_svg(graph, note)


_INSTALL_HINT = ("install Graphviz (apt-get install graphviz, brew install graphviz or "
                 "conda install graphviz) and the Python package (pip install graphviz), or "
                 "paste the DOT text (this error's .dot, or program.to_dot()) into any "
                 "Graphviz viewer")


def _graphviz(dot_text, format):
    exe = shutil.which("dot")
    if exe is None:
        raise RenderError("cannot render the program with Graphviz: its 'dot' program is not "
                          "on PATH; " + _INSTALL_HINT, dot_text)
    try:
        import graphviz
    except ImportError:
        graphviz = None
    try:
        if graphviz is not None:
            return graphviz.Source(dot_text).pipe(format=format)
        return subprocess.run([exe, f"-T{format}"], input=dot_text.encode("utf-8"),
                              capture_output=True, check=True, timeout=120).stdout
    except Exception as e:  # noqa: BLE001  (graphviz.ExecutableNotFound, CalledProcessError, ...)
        msg = " ".join(str(e).split())[:300]
        raise RenderError(f"cannot render the program: Graphviz failed ({type(e).__name__}: "
                          f"{msg})", dot_text) from None


def render(program, path=None, format="svg", *, engine="auto", collapse=None, rankdir="TB",
           **options):
    """Draw `program`; returns a `Drawing` (shown by Jupyter), or `path` after writing it there.

    `engine='auto'` uses Graphviz's `dot` when it is on PATH and otherwise
    the SVG layout of `program_svg`; 'graphviz' or 'python' pick one.
    `format` is 'svg' for both, or any Graphviz output format ('png',
    'pdf', ...) with Graphviz. `collapse` and the other options are
    `program_svg`'s; `rankdir` ('TB', 'LR') is Graphviz's. Raises
    `RenderError` (with the DOT text in `.dot`) when Graphviz is needed
    (engine 'graphviz', or a format other than 'svg') but missing or failing.
    """
    if engine not in ("auto", "graphviz", "python"):
        raise ValueError(f"engine must be 'auto', 'graphviz' or 'python', got {engine!r}")
    graph, note = _graph(program, collapse, options)
    use_graphviz = engine == "graphviz" or (engine == "auto" and (
        format != "svg" or shutil.which("dot") is not None))
    if use_graphviz:
        data = _graphviz(graph_dot(graph, rankdir, note=note), format)
        drawing = Drawing(data, format, "graphviz", note)
    elif format != "svg":
        raise RenderError(f"cannot render the program as {format!r}: the Python layout draws "
                          "only 'svg', other formats need Graphviz; " + _INSTALL_HINT,
                          graph_dot(graph, rankdir, note=note))
    else:
        drawing = Drawing(graph_svg(graph, note).encode("utf-8"), "svg", "python", note)
    return drawing if path is None else drawing.save(path)
