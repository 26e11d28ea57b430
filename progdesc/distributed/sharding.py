"""Sharding annotations: how a variable is laid out on a mesh, stored in its VarDesc.

A spec gives one entry per dim: a mesh axis name splitting that dim, or None
where the dim is not split. `()` (or all None) is replicated on purpose; no
annotation at all leaves the choice to the Executor, which replicates.
"""
from jax.sharding import NamedSharding, PartitionSpec

from lowering.errors import ProgramError
from progdesc.framework import default_startup_program


def set_sharding(var_desc, spec):
    """Record `spec` (a tuple of mesh axis names or None per dim, `()` for replicated, None
    to remove the annotation) in `var_desc`; ProgramError if it does not fit its rank."""
    if spec is None:
        var_desc.ClearField("sharding")
        return
    spec = tuple(spec)
    if any(a is not None and (not isinstance(a, str) or not a) for a in spec):
        raise ProgramError(f"a sharding spec holds mesh axis names or None, got {spec}",
                           var=var_desc.name)
    if spec and len(spec) != len(var_desc.dims):
        raise ProgramError(f"sharding spec {spec} has {len(spec)} entries, the variable "
                           f"has {len(var_desc.dims)} dims", var=var_desc.name)
    var_desc.sharding.SetInParent()
    del var_desc.sharding.dims[:]
    var_desc.sharding.dims.extend(a or "" for a in spec)


def sharding_of(var_desc):
    """The spec `var_desc` records (a tuple, `()` when replicated), or None if it has none."""
    if not var_desc.HasField("sharding"):
        return None
    dims = tuple(a or None for a in var_desc.sharding.dims)
    return () if all(a is None for a in dims) else dims


def shard(var, spec):
    """Annotate Variable `var` with `spec` in its program, and in the default startup
    program too if that declares a variable of the same name (a parameter or optimizer
    state initialized there), so both lay it out alike."""
    set_sharding(var.desc, spec)
    var.block.program.mark_changed()
    startup = default_startup_program()
    twin = startup.global_block().find_var(var.name)
    if twin is not None and twin is not var:
        set_sharding(twin.desc, spec)
        startup.mark_changed()


def named_sharding(mesh, var_desc, shape=None):
    """The `NamedSharding` of a variable on `mesh` (replicated when it has no annotation);
    ProgramError naming the variable if an axis is not in the mesh or a split dim does not
    divide by the axis size. `shape` defaults to the declared dims."""
    spec = sharding_of(var_desc) or ()
    shape = tuple(var_desc.dims) if shape is None else tuple(shape)
    for dim, (axis, size) in enumerate(zip(spec, shape)):
        if axis is None:
            continue
        if axis not in mesh.axes:
            raise ProgramError(f"the sharding annotation {spec} names mesh axis '{axis}', "
                               f"which the mesh {mesh.axes} does not have", var=var_desc.name)
        if size >= 0 and size % mesh.axes[axis]:
            raise ProgramError(f"the sharding annotation {spec} splits dim {dim} of size {size} "
                               f"over mesh axis '{axis}' of size {mesh.axes[axis]}, which does "
                               "not divide it", var=var_desc.name)
    return NamedSharding(mesh.jax_mesh, PartitionSpec(*spec))


def is_split(var_desc):
    """Whether the variable's annotation splits any dim."""
    return bool(sharding_of(var_desc))


def replicated(mesh):
    """The replicated NamedSharding of `mesh`."""
    return NamedSharding(mesh.jax_mesh, PartitionSpec())
