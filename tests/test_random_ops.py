"""Random ops draw from the program's RNG state: reproducible per `random_seed`."""
import numpy as np
import pytest

import progdesc as pd


def _program(op_type, seed):
    main = pd.Program(random_seed=seed)
    op = main.global_block().append_op(op_type, attrs={"shape": [3, 5]})
    return main, op.output("Out")[0]


def _draw(op_type, seed, scope=None):
    main, out = _program(op_type, seed)
    return pd.Executor().run(main, fetch_list=[out], scope=scope or pd.Scope())[0]


@pytest.mark.parametrize("op_type", ["uniform_random", "gaussian_random"])
def test_same_seed_same_values(op_type):
    np.testing.assert_array_equal(_draw(op_type, 7), _draw(op_type, 7))


@pytest.mark.parametrize("op_type", ["uniform_random", "gaussian_random"])
def test_different_seeds_different_values(op_type):
    assert not np.array_equal(_draw(op_type, 7), _draw(op_type, 8))


@pytest.mark.parametrize("op_type", ["uniform_random", "gaussian_random"])
def test_runs_in_one_scope_advance_the_state(op_type):
    main, out = _program(op_type, 7)
    exe, scope = pd.Executor(), pd.Scope()
    first = exe.run(main, fetch_list=[out], scope=scope)[0]
    second = exe.run(main, fetch_list=[out], scope=scope)[0]
    assert not np.array_equal(first, second)
    np.testing.assert_array_equal(first, _draw(op_type, 7))


def test_two_random_ops_of_one_program_differ():
    main = pd.Program(random_seed=3)
    block = main.global_block()
    outs = [block.append_op("uniform_random", attrs={"shape": [4]}).output("Out")[0]
            for _ in range(2)]
    a, b = pd.Executor().run(main, fetch_list=outs, scope=pd.Scope())
    assert not np.array_equal(a, b)
