"""A layer that fails its checks is appended not at all (issue 22, item 7).

Each case builds a layer that fails after it has declared its parameter, in graph mode and
in eager mode, and checks that both programs serialize to the same bytes as before, that
the Scope holds the same variables and values, and that a retry with correct input names
and initializes its parameters as a build that never failed does.
"""
import numpy as np
import pytest

import progdesc as pd
from progdesc import layers

RNG = np.random.default_rng(0)
IMAGE = RNG.normal(size=(2, 3, 6, 6)).astype("float32")
ROWS = RNG.normal(size=(2, 3)).astype("float32")
IDS = np.array([[1], [2]], np.int64)

# name -> (failing call on the rows `x`, correct call on (image, ids), its parameter)
CASES = {
    "conv2d": (lambda x: layers.conv2d(x, 4, 3),                    # rank 2: not NCHW
               lambda image, ids: layers.conv2d(image, 4, 3), "conv2d_0.w_0"),
    "fc": (lambda x: layers.fc(x, 5, bias_attr="x"),                # bias name taken
           lambda image, ids: layers.fc(image, 5), "fc_0.w_0"),
    "batch_norm": (lambda x: layers.batch_norm(x, momentum="high"),  # attribute of bad type
                   lambda image, ids: layers.batch_norm(image), "batch_norm_0.w_0"),
    "layer_norm": (lambda x: layers.layer_norm(x, epsilon="small"),
                   lambda image, ids: layers.layer_norm(image), "layer_norm_0.w_0"),
    "embedding": (lambda x: layers.embedding(x, [10, 4]),           # float ids
                  lambda image, ids: layers.embedding(ids, [10, 4]), "embedding_0.w_0"),
}


def _values(scope):
    return {n: np.array(scope.get(n)) for n in scope.local_var_names() if n in scope}


def _build(case, fail, eager):
    """(main bytes, startup bytes, scope values) before and after a failing layer, then
    (the retried layer's output name, its parameter's value in eager mode)."""
    failing, correct, param = CASES[case]
    main, startup, scope = pd.Program(random_seed=1), pd.Program(random_seed=2), pd.Scope()
    mode = pd.eager() if eager else _nothing()
    with pd.scope_guard(scope), pd.program_guard(main, startup), mode:
        x = pd.data("x", [None, 3], value=ROWS if eager else None)
        image = pd.data("image", [None, 3, 6, 6], value=IMAGE if eager else None)
        ids = pd.data("ids", [None, 1], "int64", value=IDS if eager else None)
        before = main.to_bytes(), startup.to_bytes(), _values(scope)
        if fail:
            with pytest.raises(pd.ProgdescError):
                failing(x)
        after = main.to_bytes(), startup.to_bytes(), _values(scope)
        out = correct(image, ids)
        value = np.array(scope.get(param)) if eager else None
    names = [v.name for v in main.list_vars()], [v.name for v in startup.list_vars()]
    return before, after, out.name, names, value, (main.to_bytes(), startup.to_bytes())


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("case, eager", [(case, False) for case in sorted(CASES)] + [
    (case, True) for case in ("batch_norm", "conv2d", "embedding")])   # eager compiles: a few
def test_a_failing_layer_leaves_programs_and_scope_as_they_were(case, eager):
    before, after, out, names, value, programs = _build(case, fail=True, eager=eager)
    assert after[0] == before[0] and after[1] == before[1]
    assert sorted(after[2]) == sorted(before[2])
    for name, array in before[2].items():
        assert np.array_equal(after[2][name], array), name
    # The retry is the build that never failed: same names, same programs, same values.
    _, _, clean_out, clean_names, clean_value, clean_programs = _build(case, False, eager)
    assert out == clean_out and out.startswith(case + "_0")
    assert names == clean_names and programs == clean_programs
    if eager:
        assert np.array_equal(value, clean_value)


def test_a_failing_layer_inside_another_takes_back_only_itself():
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 3])
        layers.fc(x, 2)
        kept = main.to_bytes(), startup.to_bytes()
        with pytest.raises(pd.ProgdescError):
            layers.conv2d(x, 4, 3)
        assert (main.to_bytes(), startup.to_bytes()) == kept
        assert layers.fc(x, 2).name == "fc_1.out"


def test_a_failing_control_flow_builder_leaves_no_sub_block():
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 3])
        pred = pd.data("pred", [], "bool")
        before = main.to_bytes()
        with pytest.raises(pd.ProgramError, match="must return a Variable"):
            pd.control_flow.cond(pred, lambda: layers.fc(x, 2), lambda: 3)
        assert main.to_bytes() == before and len(main.blocks) == 1
        assert startup.to_bytes() == pd.Program().to_bytes()
        out = pd.control_flow.cond(pred, lambda: layers.fc(x, 2), lambda: layers.fc(x, 2))
        assert [b.idx for b in main.blocks] == [0, 1, 2]
        assert "fc_0.w_0" in main.global_block().vars and out.shape == (-1, 2)
