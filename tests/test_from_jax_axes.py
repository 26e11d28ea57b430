"""from_jax / from_flax of functions whose collectives reduce over a named axis (issue 24
item 4): `axis_names` maps the axis to a mesh axis; on one device the collectives are the
identity, as JAX's are over an axis of size 1 (the reference: the original under
`jax.vmap(axis_name=...)` over one slice). Four devices: tests/test_distributed_devices.py."""
import jax
import numpy as np
import pytest
from flax import linen as nn
from jax import lax

import progdesc as pd

RNG = np.random.default_rng(0)


def normalise(x):
    mean = lax.pmean(x.mean(0), "batch")
    return x - mean, lax.psum(x.sum(0), "batch"), lax.pmax(x.max(0), "batch")


def _one_slice(fn, *args):
    """fn(*args) with its axis "batch" bound, of size 1."""
    out = jax.vmap(fn, axis_name="batch")(*(a[None] for a in args))
    return jax.tree_util.tree_map(lambda v: np.asarray(v)[0], out)


def test_collectives_become_allreduce_ops_over_the_mapped_mesh_axis():
    x = RNG.normal(size=(5, 3)).astype(np.float32)
    program, feeds, fetch = pd.from_jax(normalise, x, axis_names={"batch": "data"})
    ops = [op for op in program.global_block().ops if op.type.startswith("c_")]
    assert [(op.type, op.attr("axis_name")) for op in ops] == [
        ("c_allreduce", "data"), ("c_axis_size", "data"), ("c_allreduce", "data"),
        ("c_allreduce", "data")]
    got = pd.Executor().run(program, feed={"x": x[:2]}, fetch_list=fetch, scope=pd.Scope())
    for g, w in zip(got, _one_slice(normalise, x[:2])):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)


def test_axis_index_and_a_list_of_names_kept_as_they_are():
    def shifted(x):
        return x + lax.axis_index("data").astype(x.dtype)
    x = RNG.normal(size=(4,)).astype(np.float32)
    program, _, fetch = pd.from_jax(shifted, x, axis_names=["data"])
    got, = pd.Executor().run(program, feed={"x": x}, fetch_list=fetch, scope=pd.Scope())
    np.testing.assert_allclose(got, x)


def test_an_unmapped_axis_is_refused_saying_what_to_pass():
    x = RNG.normal(size=(4, 3)).astype(np.float32)
    for axis_names in ({"other": "data"}, None):
        with pytest.raises(pd.UnsupportedPrimitiveError,
                           match=r"axis 'batch'.*pass axis_names=\{'batch': 'data'\}"):
            pd.from_jax(normalise, x, axis_names=axis_names)
    with pytest.raises(TypeError, match="axis_names maps"):
        pd.from_jax(normalise, x, axis_names={"batch": 3})


class _Net(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.Dense(6)(x)
        x = nn.BatchNorm(use_running_average=False, axis_name="batch", momentum=0.8)(x)
        return nn.relu(nn.Dense(2)(x))


def test_flax_batch_norm_with_an_axis_name_trains_like_the_original():
    x = RNG.normal(size=(8, 4)).astype(np.float32)
    net = _Net()
    variables = jax.vmap(lambda v: net.init(jax.random.key(0), v), axis_name="batch")(
        x[None])
    variables = jax.tree_util.tree_map(lambda v: v[0], variables)
    scope = pd.Scope()
    program, feeds, fetch = pd.from_flax(net, variables, x, scope=scope,
                                         axis_names={"batch": "data"})
    got, = pd.Executor().run(program, feed={"x": x}, fetch_list=fetch, scope=scope)

    def apply(v):
        return net.apply(variables, v, mutable=["batch_stats"])
    want, updates = _one_slice(apply, x)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    stats = jax.tree_util.tree_leaves_with_path(updates["batch_stats"])
    for path, value in stats:   # the running statistics the step wrote back
        name = ".".join(str(getattr(k, "key", k)) for k in path)
        held = [n for n in (v.name for v in program.list_vars()) if n.endswith(name)]
        assert held, name
        np.testing.assert_allclose(scope.get(held[0]), value, rtol=1e-5, atol=1e-6)
