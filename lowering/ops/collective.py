"""Collectives across the devices of a mesh axis: `c_allreduce`.

A collective names a mesh axis (e.g. "data"). Inside `shard_map` over that axis
(the Executor's data-parallel mode, progdesc.distributed) it lowers to
`lax.psum` / `lax.pmean` / `lax.pmax` / `lax.pmin`. Anywhere else the axis is
not bound and the program runs on one device, an axis of size 1: the reduction
of one value is that value, so the op is the identity. A data-parallel program
therefore also runs, unchanged and with the same results, on a single device.
"""
from jax import lax

from lowering.errors import BackwardError, ProgramError
from lowering.registry import Attr, In, Out, op

_REDUCTIONS = {"sum": lax.psum, "mean": lax.pmean, "max": lax.pmax, "min": lax.pmin}


def axis_bound(axis_name):
    """Whether `axis_name` is a mapped axis of the trace being built (inside shard_map)."""
    try:
        lax.axis_size(axis_name)
    except NameError:
        return False
    return True


def all_reduce(x, reduce_type, axis_name):
    """`x` reduced over the devices of mesh axis `axis_name`; `x` itself if it is unbound."""
    if reduce_type not in _REDUCTIONS:
        raise ProgramError(f"reduce_type must be one of {', '.join(_REDUCTIONS)}, "
                         f"got {reduce_type!r}")
    if not axis_name or not axis_bound(axis_name):
        return x
    return _REDUCTIONS[reduce_type](x, axis_name)


@op("c_allreduce", inputs=[In("X", "number")], outputs=[Out("Out")],
    attrs={"reduce_type": Attr("reduce_type", "string", "mean", "sum, mean, max or min"),
           "axis_name": Attr("axis_name", "string", "data", "the mesh axis reduced over")})
def c_allreduce(X, *, reduce_type, axis_name):
    """Out = X reduced elementwise over the devices of mesh axis `axis_name` (every device
    gets the result); the identity where the axis is not mapped (one device)."""
    return all_reduce(X, reduce_type, axis_name)


@c_allreduce.gradient
def _(g):
    reduce_type = g.attr("reduce_type")
    if reduce_type not in ("sum", "mean"):
        raise BackwardError(f"c_allreduce with reduce_type '{reduce_type}' has no gradient "
                            "(only sum and mean do)")
    # each device's output depends on every device's input: the cotangents add up the same way
    g.call("c_allreduce", g.out_grad("Out"), reduce_type=reduce_type,
           axis_name=g.attr("axis_name"), out=g.in_grad("X"))
