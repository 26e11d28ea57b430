"""Paddle 3's PIR programs (`model.json`): the reader on the fixtures Paddle wrote (values,
parameters, feeds and fetches, constants folded into legacy attributes, if/while
regions), on truncated, edited and crafted files (FormatError naming the JSON path,
never another exception), and every PIR fixture run through
`progdesc.paddle.load_inference_model` against Paddle's executor at both batch sizes."""
import copy
import json
import os
import random
import shutil
import time

import numpy as np
import pytest

import progdesc as pd
from lowering.errors import FormatError, ProgdescError, UnsupportedOpError
from progdesc import limits
from progdesc.paddle import load_inference_model, persistable_names
from progdesc.paddle.pir import DTYPE_CODES, read_pir
from progdesc.scope import Scope

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "paddle")
MODELS = sorted(m for m in os.listdir(FIXTURES)
                if os.path.isfile(os.path.join(FIXTURES, m, "pir", "model.json")))


def _text(model):
    with open(os.path.join(FIXTURES, model, "pir", "model.json")) as f:
        return f.read()


def _doc(model):
    return json.loads(_text(model))


def _meta(model):
    with open(os.path.join(FIXTURES, model, "meta.json")) as f:
        return json.load(f)


def _raw_ops(doc):
    """Every op object of a PIR document, regions included, in file order."""
    out = []

    def walk(block):
        for op in block["ops"]:
            out.append(op)
            for region in op.get("regions", []):
                for b in region["blocks"]:
                    walk(b)
    walk(doc["program"]["regions"][0]["blocks"][0])
    return out


def _ops(prog, op_type):
    return [op for b in prog.blocks for op in b.ops if op.type == op_type]


# --- the reader on Paddle's files ---
@pytest.mark.parametrize("model", MODELS)
def test_fixture_feeds_fetches_and_parameters(model):
    doc, meta = _doc(model), _meta(model)
    prog = read_pir(_text(model))
    assert prog.format == "pir"
    block = prog.blocks[0]
    feeds = sorted(_ops(prog, "feed"), key=lambda op: op.attrs["col"])
    assert [op.outputs["Out"][0] for op in feeds] == meta["pir"]["feed_names"]
    fetches = _ops(prog, "fetch")
    assert sorted(op.attrs["col"] for op in fetches) == \
        list(range(len(meta["pir"]["fetch_names"])))
    params = {op["A"][3]: op["O"]["TT"]["D"][1] for op in _raw_ops(doc) if op["#"] == "p"}
    for name, dims in params.items():
        var = block.vars[name]
        assert list(var.shape) == dims and var.kind == "dense"
        assert var.persistable == (not name.endswith("__non_persistable"))
    for op in (op for b in prog.blocks for op in b.ops):   # every name read is declared
        for names in op.inputs.values():
            for n in names:
                assert any(n in b.vars for b in prog.blocks), (op.type, n)
    # no PIR plumbing is left for the table to see
    kinds = {op.type for b in prog.blocks for op in b.ops}
    assert not {t for t in kinds if t.startswith(("builtin.", "cf.", "pd_op."))}


def test_rnn_dropout_state_is_listed_but_not_persistable():
    prog = read_pir(_text("lstm"))
    state = [n for n in prog.blocks[0].vars if n.endswith("__non_persistable")]
    assert state and not prog.blocks[0].vars[state[0]].persistable
    assert not any(n.endswith("__non_persistable") for n in persistable_names(prog))
    rnn = _ops(prog, "rnn")[0]
    assert state[0] not in [n for names in rnn.inputs.values() for n in names]
    directions = 2 if rnn.attrs["is_bidirec"] else 1
    assert rnn.attrs["mode"] == "LSTM" and rnn.attrs["num_layers"] >= 1
    assert len(rnn.inputs["WeightList"]) == rnn.attrs["num_layers"] * directions * 4
    assert len(rnn.inputs["PreState"]) == 2             # h0, c0
    assert list(rnn.outputs) == ["Out", "DropoutState", "State", "Reserve"]
    assert len(rnn.outputs["State"]) == 2


def test_constants_fold_into_legacy_attributes():
    doc = _doc("bert")
    prog = read_pir(json.dumps(doc))
    values = {}          # value id -> full_int_array's list, read here from the JSON
    for op in _raw_ops(doc):
        if op["#"] == "1.full_int_array":
            attrs = {a["N"]: a["AT"] for a in op["A"]}
            values[op["O"][0]["%"]] = [v["D"] for v in attrs["value"]["D"]]
    raw_reshapes = [op for op in _raw_ops(doc) if op["#"] == "1.reshape"]
    reshapes = _ops(prog, "reshape2")
    assert len(reshapes) == len(raw_reshapes) > 0
    for raw, op in zip(raw_reshapes, reshapes):
        assert op.attrs["shape"] == values[raw["I"][1]["%"]]
        assert list(op.inputs) == ["X"]
    # the folded constants are gone; the dtype attributes are Paddle's legacy numbers
    assert not _ops(prog, "assign_value")
    cast = _ops(prog, "cast")[0]
    assert cast.attrs["out_dtype"] == DTYPE_CODES["float32"]
    assert cast.attrs["in_dtype"] == DTYPE_CODES["int64"]
    scale = _ops(prog, "scale")[0]
    assert isinstance(scale.attrs["scale"], float) and "ScaleTensor" not in scale.inputs
    dropout = _ops(prog, "dropout")[0]
    assert dropout.attrs["dropout_implementation"] == "upscale_in_train"
    assert dropout.attrs["dropout_prob"] == pytest.approx(0.1)


def test_batch_norm_running_statistics_are_written_in_place():
    prog = read_pir(_text("resnet18"))
    bn = _ops(prog, "batch_norm")[0]
    assert bn.outputs["MeanOut"] == bn.inputs["Mean"]
    assert bn.outputs["VarianceOut"] == bn.inputs["Variance"]
    assert bn.attrs["data_layout"] == "NCHW" and "data_format" not in bn.attrs


def test_if_and_while_regions():
    prog = read_pir(_text("dy2static"))
    (cond,) = _ops(prog, "pir.if")
    then, other = prog.blocks[cond.attrs["then_block"]], prog.blocks[cond.attrs["else_block"]]
    assert cond.regions == [then, other] and then.parent == other.parent == cond.block
    assert [op.type for op in then.ops] == ["relu"]
    assert [op.type for op in other.ops] == ["tanh", "scale"]
    assert cond.attrs["then_outputs"] == then.ops[-1].outputs["Out"]
    assert cond.attrs["else_outputs"] == other.ops[-1].outputs["Out"]
    assert len(cond.outputs["Out"]) == 1 and len(cond.inputs["Cond"]) == 1
    (loop,) = _ops(prog, "pir.while")
    body = prog.blocks[loop.attrs["body_block"]]
    assert loop.regions == [body] and body.parent == loop.block
    carried = loop.inputs["X"]
    assert len(carried) == len(loop.outputs["Out"]) == len(loop.attrs["body_inputs"]) \
        == len(loop.attrs["body_outputs"])
    assert all(n in body.vars for n in loop.attrs["body_inputs"])
    assert loop.attrs["body_cond"] in body.vars
    assert body.vars[loop.attrs["body_cond"]].dtype == "bool"
    # the body reads a value of the enclosing block by its name
    reads = {n for op in body.ops for names in op.inputs.values() for n in names}
    assert reads - set(body.vars) <= set(prog.blocks[0].vars)


def _long_form(doc):
    """The document as older writers wrote it: dialects by name, value ids under '#',
    parameters as full builtin.parameter ops."""
    doc = copy.deepcopy(doc)
    names = {"0": "builtin", "1": "pd_op", "2": "cf"}

    def walk(block):
        for op in block["ops"]:
            if op["#"] == "p":
                name, result, flags = op["A"][3], op["O"], op.get("OA", [1, 0, 1])
                op.clear()
                op.update({"#": "builtin.parameter", "I": [],
                           "O": [{"#": result["%"], "TT": result["TT"]}],
                           "A": [{"N": "parameter_name", "AT": {"#": "0.a_str", "D": name}}],
                           "OA": [{"N": "persistable", "AT": {"#": "0.a_array", "D": [
                               {"#": "0.a_bool", "D": bool(flags[0])}]}}]})
                continue
            dialect, _, base = op["#"].partition(".")
            op["#"] = f"{names[dialect]}.{base}"
            for v in op.get("I", []) + op.get("O", []):
                v["#"] = v.pop("%")
            for region in op.get("regions", []):
                for b in region["blocks"]:
                    walk(b)
    walk(doc["program"]["regions"][0]["blocks"][0])
    return doc


@pytest.mark.parametrize("model", ["lstm", "dy2static"])
def test_older_long_form_reads_the_same(model):
    doc = _doc(model)
    new, old = read_pir(json.dumps(doc)), read_pir(json.dumps(_long_form(doc)))
    assert [(b.idx, b.parent, b.vars, b.ops) for b in old.blocks] == \
        [(b.idx, b.parent, b.vars, b.ops) for b in new.blocks]


def test_unknown_pir_op_keeps_its_name_and_is_reported(tmp_path):
    doc = _doc("mlp")
    ops = doc["program"]["regions"][0]["blocks"][0]["ops"]
    k = next(i for i, op in enumerate(ops) if op["#"] == "1.relu")
    ops[k]["#"] = "1.frobnicate"
    prog = read_pir(json.dumps(doc))
    (op,) = _ops(prog, "pd_op.frobnicate")
    assert list(op.inputs) == ["0"] and list(op.outputs) == ["0"] and op.index == k
    (tmp_path / "model.json").write_text(json.dumps(doc))
    shutil.copy(os.path.join(FIXTURES, "mlp", "pir", "model.pdiparams"), tmp_path)
    with pytest.raises(UnsupportedOpError, match=rf"'pd_op.frobnicate' at #{k} in block 0"):
        load_inference_model(str(tmp_path), pd.Executor(), Scope())


# --- hostile and truncated files ---
def _path_error(doc, match):
    with pytest.raises(FormatError, match=match):
        read_pir(json.dumps(doc))


def test_errors_name_the_json_path():
    doc = _doc("mlp")
    ops = doc["program"]["regions"][0]["blocks"][0]["ops"]
    k = next(i for i, op in enumerate(ops) if op["#"] == "1.dropout")
    bad = copy.deepcopy(doc)
    bad["program"]["regions"][0]["blocks"][0]["ops"][k]["A"][1]["AT"] = {"#": "9.a_what"}
    _path_error(bad, rf"program\.regions\[0\]\.blocks\[0\]\.ops\[{k}\]\.A\[1\]\.AT: "
                     r"an attribute of type '9\.a_what'")
    bad = copy.deepcopy(doc)
    bad["program"]["regions"][0]["blocks"][0]["ops"][k]["I"][0]["%"] = 999
    _path_error(bad, rf"ops\[{k}\]\.I\[0\]: value %999 is not defined before this op")
    bad = copy.deepcopy(doc)
    del bad["program"]["regions"][0]["blocks"][0]["ops"][k]["O"]
    _path_error(bad, rf"ops\[{k}\]: has no field 'O'")
    bad = copy.deepcopy(doc)
    bad["program"]["regions"][0]["blocks"][0]["ops"][k]["O"][0]["TT"]["D"][1] = [-5, 3]
    _path_error(bad, rf"ops\[{k}\]\.O\[0\]\.TT\.D\[1\]\[0\]: a dim of -5")
    bad = copy.deepcopy(doc)
    bad["program"]["regions"][0]["blocks"][0]["ops"][k]["O"][0]["%"] = 1
    _path_error(bad, r"value %1 is defined twice")
    bad = copy.deepcopy(doc)
    bad["base_code"]["magic"] = "onnx"
    _path_error(bad, r"base_code\.magic: expected 'pir'")


@pytest.mark.parametrize("text, match", [
    ("", "not a PIR program"),
    ("[" * 100_000 + "]" * 100_000, "not a PIR program"),
    ('{"base_code": {"magic": "pir"}, "program": {"regions": []}}', "expected one region"),
    ('{"base_code": {"magic": "pir"}, "program": {"regions": [{"blocks": [{"args": [], '
     '"ops": [{"#": "1.full", "I": [], "O": [{"%": ' + "9" * 5000 + ', "TT": {"#": '
     '"NULL"}}]}]}]}]}}', "not a PIR program|does not fit 64 bits"),
    ('{"base_code": {"magic": "pir"}, "program": {"regions": [{"blocks": [{"args": [], '
     '"ops": [{"#": "1.full", "I": [], "O": [{"%": 3, "TT": {"#": "0.t_dtensor", "D": '
     '[{"#": "0.t_f32"}, [' + ",".join(["1"] * 100) + ']]}}]}]}]}]}}', "a rank of 100"),
    ('{"base_code": {"magic": "pir"}, "program": {"regions": [{"blocks": [{"args": [], '
     '"ops": [{"#": "1.full", "I": [], "O": [], "A": [{"N": "value", "AT": {"#": "0.a_f32",'
     ' "D": null}}]}]}]}]}}', r"A\[0\]\.AT\.D: a number JSON cannot hold"),
    (b"\xff\xfe{}", "not UTF-8"),
])
def test_crafted_files(text, match):
    with pytest.raises(FormatError, match=match):
        read_pir(text)


def test_region_nesting_and_op_count_are_bounded(monkeypatch):
    inner = {"args": [], "ops": []}
    block = inner
    for _ in range(limits.MAX_BLOCK_DEPTH + 1):
        block = {"args": [], "ops": [{"#": "1.if", "I": [], "O": [],
                                      "regions": [{"blocks": [block]}]}]}
    doc = {"base_code": {"magic": "pir"}, "program": {"regions": [{"blocks": [block]}]}}
    with pytest.raises(FormatError, match="nested more than"):
        read_pir(json.dumps(doc))
    monkeypatch.setattr(limits, "MAX_OPS", 10)
    with pytest.raises(FormatError, match="more than 10 ops"):
        read_pir(_text("mlp"))


def _only_format_errors(text):
    try:
        read_pir(text)
    except FormatError:
        pass


def test_truncations_give_format_errors_only():
    text = _text("dy2static")
    for cut in range(0, len(text), max(1, len(text) // 300)):
        with pytest.raises(FormatError):
            read_pir(text[:cut])


_JUNK = [None, True, -1, 0, 7, 2 ** 70, -(2 ** 70), 1.5, "", "x", "0.t_f32", "1.a_dtype",
         [], [[]], [-7], {}, {"#": "0.t_vec", "D": [{}]}, {"#": "0.a_array", "D": [7]},
         "\x1b[31m", "a" * 2000]


def _mutate(node, rng):
    """A copy of the JSON tree `node` with one random value replaced or one key deleted."""
    node = copy.deepcopy(node)
    spots = []

    def collect(x):
        if isinstance(x, dict):
            for k in x:
                spots.append((x, k))
                collect(x[k])
        elif isinstance(x, list):
            for i in range(len(x)):
                spots.append((x, i))
                collect(x[i])
    collect(node)
    parent, key = rng.choice(spots)
    if isinstance(parent, dict) and rng.random() < 0.2:
        del parent[key]
    else:
        parent[key] = copy.deepcopy(rng.choice(_JUNK))
    return node


@pytest.mark.parametrize("model", ["lstm", "dy2static"])
def test_random_edits_give_format_errors_only(model):
    rng = random.Random(25)
    doc = _doc(model)
    for _ in range(150):
        _only_format_errors(json.dumps(_mutate(doc, rng)))
    text = _text(model)
    for _ in range(100):   # byte edits of the text itself
        i = rng.randrange(len(text))
        _only_format_errors(text[:i] + rng.choice('{}[]":,0-9ae ') + text[i + 1:])


def test_random_edits_through_the_loader_give_progdesc_errors_only(tmp_path):
    rng = random.Random(7)
    doc = _doc("mlp")
    shutil.copy(os.path.join(FIXTURES, "mlp", "pir", "model.pdiparams"), tmp_path)
    for _ in range(40):
        (tmp_path / "model.json").write_text(json.dumps(_mutate(doc, rng)))
        try:
            load_inference_model(str(tmp_path), pd.Executor(), Scope())
        except ProgdescError:
            pass


# --- the fixtures end to end ---
_SLOW = ("resnet18", "mobilenetv2", "mobilenetv3_small")   # 10-20 s of XLA compiles each


@pytest.mark.parametrize("model", [pytest.param(m, marks=[pytest.mark.slow] * (m in _SLOW))
                                   for m in MODELS])
def test_fixture_matches_paddle_executor(model):
    meta = _meta(model)
    ref = np.load(os.path.join(FIXTURES, model, "reference.npz"), allow_pickle=False)
    scope = Scope()
    exe = pd.Executor()
    program, feeds, fetches = load_inference_model(os.path.join(FIXTURES, model, "pir"),
                                                   exe, scope)
    assert feeds == meta["pir"]["feed_names"]
    for batch in meta["batches"]:
        inputs = [ref[k.format(B=batch)] for k in meta["inputs"]]
        outs = exe.run(program, feed=dict(zip(feeds, inputs)), fetch_list=fetches,
                       scope=scope)
        assert len(outs) == len(meta["pir"]["outputs"])
        for key, out in zip(meta["pir"]["outputs"], outs):
            want = ref[key.format(B=batch)]
            assert np.asarray(out).shape == want.shape
            np.testing.assert_allclose(np.asarray(out), want, rtol=0, atol=1e-5,
                                       err_msg=f"{model} at batch {batch}")


@pytest.mark.parametrize("model", ["mlp", "resnet18"])
def test_training_import_then_clone_for_test_gives_paddle_eval(model):
    meta = _meta(model)
    ref = np.load(os.path.join(FIXTURES, model, "reference.npz"), allow_pickle=False)
    scope = Scope()
    exe = pd.Executor()
    program, feeds, fetches = load_inference_model(os.path.join(FIXTURES, model, "pir"),
                                                   exe, scope, for_training=True)
    block = program.global_block()
    trainable = {p.name for p in program.all_parameters()}
    persistables = {op["A"][3] for op in _raw_ops(_doc(model)) if op["#"] == "p"}
    statistics = {n for b in read_pir(_text(model)).blocks for op in b.ops
                  if op.type == "batch_norm" for n in op.inputs["Mean"] + op.inputs["Variance"]}
    assert trainable == persistables - statistics   # running statistics are state
    assert {op.type for op in block.ops} & {"batch_norm", "dropout"}
    test_program = program.clone(for_test=True)
    batch = meta["batches"][0]
    inputs = [ref[k.format(B=batch)] for k in meta["inputs"]]
    (out,) = exe.run(test_program, feed=dict(zip(feeds, inputs)), fetch_list=fetches,
                     scope=scope)
    np.testing.assert_allclose(np.asarray(out), ref[meta["pir"]["outputs"][0].format(B=batch)],
                               rtol=0, atol=1e-5)


def _dense(dims, element="0.t_f32"):
    return {"#": "0.t_dtensor", "D": [{"#": element}, dims, "NCHW", [], 0]}


def test_a_long_chain_of_unread_ops_is_dropped_in_linear_time():
    n = 5_000   # a pass over the program per dropped op would take tens of seconds
    ops = [{"#": "1.data", "I": [], "O": [{"%": 1, "TT": _dense([-1, 4])}],
            "A": [{"N": "name", "AT": {"#": "0.a_str", "D": "x"}}]}]
    for k in range(n):   # x -> relu -> relu -> ... that nothing reads
        ops.append({"#": "1.relu", "I": [{"%": k + 1}], "O": [{"%": k + 2, "TT": _dense([-1, 4])}],
                    "A": []})
    ops.append({"#": "1.fetch", "I": [{"%": 1}], "O": [{"%": n + 2, "TT": _dense([-1, 4])}],
                "A": [{"N": "col", "AT": {"#": "0.a_i32", "D": 0}}]})
    doc = {"base_code": {"magic": "pir"}, "program": {"regions": [{"blocks": [
        {"args": [], "ops": ops}]}]}}
    start = time.perf_counter()
    prog = read_pir(json.dumps(doc))
    assert time.perf_counter() - start < 10
    assert [op.type for op in prog.blocks[0].ops] == ["feed", "fetch"]
    kept = read_pir(json.dumps(doc), prune=False)
    assert len(kept.blocks[0].ops) == n + 2
