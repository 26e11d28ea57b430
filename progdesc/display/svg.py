"""A program's graph drawn as SVG in Python: no Graphviz needed.

The layout is the layered (Sugiyama) one Graphviz's `dot` uses, in its
plainest form, linear in the size of the graph after the long edges are
split:

1. cycles (a parameter read by a layer and written by its optimizer op) are
   broken by reversing the edges that go back in program order;
2. every node gets a rank (a row): the longest path from a source, with
   sources (data, parameters) moved down to the row above their first consumer;
   edges longer than one rank pass through invisible bend points;
3. rows are reordered by barycenter sweeps to reduce crossings;
4. x coordinates: each row in turn is pulled towards its neighbours' mean x,
   keeping the row's order and gaps; that is an isotonic regression
   (`scipy.optimize.isotonic_regression`) per row.

Nested blocks are laid out on their own first and then placed as one big
node in their parent's layout, inside a dashed box.
"""
import html
from dataclasses import dataclass

import numpy as np

__all__ = ["graph_svg"]

FONT_SIZE = 11
_LABEL_SIZE = 8                # edge labels
_CHAR_W = 0.6 * FONT_SIZE     # monospace advance width
_LINE_H = 14
_X_GAP, _Y_GAP = 18, 34        # between neighbours in a row, between rows
_MARGIN = 12
_BLOCK_PAD, _BLOCK_TITLE = 10, 16
_SWEEPS = 4
_BEND_BUDGET = 20000           # bend points in all; past it long edges bend fewer times
_FONT = "Menlo, Consolas, 'DejaVu Sans Mono', monospace"


def _text_size(label):
    lines = label.split("\n")
    return max(len(s) for s in lines) * _CHAR_W, len(lines) * _LINE_H


def _label_size(label):
    return len(label) * _CHAR_W * _LABEL_SIZE / FONT_SIZE + 6, _LABEL_SIZE + 4


def _node_size(node):
    tw, th = _text_size(node.label)
    if node.shape == "ellipse":
        return tw * 1.3 + 16, th * 1.3 + 8
    if node.shape == "invhouse":
        return tw + 24, th + 20
    if node.shape == "plaintext":
        return tw + 8, th + 4
    return tw + 16, th + 10


def _placement_order(graph):
    """{node id: position}: ops in program order, each op's unplaced inputs just before it
    and its unplaced outputs just after it, so that edges mostly point forward."""
    preds, succs = {}, {}
    for e in graph.edges:
        succs.setdefault(e.src, []).append(e.dst)
        preds.setdefault(e.dst, []).append(e.src)
    order = {}
    for nid, node in graph.nodes.items():
        if node.kind != "var":
            for n in preds.get(nid, []) + [nid] + succs.get(nid, []):
                if n == nid or graph.nodes[n].kind == "var":
                    order.setdefault(n, len(order))
    for nid in graph.nodes:
        order.setdefault(nid, len(order))
    return order


def _ranks(keys, edges):
    """{key: rank} for `keys` in topological order and `edges` pointing forward in it."""
    preds, succs = {}, {}
    for a, b in edges:
        preds.setdefault(b, []).append(a)
        succs.setdefault(a, []).append(b)
    rank = {}
    for k in keys:
        rank[k] = max((rank[p] + 1 for p in preds.get(k, ())), default=0)
    for k in reversed(keys):
        if k not in preds and k in succs:
            rank[k] = min(rank[s] for s in succs[k]) - 1
    low = min(rank.values(), default=0)
    return {k: r - low for k, r in rank.items()}


def _order_rows(rows, up, down):
    """Barycenter sweeps over `rows` (lists of keys, changed in place)."""
    index = {k: i for row in rows for i, k in enumerate(row)}

    def sweep(row_ids, neighbours):
        for r in row_ids:
            row = rows[r]
            keys = {}
            for k in row:
                ns = neighbours.get(k)
                keys[k] = sum(index[n] for n in ns) / len(ns) if ns else index[k]
            row.sort(key=keys.__getitem__)
            for i, k in enumerate(row):
                index[k] = i

    for _ in range(_SWEEPS):
        sweep(range(1, len(rows)), up)
        sweep(range(len(rows) - 2, -1, -1), down)


def _place_rows(rows, width, up, down, weight):
    """{key: x centre}: rows packed with gaps, then pulled towards their neighbours."""
    x = {}
    seps = []
    for row in rows:
        w = np.array([width[k] for k in row])
        sep = np.concatenate([[0.0], np.cumsum((w[:-1] + w[1:]) / 2 + _X_GAP)])
        seps.append(sep)
        for k, s in zip(row, sep - sep[-1] / 2):
            x[k] = s

    from scipy.optimize import isotonic_regression   # here: it takes 0.5 s to import

    def pull(row_ids, neighbour_maps):
        for r in row_ids:
            row = rows[r]
            want = []
            for k in row:
                ns = [x[n] for m in neighbour_maps for n in m.get(k, ())]
                want.append(sum(ns) / len(ns) if ns else x[k])
            want = np.array(want)
            if len(row) > 1:   # closest to `want` that keeps the order and the gaps
                w = np.array([weight[k] for k in row])
                want = isotonic_regression(want - seps[r], weights=w).x + seps[r]
            for k, v in zip(row, want):
                x[k] = float(v)

    for _ in range(_SWEEPS):
        pull(range(1, len(rows)), [up])
        pull(range(len(rows) - 2, -1, -1), [down])
    pull(range(len(rows)), [up, down])
    return x


def _bend_ranks(top, bottom, most):
    """The rows a long edge bends in: every row between `top` and `bottom`, or, past `most`
    of them, the first and then evenly spaced ones (the edge then may cross nodes)."""
    if bottom - top - 1 <= most:
        return range(top + 1, bottom)
    step = (bottom - top) / most
    return sorted({top + 1} | {top + round(j * step) for j in range(1, most)})


def _lay_out_rows(keys, sizes, edges, labels):
    """Positions of `keys` (in placement order) with `sizes` {key: (w, h)} for `edges`
    [(a, b)] (a != b) whose `labels` are sizes (w, h) or None.

    Returns ({key: (x, y) centre}, [bend points per edge], [label centre or None per edge],
    width, height).
    """
    pos_of = {k: i for i, k in enumerate(keys)}
    forward = [(a, b) if pos_of[a] <= pos_of[b] else (b, a) for a, b in edges]
    rank = _ranks(keys, forward)
    spread = 2 if any(labels) else 1   # labels sit on a row of their own between two ranks
    rank = {k: r * spread for k, r in rank.items()}
    width = {k: sizes[k][0] for k in keys}
    height = {k: sizes[k][1] for k in keys}
    weight = {k: 1.0 for k in keys}
    rows = [[] for _ in range(max(rank.values(), default=-1) + 1)]
    for k in keys:
        rows[rank[k]].append(k)
    up, down = {}, {}
    chains, label_keys = [], []
    most = max(4, _BEND_BUDGET // max(len(edges), 1))
    for i, ((a, b), label) in enumerate(zip(forward, labels)):
        chain = [a]
        for r in _bend_ranks(rank[a], rank[b], most):   # bend points of a long edge
            d = ("bend", i, r)
            rank[d], width[d], height[d], weight[d] = r, 4.0, 0.0, 4.0   # heavy: keeps it straight
            rows[r].append(d)
            chain.append(d)
        if label:   # the first bend holds the label: as wide and high as it
            width[chain[1]], height[chain[1]] = label
        label_keys.append(chain[1] if label else None)
        chain.append(b)
        for u, v in zip(chain, chain[1:]):
            down.setdefault(u, []).append(v)
            up.setdefault(v, []).append(u)
        chains.append(chain)
    _order_rows(rows, up, down)
    x = _place_rows(rows, width, up, down, weight)
    row_y, y = [], 0.0
    for row in rows:
        h = max((height[k] for k in row), default=0.0)
        row_y.append(y + h / 2)
        y += h + _Y_GAP / spread
    left = min((x[k] - width[k] / 2 for k in x), default=0.0)
    right = max((x[k] + width[k] / 2 for k in x), default=0.0)

    def at(k):
        return x[k] - left, row_y[rank[k]]

    bends = []
    for (a, b), chain in zip(edges, chains):
        points = [at(d) for d in chain[1:-1]]
        bends.append(points if chain[0] == a else points[::-1])
    label_at = [at(k) if k is not None else None for k in label_keys]
    return ({k: at(k) for k in keys}, bends, label_at, right - left,
            max(y - _Y_GAP / spread, 0.0))


@dataclass
class _Level:
    """The layout of one block (or the top): centres and sizes of its items (nodes and
    ('block', b) boxes), the routes {edge index: (bends, label centre)} of the edges between
    them, the layouts of the nested blocks, and its size."""
    centre: dict
    sizes: dict
    routes: dict
    inner: dict
    width: float
    height: float


class _Placement:
    """Absolute boxes of nodes and blocks, and the routes of edges, for one Graph."""

    def __init__(self, graph):
        self.graph = graph
        self.order = _placement_order(graph)
        self.sizes = {nid: _node_size(n) for nid, n in graph.nodes.items()}
        self.block_of = {nid: b for b, ids in graph.members.items() for nid in ids}
        self.parent = {c: b for b, cs in graph.nested.items() for c in cs}
        self.centre = {}       # node id -> (x, y), absolute
        self.blocks = []       # (block idx, x, y, w, h), absolute
        self.bends = {}        # edge index -> bend points, absolute
        self.labels = {}       # edge index -> centre of its label, absolute
        self.width = self.height = 0.0

    def _item(self, nid, level):
        """What holds node `nid` at `level` (a block idx, None for the top): the node itself,
        ('block', b) for the nested block b it sits in, or None if it is outside."""
        b = self.block_of[nid]
        tops = self.graph.roots if level is None else [level]
        if b in tops:
            return nid
        while b in self.parent:
            if self.parent[b] in tops:
                return ("block", b)
            b = self.parent[b]
        return None

    def _members(self, level):
        blocks = self.graph.roots if level is None else [level]
        items = [nid for b in blocks for nid in self.graph.members[b]]
        items += [("block", c) for b in blocks for c in self.graph.nested.get(b, [])]
        return items

    def lay_out(self, level=None):
        """The `_Level` of a block (None: the top), nested blocks laid out first."""
        items = self._members(level)
        sizes, inner = {}, {}
        for it in items:
            if isinstance(it, tuple):
                inner[it] = self.lay_out(it[1])
                sizes[it] = (inner[it].width + 2 * _BLOCK_PAD,
                             inner[it].height + 2 * _BLOCK_PAD + _BLOCK_TITLE)
            else:
                sizes[it] = self.sizes[it]
        first = {}
        for it in items:
            first[it] = self.order[it] if not isinstance(it, tuple) else min(
                (self.order[n] for n, b in self.block_of.items() if self._item(n, level) == it),
                default=len(self.order))
        keys = sorted(items, key=first.__getitem__)
        edges, labels, which = [], [], []
        for i, e in enumerate(self.graph.edges):
            a, b = self._item(e.src, level), self._item(e.dst, level)
            if a is not None and b is not None and a != b:
                edges.append((a, b))
                labels.append(_label_size(e.label) if e.label else None)
                which.append(i)
        centre, bends, label_at, w, h = _lay_out_rows(keys, sizes, edges, labels)
        return _Level(centre, sizes, dict(zip(which, zip(bends, label_at))), inner, w, h)

    def place(self, level, dx, dy):
        """Record the absolute positions of a `_Level` moved to (dx, dy)."""
        for it, (x, y) in level.centre.items():
            if isinstance(it, tuple):
                w, h = level.sizes[it]
                self.blocks.append((it[1], dx + x - w / 2, dy + y - h / 2, w, h))
                self.place(level.inner[it], dx + x - w / 2 + _BLOCK_PAD,
                           dy + y - h / 2 + _BLOCK_PAD + _BLOCK_TITLE)
            else:
                self.centre[it] = (dx + x, dy + y)
        for i, (points, label) in level.routes.items():
            self.bends[i] = [(dx + x, dy + y) for x, y in points]
            if label is not None:
                self.labels[i] = (dx + label[0], dy + label[1])

    def run(self, top):
        """Lay out the whole graph below a margin of `top`."""
        level = self.lay_out()
        self.place(level, _MARGIN, top)
        self.width = level.width + 2 * _MARGIN
        self.height = level.height + top + _MARGIN


def _f(v):
    return f"{v:.1f}"


def _e(text):
    return html.escape(str(text), quote=True)


def _text(label, x, y, size=FONT_SIZE):
    lines = label.split("\n")
    top = y - (len(lines) - 1) * _LINE_H / 2
    spans = "".join(f'<tspan x="{_f(x)}" y="{_f(top + i * _LINE_H)}">{_e(s)}</tspan>'
                    for i, s in enumerate(lines))
    return (f'<text text-anchor="middle" dominant-baseline="central" font-size="{size}">'
            f"{spans}</text>")


def _shape(node, x, y, w, h):
    stroke = ' stroke="#333333"' + (' stroke-width="2"' if node.bold else "") + (
        ' stroke-dasharray="4,3"' if node.dashed else "")
    fill = f' fill="{_e(node.fill)}"' if node.fill else ' fill="#ffffff"'
    if node.shape == "ellipse":
        return (f'<ellipse cx="{_f(x)}" cy="{_f(y)}" rx="{_f(w / 2)}" ry="{_f(h / 2)}"'
                f"{fill}{stroke}/>")
    if node.shape == "invhouse":
        l, r, t, b = x - w / 2, x + w / 2, y - h / 2, y + h / 2
        pts = [(l, t), (r, t), (r, b - 8), (x, b), (l, b - 8)]
        return f'<polygon points="{" ".join(f"{_f(a)},{_f(c)}" for a, c in pts)}"{fill}{stroke}/>'
    if node.shape == "plaintext":   # an invisible box: the node's extent, for tools
        fill, stroke = ' fill="none"', ' stroke="none"'
    rx = ' rx="6"' if node.rounded else ""
    return (f'<rect x="{_f(x - w / 2)}" y="{_f(y - h / 2)}" width="{_f(w)}" height="{_f(h)}"'
            f"{rx}{fill}{stroke}/>")


def _edge_path(points):
    """A smooth path through `points`: vertical tangents at each point, like dot's splines."""
    d = f"M{_f(points[0][0])},{_f(points[0][1])}"
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        my = (y0 + y1) / 2
        d += f" C{_f(x0)},{_f(my)} {_f(x1)},{_f(my)} {_f(x1)},{_f(y1)}"
    return d


def _arrow_head(tip, before):
    """A triangle at `tip`, pointing the way `_edge_path` arrives there from `before`."""
    (x1, y1), (x0, y0) = tip, before
    if abs(y1 - y0) > 1e-6:
        ux, uy = 0.0, (1.0 if y1 > y0 else -1.0)
    else:
        ux, uy = (1.0 if x1 >= x0 else -1.0), 0.0
    bx, by = x1 - 8 * ux, y1 - 8 * uy
    pts = [(x1, y1), (bx - 3.5 * uy, by + 3.5 * ux), (bx + 3.5 * uy, by - 3.5 * ux)]
    return f'<polygon points="{" ".join(f"{_f(a)},{_f(b)}" for a, b in pts)}" fill="#555555"/>'


def _edge_title(graph, edge):
    def name(nid):
        return graph.nodes[nid].label.split("\n", 1)[0]
    return f"{name(edge.src)} \u2192 {name(edge.dst)}"


def _edge(d, i, edge):
    """The `<g class="edge">` of edge number `i`, placed by `_Placement` `d`."""
    (sx, sy), (tx, ty) = d.centre[edge.src], d.centre[edge.dst]
    sh, th = d.sizes[edge.src][1] / 2, d.sizes[edge.dst][1] / 2
    bends = d.bends.get(i, [])
    nxt = bends[0] if bends else (tx, ty)
    if nxt[1] >= sy:
        start, end = (sx, sy + sh), (tx, ty - th)
    else:   # an edge drawn upwards (a cycle) runs beside its downward twin
        dx = min(8.0, d.sizes[edge.src][0] / 4, d.sizes[edge.dst][0] / 4)
        start, end = (sx + dx, sy - sh), (tx + dx, ty + th)
    points = [start] + bends + [end]
    dash = ' stroke-dasharray="5,4"' if edge.dashed else ""
    out = [f'<g class="edge" data-src="{_e(edge.src)}" data-dst="{_e(edge.dst)}">',
           f"<title>{_e(edge.tooltip or _edge_title(d.graph, edge))}</title>",
           f'<path d="{_edge_path(points)}" fill="none" stroke="#555555"{dash}/>',
           _arrow_head(points[-1], points[-2])]
    if i in d.labels:
        (lx, ly), (w, h) = d.labels[i], _label_size(edge.label)
        out.append(f'<rect x="{_f(lx - w / 2)}" y="{_f(ly - h / 2)}" width="{_f(w)}" '
                   f'height="{_f(h)}" fill="#ffffff" fill-opacity="0.85"/>'
                   f'<g fill="#444444">{_text(edge.label, lx, ly, _LABEL_SIZE)}</g>')
    out.append("</g>")
    return "".join(out)


def graph_svg(graph, note=""):
    """SVG text (an `<svg>` document) of a `Graph` from `build_graph`.

    Each node is a `<g class="node KIND" id=ID>` (KIND 'op', 'group', 'var'
    or 'note') holding its shape, its label and a `<title>` tooltip; each
    edge a `<g class="edge">` with one `<path>`; each nested block a
    `<g class="block">`. `note` is printed above the drawing.
    """
    top = _MARGIN + (_LINE_H + 6 if note else 0)
    d = _Placement(graph)
    d.run(top)
    width = max(d.width, len(note) * _CHAR_W + 2 * _MARGIN)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_f(width)}" '
           f'height="{_f(d.height)}" viewBox="0 0 {_f(width)} {_f(d.height)}" '
           f'font-family="{_e(_FONT)}" font-size="{FONT_SIZE}">',
           f'<rect width="100%" height="100%" fill="#ffffff"/>']
    if note:
        out.append(f'<text class="note" x="{_MARGIN}" y="{_MARGIN + _LINE_H / 2}" '
                   f'dominant-baseline="central" fill="#8a4b00">{_e(note)}</text>')
    for b, x, y, w, h in sorted(d.blocks):
        out.append(f'<g class="block" id="block_{b}"><rect x="{_f(x)}" y="{_f(y)}" '
                   f'width="{_f(w)}" height="{_f(h)}" fill="none" stroke="#8888aa" '
                   f'stroke-dasharray="5,4"/><text x="{_f(x + 6)}" y="{_f(y + 11)}" '
                   f'dominant-baseline="central" fill="#555577">block {b}</text></g>')
    for i, edge in enumerate(graph.edges):
        out.append(_edge(d, i, edge))
    for nid, node in graph.nodes.items():
        x, y = d.centre[nid]
        w, h = d.sizes[nid]
        title = f"<title>{_e(node.tooltip)}</title>" if node.tooltip else ""
        out.append(f'<g class="node {node.kind}" id="{_e(nid)}">{title}{_shape(node, x, y, w, h)}'
                   f"{_text(node.label, x, y)}</g>")
    out.append("</svg>")
    return "\n".join(out) + "\n"
