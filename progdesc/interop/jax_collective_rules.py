"""The from_jax rules of JAX's collectives over named axes (`psum`, `pmax`, `pmin`, and
`pmean`, which JAX writes as a `psum` and a division by the axis size; `axis_index`).

A model written for `pmap` / `shard_map` names the axis its collectives reduce over
(Flax's `BatchNorm(axis_name="batch")`). `from_jax(..., axis_names={"batch": "data"})`
traces it with that axis bound and maps it to a mesh axis of the program: each
collective becomes a `c_allreduce` over that mesh axis, the op the data-parallel pass
inserts, so that under `Executor(mesh=...)` the devices reduce together and on one device
the op is the identity, as for our own data-parallel programs. The axis size JAX bakes
into the jaxpr as a number (pmean's divisor) becomes a `c_axis_size` op: the function is
traced with each axis of a size no real constant is likely to equal (`AXIS_SIZES`), and
a scalar of exactly that size is read as the axis size.
"""
from progdesc.interop.jax_rules import RULES
from progdesc.translate import Unsupported

AXIS_SIZES = (7919, 7927, 7933, 7937)
"""The sizes (primes) named axes are traced with, one per axis in order."""


def _mesh_axis(t, axes, axis_index_groups=None):
    if axis_index_groups is not None:
        raise Unsupported("axis_index_groups (a collective over groups of devices) has no "
                          "progdesc op")
    if len(axes) != 1:
        raise Unsupported(f"a collective over {len(axes)} axes {list(axes)} (one axis at a "
                          "time is translated)")
    axis = axes[0]
    mesh_axis = t.axis_names.get(axis) if isinstance(axis, str) else None
    if mesh_axis is None:
        raise Unsupported(f"axis '{axis}' is not mapped to a mesh axis: pass "
                          f"axis_names={{'{axis}': 'data'}} to from_jax / from_flax")
    return mesh_axis


def _reduction(reduce_type):
    def rule(t, *xs, axes, axis_index_groups=None):
        axis_name = _mesh_axis(t, axes, axis_index_groups)
        return [t.call("c_allreduce", x, reduce_type=reduce_type, axis_name=axis_name)
                for x in xs]
    rule.__name__ = f"p{reduce_type}"
    return rule


for _prim, _reduce in (("psum", "sum"), ("pmax", "max"), ("pmin", "min")):
    RULES.rule(_prim)(_reduction(_reduce))
del _prim, _reduce


@RULES.rule("axis_index")
def axis_index(t, *, axis_name):
    index = t.call("c_axis_index", axis_name=_mesh_axis(t, (axis_name,)))
    return index
