"""progdesc.translate without JAX's front end: a made-up foreign format (a graph is a dict
of inputs, nodes and outputs; a node a dict) with a few rules. Its programs compute what
NumPy computes; ops go through the public API; constants are made one way; a sub-graph
becomes a sub-block; every unsupported op is listed, with its place, in one error; the
table resolves renames, aliases and versions."""
import numpy as np
import pytest

import progdesc as pd
from progdesc import framework
from progdesc.constants import LARGE_CONSTANT
from progdesc.control_flow import cond
from progdesc.translate import (Environment, Literal, Node, RuleTable, Translator,
                                Unsupported)

RULES = RuleTable("toy op")
RULES.rename("Mul", "mul")
RULES.rename("Add", "add")
RULES.alias("Times", "Mul")   # an old name of Mul


@RULES.rule("Scale")
def scale(t, x, *, factor=1.0, bias=0.0, mode="linear"):
    if mode != "linear":
        raise Unsupported(f"mode {mode!r}")
    return t.call("scale", x, scale=factor, bias=bias)


@RULES.rule("Const")
def const(t, *, value):
    return t.constant(np.asarray(value, np.float32))


@RULES.rule("Softmax", since=13)
def softmax(t, x, *, axis=-1):
    return t.call("softmax", x, axis=axis)


@RULES.rule("Softmax")   # before version 13 the axis defaulted to 1
def softmax_old(t, x, *, axis=1):
    return t.call("softmax", x, axis=axis)


@RULES.rule("If")
def if_(t, pred, *, then_graph, else_graph):
    out = cond(t.block.var(pred), lambda: t.sub_block(then_graph, []),
               lambda: t.sub_block(else_graph, []))
    return [v.name for v in out]


@RULES.rule("Shape")
def shape(t, x, *, out_types):
    """The driver's `out_types`: this format's (dims, dtype) of the outputs."""
    (dims, dtype), = out_types
    return t.constant(np.asarray(t.var(x)[0], dtype))


class ToyTranslator(Translator):
    """The front end of the toy format: nodes are dicts, values are named by strings, and
    a branch reads the values of the graph around it."""

    def __init__(self, program, version=None):
        super().__init__(program, RULES, version=version)
        self._envs = []
        self._graphs = 0

    def inline(self, graph, args=None):
        env = Environment(self, parent=self._envs[-1] if self._envs else None)
        env.bind(graph["inputs"], args if args is not None else [None] * len(graph["inputs"]))
        block, self._graphs = self._graphs, self._graphs + 1
        self._envs.append(env)
        try:
            self.translate([self._node(d, block, i) for i, d in enumerate(graph["nodes"])], env)
        finally:
            self._envs.pop()
        return [env.read(name) for name in graph["outputs"]]

    @staticmethod
    def _node(d, block, index):
        inputs = [Literal(np.float32(v)) if isinstance(v, float) else v for v in d["in"]]
        attrs = d.get("attrs", {})
        return Node(d["op"], inputs, d["out"], attrs, d.get("line", ""), block=block,
                    index=index, out_types=d.get("types", ()),
                    subgraphs=tuple(v for v in attrs.values() if isinstance(v, dict)))


def translate(graph, feeds, version=None):
    """(program, fetch names, values for the Scope) of a toy graph with float32 `feeds`
    {name: dims}."""
    program = pd.Program()
    for name, dims in feeds.items():
        program.global_block().create_var(name, dims, "float32", need_check_feed=True)
    t = ToyTranslator(program, version)
    with pd.program_guard(program):
        outs = t.inline(graph, list(feeds))
    t.check()
    return program, outs, t.values


def run(program, outs, values, feed):
    scope = pd.Scope()
    for name, value in values.items():
        scope.set(name, value)
    return pd.Executor().run(program, feed=feed, fetch_list=outs, scope=scope)


def _softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


X = np.random.default_rng(0).uniform(-1, 1, (2, 3)).astype(np.float32)
W = np.random.default_rng(1).uniform(-1, 1, (2, 3)).astype(np.float32)
ROW = [0.5, -1.0, 2.0]


def test_a_graph_computes_what_numpy_computes_through_the_public_api():
    graph = {"inputs": ["x", "w"], "outputs": ["e", "f"], "nodes": [
        {"op": "Times", "in": ["x", "w"], "out": ["a"]},
        {"op": "Const", "in": [], "out": ["row"], "attrs": {"value": ROW}},
        {"op": "Add", "in": ["a", "row"], "out": ["b"]},
        {"op": "Scale", "in": ["b"], "out": ["c"], "attrs": {"factor": 2.0, "bias": 0.5}},
        {"op": "Add", "in": ["c", 1.5], "out": ["d"]},   # a literal operand
        {"op": "Softmax", "in": ["d"], "out": ["e"], "attrs": {"axis": 0}},
        {"op": "Softmax", "in": ["d"], "out": ["f"]},
    ]}
    appended = []

    class Recorder(framework.ProgramListener):
        def op_appended(self, block, index, opdef, inputs, outputs, attrs):
            appended.append(opdef.type)
    stop = framework.add_listener(Recorder())
    try:
        program, outs, values = translate(graph, {"x": (2, 3), "w": (2, 3)}, version=13)
    finally:
        stop()
    ops = [op.type for op in program.global_block().ops]
    assert appended == ops == ["mul", "assign_value", "add", "scale", "fill_constant", "add",
                               "softmax", "softmax"]
    e, f = run(program, outs, values, {"x": X, "w": W})
    d = (X * W + np.float32(ROW)) * 2.0 + 0.5 + 1.5
    np.testing.assert_allclose(e, _softmax(d, 0), rtol=1e-6)
    np.testing.assert_allclose(f, _softmax(d, -1), rtol=1e-6)


def test_versions_are_resolved_by_the_table():
    graph = {"inputs": ["x"], "outputs": ["s"], "nodes": [
        {"op": "Softmax", "in": ["x"], "out": ["s"]}]}
    x = np.random.default_rng(2).uniform(-1, 1, (3, 2)).astype(np.float32)
    for version, axis in ((11, 1), (13, -1), (None, -1)):
        program, outs, values = translate(graph, {"x": (3, 2)}, version=version)
        (op,) = program.global_block().ops
        assert op.attr("axis") == axis
        (got,) = run(program, outs, values, {"x": x})
        np.testing.assert_allclose(got, _softmax(x, axis), rtol=1e-6)
    assert RULES.lookup("Times") is RULES.lookup("Mul") and RULES.lookup("Sort") is None
    assert RULES.lookup("Softmax", 12).fn is softmax_old
    assert RULES.lookup("Mul").op_type == "mul"


def test_constants_are_made_one_way_by_value_and_size():
    big = np.arange(LARGE_CONSTANT + 1, dtype=np.float32) / 7
    graph = {"inputs": ["x", "y"], "outputs": ["r", "s", "u", "v"], "nodes": [
        {"op": "Const", "in": [], "out": ["big"], "attrs": {"value": big}},
        {"op": "Const", "in": [], "out": ["ones"], "attrs": {"value": np.ones(big.size)}},
        {"op": "Const", "in": [], "out": ["row"], "attrs": {"value": ROW}},
        {"op": "Const", "in": [], "out": ["same"], "attrs": {"value": big.copy()}},
        {"op": "Mul", "in": ["x", "big"], "out": ["r"]},
        {"op": "Add", "in": ["x", "ones"], "out": ["s"]},
        {"op": "Add", "in": ["same", "x"], "out": ["u"]},
        {"op": "Mul", "in": ["y", "row"], "out": ["v"]},
    ]}
    program, outs, values = translate(graph, {"x": big.shape, "y": (3,)})
    block = program.global_block()
    # all equal: fill_constant; small: assign_value; large: a persistable valued in the Scope
    assert [op.type for op in block.ops] == ["fill_constant", "assign_value", "mul", "add",
                                             "add", "mul"]
    (stored,) = values   # made once for both equal arrays
    assert stored.startswith("const_")
    assert [v.name for v in block.vars.values() if v.persistable] == [stored]
    assert block.var(stored).stop_gradient and not program.all_parameters()
    np.testing.assert_array_equal(values[stored], big)
    x = np.random.default_rng(3).uniform(-1, 1, big.shape).astype(np.float32)
    y = np.float32([1.0, 2.0, 3.0])
    r, s, u, v = run(program, outs, values, {"x": x, "y": y})
    np.testing.assert_allclose(r, x * big, rtol=1e-6)
    np.testing.assert_allclose(s, x + 1.0, rtol=1e-6)
    np.testing.assert_allclose(u, big + x, rtol=1e-6)
    np.testing.assert_allclose(v, y * np.float32(ROW), rtol=1e-6)


def test_a_sub_graph_becomes_a_sub_block():
    then_graph = {"inputs": [], "outputs": ["t"], "nodes": [
        {"op": "Mul", "in": ["x", "w"], "out": ["t"]}]}   # reads the values around it
    else_graph = {"inputs": [], "outputs": ["e"], "nodes": [
        {"op": "Scale", "in": ["x"], "out": ["e"], "attrs": {"factor": -3.0}}]}
    graph = {"inputs": ["x", "w", "p"], "outputs": ["y"], "nodes": [
        {"op": "If", "in": ["p"], "out": ["y"],
         "attrs": {"then_graph": then_graph, "else_graph": else_graph}}]}
    program = pd.Program()
    block = program.global_block()
    for name in ("x", "w"):
        block.create_var(name, (2, 3), "float32", need_check_feed=True)
    block.create_var("p", (), "bool", need_check_feed=True)
    t = ToyTranslator(program)
    with pd.program_guard(program):
        outs = t.inline(graph, ["x", "w", "p"])
    t.check()
    assert [op.type for op in block.ops] == ["cond"]
    assert [[op.type for op in b.ops] for b in program.blocks[1:]] == [["mul"], ["scale"]]
    assert all(b.parent_idx == 0 for b in program.blocks[1:])
    for p, want in ((True, X * W), (False, -3.0 * X)):
        (y,) = pd.Executor().run(program, feed={"x": X, "w": W, "p": np.bool_(p)},
                                 fetch_list=outs, scope=pd.Scope())
        np.testing.assert_allclose(y, want, rtol=1e-6)


def test_every_unsupported_op_is_reported_with_its_place_in_one_error():
    def branch():
        return {"inputs": [], "outputs": ["q"], "nodes": [
            {"op": "Mul", "in": ["x", "x"], "out": ["m"]},
            {"op": "Gather", "in": ["m"], "out": ["q"]}]}
    graph = {"inputs": ["x", "p"], "outputs": ["z", "y", "k"], "nodes": [
        {"op": "Sort", "in": ["x"], "out": ["s"], "line": "model.py:3"},
        {"op": "Add", "in": ["s", "x"], "out": ["a"]},   # reads a failed value: not reported
        {"op": "Scale", "in": ["x"], "out": ["z"], "attrs": {"mode": "cubic"}},
        {"op": "Const", "in": [], "out": ["k"]},           # its attribute is missing
        {"op": "If", "in": ["p"], "out": ["y"],
         "attrs": {"then_graph": branch(), "else_graph": branch()}},
    ]}
    program = pd.Program()
    program.global_block().create_var("x", (3,), "float32")
    program.global_block().create_var("p", (), "bool")
    t = ToyTranslator(program)
    with pd.program_guard(program):
        t.inline(graph, ["x", "p"])
    with pytest.raises(pd.UnsupportedOpError) as info:
        t.check()
    error = info.value
    assert isinstance(error, pd.ProgramError)
    assert error.places == [("Sort", 0, 0, "model.py:3", ""),
                            ("Scale", 0, 2, "", "mode 'cubic'"),
                            ("Const", 0, 3, "", "no attribute 'value'"),
                            ("Gather", 1, 1, "", ""),
                            ("Gather", 2, 1, "", "")]
    assert error.unsupported[0] == ("Sort", "model.py:3", "")
    message = str(error)
    assert "cannot translate 5 toy op(s) into progdesc ops" in message
    for part in ("'Sort' at model.py:3", "'Scale' at #2 in block 0 (mode 'cubic')",
                 "'Const' at #3 in block 0 (no attribute 'value')", "'Gather' at #1 in block 1",
                 "'Gather' at #1 in block 2"):
        assert part in message, (part, message)


def test_a_rule_gets_the_output_types_the_driver_passes():
    graph = {"inputs": ["x"], "outputs": ["n"], "nodes": [
        {"op": "Shape", "in": ["x"], "out": ["n"], "types": [((2,), "int32")]}]}
    program, outs, values = translate(graph, {"x": (4, 5)})
    (n,) = run(program, outs, values, {"x": np.zeros((4, 5), np.float32)})
    assert n.dtype == np.int32
    np.testing.assert_array_equal(n, [4, 5])
