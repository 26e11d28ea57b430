"""Collectives across the devices of a mesh axis: `c_allreduce`, and the size of a mesh axis
and a device's index along it (`c_axis_size`, `c_axis_index`); and those of tensor parallel
layers (`c_identity`, `mp_allreduce_sum`, `c_concat`, `c_split`, `c_embedding`).

A collective names a mesh axis (e.g. "data"). Inside `shard_map` over that axis
(the Executor's data-parallel mode, progdesc.distributed) it lowers to
`lax.psum` / `lax.pmean` / `lax.pmax` / `lax.pmin`. Anywhere else the axis is
not bound and the program runs on one device, an axis of size 1: the reduction
of one value is that value, so the op is the identity. A data-parallel program
therefore also runs, unchanged and with the same results, on a single device.

Devices communicate only through these ops: a gradient op lowered through
`jax.vjp` uses `local_vjp`, so that inside shard_map it computes each device's
own partial gradient rather than one JAX sums over the devices.
"""
import jax
import jax.numpy as jnp
from jax import lax

from lowering.errors import BackwardError, ProgramError
from lowering.constraints import one_of
from lowering import dtypes
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


def varying_axes(x):
    """The mapped axes over which traced value `x` may differ between devices (inside
    shard_map; an empty set anywhere else)."""
    aval = jax.typeof(x)
    vma = getattr(aval, "vma", None)
    if vma is None:
        mat = getattr(aval, "manual_axis_type", None)
        vma = mat.varying if mat is not None else ()
    return frozenset(vma)


def local_vjp(fn, primals, cotangent):
    """`jax.vjp(fn, *primals)` applied to `cotangent`, as one device's partial gradients.

    Inside shard_map, JAX's transpose of using a replicated value (a parameter) in a
    per-device computation sums its gradient over the devices. A gradient op of
    progdesc computes each device's own part and leaves communication to explicit
    `c_allreduce` ops, so every primal is first marked as varying over the axes that
    any input varies over. Anywhere else this is `jax.vjp`. Gradient ops lowered
    through `jax.vjp` use this. None primals pass through.
    """
    axes = frozenset().union(*(varying_axes(v) for v in (*primals, cotangent)
                               if v is not None))
    if axes:
        primals = tuple(v if v is None else _vary(v, axes) for v in primals)
    _, vjp = jax.vjp(fn, *primals)
    return vjp(cotangent)


def _vary(x, axes):
    missing = tuple(sorted(axes - varying_axes(x)))
    return lax.pcast(x, missing, to="varying") if missing else x


@op("c_allreduce", inputs=[In("X", "number")], outputs=[Out("Out")],
    attrs={"reduce_type": Attr("reduce_type", "string", "mean", "sum, mean, max or min",
                               where=one_of("sum", "mean", "max", "min")),
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


@op("c_axis_size", inputs=[], outputs=[Out("Out")],
    attrs={"axis_name": Attr("axis_name", "string", "data", "the mesh axis"),
           "dtype": Attr("dtype", "dtype", "int32", "the result's dtype")},
    differentiable=False)
def c_axis_size(*, axis_name, dtype):
    """Out = the number of devices along mesh axis `axis_name` (a scalar); 1 where the axis
    is not mapped (one device)."""
    size = lax.axis_size(axis_name) if axis_bound(axis_name) else 1
    return jax.numpy.asarray(size, dtypes.to_numpy(dtype))


@op("c_axis_index", inputs=[], outputs=[Out("Out")],
    attrs={"axis_name": Attr("axis_name", "string", "data", "the mesh axis")},
    differentiable=False)
def c_axis_index(*, axis_name):
    """Out = this device's index along mesh axis `axis_name` (an int32 scalar); 0 where the
    axis is not mapped (one device)."""
    if axis_bound(axis_name):
        return lax.axis_index(axis_name).astype("int32")
    return jax.numpy.zeros((), "int32")


# --- tensor parallel (Megatron's layout): the collectives of a layer split over a mesh axis ---
#
# A layer split over the "model" axis holds a slice of its weights on each device of that
# axis. Values that every device of the axis holds whole (replicated) have the same value
# and the same gradient on each; split values hold this device's slice. These ops move
# between the two, and are the identity on one device (where the axis is not mapped), so a
# tensor-parallel program also runs unchanged there.

_MODEL_AXIS = Attr("axis_name", "string", "model", "the mesh axis the layer is split over")


@op("c_identity", inputs=[In("X", "float")], outputs=[Out("Out")],
    attrs={"axis_name": _MODEL_AXIS})
def c_identity(X, *, axis_name):
    """Out = X: a replicated value entering a layer split over `axis_name` (Megatron's `f`).
    Its gradient adds up the partial gradients of the devices of the axis
    (`mp_allreduce_sum`)."""
    return X


@c_identity.gradient
def _(g):
    g.call("mp_allreduce_sum", g.out_grad("Out"), axis_name=g.attr("axis_name"),
           out=g.in_grad("X"))


@op("mp_allreduce_sum", inputs=[In("X", "float")], outputs=[Out("Out")],
    attrs={"axis_name": _MODEL_AXIS})
def mp_allreduce_sum(X, *, axis_name):
    """Out = the sum of X over the devices of `axis_name`: the partial results of a layer
    split over the axis made whole (Megatron's `g`). Unlike `c_allreduce`, its gradient is
    the identity (`c_identity`): the gradient of a replicated value is the same on every
    device. X itself where the axis is not mapped."""
    return all_reduce(X, "sum", axis_name)


@mp_allreduce_sum.gradient
def _(g):
    g.call("c_identity", g.out_grad("Out"), axis_name=g.attr("axis_name"), out=g.in_grad("X"))


@op("c_concat", inputs=[In("X", "float")], outputs=[Out("Out")],
    attrs={"axis_name": _MODEL_AXIS})
def c_concat(X, *, axis_name):
    """Out = the slices X of the devices of `axis_name` concatenated along the last dim, in
    device order (an all-gather): a value split over the axis made whole on every device.
    X itself where the axis is not mapped."""
    if not axis_bound(axis_name):
        return X
    # each slice in its place among zeros, summed: the whole value, exactly, and a value
    # JAX knows every device holds alike (all_gather's is typed as varying over the axis)
    part = X.shape[-1]
    whole = jnp.zeros((*X.shape[:-1], part * lax.axis_size(axis_name)), X.dtype)
    mine = lax.dynamic_update_slice_in_dim(whole, X, lax.axis_index(axis_name) * part,
                                           axis=X.ndim - 1)
    return lax.psum(mine, axis_name)


@c_concat.gradient
def _(g):
    g.call("c_split", g.out_grad("Out"), axis_name=g.attr("axis_name"), out=g.in_grad("X"))


@op("c_split", inputs=[In("X", "float")], outputs=[Out("Out")],
    attrs={"axis_name": _MODEL_AXIS})
def c_split(X, *, axis_name):
    """Out = this device's slice of X along the last dim, the i-th of `axis size` equal
    parts on the device of index i along `axis_name`: a replicated value split over the
    axis. X itself where the axis is not mapped."""
    if not axis_bound(axis_name):
        return X
    size = lax.axis_size(axis_name)
    if X.shape[-1] % size:
        raise ProgramError(f"c_split: the last dim {X.shape[-1]} does not divide by the "
                           f"{size} devices of mesh axis '{axis_name}'")
    part = X.shape[-1] // size
    return lax.dynamic_slice_in_dim(X, lax.axis_index(axis_name) * part, part, axis=X.ndim - 1)


@c_split.gradient
def _(g):
    g.call("c_concat", g.out_grad("Out"), axis_name=g.attr("axis_name"), out=g.in_grad("X"))


def _vocab_slice(W, Ids, axis_name):
    """(ids local to this device's rows of the table, mask of the ids it holds)."""
    start = 0
    if axis_bound(axis_name):
        start = lax.axis_index(axis_name) * W.shape[0]
    local = Ids - start
    held = (local >= 0) & (local < W.shape[0])
    return jnp.where(held, local, 0), held


@op("c_embedding", inputs=[In("W", "float", doc="this device's rows [V / n, D]"),
                           In("Ids", "int", doc="in [0, V)")],
    outputs=[Out("Out")], attrs={"axis_name": _MODEL_AXIS})
def c_embedding(W, Ids, *, axis_name):
    """Out = the rows of a vocabulary split over `axis_name` at Ids, zero for the ids
    another device holds: device i holds rows [i * V/n, (i + 1) * V/n) of the table. Summed
    over the axis (`mp_allreduce_sum`) it is the lookup in the whole table; on one device
    it is that lookup."""
    local, held = _vocab_slice(W, Ids, axis_name)
    return jnp.where(held[..., None], W[local], jnp.zeros((), W.dtype))


@c_embedding.gradient
def _(g):
    g.call("c_embedding_grad", g.input("W"), g.input("Ids"), g.out_grad("Out"),
           axis_name=g.attr("axis_name"), out=g.in_grad("W"))


@op("c_embedding_grad",
    inputs=[In("W", differentiable=False, doc="only its shape is used"), In("Ids", "int"),
            In("OutGrad", "float")],
    outputs=[Out("Out")], attrs={"axis_name": _MODEL_AXIS})
def c_embedding_grad(W, Ids, OutGrad, *, axis_name):
    """Gradient of c_embedding's W: the rows of OutGrad at the ids this device holds, added
    up into its rows of the table (zeros shaped like W)."""
    local, held = _vocab_slice(W, Ids, axis_name)
    rows = jnp.where(held[..., None], OutGrad, jnp.zeros((), OutGrad.dtype))
    return jnp.zeros(W.shape, OutGrad.dtype).at[local].add(rows)


@c_embedding_grad.gradient
def _(g):
    g.call("c_embedding", g.out_grad("Out"), g.input("Ids"), axis_name=g.attr("axis_name"),
           out=g.in_grad("OutGrad"))


COLLECTIVE_OPS = ("c_allreduce", "c_identity", "mp_allreduce_sum", "c_concat", "c_split",
                  "c_embedding", "c_embedding_grad")
"""Op types that communicate over (or depend on their place along) the mesh axis their
`axis_name` names: a program with any runs under shard_map (progdesc.distributed.run)."""
# --- pipeline parallel (progdesc/distributed/pipeline): stage-to-stage transfers ---

@op("c_ppermute", inputs=[In("X")], outputs=[Out("Out")],
    attrs={"axis_name": Attr("axis_name", "string", "pipe", "the mesh axis of the stages"),
           "shift": Attr("shift", "int", 1, "how many stages on the value moves (negative: "
                         "back, as gradients do)")})
def c_ppermute(X, *, axis_name, shift):
    """Out = the X of the device `shift` places before this one along mesh axis `axis_name`
    (device i receives from device i - shift; a device with no such sender receives zeros):
    the transfer of an activation to the next pipeline stage (shift 1), or of its gradient
    back (shift -1). The identity where the axis is not mapped (one device holds every
    stage). The pipeline Executor (progdesc/distributed/pipeline) runs each stage on its
    own device and makes the transfer a device-to-device copy."""
    if not axis_name or not axis_bound(axis_name):
        return X
    n = lax.axis_size(axis_name)
    perm = [(i, i + shift) for i in range(n) if 0 <= i + shift < n]
    return lax.ppermute(X, axis_name, perm)


@c_ppermute.gradient
def _(g):
    # the value went `shift` stages on; its cotangent goes the same way back
    g.call("c_ppermute", g.out_grad("Out"), axis_name=g.attr("axis_name"),
           shift=-g.attr("shift"), out=g.in_grad("X"))


@op("pipeline_schedule", inputs=[], outputs=[Out("Out")],
    attrs={"stages": Attr("stages", "int", 1, "how many pipeline stages"),
           "micro_batches": Attr("micro_batches", "int", 1,
                                 "how many micro-batches each fed batch is split into"),
           "schedule": Attr("schedule", "string", "gpipe", "gpipe or 1f1b",
                            where=one_of("gpipe", "1f1b")),
           "axis_name": Attr("axis_name", "string", "pipe", "the mesh axis of the stages")},
    differentiable=False)
def pipeline_schedule(*, stages, micro_batches, schedule, axis_name):
    """Out = `micro_batches` (an int32 scalar). The op states the pipeline a program runs
    as (the pass `progdesc.distributed.pipeline` puts it first): `stages` stages along mesh
    axis `axis_name`, each fed batch split into `micro_batches`, ordered by `schedule`.
    Nothing reads its output; on one device the program runs whole, as one batch."""
    return jax.numpy.asarray(micro_batches, "int32")
