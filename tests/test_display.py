"""progdesc.display: HTML tables (Program, Block, Scope), DOT graphs, and rendering."""
import html
import re
import shutil

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
    text = main._repr_html_()
    assert text == display.program_html(main)
    op_rows = _rows(text, "pd-op")
    assert len(op_rows) == len(main.global_block().ops)
    for op, row in zip(main.global_block().ops, op_rows):
        assert f"<b>{op.type}</b>" in row
        for names in list(op.inputs.values()) + list(op.outputs.values()):
            for n in names:
                assert html.escape(n) in row
    first = op_rows[0]          # matmul(x, fc_0.w_0) -> matmul_0.out
    assert "x</span>" in first and "float32[-1, 4]" in first
    assert "fc_0.w_0" in first and "float32[4, 16]" in first and "pd-param" in first
    assert "float32[-1, 16]" in first
    # non-default attributes only: the backward matmul has transpose_y=True, the forward none
    assert "transpose" not in first
    assert any("transpose_y=True" in r for r in op_rows)
    assert "learning_rate" in text and "seed 0" in text


def test_html_tells_roles_apart():
    main, _, _ = _mlp()
    text = main._repr_html_()
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
    assert "pd-role-backward" not in main.clone(for_test=True)._repr_html_()


def test_html_escapes_names():
    main = pd.Program()
    with pd.program_guard(main, pd.Program()):
        x = pd.data("<b>", [2, 2])
        ops.relu(x, name='a"&<i>')
    for text in (main._repr_html_(), main.global_block()._repr_html_()):
        assert "<b>" not in text.replace("<b>relu</b>", "").replace("<b>block 0</b>", "") \
            .replace("<b>Program</b>", "")
        assert "&lt;b&gt;" in text
        assert "&lt;i&gt;" in text and "&quot;&amp;" in text


def test_block_html_and_nested_blocks():
    name = "display_test_with_block"

    @custom_op.op(name, inputs=[custom_op.In("X")], outputs=[custom_op.Out("Out")],
                  attrs={"sub_block": custom_op.Attr("sub_block", "block")}, replace=True)
    def _(X, *, sub_block):
        return X

    try:
        main = pd.Program()
        with pd.program_guard(main, pd.Program()):
            x = pd.data("x", [2, 3])
            sub = main.create_block()
            ops.tanh(x, name="inner")
            main.rollback()
            main.global_block().append_op(name, inputs={"X": x}, outputs={"Out": "y"},
                                          attrs={"sub_block": sub.idx})
        text = main._repr_html_()
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
    finally:
        custom_op.unregister(name)


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
    assert "cpu" in row.lower()
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


# --- rendering ---

def test_render_without_dot_raises_one_clear_error(monkeypatch):
    main = _tiny()
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    with pytest.raises(display.RenderError) as info:
        main.render()
    err = info.value
    assert isinstance(err, pd.ProgdescError) and isinstance(err, RuntimeError)
    assert "\n" not in str(err) and "Graphviz" in str(err) and "dot" in str(err)
    assert err.dot == main.to_dot()


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz 'dot' is not installed")
def test_render_svg_and_png(tmp_path):
    pytest.importorskip("graphviz")
    main, _, _ = _mlp()
    svg = main.render(collapse=True)
    assert svg.lstrip().startswith(b"<?xml") and b"<svg" in svg and b"fc_0" in svg
    path = main.render(str(tmp_path / "g.png"), format="png", show_backward=False)
    assert path == str(tmp_path / "g.png")
    assert (tmp_path / "g.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
