"""Errors name the line of the user's code: a script, a `python -c` string, a notebook cell.

Each way of building ops (an op function, a Variable operator, `append_op`, a layer, a
loss, a custom op), the checks a layer or `create_parameter` makes before any op exists,
and a run-time error at `Executor.run` is tried from a script written
to a temporary directory and run in a fresh interpreter with this repository on
PYTHONPATH, as a user would run it. The expected line is marked `# HERE` in the script.
"""
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import progdesc as pd
from progdesc import layers, ops
from test_notebooks import kernel_env, monkeypatch_module  # noqa: F401  (fixtures)

ROOT = pathlib.Path(__file__).resolve().parent.parent

PRELUDE = """\
import numpy as np
import progdesc as pd
from progdesc import layers, ops
from progdesc.custom_op import In, Out, op

main, startup = pd.Program(), pd.Program()
exe, scope = pd.Executor(), pd.Scope()
"""

# case -> (body, the error's type, fragments its message holds besides the marked line,
# which follows "created at" (the op's line) or, for a run-time error, "in run called at";
# a fourth element gives another phrase, e.g. "in Optimizer.minimize called at")
CASES = {
    "op_function": ("""
        a, b = pd.data("a", [4, 5]), pd.data("b", [4, 3])
        ops.add(a, b)  # HERE
        """, "ShapeError", ["op #0 'add'", "X float32[4, 5] and Y float32[4, 3] do not broadcast"]),
    "variable_operator": ("""
        a, b = pd.data("a", [4, 5]), pd.data("b", [4, 3])
        c = a * b  # HERE
        """, "ShapeError", ["op #0 'mul'"]),
    "append_op": ("""
        a, b = pd.data("a", [4, 5]), pd.data("b", [3, 6])
        main.global_block().append_op("matmul", {"X": a, "Y": b})  # HERE
        """, "ShapeError", ["op #0 'matmul'", "dim 0 of Y float32[3, 6] must be 5"]),
    "layer": ("""
        image = pd.data("image", [None, 64])
        h = layers.conv2d(image, 8, 3)  # HERE
        """, "ShapeError", ["'conv2d'", "Input must have rank 4 (N, C, H, W), got float32[-1, 64]"]),
    "layer_parameter_init": ("""
        ids = pd.data("ids", [None, 4], "int64")
        h = layers.fc(ids, 3)  # HERE
        """, "ShapeError", ["attribute dtype='int64' must be a float type"]),
    "loss": ("""
        logits = layers.fc(pd.data("x", [None, 4]), 3)
        label = pd.data("label", [None], "int64")
        loss = layers.softmax_with_cross_entropy(logits, label)  # HERE
        """, "ShapeError", ["'softmax_with_cross_entropy'", "variable 'label'",
                            "Label must have shape [-1, 1]", "got int64[-1]"]),
    "custom_op": ("""
        @op("pair_sum", inputs=[In("X", "float"), In("Y", "float")], outputs=[Out("Out")])
        def pair_sum(X, Y):
            return X + Y

        a, b = pd.data("a", [4, 5]), pd.data("b", [4, 3])
        pd.ops.pair_sum(a, b)  # HERE
        """, "ShapeError", ["op #0 'pair_sum'", "X float32[4, 5], Y float32[4, 3] rejected"]),
    "layer_unknown_features": ("""
        x = pd.data("x", [None, None])
        h = layers.fc(x, 3)  # HERE
        """, "ProgramError", ["variable 'x'", "feature dims of fc's input must be known",
                              "got [-1]"]),
    "layer_groups": ("""
        image = pd.data("image", [None, 3, 8, 8])
        h = layers.conv2d(image, 4, 3, groups=2)  # HERE
        """, "ProgramError", ["3 input channels do not split into 2 groups"]),
    "layer_heads": ("""
        tokens = pd.data("tokens", [None, 5, 6])
        h = layers.multi_head_attention(tokens, num_heads=4)  # HERE
        """, "ProgramError", ["variable 'tokens'", "d_model 6 is not divisible by 4 heads"]),
    "create_parameter": ("""
        x = pd.data("x", [None, 4])
        h = layers.fc(x, 3, param_attr=pd.ParamAttr(name="w"))
        h = layers.fc(h, 3, param_attr=pd.ParamAttr(name="w"))  # HERE
        """, "ProgramError", ["variable 'w'", "a variable of this name already exists"]),
    "feed_shape": ("""
        x = pd.data("x", [None, 4])
        y = ops.reduce_sum(x)
        exe.run(main, feed={"x": np.ones((8, 5), "float32")}, fetch_list=[y])  # HERE
        """, "FeedError", ["variable 'x'", "feed has shape [8, 5]"]),
    "feed_not_a_mapping": ("""
        x = pd.data("x", [None, 4])
        y = ops.reduce_sum(x)
        exe.run(main, feed=[np.ones((8, 4), "float32")], fetch_list=[y])  # HERE
        """, "FeedError", ["feed maps data variables (or their names) to values, got a list"]),
    "fetch_typo": ("""
        x = pd.data("x", [None, 4])
        total = ops.reduce_sum(x, name="total")
        exe.run(main, feed={"x": np.ones((8, 4), "float32")}, fetch_list=["totl.out"])  # HERE
        """, "FetchError", ["variable 'totl.out'", "did you mean 'total_0.out'?"],
        "in run called at"),
    "variable_operand": ("""
        x = pd.data("x", [None, 4])
        y = x + "1"  # HERE
        """, "OperandError", ["op 'add'", "variable 'x'", "got str '1'"]),
    "variable_comparison_operand": ("""
        x = pd.data("x", [None, 4])
        y = x < None  # HERE
        """, "OperandError", ["op 'less_than'", "got NoneType None"]),
    "backward_non_scalar_loss": ("""
        h = layers.fc(pd.data("x", [None, 4]), 3)
        pd.optimizer.SGD(0.1).minimize(h)  # HERE
        """, "BackwardError", ["variable 'fc_0.out'", "loss must be a scalar"],
        "in Optimizer.minimize called at"),
    "data_dtype_typo": ("""
        x = pd.data("x", [None, 4], "flaot32")  # HERE
        """, "ProgramError", ["variable 'x'", "unsupported dtype 'flaot32'"]),
    "mesh_with_check_numerics": ("""
        mesh = pd.distributed.Mesh({"data": 1})
        pd.Executor(mesh=mesh, check_numerics=True)  # HERE
        """, "DistributedError", ["check_numerics runs op by op on one device"],
        "in Executor called at"),
    "dropout_probability": ("""
        x = pd.data("x", [None, 4])
        y = layers.dropout(x, 1.5)  # HERE
        """, "AttributeValueError", ["op #0 'dropout'", "attribute dropout_prob=1.5 must be "
                                     "in [0, 1]"]),
    "layer_fractional_size": ("""
        h = layers.fc(pd.data("x", [None, 4]), 2.5)  # HERE
        """, "ProgramError", ["fc's size must be a positive int (or ints), got 2.5"]),
    "layer_zero_size": ("""
        h = layers.fc(pd.data("x", [None, 4]), 0)  # HERE
        """, "ProgramError", ["fc's size must be a positive int (or ints), got 0"]),
}


def _script(body):
    """The script's text and the number of the line marked `# HERE`."""
    text = PRELUDE + "with pd.program_guard(main, startup):\n" + textwrap.indent(
        textwrap.dedent(body).strip("\n"), "    ") + "\n"
    lines = text.splitlines()
    return text, next(i for i, line in enumerate(lines, 1) if line.endswith("# HERE"))


def _run(args, cwd):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
        JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
    done = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode != 0, f"the script did not fail:\n{done.stdout}\n{done.stderr}"
    return done.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("case", list(CASES))
def test_error_names_the_scripts_line(case, tmp_path):
    body, error, fragments, *where = CASES[case]
    text, line = _script(body)
    (tmp_path / "train.py").write_text(text)
    last = _run(["train.py"], tmp_path)
    assert last.startswith(f"lowering.errors.{error}: "), last
    where = where[0] if where else "in run called at" if error == "FeedError" else "created at"
    assert f"{where} train.py:{line}" in last, last
    for fragment in fragments:
        assert fragment in last, last
    assert "<progdesc." not in last


def test_feeds_that_disagree_on_a_shared_batch_dim_name_both_feeds(tmp_path):
    text, line = _script("""
        x, y = pd.data("x", [None, 4]), pd.data("y", [None, 1])
        loss = ops.mean(ops.sub(ops.reduce_sum(x, axis=[1], keep_dim=True), y))
        exe.run(main, feed={"x": np.ones((8, 4), "float32"), "y": np.ones((3, 1), "float32")},
                fetch_list=[loss])  # HERE
        """)
    (tmp_path / "train.py").write_text(text)
    last = _run(["train.py"], tmp_path)
    assert last.startswith("lowering.errors.FeedError: "), last
    assert f"op #1 'sub', created at train.py:{line - 2}" in last, last
    assert f"in run called at train.py:{line - 1}" in last, last   # a call spanning two lines
    assert "feeds 'x' [8, 4] and 'y' [3, 1] differ on dim 0 (8 vs 3)" in last, last


def test_python_c_string_names_its_line(tmp_path):
    text, line = _script(CASES["op_function"][0])
    last = _run(["-c", text], tmp_path)
    assert f"op #0 'add', created at <string>:{line}" in last, last


def test_notebook_cell_names_its_cell_and_line(kernel_env, tmp_path):  # noqa: F811
    import nbclient
    import nbformat
    cells = ["import progdesc as pd\nfrom progdesc import ops",
             "a = pd.data('a', [4, 5])\nb = pd.data('b', [4, 3])\nops.add(a, b)"]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nbclient.NotebookClient(nb, kernel_name=kernel_env, timeout=300, allow_errors=True,
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    errors = [o for c in nb.cells for o in c.outputs if o.output_type == "error"]
    assert [e.ename for e in errors] == ["ShapeError"]
    assert "op #0 'add', created at In[2]:3" in errors[0].evalue, errors[0].evalue


def _regression(main, startup):
    """x [-1, 4] and y [-1, 1] combined by an mse loss trained with SGD; returns the loss."""
    with pd.program_guard(main, startup):
        x, y = pd.data("x", [None, 4]), pd.data("y", [None, 1])
        loss = layers.mse_loss(layers.fc(x, 1), y)
        pd.optimizer.SGD(0.1).minimize(loss)
    return loss


@pytest.mark.parametrize("steps", [None, 2])
def test_feeds_that_disagree_leave_the_scope_as_it_was(steps):
    main, startup = pd.Program(), pd.Program()
    loss = _regression(main, startup)
    exe, scope = pd.Executor(), pd.Scope()
    exe.run(startup, scope=scope)
    before = {n: np.array(scope.get(n)) for n in scope.local_var_names()}
    lead = () if steps is None else (steps,)
    bad = {"x": np.ones(lead + (8, 4), "float32"), "y": np.ones(lead + (3, 1), "float32")}
    for _ in range(2):   # the second run finds the failed signature in the Executor's cache
        with pytest.raises(pd.FeedError, match=r"feeds 'x' \[8, 4\] and 'y' \[3, 1\] differ on "
                                               r"dim 0 \(8 vs 3\)"):
            exe.run(main, feed=bad, fetch_list=[loss], scope=scope, steps=steps)
    for name, value in before.items():
        np.testing.assert_array_equal(scope.get(name), value, err_msg=name)
    good = {"x": np.ones(lead + (3, 4), "float32"), "y": np.ones(lead + (3, 1), "float32")}
    exe.run(main, feed=good, fetch_list=[loss], scope=scope, steps=steps)


def test_feeds_of_different_batch_sizes_run_where_no_op_combines_them():
    main = pd.Program()
    with pd.program_guard(main):
        x, y = pd.data("x", [None, 4]), pd.data("y", [None, 4])
        sums = ops.reduce_sum(x, axis=[1]), ops.reduce_sum(y, axis=[1])
        both = ops.concat([x, y], axis=0)    # stacks the batches: sizes may differ
    x_value, y_value = np.arange(32.0).reshape(8, 4), np.arange(12.0).reshape(3, 4)
    got = pd.Executor().run(main, feed={"x": x_value, "y": y_value},
                            fetch_list=[*sums, both], scope=pd.Scope())
    np.testing.assert_allclose(got[0], x_value.sum(1))
    np.testing.assert_allclose(got[1], y_value.sum(1))
    np.testing.assert_allclose(got[2], np.concatenate([x_value, y_value]))
