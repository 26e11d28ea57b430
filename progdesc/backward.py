"""Compile-time autodiff over program descriptions (seeds 000 and 001).

Gradient ops are emitted by each op's registered gradient maker and appended
to the block like any other op; nothing here computes a value.
"""
from lowering import registry
from lowering import progdesc_pb2 as pb
from lowering.desc import read_attrs, slot_map
from lowering.errors import BackwardError, ProgdescError
from lowering.gradients import GradContext


def emit_grad_ops(block, op_desc, op_index, in_grad_targets, out_grads):
    """Append the gradient ops of one forward op to `block`; returns the Operators appended.

    `in_grad_targets` maps (input slot, position) to the name the gradient of
    that input is written to; `out_grads` maps forward output names to the
    names of their gradients.
    """
    opdef = registry.get(op_desc.type)
    if opdef.grad is None:
        raise BackwardError(f"op type '{opdef.type}' has no gradient maker",
                            op_type=opdef.type, op_index=op_index, block_idx=block.idx,
                            callsite=op_desc.callsite)
    names = block.program._names

    def var(name):
        v = block.var(name)
        return v.shape, v.dtype

    g = GradContext(opdef, slot_map(op_desc.inputs), slot_map(op_desc.outputs),
                    read_attrs(opdef, op_desc), in_grad_targets=in_grad_targets,
                    out_grads=out_grads, var=var, new_name=lambda hint: names(hint))
    opdef.grad(g)
    appended = []
    for spec in g.ops:
        try:
            appended.append(block.append_op(spec.type, spec.inputs, spec.outputs, spec.attrs,
                                            role=pb.BACKWARD, callsite=op_desc.callsite))
        except ProgdescError as e:
            raise BackwardError(f"gradient op '{spec.type}' of this op is invalid: {e.detail}",
                                op_type=opdef.type, op_index=op_index, block_idx=block.idx,
                                var=e.var, callsite=op_desc.callsite) from None
    return appended
