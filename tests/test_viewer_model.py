"""The viewer's view model (progdesc.display.viewer.model) against programs of known structure.

The expected groups, nodes and edges are derived here from how the layers compose their ops
(`fc` = matmul + add [+ activation]), from the program's own records (op roles, the
'@forward_op' links append_backward writes) and from a brute-force reading of the ops,
not from the model's code.
"""
import json
import os

import numpy as np
import pytest

import progdesc as pd
from lowering.desc import FORWARD_OP
from progdesc import control_flow as cf
from progdesc import layers, ops
from progdesc.display import Drawing, Viewer, view_model
from progdesc.distributed import shard
from source_lines import line_of

REGION = {"forward": "forward", "loss": "forward", "backward": "backward",
          "optimize": "optimizer", "lr_sched": "optimizer"}


def _mlp():
    main, startup = pd.Program(random_seed=0), pd.Program(random_seed=0)
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 4])
        label = pd.data("label", [None, 1], "int64")
        hidden = layers.fc(x, 16, act="relu")      # fc_0: matmul, add, relu
        logits = layers.fc(hidden, 3)              # fc_1: matmul, add
        loss = ops.mean(layers.softmax_with_cross_entropy(logits, label))
        pd.optimizer.Adam(learning_rate=0.01).minimize(loss)
    return main, startup, loss


@pytest.fixture(scope="module")
def mlp():
    main, startup, loss = _mlp()
    return main, startup, loss, view_model(main, fetch=[loss])


def _nodes(model, kind=None):
    return {n["id"]: n for n in model["nodes"] if kind is None or n["kind"] == kind}


def _groups(model):
    return {g["id"]: g for g in model["groups"]}


def _ancestors(model, group_id):
    groups, out = _groups(model), []
    while group_id is not None:
        out.append(group_id)
        group_id = groups[group_id]["parent"]
    return out


def _reference_edges(program):
    """{(src, dst, var)} of block 0, found by scanning back from each op for the last op
    that wrote each non-persistable input ('v:<name>' where none did)."""
    block = program.global_block()
    descs = list(block.desc.ops)
    edges = set()
    for i, d in enumerate(descs):
        for slot in d.inputs:
            for name in slot.arguments:
                if block.var(name).persistable:
                    continue
                src = f"v:{name}"
                for j in range(i - 1, -1, -1):
                    if any(name in s.arguments for s in descs[j].outputs):
                        src = f"op:0:{j}"
                        break
                edges.add((src, f"op:0:{i}", name))
    return edges


# --- a 2-layer MLP with its backward pass and Adam ---

def test_mlp_regions_groups_and_nodes(mlp):
    main, _, _, model = mlp
    json.dumps(model)                                   # JSON-ready as it is
    descs = main.global_block().desc.ops
    roles = [main.global_block().ops[i].role for i in range(len(descs))]
    assert model["version"] == 1 and model["title"] == f"program ({len(descs)} ops)"
    groups = _groups(model)
    regions = [g for g in model["groups"] if g["kind"] == "region"]
    assert [(g["id"], g["parent"], g["collapsed"]) for g in regions] == [
        ("r:forward", None, False), ("r:backward", None, True), ("r:optimizer", None, True)]
    ops_ = _nodes(model, "op")
    assert list(ops_) == [f"op:0:{i}" for i in range(len(descs))]
    for i, role in enumerate(roles):
        node = ops_[f"op:0:{i}"]
        assert node["type"] == descs[i].type and node["region"] == REGION[role]
        assert _ancestors(model, node["group"])[-1] == f"r:{REGION[role]}"
    # the forward pass: fc_0 holds matmul, add, relu; fc_1 matmul, add; the loss ops
    # (softmax_with_cross_entropy, mean) are one-op groups, dissolved into the region
    forward = [n for n in ops_.values() if n["region"] == "forward"]
    assert [(n["type"], n["group"]) for n in forward] == [
        ("matmul", "g:forward/fc_0"), ("add", "g:forward/fc_0"), ("relu", "g:forward/fc_0"),
        ("matmul", "g:forward/fc_1"), ("add", "g:forward/fc_1"),
        ("softmax_with_cross_entropy", "r:forward"), ("mean", "r:forward")]
    for gid, n in (("g:forward/fc_0", 3), ("g:forward/fc_1", 2)):
        assert groups[gid] == {"id": gid, "label": gid.rsplit("/", 1)[1], "kind": "layer",
                               "region": "forward", "parent": "r:forward", "collapsed": True,
                               "ops": n}
    # the optimizer: one adam op per parameter, grouped by the parameter's layer; the
    # learning-rate step counter (lr_sched) belongs to no layer
    optimizer = [n for n in ops_.values() if n["region"] == "optimizer"]
    assert [(n["type"], n["group"]) for n in optimizer] == [
        ("adam", "g:optimizer/fc_0"), ("adam", "g:optimizer/fc_0"),
        ("adam", "g:optimizer/fc_1"), ("adam", "g:optimizer/fc_1"),
        ("increment", "r:optimizer")]
    # every group's op count is the number of ops under it
    for gid, g in groups.items():
        if g["kind"] == "layer":
            under = [n for n in ops_.values() if gid in _ancestors(model, n["group"])]
            assert g["ops"] == len(under) >= 2, gid


def test_mlp_backward_ops_are_grouped_like_their_forward_op(mlp):
    main, _, _, model = mlp
    descs = main.global_block().desc.ops
    ops_ = _nodes(model, "op")
    for i, d in enumerate(descs):
        if FORWARD_OP not in d.attrs:
            continue
        fb, fi = d.attrs[FORWARD_OP].ints.values
        first_out = descs[fi].outputs[0].arguments[0]
        layer = first_out.split(".")[0]            # fc_0, fc_1, softmax_with..._0, mean_0
        group = ops_[f"op:0:{i}"]["group"]
        if layer in ("fc_0", "fc_1"):
            assert f"g:backward/{layer}" in _ancestors(model, group), (i, d.type)
        else:
            assert not group.startswith("g:backward/fc_"), (i, d.type)
    under = {}
    for n in ops_.values():
        for gid in _ancestors(model, n["group"]):
            under.setdefault(gid, []).append(n["type"])
    # fc_1's gradient: the bias's (reduce_as) and the matmul's two (dX, dW), the two in a
    # group of their own (named like the forward matmul's output, fc_1.matmul_0.out)
    assert sorted(under["g:backward/fc_1"]) == ["matmul", "matmul", "reduce_as"]
    assert under["g:backward/fc_1.matmul_0"] == ["matmul", "matmul"]
    # fc_0's: relu's, the bias's and the matmul's (dW only: x needs no gradient), so no
    # one-op group for the matmul's gradient
    assert under["g:backward/fc_0"].count("matmul") == 1
    assert "reduce_as" in under["g:backward/fc_0"]
    assert "g:backward/fc_0.matmul_0" not in _groups(model)


def test_mlp_data_nodes_no_parameter_nodes_and_edges(mlp):
    main, _, loss, model = mlp
    data = _nodes(model, "data")
    assert data == {
        "v:x": {"id": "v:x", "kind": "data", "label": "x", "group": "r:forward",
                "region": "forward", "var": "x"},
        "v:label": {"id": "v:label", "kind": "data", "label": "label", "group": "r:forward",
                    "region": "forward", "var": "label"}}
    n_ops = len(main.global_block().desc.ops)
    assert len(model["nodes"]) == n_ops + 2          # no parameter or state nodes
    persistable = {v.name for v in main.global_block().desc.vars if v.persistable}
    assert {"fc_0.w_0", "fc_1.b_0", "fc_0.w_0.moment1", "learning_rate_0"} <= persistable
    edges = {(e["src"], e["dst"], e["var"]) for e in model["edges"]}
    assert len(edges) == len(model["edges"])           # no duplicates
    assert not {e[2] for e in edges} & persistable
    assert edges == _reference_edges(main)
    forward = {e for e in edges if int(e[1].rsplit(":", 1)[1]) < 7}
    assert forward == {                                # the forward pass, by hand
        ("v:x", "op:0:0", "x"), ("op:0:0", "op:0:1", "fc_0.matmul_0.out"),
        ("op:0:1", "op:0:2", "fc_0.add_0.out"), ("op:0:2", "op:0:3", "fc_0.out"),
        ("op:0:3", "op:0:4", "fc_1.matmul_0.out"), ("op:0:4", "op:0:5", "fc_1.out"),
        ("v:label", "op:0:5", "label"),
        ("op:0:5", "op:0:6", "softmax_with_cross_entropy_0.out")}
    ids = {n["id"] for n in model["nodes"]}
    assert all(e[0] in ids and e[1] in ids for e in edges)
    assert model["fetch"] == [loss.name]


def test_mlp_vars_and_op_panels(mlp):
    main, _, _, model = mlp
    v = model["vars"]
    assert v["x"] == {"shape": [-1, 4], "dtype": "float32", "kind": "data",
                      "persistable": False, "sharding": None, "block": 0}
    assert v["label"]["dtype"] == "int64" and v["label"]["kind"] == "data"
    assert v["fc_0.w_0"] == {"shape": [4, 16], "dtype": "float32", "kind": "parameter",
                             "persistable": True, "sharding": None, "block": 0}
    assert v["fc_0.w_0.moment1"]["kind"] == "state"
    assert v["fc_0.out"]["kind"] == "temp" and v["fc_0.out"]["shape"] == [-1, 16]
    assert v["fc_0.w_0@GRAD"]["kind"] == "grad"
    named = {a for n in model["nodes"] if n["kind"] == "op"
             for _, names in n["inputs"] + n["outputs"] for a in names}
    assert set(v) == named | {"x", "label"}
    first = _nodes(model)["op:0:0"]
    assert first["inputs"] == [["X", ["x"]], ["Y", ["fc_0.w_0"]]]
    assert first["outputs"] == [["Out", ["fc_0.matmul_0.out"]]]
    assert first["attrs"] == [] and first["forward"] is None and first["blocks"] == []
    # non-default attributes, printed: the gradient of fc_1's matmul w.r.t. X transposes Y
    assert any(["transpose_y", "True"] in n["attrs"] for n in model["nodes"]
               if n["kind"] == "op" and n["region"] == "backward")


def test_forward_links_of_gradient_ops(mlp):
    main, _, _, model = mlp
    descs = main.global_block().desc.ops
    ops_ = _nodes(model, "op")

    def writer(name):
        return next(f"op:0:{i}" for i, d in enumerate(descs)
                    if any(name in s.arguments for s in d.outputs) and d.role == 0)

    def grad_writer(name):
        return next(n for n in ops_.values() if [name] in [a for _, a in n["outputs"]])

    # the gradient of each weight comes from the matmul that used it; of each bias, the add
    assert grad_writer("fc_0.w_0@GRAD")["forward"] == writer("fc_0.matmul_0.out")
    assert grad_writer("fc_1.w_0@GRAD")["forward"] == writer("fc_1.matmul_0.out")
    assert grad_writer("fc_1.b_0@GRAD")["forward"] == writer("fc_1.out")
    assert grad_writer("fc_1.out@GRAD")["forward"] == writer("softmax_with_cross_entropy_0.out")
    assert all(n["forward"] is None for n in ops_.values() if n["region"] != "backward")
    linked = [n for n in ops_.values() if n["forward"]]
    assert linked and all(ops_[n["forward"]]["region"] == "forward" for n in linked)


def test_forward_link_of_an_unlinked_grad_op_by_its_type_and_inputs():
    """A program whose gradient ops carry no '@forward_op' record (as one imported from
    Paddle): a '<type>_grad' op links to the op of that type that wrote one of its inputs."""
    main, _, _ = _mlp()
    for d in main.global_block().desc.ops:
        if FORWARD_OP in d.attrs:
            del d.attrs[FORWARD_OP]
    model = view_model(main)
    ops_ = _nodes(model, "op")
    grad = [n for n in ops_.values() if n["type"] == "softmax_with_cross_entropy_grad"]
    fwd = [n for n in ops_.values() if n["type"] == "softmax_with_cross_entropy"]
    assert len(grad) == len(fwd) == 1 and grad[0]["forward"] == fwd[0]["id"]
    assert [n["id"] for n in ops_.values() if n["forward"]] == [grad[0]["id"]]


# --- a transformer encoder layer: nested groups ---

@pytest.fixture(scope="module")
def transformer():
    main, startup = pd.Program(random_seed=0), pd.Program(random_seed=0)
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 4, 8])
        y = pd.data("y", [None, 4, 8])
        h = layers.transformer_encoder_layer(x, 2, 16, dropout_rate=0.1)
        loss = ops.mean(layers.mse_loss(h, y))
        pd.optimizer.Adam(learning_rate=0.01).minimize(loss)
    return main, view_model(main)


def test_transformer_layer_nested_groups(transformer):
    main, model = transformer
    groups = _groups(model)
    ops_ = _nodes(model, "op")
    enc = "g:forward/transformer_encoder_0"
    assert groups[enc]["parent"] == "r:forward"
    assert groups[f"{enc}.attn"]["parent"] == enc and groups[f"{enc}.attn"]["label"] == "attn"
    for proj in ("query", "key", "value"):           # an fc each: matmul + add
        gid = f"{enc}.attn.{proj}"
        assert groups[gid]["parent"] == f"{enc}.attn" and groups[gid]["label"] == proj
        assert [n["type"] for n in ops_.values() if n["group"] == gid] == ["matmul", "add"]
    assert groups[f"{enc}.ffn1"]["ops"] == 3          # matmul, add, gelu
    # each forward op sits in the innermost group of at least two ops its output names
    descs = main.global_block().desc.ops
    for i, d in enumerate(descs):
        if d.role != 0:
            continue
        parts = d.outputs[0].arguments[0].split(".")
        prefixes = [".".join(parts[:k]) for k in range(1, len(parts))]
        want = [p for p in prefixes if f"g:forward/{p}" in groups]
        group = ops_[f"op:0:{i}"]["group"]
        assert group == (f"g:forward/{want[-1]}" if want else "r:forward"), (i, d.type)
    # the backward pass mirrors the layers (ids under g:backward/), the optimizer too
    assert groups[f"g:backward/transformer_encoder_0.attn.query"]["parent"] == \
        "g:backward/transformer_encoder_0.attn"
    assert groups["g:optimizer/transformer_encoder_0.attn.query"]["ops"] == 2   # w and b
    for g in groups.values():
        if g["parent"] is not None:
            assert groups[g["parent"]]["region"] == g["region"]
    # groups come parents first
    seen = set()
    for g in model["groups"]:
        assert g["parent"] is None or g["parent"] in seen
        seen.add(g["id"])


# --- sub-blocks ---

def test_cond_branches_are_block_groups_under_the_owner():
    main, startup = pd.Program(random_seed=0), pd.Program(random_seed=0)
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 3])
        h = layers.fc(x, 3)
        y = cf.cond(ops.reduce_sum(h) > 0.0, lambda: ops.tanh(h) * 2.0, lambda: h * h + 1.0)
        ops.mean(y)
    model = view_model(main)
    groups, ops_ = _groups(model), _nodes(model, "op")
    cond = [n for n in ops_.values() if n["type"] == "cond"]
    assert len(cond) == 1 and cond[0]["blocks"] == ["b:1", "b:2"]
    for k, branch in ((1, "true"), (2, "false")):
        g = groups[f"b:{k}"]
        assert g["kind"] == "block" and g["owner"] == cond[0]["id"]
        assert g["parent"] == cond[0]["group"] and g["label"] == f"block {k} (cond {branch} branch)"
        inner = [n for n in ops_.values() if n["id"].startswith(f"op:{k}:")]
        assert len(inner) == g["ops"] == len(main.block(k).desc.ops)
        assert all(f"b:{k}" in _ancestors(model, n["group"]) for n in inner)
    # the branches read fc_0.out, written in block 0 by fc_0's add
    add = next(n["id"] for n in ops_.values() if n["outputs"] == [["Out", ["fc_0.out"]]])
    tanh = next(n["id"] for n in ops_.values() if n["type"] == "tanh")
    assert {"src": add, "dst": tanh, "var": "fc_0.out"} in model["edges"]


def test_while_body_is_a_block_group():
    main, startup = pd.Program(random_seed=0), pd.Program(random_seed=0)
    with pd.program_guard(main, startup):
        x = pd.data("x", [2, 3])
        i0 = ops.reduce_sum(x) * 0.0
        _, out = cf.while_loop(lambda i, v: i < 3.0, lambda i, v: (i + 1.0, ops.tanh(v)),
                               (i0, x))
    model = view_model(main)
    loop = [n for n in _nodes(model, "op").values() if n["type"] == "while"]
    assert len(loop) == 1 and len(loop[0]["blocks"]) == 1
    body = _groups(model)[loop[0]["blocks"][0]]
    assert body["label"].endswith("(while body)") and body["owner"] == loop[0]["id"]
    k = int(body["id"][2:])
    inner = {n["type"] for n in model["nodes"] if n["id"].startswith(f"op:{k}:")}
    assert {"tanh", "less_than"} <= inner


# --- callsites, sharding, scope ---

def test_callsite_names_the_users_line():
    main = pd.Program()
    with pd.program_guard(main, pd.Program()):
        x = pd.data("x", [None, 2])
        ops.relu(x)  # the line the viewer names
    node = _nodes(view_model(main), "op")["op:0:0"]
    site = line_of(__file__, "ops.relu(x)  # the line the viewer names")
    assert node["callsite"] == f"{site}  ops.relu(x)  # the line the viewer names"


def test_sharding_and_scope_values_in_vars():
    main, startup = pd.Program(random_seed=0), pd.Program(random_seed=0)
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 4])
        h = layers.fc(x, 6)
        shard(x, ("data", None))
        shard(main.global_block().var("fc_0.w_0"), ())
    scope = pd.Scope()
    pd.Executor().run(startup, scope=scope)
    v = view_model(main, scope=scope)["vars"]
    assert v["x"]["sharding"] == ["data", None]
    assert v["fc_0.w_0"]["sharding"] == []
    assert v[h.name]["sharding"] is None
    assert v["fc_0.w_0"]["value"] == {"shape": [4, 6], "dtype": "float32"}
    assert "value" not in v["x"]


# --- size ---

def test_ten_thousand_ops():
    main, startup = pd.Program(random_seed=0), pd.Program(random_seed=0)
    with pd.program_guard(main, startup):
        h = pd.data("x", [None, 4])
        for _ in range(500):                      # 500 layers of 20 ops, 10 of each type
            with main.layer_scope("block", None):
                for _ in range(10):
                    h = ops.relu(ops.tanh(h))
    model = view_model(main)
    assert len(_nodes(model, "op")) == 10_000 and len(_nodes(model, "data")) == 1
    assert len(model["edges"]) == 10_000          # a chain: x -> op 0 -> ... -> op 9999
    layers_ = [g for g in model["groups"] if g["kind"] == "layer"]
    assert len(layers_) == 500 and all(g["ops"] == 20 for g in layers_)
    assert _nodes(model)["op:0:9999"]["group"] == "g:forward/block_499"


# --- the Viewer and Program's display ---

def test_viewer_html_save_and_program_display(mlp, tmp_path):
    main = mlp[0]
    viewer = Viewer(main, title="mlp")
    assert viewer.model["title"].startswith("mlp (")
    fragment = viewer._repr_html_()
    assert fragment.startswith('<div class="pdv"') and "<!doctype" not in fragment.lower()
    assert main._repr_html_().startswith('<div class="pdv"')
    path = viewer.save(tmp_path / "m.html")
    assert path == tmp_path / "m.html" and os.listdir(tmp_path) == ["m.html"]
    page = (tmp_path / "m.html").read_text(encoding="utf-8")
    assert page.lower().startswith("<!doctype html>") and 'class="pdv"' in page
    # render(): the viewer with no path; its page for an .html path; else the static drawing
    assert isinstance(main.render(), Viewer)
    assert main.render(str(tmp_path / "r.html")) == str(tmp_path / "r.html")
    assert 'class="pdv"' in (tmp_path / "r.html").read_text(encoding="utf-8")
    drawing = main.render(format="svg", engine="python")
    assert isinstance(drawing, Drawing) and drawing.format == "svg"
    assert isinstance(main.render(collapse=True, engine="python"), Drawing)
    with pytest.raises(TypeError, match="collapse"):
        main.render(str(tmp_path / "bad.html"), collapse=True)
    assert not (tmp_path / "bad.html").exists()
    # the table stays a call away
    table = main.table()._repr_html_()
    assert table.count('<tr class="pd-op') == len(main.global_block().desc.ops)
    assert np.all([t in table for t in ("fc_0.w_0", "adam")])


def test_imported_program_ops_join_the_layer_of_their_parameters():
    """Paddle's LeNet, imported: its ops' outputs are named flat ('conv2d_2.output',
    'add_0.out'), only its parameters name layers ('conv2d_0.w_0', 'linear_1.b_0'). An op
    joins the layer of the parameter it reads; the bias add, activation, pooling and
    flattening after it join that layer too."""
    from progdesc import paddle
    path = os.path.join(os.path.dirname(__file__), "fixtures", "paddle", "lenet", "legacy",
                        "model")
    program, _, _ = paddle.load_inference_model(path, scope=pd.Scope())
    model = view_model(program)
    got = [(n["type"], n["group"].removeprefix("g:forward/"))
           for n in model["nodes"] if n["kind"] == "op"]
    conv = ["conv2d", "reshape", "add", "relu", "pool2d"]    # conv, its bias, act, pool
    assert got == ([(t, "conv2d_0") for t in conv]
                   + [(t, "conv2d_1") for t in conv + ["reshape"]]   # + the flatten
                   + [(t, "linear_0") for t in ("matmul", "add", "relu")]
                   + [(t, "linear_1") for t in ("matmul", "add", "relu")]
                   + [(t, "linear_2") for t in ("matmul", "add")])


def test_a_malformed_program_still_gets_a_model():
    """Blocks whose parents form a cycle, a gradient link to no op, an undeclared input:
    the model still lists every op once, in some group, with edges between its nodes."""
    main = pd.Program()
    with pd.program_guard(main, pd.Program()):
        x = pd.data("x", [2, 3])
        main.create_block()
        ops.tanh(x)
        main.rollback()
        main.create_block()
        main.rollback()
        ops.relu(x)
    desc = main.desc
    desc.blocks[1].parent_idx, desc.blocks[2].parent_idx = 2, 1
    desc.blocks[0].ops[0].attrs[FORWARD_OP].ints.values[:] = [7, 99]
    desc.blocks[0].ops[0].inputs[0].arguments.append("undeclared")
    model = view_model(main)
    ops_ = _nodes(model, "op")
    assert sorted(ops_) == ["op:0:0", "op:1:0"]
    assert ops_["op:0:0"]["forward"] is None
    groups = _groups(model)
    assert all(n["group"] in groups for n in model["nodes"])
    ids = {n["id"] for n in model["nodes"]}
    assert all(e["src"] in ids and e["dst"] in ids for e in model["edges"])
    assert model["vars"]["undeclared"]["shape"] is None
    json.dumps(model)


def test_imported_flax_ops_join_their_submodules():
    """An nnx model imported by from_flax: JAX names no layers, the submodules' parameters
    and state do (`conv.kernel`, `norm.mean`, `drop.rngs.key`). Each op reading one sits in
    that submodule's group, and a constant sits with the op that first reads it."""
    nnx = pytest.importorskip("flax.nnx")

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.conv = nnx.Conv(1, 4, (3, 3), rngs=rngs)
            self.norm = nnx.BatchNorm(4, rngs=rngs)
            self.drop = nnx.Dropout(0.2, rngs=rngs)
            self.dense = nnx.Linear(4 * 4 * 4, 3, rngs=rngs)

        def __call__(self, x):
            x = nnx.relu(self.norm(self.conv(x)))
            return self.dense(self.drop(x.reshape(x.shape[0], -1)))

    program, _, _ = pd.from_flax(Net(nnx.Rngs(0)), None, np.zeros((2, 4, 4, 1), np.float32),
                                 scope=pd.Scope(), eval_mode=True)
    model = view_model(program)
    ops_ = [n for n in model["nodes"] if n["kind"] == "op"]
    persistable = {v.name for v in program.global_block().desc.vars if v.persistable}
    seen = set()
    for n in ops_:
        reads = [a for _, names in n["inputs"] for a in names if a in persistable]
        if reads:
            layer = reads[0].split(".")[0]
            assert n["group"] == f"g:forward/{layer}", (n["id"], n["type"], reads)
            seen.add(layer)
    assert seen == {"conv", "norm", "drop", "dense"}
    first_reader = {}
    for n in ops_:
        for _, names in n["inputs"]:
            for a in names:
                first_reader.setdefault(a, n)
    constants = [n for n in ops_ if n["type"] == "fill_constant"]
    joined = [n for n in constants if first_reader[n["outputs"][0][1][0]]["group"] != "r:forward"]
    assert joined and all(n["group"] == first_reader[n["outputs"][0][1][0]]["group"]
                          for n in joined)


def test_imported_ops_between_layers_join_the_later_layer():
    """Flat-named ops (an import's) reading results of two layers that share no prefix join
    the layer that began later in the program (a norm applied to a conv's output, a dropout
    mask applied to the norm's); reading a feed (a shape, as random bits do) does not keep
    an op out of its layer."""
    main = pd.Program()
    with pd.program_guard(main, pd.Program()):
        x = pd.data("x", [2, 3])
        block = main.global_block()
        a_w, b_scale, c_seed = (block.create_parameter(n, s) for n, s in
                                (("a.w", [3, 3]), ("b.scale", [3]), ("c.seed", [3])))
        d_w, d_b = block.create_parameter("d.w", [3, 2]), block.create_parameter("d.b", [2])
        h = ops.matmul(x, a_w)                                  # a: its parameter
        s = ops.square(h)                                       # a: continues a
        ops.reduce_sum(h)                                       # a
        r = ops.mul(h, b_scale)                                 # b: its parameter
        t = ops.relu(ops.sub(s, r))                             # b: a's and b's -> b; b
        bits = ops.mul(ops.tanh(c_seed), x)                     # c: its parameter; c and a feed
        ops.add(ops.matmul(ops.mul(bits, t), d_w), d_b)         # c: b's and c's -> c; d, d
    model = view_model(main)
    got = [(n["type"], n["group"].removeprefix("g:forward/"))
           for n in model["nodes"] if n["kind"] == "op"]
    assert got == [("matmul", "a"), ("square", "a"), ("reduce_sum", "a"),
                   ("mul", "b"), ("sub", "b"), ("relu", "b"),
                   ("tanh", "c"), ("mul", "c"), ("mul", "c"),
                   ("matmul", "d"), ("add", "d")]
