"""The program viewer as a person sees it: real programs' viewer pages in headless Chromium
at 1000x800 (tests/browser.py), checked against what building the program tells us: the
initial view fits the width and reads at a legible size, groups open on click, search
selects, the side panel shows shapes and dtypes, a gradient op links to its forward op,
backward and optimizer start folded, and no JavaScript error is raised. Screenshots go to
build/test-artifacts/viewer/."""
from pathlib import Path

import pytest

import viewer_models as M
from browser import LEGIBLE_PX, SEEN, new_page
from progdesc.display.viewer import Viewer

ARTIFACTS = Path(__file__).resolve().parents[1] / "build" / "test-artifacts" / "viewer"
MODELS = {"cnn": M.demo_cnn, "mlp": M.mlp, "transformer": M.transformer,
          "control_flow": M.control_flow, "bert": M.bert_base, "ops10k": lambda: M.chain(10_000)}


class Opened:
    """One model's viewer page, opened once for the module."""

    def __init__(self, browser, name, folder):
        self.program, self.facts = MODELS[name]()
        self.name = name
        self.page = new_page(browser)
        viewer = Viewer(self.program)
        self.model = viewer.model
        path = viewer.save(folder / f"{name}.html")   # a file: as a person opens it
        self.page.goto(path.as_uri())
        self.page.wait_for_selector(".pdv-node")
        self.viewer = "Object.values(window.progdescViewers)[0]"

    def js(self, expr):
        return self.page.evaluate(f"() => {{ const v = {self.viewer}; return {expr}; }}")

    def selected(self):
        return self.page.get_attribute(".pdv-canvas .pdv-selected", "data-id")

    def node(self, id):
        return self.page.locator(f'.pdv-node[data-id="{id}"]')

    def search(self, text):
        """Types `text` in the search box and picks the result that reads exactly `text`."""
        self.page.fill(".pdv-search", text)
        self.page.locator(".pdv-results li", has_text=text).filter(
            has=self.page.locator(".pdv-rtext", has_text=text)).first.click()

    def panel_row(self, side, var):
        """(shape, dtype) the panel shows for variable `var` among the op's `side`."""
        row = self.page.locator(f".pdv-panel .pdv-{side} .pdv-io", has=self.page.locator(
            ".pdv-var", has_text=var)).first
        return row.locator(".pdv-shape").inner_text(), row.locator(".pdv-dtype").inner_text()

    def shot(self, tag):
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(ARTIFACTS / f"{self.name}_{tag}.png"))


@pytest.fixture(scope="module")
def opened(browser, tmp_path_factory):
    pages, folder = {}, tmp_path_factory.mktemp("viewer")

    def open_(name):
        if name not in pages:
            pages[name] = Opened(browser, name, folder)
        return pages[name]
    yield open_
    for o in pages.values():
        o.page.close()


def op_index(block, pred):
    return next(i for i, op in enumerate(block.ops) if pred(op))


def forward_ops(block):
    """The ops before the first gradient op."""
    ops = block.ops
    end = next((i for i, op in enumerate(ops) if op.type.endswith("_grad")), len(ops))
    return list(enumerate(ops[:end]))


@pytest.mark.parametrize("name", ["cnn", "mlp", "transformer", "control_flow", "bert"])
def test_initial_view_fits_1000px_and_reads_legibly(opened, name):
    o = opened(name)
    seen = o.page.evaluate(SEEN)
    o.shot("initial")
    assert seen["scrollWidth"] <= 1000, seen
    assert 0 <= seen["svgLeft"] and seen["svgRight"] <= 1000, seen
    assert seen["font"] >= LEGIBLE_PX - 0.01, seen
    assert seen["inside"] >= 3 and not seen["outside"], seen
    has_backward = any(op.type.endswith("_grad") for op in o.program.global_block().ops)
    if has_backward:   # backward and optimizer folded: drawn as one node each, none of their ops
        assert o.node("r:backward").get_attribute("class").split().count("pdv-collapsed") == 1
        assert o.page.locator(".pdv-node.pdv-op.pdv-r-backward").count() == 0
    if any(op.type in ("adam", "sgd") for op in o.program.global_block().ops):
        assert "pdv-collapsed" in o.node("r:optimizer").get_attribute("class")
        assert o.page.locator(".pdv-node.pdv-op.pdv-r-optimizer").count() == 0
    assert o.page.errors == []


def test_a_layer_group_expands_on_click_and_folds_on_its_label(opened):
    o = opened("cnn")
    block = o.program.global_block()
    members = [i for i, op in forward_ops(block)
               if any(n.startswith("conv2d_0.") for names in op.outputs.values() for n in names)]
    assert len(members) >= 2
    before = o.js("v.visibleIds().length")
    o.node("g:forward/conv2d_0").click()
    assert o.js("v.visibleIds().length") == before - 1 + len(members)
    for i in members:
        assert o.node(f"op:0:{i}").is_visible()
    assert block.ops[members[0]].type == "conv2d"
    assert o.node(f"op:0:{members[0]}").text_content() == "conv2d"
    assert o.page.evaluate(SEEN)["scrollWidth"] <= 1000
    o.page.click('.pdv-group[data-id="g:forward/conv2d_0"] .pdv-group-label')
    assert o.js("v.visibleIds().length") == before
    assert "pdv-collapsed" in o.node("g:forward/conv2d_0").get_attribute("class")
    assert o.page.errors == []


def test_search_finds_a_variable_and_the_panel_shows_its_shape(opened):
    o = opened("cnn")
    block = o.program.global_block()
    pool = op_index(block, lambda op: op.type == "pool2d")
    out = block.ops[pool].output("Out")[0]
    o.search(out)
    assert o.selected() == f"op:0:{pool}"
    assert o.page.is_visible(".pdv-panel")
    assert o.page.locator(".pdv-panel .pdv-ptitle").inner_text() == "pool2d"
    assert o.panel_row("outputs", out) == ("[-1, 32, 4, 4]", "float32")   # 32 x 4 x 4, demo.py
    assert o.page.locator(".pdv-panel .pdv-io.pdv-hit .pdv-var").inner_text() == out
    assert o.node(f"op:0:{pool}").is_visible()
    assert o.page.errors == []


def test_panel_shows_an_ops_inputs_and_outputs_with_shapes_and_dtypes(opened):
    o = opened("cnn")
    block = o.program.global_block()
    conv = op_index(block, lambda op: op.type == "conv2d")
    o.page.evaluate(f"() => {o.viewer}.expand('g:forward/conv2d_0')")
    o.node(f"op:0:{conv}").click()
    assert o.selected() == f"op:0:{conv}"
    assert o.panel_row("inputs", "image") == ("[-1, 1, 8, 8]", "float32")
    assert o.panel_row("inputs", block.ops[conv].input("Filter")[0]) == ("[32, 1, 3, 3]", "float32")
    assert o.panel_row("outputs", block.ops[conv].output("Output")[0]) == ("[-1, 32, 8, 8]", "float32")
    text = o.page.inner_text(".pdv-panel")
    assert "paddings" in text and "sharding" in text and "callsite" in text
    o.shot("conv_selected")
    assert o.page.errors == []


def test_gradient_of_link_reveals_and_selects_the_forward_op(opened):
    o = opened("cnn")
    o.page.click(".pdv-collapse-all")
    block = o.program.global_block()
    grad = op_index(block, lambda op: op.type == "conv2d_grad")
    g = block.ops[grad]
    fwd = op_index(block, lambda op: op.type == "conv2d" and op.input("Filter") == g.input("Filter"))
    o.page.evaluate(f"() => {o.viewer}.select('op:0:{grad}')")
    assert o.selected() == f"op:0:{grad}"
    assert o.page.locator(".pdv-panel .pdv-ptitle").inner_text() == "conv2d_grad"
    o.page.click(".pdv-panel .pdv-grad-link")
    assert o.selected() == f"op:0:{fwd}"
    assert o.node(f"op:0:{fwd}").is_visible()
    assert o.page.locator(".pdv-panel .pdv-ptitle").inner_text() == "conv2d"
    assert o.page.errors == []


def test_search_ranks_a_layer_by_its_name_and_opens_it(opened):
    o = opened("cnn")
    o.page.fill(".pdv-search", "conv2d_1")
    first = o.page.locator(".pdv-results li").first
    assert first.locator(".pdv-rkind").inner_text() == "layer"
    first.click()
    assert o.selected() == "g:forward/conv2d_1"
    assert o.page.locator(".pdv-panel .pdv-ptitle").inner_text() == "conv2d_1"
    assert o.page.errors == []


def test_mlp_panel_shapes_by_searching_a_parameter(opened):
    o = opened("mlp")
    block = o.program.global_block()
    first = op_index(block, lambda op: "fc_0.w_0" in op.input("Y"))
    o.search("fc_0.w_0")
    assert o.selected() == f"op:0:{first}"
    assert o.panel_row("inputs", "x") == ("[-1, 784]", "float32")
    assert o.panel_row("inputs", "fc_0.w_0") == ("[784, 128]", "float32")
    assert o.panel_row("outputs", block.ops[first].output("Out")[0]) == ("[-1, 128]", "float32")
    callsite = o.page.locator(".pdv-panel .pdv-callsite .pdv-val").inner_text()
    line = next(i for i, text in enumerate(Path(M.__file__).read_text().splitlines(), 1)
                if "hidden = layers.fc(x, 128" in text)
    assert callsite.startswith(f"viewer_models.py:{line}") and "layers.fc(x, 128" in callsite
    assert o.page.errors == []


def test_drag_pans_and_wheel_and_buttons_zoom(opened):
    o = opened("mlp")
    node = o.node("v:x")
    box = node.bounding_box()
    canvas = o.page.locator(".pdv-canvas").bounding_box()
    start = (canvas["x"] + 40, canvas["y"] + canvas["height"] - 40)     # empty canvas
    o.page.mouse.move(*start)
    o.page.mouse.down()
    o.page.mouse.move(start[0] + 120, start[1] - 60, steps=5)
    o.page.mouse.up()
    moved = node.bounding_box()
    assert (moved["x"] - box["x"], moved["y"] - box["y"]) == pytest.approx((120, -60), abs=1)
    width = moved["width"]
    o.page.mouse.move(moved["x"] + 5, moved["y"] + 5)
    o.page.mouse.wheel(0, -300)                                           # wheel up: zoom in
    o.page.wait_for_function("w => document.querySelector('.pdv-node[data-id=\"v:x\"]')"
                             ".getBoundingClientRect().width > w * 1.2", arg=width, timeout=5000)
    o.page.click(".pdv-fit")
    assert node.bounding_box()["width"] == pytest.approx(box["width"], rel=0.01)
    o.page.click(".pdv-zoom-out")
    assert node.bounding_box()["width"] == pytest.approx(box["width"] * 0.8, rel=0.01)
    o.page.click(".pdv-fit")
    assert o.page.errors == []


def test_transformer_nested_groups_open_one_level_at_a_time(opened):
    o = opened("transformer")
    layer, attn = "g:forward/transformer_encoder_0", "g:forward/transformer_encoder_0.attn"
    o.node(layer).click()
    assert o.node(attn).is_visible()
    assert "pdv-collapsed" in o.node(attn).get_attribute("class")
    block = o.program.global_block()
    query = [i for i, op in forward_ops(block)
             if op.output("Out") and op.output("Out")[0].startswith("transformer_encoder_0.attn.query.")]
    assert query and not o.node(f"op:0:{query[0]}").count()
    o.node(attn).click()
    o.node(f"{attn}.query").click()
    for i in query:
        assert o.node(f"op:0:{i}").is_visible()
    o.shot("attention_open")
    assert o.page.evaluate(SEEN)["scrollWidth"] <= 1000
    assert o.page.errors == []


THROUGH_NODES = """() => {
  const boxes = [...document.querySelectorAll('.pdv-node rect')].map(r => r.getBBox());
  const through = [];
  document.querySelectorAll('.pdv-edges path').forEach(p => {
    const length = p.getTotalLength();
    for (let t = 0; t <= length; t += 3) {
      const q = p.getPointAtLength(t);
      if (boxes.some(r => q.x > r.x + 1 && q.x < r.x + r.width - 1 && q.y > r.y + 1 && q.y < r.y + r.height - 1)) {
        through.push(p.getAttribute('d').slice(0, 60)); return;
      }
    }
  });
  return {edges: document.querySelectorAll('.pdv-edges path').length, through: through};
}"""


def test_no_edge_runs_through_a_node_with_everything_open(opened):
    """Residual connections skip over whole sub-layers: with every group of the transformer
    open and the view zoomed out to take it all in, no edge passes through a node's box."""
    o = opened("transformer")
    o.page.click(".pdv-expand-all")
    for _ in range(12):
        o.page.click(".pdv-zoom-out")
    every = len(o.program.global_block().ops) + 1                     # the ops and x
    o.page.wait_for_function(f"() => document.querySelectorAll('.pdv-node').length === {every}",
                             timeout=5000)   # the redraw of what the wider view reaches
    seen = o.page.evaluate(THROUGH_NODES)
    assert seen["edges"] > 100 and seen["through"] == [], seen
    assert o.page.errors == []


def test_sub_blocks_are_groups_that_open(opened):
    o = opened("control_flow")
    program = o.program
    cond = op_index(program.global_block(), lambda op: op.type == "cond")
    o.node(f"op:0:{cond}").click()
    assert "sub-block" in o.page.inner_text(".pdv-panel")
    true_block = 1
    assert o.node(f"b:{true_block}").is_visible()
    o.node(f"b:{true_block}").click()
    for i, op in enumerate(program.blocks[true_block].ops):
        assert o.node(f"op:{true_block}:{i}").is_visible()
        assert o.node(f"op:{true_block}:{i}").text_content() == op.type
    o.shot("true_block_open")
    assert o.page.errors == []


def test_bert_layer_opens_search_and_expand_all(opened):
    o = opened("bert")
    layer = o.facts["layer_outputs"][5]
    o.search(layer)
    block = o.program.global_block()
    producer = op_index(block, lambda op: layer in [n for ns in op.outputs.values() for n in ns])
    assert o.selected() == f"op:0:{producer}"
    assert o.panel_row("outputs", layer) == ("[-1, 128, 768]", "float32")
    o.page.click(".pdv-expand-all")
    seen = o.page.evaluate(SEEN)
    assert seen["scrollWidth"] <= 1000 and seen["font"] >= LEGIBLE_PX - 0.01, seen
    assert o.page.locator(".pdv-node.pdv-collapsed").count() == 0
    assert o.page.errors == []


def test_ten_thousand_ops_open_and_expand_all(opened):
    o = opened("ops10k")
    block = o.program.global_block()
    assert len(block.ops) >= 10_000
    assert o.page.evaluate(SEEN)["scrollWidth"] <= 1000
    o.page.click(".pdv-expand-all")
    o.page.wait_for_function("() => document.querySelectorAll('.pdv-node').length > 0")
    assert o.js("v.visibleIds().length") == len(block.ops) + 1       # every op and the feed x
    assert o.page.locator(".pdv-node.pdv-collapsed").count() == 0
    o.page.click(".pdv-collapse-all")
    assert sorted(o.js("v.visibleIds()")) == ["r:backward", "r:forward"]
    assert o.page.errors == []


def test_ten_thousand_ops_without_layers_open(opened, tmp_path):
    """The same 10k ops with no layer groups (as a program imported without layer names may
    be): every op is laid out at once when the page opens."""
    from progdesc.display.viewer.page import viewer_html
    o = opened("ops10k")
    model = dict(o.model, groups=[dict(g, collapsed=False) for g in o.model["groups"]
                                  if g["kind"] == "region"])
    model["nodes"] = [dict(n, group="r:" + n["region"]) for n in o.model["nodes"]]
    path = tmp_path / "flat.html"
    path.write_text(viewer_html(model, standalone=True), encoding="utf-8")
    page = new_page(o.page.context.browser)
    try:
        page.goto(path.as_uri())
        page.wait_for_selector(".pdv-node", timeout=10_000)
        count = page.evaluate("Object.values(window.progdescViewers)[0].visibleIds().length")
        assert count == len(o.program.global_block().ops) + 1
        assert page.evaluate("document.documentElement.scrollWidth") <= 1000
        assert page.errors == []
    finally:
        page.close()


def test_two_notebook_outputs_on_one_page_work_apart_and_survive_a_rerender(browser, tmp_path):
    """Notebook fragments (what `_repr_html_` returns) of two programs in one page, as a
    notebook holds them; then the first output's script runs again, as a re-rendered
    output's does."""
    cnn, _ = M.demo_cnn()
    mlp, _ = M.mlp()
    first, second = Viewer(cnn)._repr_html_(), Viewer(mlp)._repr_html_()
    path = tmp_path / "notebook.html"
    path.write_text("<!doctype html><html><head><meta charset='utf-8'></head><body>"
                    f"<div class='cell'>{first}</div><div class='cell'>{second}</div></body></html>",
                    encoding="utf-8")
    page = new_page(browser)
    try:
        page.goto(path.as_uri())
        roots = page.eval_on_selector_all(".pdv", "els => els.map(e => e.id)")
        assert len(roots) == 2 and roots[0] != roots[1]
        assert page.evaluate("Object.keys(window.progdescViewers).length") == 2
        a, b = (page.locator(f"#{r}") for r in roots)
        assert a.locator(".pdv-fallback").count() == 0 and a.locator(".pdv-bar").count() == 1
        a.locator('.pdv-node[data-id="g:forward/conv2d_0"]').click()
        assert a.locator('.pdv-group[data-id="g:forward/conv2d_0"]').count() == 1
        assert b.locator(".pdv-group").count() == 1          # the second viewer: untouched
        b.locator(".pdv-search").fill("fc_1.w_0")
        b.locator(".pdv-results li").first.click()
        assert b.locator(".pdv-panel").is_visible() and a.locator(".pdv-panel").is_hidden()
        page.evaluate(f"() => window.progdescViewer.init(document.getElementById('{roots[0]}'))")
        assert a.locator(".pdv-bar").count() == 1 and a.locator(".pdv-canvas").count() == 1
        a.locator('.pdv-node[data-id="g:forward/fc_0"]').click()
        assert a.locator('.pdv-group[data-id="g:forward/fc_0"]').count() == 1
        assert page.evaluate("document.documentElement.scrollWidth") <= 1000
        assert page.errors == []
    finally:
        page.close()


def test_names_that_look_like_markup_stay_text_and_an_empty_program_opens(browser, tmp_path):
    """A model whose names hold `</script>` and `<!--` (the page must carry them as data,
    not markup), and the model of an empty program."""
    import progdesc as pd
    hostile = "</script><b id='injected'>x</b><!--"
    model = {"version": 1, "title": hostile, "fetch": [], "edges": [],
             "groups": [{"id": "r:forward", "label": "forward", "kind": "region",
                         "region": "forward", "parent": None, "collapsed": False}],
             "nodes": [{"id": "v:a", "kind": "data", "label": hostile, "group": "r:forward",
                        "region": "forward", "var": hostile}],
             "vars": {hostile: {"shape": [2], "dtype": "float32", "kind": "data",
                                "persistable": False, "sharding": None, "block": 0}}}
    from progdesc.display.viewer.page import viewer_html
    page = new_page(browser)
    try:
        for i, m in enumerate((model, Viewer(pd.Program()).model)):
            path = tmp_path / f"m{i}.html"
            path.write_text(viewer_html(m, standalone=True), encoding="utf-8")
            page.goto(path.as_uri())
            page.wait_for_selector(".pdv-canvas")
            assert page.locator("#injected").count() == 0
            assert page.locator(".pdv-title").inner_text() == m["title"]
        page.goto((tmp_path / "m0.html").as_uri())
        assert page.locator('.pdv-node[data-id="v:a"]').text_content() == hostile
        assert page.errors == []
    finally:
        page.close()


def test_viewer_html_refuses_what_is_not_a_view_model():
    from progdesc.display.viewer.page import viewer_html
    with pytest.raises(TypeError, match="view model dict, got list"):
        viewer_html([], standalone=True)
    with pytest.raises(ValueError, match="lacks 'edges', 'vars'"):
        viewer_html({"groups": [], "nodes": []}, standalone=False)


def test_a_model_with_a_cycle_of_group_parents_still_opens(browser, tmp_path):
    from progdesc.display.viewer.page import viewer_html
    group = {"kind": "layer", "region": "forward", "collapsed": True, "ops": 1}
    model = {"version": 1, "title": "broken", "fetch": [], "vars": {},
             "groups": [{"id": "r:forward", "label": "forward", "kind": "region", "region": "forward",
                         "parent": None, "collapsed": False},
                        dict(group, id="g:a", label="a", parent="g:b"),
                        dict(group, id="g:b", label="b", parent="g:a")],
             "nodes": [{"id": "op:0:0", "kind": "op", "type": "relu", "label": "relu", "group": "g:a",
                        "region": "forward", "inputs": [], "outputs": [], "attrs": [],
                        "callsite": "", "forward": None, "blocks": []}],
             "edges": [{"src": "op:0:0", "dst": "op:0:9", "var": "dangling"}]}
    path = tmp_path / "broken.html"
    path.write_text(viewer_html(model, standalone=True), encoding="utf-8")
    page = new_page(browser)
    try:
        page.goto(path.as_uri())
        page.wait_for_selector(".pdv-node")
        page.click(".pdv-expand-all")
        assert page.locator('.pdv-node[data-id="op:0:0"]').count() == 1
        assert page.errors == []
    finally:
        page.close()


def test_a_notebook_holding_an_older_viewer_script_gets_the_new_one(browser, tmp_path):
    """A notebook page keeps the scripts of earlier outputs: an output made by another
    progdesc version must not run with that version's viewer."""
    mlp, _ = M.mlp()
    old = ("<script>window.progdescViewer = {version: 'older', "
           "init: function () { throw new Error('the older viewer ran'); }};</script>")
    path = tmp_path / "notebook.html"
    path.write_text(f"<!doctype html><html><body>{old}{Viewer(mlp)._repr_html_()}</body></html>",
                    encoding="utf-8")
    page = new_page(browser)
    try:
        page.goto(path.as_uri())
        page.wait_for_selector(".pdv-node")
        assert page.evaluate("window.progdescViewer.version") != "older"
        assert page.errors == []
    finally:
        page.close()
