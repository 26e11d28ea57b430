"""Looking at programs: HTML tables for Jupyter, and the program's graph as DOT or SVG.

- tables: `program_html`, `block_html`, `scope_html` (what Jupyter shows for
  a Program, a Block and a Scope).
- graph: `build_graph` makes the graph of a program once (ops or layers,
  variables, edges, nested blocks, with labels, shapes and colours), and
  `program_dot` writes it as Graphviz DOT text.
- svg: `graph_svg` lays the same graph out in Python and writes SVG, so
  `program_svg` needs no Graphviz.
- viewer: `Viewer`, the interactive viewer (layers as groups you open, pan,
  zoom, search, a side panel) that Jupyter shows for a Program and
  `Program.render()` returns; `Program.table()` is the table.
- render: `render` (also `Program.render`) returns a `Drawing` that Jupyter
  shows, made by Graphviz's `dot` when it is installed and by `program_svg`
  otherwise.
"""
from progdesc.display.graph import build_graph, program_dot
from progdesc.display.drawing import MAX_NODES, Drawing, RenderError, program_svg, render
from progdesc.display.tables import ProgramTable, block_html, program_html, scope_html
from progdesc.display.viewer import Viewer, view_model

__all__ = ["MAX_NODES", "Drawing", "ProgramTable", "RenderError", "Viewer", "block_html",
           "build_graph", "program_dot", "program_html", "program_svg", "render", "scope_html",
           "view_model"]
