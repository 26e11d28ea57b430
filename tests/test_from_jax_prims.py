"""pd.from_jax of the primitives issue 24 added (tan, exp2, atan2, inverse and hyperbolic
trigonometry, cbrt, lgamma, digamma, ceil, round, tile, integer div, sort, the cumulative
reductions, scatters other than scatter-add, argmax of bools, iotas over the batch, slices
(`lax.slice`) that end at or count from the end of the batch dim, and sizes such as
`batch - 1` as values) and the gradients of max, min and clamp at ties (JAX's rules): each
imported function's outputs equal the function's own, run by JAX, and the gradients of its
float outputs equal `jax.grad`."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import progdesc as pd
from test_from_jax import check_gradients, check_other_batch_sizes, check_outputs


def _rand(*shape, seed=0, low=-1.0, high=1.0):
    return np.random.default_rng(seed).uniform(low, high, size=shape).astype(np.float32)


def trig(x, y):
    return jnp.tan(x), jnp.exp2(3.0 * y), jnp.arctan2(x, y), jnp.arctan2(x, 0.5)


def more_elementwise(x, y):
    return (jnp.arcsin(x * 0.9) + jnp.arccos(y * 0.9) + jnp.arctan(x * 3.0) + jnp.sinh(y)
            + jnp.cosh(x) + jnp.arcsinh(y * 2.0) + jnp.arccosh(x * x + 1.5)
            + jnp.arctanh(y * 0.8) + jnp.cbrt(x + 2.0),
            jax.scipy.special.gammaln(x + 1.5) * jax.scipy.special.digamma(y + 1.5),
            jnp.ceil(x * 4.0), jnp.round(y * 4.0), lax.round(x * 4.0), jnp.trunc(y * 3.0),
            jnp.round(jnp.array([0.5, 1.5, 2.5, -0.5])) * x[0, 0])


def tiles(x):
    return jnp.tile(x, (1, 3)), jnp.tile(x, (2, 2)) * 2.0, jnp.tile(x[0], 2)


def integer_division(n, m, x):
    return lax.div(n, m), n // m, n // 3, x * (n // m).astype(jnp.float32)


def argmax_of_bools(x):
    hit = x > 0.3
    return (jnp.argmax(hit, axis=1), jnp.argmin(hit, axis=0), jnp.argmax(hit.reshape(-1)),
            x * jnp.argmax(hit, axis=0).astype(jnp.float32))


def cumulative(x, n):
    return (jnp.cumprod(x, axis=1), lax.cumprod(x, axis=0, reverse=True),
            lax.cummax(x, axis=1), lax.cummin(x, axis=1, reverse=True),
            lax.cummax(x, axis=0), lax.cummax(n, axis=0), jnp.cumprod(n, axis=1))


_WITH_ZEROS_AND_TIES = np.array([[2.0, 0.0, 3.0, 0.0, 0.5], [0.5, 1.5, 1.5, 0.0, 1.2],
                                 [0.0, 0.7, 1.1, -0.9, 2.0], [1.1, 0.7, 0.7, 1.1, -1.0]],
                                np.float32)


def sorting(x, n):
    keys, values = lax.sort((n, x), dimension=1, num_keys=1, is_stable=True)
    k2, v2 = lax.sort((n, x), dimension=1, num_keys=2, is_stable=False)
    return (jnp.sort(x, axis=1), jnp.argsort(x, axis=0), jnp.sort(x.T, axis=0) * 2.0, keys,
            values, k2, v2, jnp.argsort(n, axis=1, stable=True), jnp.sort(n, axis=0))


def iotas(x):
    i = lax.broadcasted_iota(jnp.int32, x.shape, 0)
    j = lax.broadcasted_iota(jnp.float32, x.shape, 1)
    return i, j, x * i + j, jnp.arange(x.shape[0]) * 2


def scatters(x, v, ids):
    rows = ids[:, 0]
    return (x.at[rows].set(v), x.at[1].set(v[0] * 2.0), x.at[:, 2].set(-1.0),
            x.at[ids[:, 1]].mul(3.0), x.at[rows].mul(v, unique_indices=True),
            x.at[ids[:, 1]].min(v), x.at[ids[:, 1], 0].max(v[:, 1]),
            x.at[rows + 3].set(v, mode="drop"), x.at[rows + 3].max(v, mode="clip"))


def slices_from_the_end(x, n):
    """What jraph does with a batch of graphs: a roll by one (`jnp.repeat`'s), slices to
    and from the end, the count of trailing padding graphs, a size less one as a value."""
    end = x.shape[0]
    return (jnp.roll(x, 1, axis=0), lax.slice_in_dim(x, 1, end) * 2.0,
            lax.slice_in_dim(x, 0, end - 1),
            x * (x.shape[0] - 1), jnp.argmin(n[::-1] == 0),
            jnp.repeat(x, n, axis=0, total_repeat_length=x.shape[0]))


def ties(x, y):
    return (jnp.maximum(x, y), jnp.minimum(x, y) * 2.0, lax.clamp(-0.5, x, 0.5),
            jnp.maximum(x, 0.0) * 3.0, jnp.max(x, axis=1), jnp.min(y, axis=0) * 2.0)


_TIED = np.array([[0.5, 0.0, -0.5, 1.0], [0.0, 0.25, 0.25, -1.0], [2.0, 0.5, 2.0, 0.0]],
                 np.float32)

_SORT_ARGS = (_rand(3, 5), np.array([[3, 1, 2, 1, 0], [2, 2, 2, 1, 1], [0, 4, 4, 3, 3]],
                                    np.int32))

ZOO = {
    "trig": (trig, (_rand(3, 4), _rand(3, 4, seed=1))),
    "more_elementwise": (more_elementwise, (_rand(3, 4), _rand(3, 4, seed=1))),
    "tiles": (tiles, (_rand(3, 4),)),
    "integer_division": (integer_division, (np.array([[7, -7, 6], [-6, 0, 5]], np.int32),
                                            np.array([[2, 2, -4], [-4, 3, -5]], np.int32),
                                            _rand(2, 3))),
    "cumulative": (cumulative, (_WITH_ZEROS_AND_TIES, np.arange(12, dtype=np.int32)
                                .reshape(4, 3) % 5 - 2)),
    "sorting": (sorting, _SORT_ARGS),
    "iotas": (iotas, (_rand(3, 4),)),
    "scatters": (scatters, (np.random.default_rng(3).permutation(15).reshape(5, 3)
                            .astype(np.float32) / 8 - 1,
                            np.random.default_rng(4).permutation(9).reshape(3, 3)
                            .astype(np.float32) / 6 - 0.7,
                            np.array([[0, 4], [2, 2], [3, 2]], np.int32))),
    "argmax_of_bools": (argmax_of_bools, (_rand(4, 5),)),
    "slices_from_the_end": (slices_from_the_end, (_rand(5, 3), np.array([2, 0, 1, 2, 0],
                                                                         np.int32))),
    "ties": (ties, (_TIED, np.where(_rand(3, 4, seed=2) > 0, _TIED, _rand(3, 4, seed=3)))),
}


def unstacking(x):
    first, second, third = lax.unstack(x, axis=1)   # what iterating over an array binds in JAX 0.11
    return first * second + third, lax.unstack(x[:, :2, None], axis=2)[0] * 2.0


ZOO["unstacking"] = (unstacking, (_rand(4, 3),))


# imported at the example's batch size: cummax and cummin along the batch dim differentiate
# with an associative scan, which needs its size (as in JAX); the scatters' updates do not
# share the operand's batch dim
FIXED = {"cumulative", "scatters"}


@pytest.mark.parametrize("case", ZOO)
def test_outputs_equal_the_function(case):
    check_outputs(*ZOO[case], polymorphic=case not in FIXED)


@pytest.mark.parametrize("case", ZOO)
def test_gradients_equal_jax_grad(case):
    check_gradients(*ZOO[case], polymorphic=case not in FIXED)


def test_scatter_mul_refuses_the_gradient_of_colliding_updates_as_jax_does():
    def fn(x, v):
        return jnp.asarray(x).at[np.array([1, 1, 2])].mul(v)
    x, v = _rand(4, 3), _rand(3, 3, seed=1)
    with pytest.raises(NotImplementedError):
        jax.grad(lambda v: fn(x, v).sum())(v)
    program, feeds, fetches = pd.from_jax(fn, x, v, scope=pd.Scope(), batch_polymorphic=False)
    with pd.program_guard(program), pytest.raises(pd.BackwardError, match="unique_indices"):
        pd.gradients(pd.ops.reduce_sum(fetches[0]), [program.global_block().var(feeds[1])])


@pytest.mark.parametrize("case", sorted(set(ZOO) - FIXED))
def test_a_polymorphic_import_runs_at_other_batch_sizes(case):
    check_other_batch_sizes(*ZOO[case])


class _FlatTreeOfScan:
    """What JAX 0.11 gives a scan equation as `ft_in`: a tree of (consts, carry, xs) whose
    `unpack()` gives the three parts."""

    def __init__(self, *parts):
        self.parts = parts

    def unpack(self):
        return self.parts


def test_scan_counts_come_from_jax_0_10s_parameters_or_jax_0_11s_flat_tree():
    from progdesc.interop.jax_rules import scan_counts
    assert scan_counts(2, 1, None) == (2, 1)
    assert scan_counts(None, None, _FlatTreeOfScan([None] * 2, [None] * 3, [None])) == (2, 3)
