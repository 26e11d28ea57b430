"""The data-parallel pass: average each parameter gradient over the devices of a mesh axis.

Every device runs the whole program on its share of the batch; inserting a
`c_allreduce` (mean) on each parameter gradient, after the backward op that
last writes it and before any optimizer op reads it, makes every device apply
the gradient of the global batch's mean loss, so the parameters stay equal.
The op is part of the description (print shows it); it lowers to `lax.pmean`
under the Executor's data-parallel mode, and is the identity on one device.
"""
from lowering import progdesc_pb2 as pb
from lowering.errors import ProgramError
from lowering.gradients import grad_name
from lowering.ops.collective import COLLECTIVE_OPS

# the axis a collective op without an axis_name attribute works over (its attr's default)
_DEFAULT_AXIS = {t: "data" if t == "c_allreduce" else "model" for t in COLLECTIVE_OPS}


def after_last_writer(block, grads, refused=None, why=""):
    """The index after the last op of `block` that writes one of the gradients `grads`;
    ProgramError naming the gradient if no op writes one, or (`why`) if an op of type
    `refused` writes one."""
    last = {}
    for i, op_desc in enumerate(block.desc.ops):
        for slot in op_desc.outputs:
            for g in slot.arguments:
                if g in grads:
                    if op_desc.type == refused:
                        raise ProgramError(why, op_type=op_desc.type, op_index=i, var=g)
                    last[g] = i
    missing = [g for g in grads if g not in last]
    if missing:
        raise ProgramError("no op writes this gradient: append the backward pass first",
                           var=missing[0])
    return max(last.values()) + 1


def all_reduce_gradients(block, params_grads, axis_name="data"):
    """Insert one `c_allreduce` (mean over `axis_name`) per gradient of [(param, grad)],
    in place (it writes the gradient variable it reads), right after the last op that
    writes any of them. Returns the inserted ops' indices. ProgramError, leaving the block
    as it was, if a gradient is already all-reduced or no op writes it."""
    grads = [g.name if hasattr(g, "name") else g for _, g in params_grads]
    at = after_last_writer(block, grads, refused="c_allreduce",
                           why="the gradient is already all-reduced (data_parallel was "
                               "applied before)")
    for k, g in enumerate(grads):
        block.insert_op(at + k, "c_allreduce", {"X": g}, {"Out": g},
                        {"reduce_type": "mean", "axis_name": axis_name}, role=pb.BACKWARD,
                        callsite="")
    return list(range(at, at + len(grads)))


def minimize_option(block, params_grads, data_parallel):
    """What `minimize(..., data_parallel=)` does with its argument: False nothing, True
    all-reduce the gradients over the "data" axis, a string over that mesh axis."""
    if data_parallel:
        all_reduce_gradients(block, params_grads,
                             "data" if data_parallel is True else data_parallel)


def data_parallel(program, axis_name="data"):
    """The pass on its own: all-reduce (mean over mesh axis `axis_name`) the gradient of
    every trainable parameter of `program` that its backward pass computed (the variables
    named '<param>@GRAD'), before the optimizer ops. `optimizer.minimize(loss,
    data_parallel=True)` does the same while it appends the backward pass. Returns the
    names of the all-reduced gradients; ProgramError if the program has no gradients."""
    block = program.global_block()
    written = {n for op_desc in block.desc.ops if op_desc.role == pb.BACKWARD
               for slot in op_desc.outputs for n in slot.arguments}
    pairs = [(p.name, grad_name(p.name)) for p in program.all_parameters()
             if not p.stop_gradient and grad_name(p.name) in written]
    if not pairs:
        raise ProgramError("the program computes no parameter gradient: append the backward "
                           "pass (or minimize) before data_parallel")
    all_reduce_gradients(block, pairs, axis_name)
    return [g for _, g in pairs]


def collective_axes(program_desc):
    """The mesh axes that ops of the program communicate over (those of `c_allreduce` ops and
    the other collectives of lowering/ops/collective.py, and of `batch_norm` ops that
    synchronise their statistics): a program with any runs under shard_map."""
    axes = set()
    for block in program_desc.blocks:
        for op_desc in block.ops:
            if op_desc.type in COLLECTIVE_OPS:
                attr = op_desc.attrs.get("axis_name")
                axes.add(attr.s if attr is not None else _DEFAULT_AXIS[op_desc.type])
            elif op_desc.type == "batch_norm" and "sync_axis" in op_desc.attrs:
                axes.add(op_desc.attrs["sync_axis"].s)
    axes.discard("")
    return axes
