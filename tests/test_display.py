"""progdesc.display: HTML tables (Program, Block, Scope), DOT graphs, and rendering."""
import html
import re
import shutil
import xml.etree.ElementTree as ET

import jax
import numpy as np
import pytest

import progdesc as pd
from progdesc import custom_op, display, layers, ops

# pydot's parser calls pyparsing's deprecated camelCase API
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _mlp(optimizer=True):
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 4])
        y = pd.data("y", [None, 1], "int64")
        h = layers.fc(x, 16, act="tanh")
        logits = layers.fc(h, 3)
        loss = ops.mean(layers.softmax_with_cross_entropy(logits, y))
        if optimizer:
            pd.optimizer.SGD(0.1).minimize(loss)
    return main, startup, loss


def _tiny():
    """y = relu(x @ w): 2 ops, 4 variables (x, w, matmul out, relu out)."""
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 3])
        w = pd.create_parameter([3, 2], "float32", attr="w")
        ops.relu(ops.matmul(x, w))
    return main


def _graph(dot_text):
    """The one digraph parsed from `dot_text` by pydot (a test extra: skips without it)."""
    pydot = pytest.importorskip("pydot")
    graphs = pydot.graph_from_dot_data(dot_text)
    assert graphs is not None and len(graphs) == 1, dot_text
    g = graphs[0]
    assert g.get_type() == "digraph"
    return g


def _nodes(g):
    out = [n for n in g.get_nodes() if n.get_name().strip('"') not in ("node", "edge", "graph")]
    for sub in g.get_subgraphs():
        out += _nodes(sub)
    return out


def _edges(g):
    out = list(g.get_edges())
    for sub in g.get_subgraphs():
        out += _edges(sub)
    return out


def _label(node):
    return node.get_attributes().get("label", "").strip('"').replace("\\n", "\n")


def _rows(text, cls):
    return re.findall(rf'<tr class="[^"]*\b{cls}\b[^"]*"[^>]*>(.*?)</tr>', text, re.S)


# --- HTML ---

def test_program_html_lists_ops_variables_shapes_and_attrs():
    main, _, _ = _mlp()
    text = main.table()._repr_html_()
    assert text == display.program_html(main)
    op_rows = _rows(text, "pd-op")
    assert len(op_rows) == len(main.global_block().ops)
    for op, row in zip(main.global_block().ops, op_rows):
        assert f"<b>{op.type}</b>" in row
        for names in list(op.inputs.values()) + list(op.outputs.values()):
            for n in names:
                assert html.escape(n) in row
    first = op_rows[0]          # matmul(x, fc_0.w_0) -> fc_0.matmul_0.out
    assert "x</span>" in first and "float32[-1, 4]" in first
    assert "fc_0.w_0" in first and "float32[4, 16]" in first and "pd-param" in first
    assert "float32[-1, 16]" in first
    # non-default attributes only: the backward matmul has transpose_y=True, the forward none
    assert "transpose" not in first
    assert any("transpose_y=True" in r for r in op_rows)
    assert "learning_rate" in text and "seed 0" in text


def test_html_tells_roles_apart():
    main, _, _ = _mlp()
    text = main.table()._repr_html_()
    roles = [op.role for op in main.global_block().ops]
    marked = re.findall(r'<tr class="pd-op pd-role-(\w+)" data-role="(\w+)"', text)
    assert [a for a, _ in marked] == roles
    assert {"forward", "backward", "optimize"} <= set(roles)
    for row, role in zip(_rows(text, "pd-op"), roles):
        assert f"<td>{role}</td>" in row
    bwd = [r for r, role in zip(_rows(text, "pd-op"), roles) if role == "backward"]
    assert bwd and all("@GRAD" in r or ".grad" in r for r in bwd)
    assert "backward ops</td>" in text and "optimize ops</td>" in text
    # the forward-only clone has no backward rows
    assert "pd-role-backward" not in main.clone(for_test=True).table()._repr_html_()


def test_html_escapes_names():
    main = pd.Program()
    with pd.program_guard(main, pd.Program()):
        x = pd.data("<b>", [2, 2])
        ops.relu(x, name='a"&<i>')
    for text in (main.table()._repr_html_(), main.global_block()._repr_html_()):
        assert "<b>" not in text.replace("<b>relu</b>", "").replace("<b>block 0</b>", "") \
            .replace("<b>Program</b>", "")
        assert "&lt;b&gt;" in text
        assert "&lt;i&gt;" in text and "&quot;&amp;" in text


@pytest.fixture
def op_with_block():
    """The name of a custom op with a `sub_block` attribute (registered for one test)."""
    name = "display_test_with_block"

    @custom_op.op(name, inputs=[custom_op.In("X")], outputs=[custom_op.Out("Out")],
                  attrs={"sub_block": custom_op.Attr("sub_block", "block")}, replace=True)
    def _(X, *, sub_block):
        return X

    yield name
    custom_op.unregister(name)


def test_block_html_and_nested_blocks(op_with_block):
    name = op_with_block
    main = pd.Program()
    with pd.program_guard(main, pd.Program()):
        x = pd.data("x", [2, 3])
        sub = main.create_block()
        ops.tanh(x, name="inner")
        main.rollback()
        main.global_block().append_op(name, inputs={"X": x}, outputs={"Out": "y"},
                                      attrs={"sub_block": sub.idx})
    text = main.table()._repr_html_()
    # block 1 is shown once, nested in the row after the op that refers to it
    assert text.count("<b>block 1</b>") == 1
    nested = text.index('<tr class="pd-nested">')
    assert text.index(f"<b>{name}</b>") < nested < text.index("<b>block 1</b>")
    assert nested < text.index("inner_0.out")
    assert "sub_block=block 1" in text
    inner = main.block(1)._repr_html_()
    assert "<b>tanh</b>" in inner and name not in inner
    dot = main.to_dot()
    g = _graph(dot)
    assert [s.get_name() for s in g.get_subgraphs()] == ["cluster_block_1"]
    assert any("lhead" in e.get_attributes() for e in _edges(g))


def test_scope_html():
    main, startup, _ = _mlp(optimizer=False)
    scope = pd.Scope()
    pd.Executor().run(startup, scope=scope)
    kid = scope.new_scope()
    kid.set("<kid>", np.zeros((5,), np.int32))
    scope.var("empty")
    text = scope._repr_html_()
    assert text == display.scope_html(scope)
    row = next(r for r in re.findall(r"<tr>(.*?)</tr>", text, re.S) if "fc_0.w_0<" in r)
    assert "[4, 16]" in row and "float32" in row and f"{4 * 16 * 4:,}" in row
    assert str(jax.devices()[0]).lower() in row.lower()   # "cpu:0", "cuda:0"
    assert "unset" in text                         # 'empty' has no value
    assert "&lt;kid&gt;" in text and "<kid>" not in text and "child scope" in text
    flat = display.scope_html(scope, kids=False)
    assert "&lt;kid&gt;" not in flat and "1 child scope(s) not shown" in flat
    total = sum(scope.get(n).nbytes for n in scope.local_var_names() if n != "empty")
    assert f"{len(scope.local_var_names())} variables \u00b7 {total} B</div>" in text


# --- DOT ---

def test_dot_tiny_program_counts():
    main = _tiny()
    g = _graph(main.to_dot())
    nodes, edges = _nodes(g), _edges(g)
    assert len(nodes) == 2 + 4          # 2 ops, 4 variables
    assert len(edges) == 5              # x->matmul, w->matmul, matmul->out, out->relu, relu->out
    labels = {_label(n).split("\n")[0]: n for n in nodes}
    assert {"matmul", "relu", "x", "w", "matmul_0.out", "relu_0.out"} <= set(labels)
    assert "float32[3, 2]" in _label(labels["w"])
    w_style = labels["w"].get_attributes()["style"]
    assert "bold" in w_style and "filled" in w_style     # parameters are marked
    assert "bold" not in labels["matmul_0.out"].get_attributes().get("style", "")
    ids = {_label(n).split("\n")[0]: n.get_name() for n in nodes}
    pairs = {(e.get_source(), e.get_destination()) for e in edges}
    assert (ids["x"], ids["matmul"]) in pairs and (ids["matmul"], ids["matmul_0.out"]) in pairs
    assert (ids["relu"], ids["relu_0.out"]) in pairs


def test_dot_roles_and_hiding():
    main, _, _ = _mlp()
    full = _graph(main.to_dot())
    n_ops = len(main.global_block().ops)
    op_nodes = [n for n in _nodes(full) if n.get_name().startswith("op_")]
    assert len(op_nodes) == n_ops
    fwd = _graph(main.to_dot(show_backward=False, show_optimizer=False))
    n_fwd = sum(op.role == "forward" for op in main.global_block().ops)
    assert len([n for n in _nodes(fwd) if n.get_name().startswith("op_")]) == n_fwd
    assert "@GRAD" not in main.to_dot(show_backward=False, show_optimizer=False)
    no_bwd = _graph(main.to_dot(show_backward=False))
    n_opt = sum(op.role in ("optimize", "lr_sched") for op in main.global_block().ops)
    assert n_opt and len([n for n in _nodes(no_bwd) if n.get_name().startswith("op_")]) == \
        n_fwd + n_opt
    assert "sgd" in main.to_dot() and '"sgd"' not in main.to_dot(show_optimizer=False)


def test_collapse_reduces_nodes_by_name_scope():
    main, _, _ = _mlp()
    full = _graph(main.to_dot(show_backward=False, show_optimizer=False))
    collapsed = _graph(main.to_dot(collapse=True, show_backward=False, show_optimizer=False))
    assert len(_nodes(collapsed)) < len(_nodes(full))
    groups = {_label(n).split("\n")[0]: _label(n) for n in _nodes(collapsed)
              if n.get_name().startswith("grp_")}
    assert "fc_0" in groups and "matmul, add, tanh" in groups["fc_0"]   # the act joins its layer
    assert "fc_1" in groups and "3 ops" not in groups["fc_1"]
    # parameters stay visible and marked
    params = [n for n in _nodes(collapsed) if "bold" in n.get_attributes().get("style", "")]
    assert {_label(n).split("\n")[0] for n in params} == {"fc_0.w_0", "fc_0.b_0", "fc_1.w_0",
                                                          "fc_1.b_0"}
    with_bwd = _graph(main.to_dot(collapse=True))
    assert any("(backward)" in _label(n) for n in _nodes(with_bwd))
    assert len(_nodes(with_bwd)) < len(_nodes(_graph(main.to_dot())))


def test_dot_escapes_quotes_and_backslashes():
    main = pd.Program()
    with pd.program_guard(main, pd.Program()):
        ops.relu(pd.data('a"b\\c', [2]))
    g = _graph(main.to_dot())
    assert any('a\\"b\\\\c' in n.get_attributes().get("label", "") for n in _nodes(g))


# --- SVG (no Graphviz) ---

_NS = "{http://www.w3.org/2000/svg}"


def _svg(text):
    root = ET.fromstring(text)       # well-formed XML, or this raises
    assert root.tag == _NS + "svg"
    return root


def _svg_groups(root, cls):
    return [g for g in root.iter(_NS + "g") if g.get("class", "").split()[:1] == [cls]]


def _svg_text(g):
    return "\n".join(t.text or "" for t in g.find(_NS + "text").iter(_NS + "tspan"))


def _bbox(g):
    """(left, top, right, bottom) of a node's or block's shape."""
    for shape in g:
        tag, a = shape.tag[len(_NS):], shape.attrib
        if tag == "rect":
            x, y = float(a["x"]), float(a["y"])
            return x, y, x + float(a["width"]), y + float(a["height"])
        if tag == "ellipse":
            cx, cy, rx, ry = (float(a[k]) for k in ("cx", "cy", "rx", "ry"))
            return cx - rx, cy - ry, cx + rx, cy + ry
        if tag == "polygon":
            pts = [tuple(map(float, p.split(","))) for p in a["points"].split()]
            return (min(p[0] for p in pts), min(p[1] for p in pts),
                    max(p[0] for p in pts), max(p[1] for p in pts))
    raise AssertionError(f"no shape in {g.get('id')}")


def _overlap(a, b):
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _assert_no_overlaps(boxes):
    items = sorted(boxes.items(), key=lambda kv: kv[1][0])
    for i, (na, a) in enumerate(items):
        for nb, b in items[i + 1:]:
            if b[0] >= a[2]:
                break
            assert not _overlap(a, b), f"{na} {a} overlaps {nb} {b}"


def _path_ends(edge):
    nums = [float(v) for v in re.findall(r"-?\d+(?:\.\d+)?", edge.find(_NS + "path").get("d"))]
    return (nums[0], nums[1]), (nums[-2], nums[-1])


def _on_border(point, box, tol=0.6):
    x, y = point
    inside = box[0] - tol <= x <= box[2] + tol and box[1] - tol <= y <= box[3] + tol
    return inside and min(abs(y - box[1]), abs(y - box[3])) <= tol


def test_svg_one_node_per_op_and_variable_edges_between_them():
    main, _, _ = _mlp()
    block = main.global_block()
    root = _svg(display.program_svg(main, collapse=False))
    ops_drawn = {g.get("id"): g for g in _svg_groups(root, "node") if "op" in g.get("class")}
    assert len(ops_drawn) == len(block.ops)
    for i, op in enumerate(block.ops):          # each op's node shows its type
        assert _svg_text(ops_drawn[f"op_0_{i}"]) == op.type
    names = {n for op in block.ops for ns in list(op.inputs.values()) + list(op.outputs.values())
             for n in ns}
    vars_drawn = [g for g in _svg_groups(root, "node") if "var" in g.get("class")]
    assert sorted(_svg_text(g).split("\n")[0] for g in vars_drawn) == sorted(names)
    # one edge per (variable, op) input pair and per (op, variable) output pair
    pairs = {(n, i) for i, op in enumerate(block.ops) for ns in op.inputs.values() for n in ns}
    pairs |= {(i, n) for i, op in enumerate(block.ops) for ns in op.outputs.values() for n in ns}
    edges = _svg_groups(root, "edge")
    assert len(edges) == len(pairs)
    boxes = {g.get("id"): _bbox(g) for g in _svg_groups(root, "node")}
    _assert_no_overlaps(boxes)
    for e in edges:                              # each path runs between its two nodes
        start, end = _path_ends(e)
        assert _on_border(start, boxes[e.get("data-src")]), (e.get("data-src"), start)
        assert _on_border(end, boxes[e.get("data-dst")]), (e.get("data-dst"), end)
    # data, parameters and gradients are told apart as in the DOT drawing
    w = next(g for g in vars_drawn if _svg_text(g).startswith("fc_0.w_0\n"))
    assert w.find(_NS + "ellipse").get("stroke-width") == "2"
    x = next(g for g in vars_drawn if _svg_text(g).startswith("x\n"))
    assert x.find(_NS + "polygon") is not None
    grad = next(g for g in vars_drawn if "@GRAD" in _svg_text(g))
    assert grad.find(_NS + "ellipse").get("stroke-dasharray")


def test_svg_collapsed_one_node_per_layer():
    main, _, _ = _mlp()
    n_fwd = sum(op.role == "forward" for op in main.global_block().ops)
    root = _svg(display.program_svg(main, collapse=True, show_backward=False,
                                    show_optimizer=False))
    groups = {_svg_text(g).split("\n")[0]: _svg_text(g) for g in _svg_groups(root, "node")
              if "group" in g.get("class")}
    assert "matmul, add, tanh" in groups["fc_0"] and "fc_1" in groups
    counts = [int(re.search(r"\n(\d+) ops?:", text).group(1)) for text in groups.values()]
    assert sum(counts) == n_fwd                  # every forward op is in exactly one group
    assert not any("(backward)" in t for t in groups)
    params = {_svg_text(g).split("\n")[0] for g in _svg_groups(root, "node")
              if "var" in g.get("class") and g.find(_NS + "ellipse") is not None
              and g.find(_NS + "ellipse").get("stroke-width") == "2"}
    assert params == {"fc_0.w_0", "fc_0.b_0", "fc_1.w_0", "fc_1.b_0"}
    graph = display.build_graph(main, True, show_backward=False, show_optimizer=False)
    assert len(_svg_groups(root, "edge")) == len(graph.edges)
    _assert_no_overlaps({g.get("id"): _bbox(g) for g in _svg_groups(root, "node")})
    labelled = [e for e in graph.edges if e.label]
    assert labelled and all(e.label in ET.tostring(root, encoding="unicode") for e in labelled)
    full = _svg(display.program_svg(main, collapse=True))
    assert any("(backward)" in _svg_text(g) for g in _svg_groups(full, "node"))
    # nodes and edge labels (layer -> layer edges are labelled with the tensor's type) apart
    boxes = {g.get("id"): _bbox(g) for g in _svg_groups(full, "node")}
    labels = [e.find(_NS + "rect") for e in _svg_groups(full, "edge")]
    labels = [r for r in labels if r is not None]
    assert labels
    boxes.update({f"label {i}": _bbox([r]) for i, r in enumerate(labels)})
    _assert_no_overlaps(boxes)


def test_svg_large_program_collapses_with_a_note(monkeypatch):
    main, _, _ = _mlp()
    n_nodes = len(_svg_groups(_svg(display.program_svg(main)), "node"))
    monkeypatch.setattr("progdesc.display.drawing.MAX_NODES", n_nodes - 1)
    root = _svg(display.program_svg(main))
    notes = [t for t in root.iter(_NS + "text") if t.get("class") == "note"]
    assert len(notes) == 1
    n_ops = len(main.global_block().ops)
    assert notes[0].text.startswith(f"{n_ops} ops: drawn one node per layer")
    assert "collapse=False" in notes[0].text
    assert _svg_groups(root, "node") and all(
        "op" not in g.get("class").split() for g in _svg_groups(root, "node"))
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    with pytest.raises(display.RenderError) as info:          # Graphviz gets the note too
        main.render(engine="graphviz")
    assert f'label="{notes[0].text}", labelloc=t' in info.value.dot
    assert 'label="matmul"' not in info.value.dot
    explicit = _svg(display.program_svg(main, collapse=False))   # asked for: every op
    assert len(_svg_groups(explicit, "node")) == n_nodes
    assert not [t for t in explicit.iter(_NS + "text") if t.get("class") == "note"]


def test_svg_escapes_names():
    main = pd.Program()
    with pd.program_guard(main, pd.Program()):
        ops.relu(pd.data('a<b>&"c', [2]))
    root = _svg(display.program_svg(main))
    assert any(_svg_text(g).startswith('a<b>&"c\n') for g in _svg_groups(root, "node"))


def test_svg_nested_block_is_a_box_around_its_ops(op_with_block):
    name = op_with_block
    main = pd.Program()
    with pd.program_guard(main, pd.Program()):
        x = pd.data("x", [2, 3])
        sub = main.create_block()
        ops.exp(ops.tanh(x, name="inner"))
        main.rollback()
        main.create_block()             # an empty block: still drawn
        main.rollback()
        main.global_block().append_op(name, inputs={"X": x}, outputs={"Out": "y"},
                                      attrs={"sub_block": sub.idx})
    root = _svg(display.program_svg(main))
    blocks = {g.get("id"): _bbox(g) for g in _svg_groups(root, "block")}
    assert set(blocks) == {"block_1", "block_2"}
    nodes = {g.get("id"): _bbox(g) for g in _svg_groups(root, "node")}
    for node_id in ("op_1_0", "op_1_1"):     # tanh and exp sit inside block 1's box
        inner, box = nodes[node_id], blocks["block_1"]
        assert box[0] <= inner[0] and inner[2] <= box[2] and box[1] <= inner[1] \
            and inner[3] <= box[3]
    assert not _overlap(blocks["block_1"], blocks["block_2"])
    outside = [n for n in nodes if n.startswith("op_0_")]
    assert outside and not any(_overlap(nodes[n], b) for n in outside for b in blocks.values())
    _assert_no_overlaps(nodes)
    dashed = [e for e in _svg_groups(root, "edge")
              if e.find(_NS + "path").get("stroke-dasharray")]
    assert [(e.get("data-src"), e.get("data-dst")) for e in dashed] == [("op_0_0", "op_1_0")]


# --- rendering ---

def test_render_without_graphviz_draws_svg_in_python(monkeypatch):
    main = _tiny()
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)   # no 'dot' anywhere
    drawing = main.render(format="svg")   # the static drawing (no path: the viewer)
    assert drawing.engine == "python" and drawing.format == "svg"
    root = _svg(drawing._repr_svg_())
    assert drawing._repr_png_() is None
    assert sorted(_svg_text(g) for g in _svg_groups(root, "node") if "op" in g.get("class")) \
        == ["matmul", "relu"]
    assert len(_svg_groups(root, "edge")) == 5
    assert bytes(drawing) == drawing.data == display.program_svg(main).encode("utf-8")


def test_render_needs_graphviz_for_other_formats(monkeypatch, tmp_path):
    main = _tiny()
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    for kwargs in (dict(format="png"), dict(engine="graphviz")):
        with pytest.raises(display.RenderError) as info:
            main.render(**kwargs)
        err = info.value
        assert isinstance(err, pd.ProgdescError) and isinstance(err, RuntimeError)
        assert "\n" not in str(err) and "Graphviz" in str(err) and "dot" in str(err)
        assert err.dot == main.to_dot()
    assert not list(tmp_path.iterdir())
    path = main.render(str(tmp_path / "g.svg"), engine="python")
    assert path == str(tmp_path / "g.svg")
    _svg((tmp_path / "g.svg").read_text(encoding="utf-8"))
    with pytest.raises(ValueError, match="engine"):
        main.render(engine="nosuch")


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz 'dot' is not installed")
def test_render_svg_and_png(tmp_path):
    pytest.importorskip("graphviz")
    main, _, _ = _mlp()
    drawing = main.render(collapse=True)
    assert drawing.engine == "graphviz"
    svg = bytes(drawing)
    assert svg.lstrip().startswith(b"<?xml") and b"<svg" in svg and b"fc_0" in svg
    path = main.render(str(tmp_path / "g.png"), format="png", show_backward=False)
    assert path == str(tmp_path / "g.png")
    assert (tmp_path / "g.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
