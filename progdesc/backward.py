"""Compile-time autodiff over program descriptions (seeds 000 and 001).

Gradient ops are emitted by each op's registered gradient maker and appended
to the block like any other op; nothing here computes a value.
"""
import functools

from lowering import registry
from lowering import progdesc_pb2 as pb
from lowering.blocks import free_reads
from lowering.desc import FORWARD_OP, read_attrs, slot_map
from lowering.errors import BackwardError, ProgdescError
from lowering.gc_pause import gc_paused
from lowering.gradients import GradContext, OpSpec, grad_name
from progdesc.callsites import user_call


def emit_grad_ops(block, op_desc, op_index, in_grad_targets, out_grads, aliasable=frozenset(),
                  slots=None):
    """Append the gradient ops of one forward op to `block`.

    `in_grad_targets` maps (input slot, position) to the name the gradient of
    that input is written to; `out_grads` maps forward output names to the
    names of their gradients. For the keys in `aliasable`, the maker may name
    an existing variable as the gradient instead of writing the target.
    `slots` is the op's ({input slot: [names]}, {output slot: [names]}) if the
    caller has read them already. Returns ({(input slot, position): variable}
    of the aliased gradients, [OpSpec] of the ops appended).
    """
    opdef = registry.get(op_desc.type)
    if opdef.grad is None:
        raise BackwardError(f"op type '{opdef.type}' has no gradient maker",
                            op_type=opdef.type, op_index=op_index, block_idx=block.idx,
                            callsite=op_desc.callsite)
    inputs, outputs = slots or (slot_map(op_desc.inputs), slot_map(op_desc.outputs))
    g = GradContext(opdef, inputs, outputs, lambda: read_attrs(opdef, op_desc),
                    in_grad_targets=in_grad_targets, out_grads=out_grads,
                    var=block.var_type, new_name=block.program.unique_name, aliasable=aliasable,
                    sub_blocks=_SubBlocks(block) if opdef.has_blocks else None)
    try:
        opdef.grad(g)
    except BackwardError as e:
        if e.op_type is not None:
            raise
        raise BackwardError(e.detail, op_type=opdef.type, op_index=op_index, block_idx=block.idx,
                            var=e.var, callsite=op_desc.callsite) from None
    for spec in g.ops:
        try:
            _append(block, spec, op_desc.callsite, (block.idx, op_index))
        except ProgdescError as e:
            raise BackwardError(f"gradient op '{spec.type}' of this op is invalid: {e.detail}",
                                op_type=opdef.type, op_index=op_index, block_idx=block.idx,
                                var=e.var, callsite=op_desc.callsite) from None
    return g.aliases, g.ops


class _SubBlocks:
    """What the gradient maker of an op with sub-blocks in `block` uses (see GradContext)."""

    def __init__(self, block):
        self.block = block

    def backward(self, block_idx, targets, seeds, wrt, declare=(), given=(), then=()):
        """(index of a new child of `block` declaring `declare`, holding a copy of sub-block
        `block_idx` (but its ops that only write names in `given`) followed by the ops
        `then` and the gradient ops of `targets` w.r.t. `wrt`, {name in wrt: gradient name})."""
        program = self.block.program
        with program.sub_block(self.block.idx) as new:
            for name, dims, dtype in declare:
                new.create_var(name, dims, dtype)
            _copy_block(program, program.blocks[block_idx], new)
            for spec in then:
                _append(new, spec)
            grads = _grad_ops(new, list(targets), list(seeds), list(wrt), set())
            for n in wrt:
                if grads[n] is None:
                    grads[n] = program.unique_name(f"{grad_name(n)}@ZERO")
                    _append(new, OpSpec("fill_zeros_like", {"X": [n]}, {"Out": [grads[n]]}))
            given = set(given)
            kept = [i for i, d in enumerate(new.desc.ops)
                    if not given.issuperset(_outputs(d) or [None])]
            ops = [new.desc.ops[i] for i in kept]
            del new.desc.ops[:]
            new.desc.ops.extend(ops)
            _relink(program, new.idx, block_idx, len(program.blocks[block_idx].desc.ops), kept)
        return new.idx, grads

    def append(self, block_idx, spec):
        """Append the op `spec` to sub-block `block_idx`."""
        _append(self.block.program.blocks[block_idx], spec)

    def reads(self, block_idx, results):
        """The names of enclosing blocks sub-block `block_idx` reads to compute `results`."""
        return free_reads(self.block.program.desc, block_idx, results)


def _relink(program, block_idx, source_idx, n_copied, kept):
    """Point the forward-op links into block `block_idx`, whose first `n_copied` ops were copies
    of the ops of block `source_idx` and which kept its ops at indices `kept`, at the ops the
    user made: a copy's original in block `source_idx`, any other op at its new index."""
    new_index = {old: new for new, old in enumerate(kept)}
    for block in program.desc.blocks[block_idx:]:
        for op_desc in block.ops:
            if FORWARD_OP in op_desc.attrs:
                link = op_desc.attrs[FORWARD_OP].ints.values
                if link[0] == block_idx:
                    link[:] = ([source_idx, link[1]] if link[1] < n_copied
                               else [block_idx, new_index.get(link[1], -1)])


def _copy_block(program, source, target):
    """Copy the variables and ops of Block `source` into the empty Block `target`, as
    backward ops (they recompute the forward values a gradient needs); the sub-blocks
    of its ops are copied too, as new children of `target`."""
    for v in source.desc.vars:
        target.desc.vars.add().CopyFrom(v)
    for op_desc in source.desc.ops:
        copy = target.desc.ops.add()
        copy.CopyFrom(op_desc)
        copy.role = pb.BACKWARD
        for name in sorted(copy.attrs):
            attribute = copy.attrs[name]
            which = attribute.WhichOneof("value")
            if which == "block_idx":
                attribute.block_idx = _copy_sub_block(program, attribute.block_idx, target)
            elif which == "blocks_idx":
                attribute.blocks_idx.values[:] = [_copy_sub_block(program, i, target)
                                                  for i in attribute.blocks_idx.values]
    target.sync()


def _copy_sub_block(program, block_idx, parent):
    child = program.create_block(parent_idx=parent.idx)
    _copy_block(program, program.blocks[block_idx], child)
    return child.idx


def _append(block, spec, callsite="", forward_op=None):
    """Append the gradient op `spec`; `forward_op` is the (block, index) of the op it is a
    gradient of."""
    desc = block.append_op(spec.type, spec.inputs, spec.outputs, spec.attrs,
                           role=pb.BACKWARD, callsite=callsite).desc
    if forward_op is not None:
        desc.attrs[FORWARD_OP].ints.values[:] = forward_op


def _outputs(op_desc):
    return [n for s in op_desc.outputs for n in s.arguments]


def _diff_inputs(op_type, inputs):
    """(slot, position, name) of the {slot: [names]} `inputs` bound to slots that may
    receive gradients."""
    diff = registry.get(op_type).differentiable_inputs
    return [(slot, i, n) for slot, names in inputs.items() if slot in diff
            for i, n in enumerate(names)]


_FLOAT_DTYPES = frozenset(("float16", "bfloat16", "float32", "float64"))


def _unique_grad_name(block, name):
    base = grad_name(name)
    candidate, k = base, 1
    while block.find_var(candidate) is not None:
        candidate, k = f"{base}_{k}", k + 1
    return candidate


def _grad_ops(block, targets, target_grads, inputs, no_grad_set):
    """Append gradient ops of `targets` w.r.t. `inputs`; returns {input name: grad name}."""
    with gc_paused():
        return _append_grad_ops(block, targets, target_grads, inputs, no_grad_set)


def _append_grad_ops(block, targets, target_grads, inputs, no_grad_set):
    ops = list(block.desc.ops)
    n_forward = len(ops)
    requested = set(inputs)
    blocked = set(no_grad_set)
    flows = {}

    def flows_into(name):
        if name not in flows:
            v = block.find_var(name)
            flows[name] = name not in blocked and (name in requested or (
                v is not None and not v.stop_gradient and v.dtype in _FLOAT_DTYPES))
        return flows[name]

    slots = [(slot_map(d.inputs), slot_map(d.outputs)) for d in ops]
    diff_inputs = [_diff_inputs(d.type, ins) for d, (ins, _) in zip(ops, slots)]
    outputs = [[n for names in outs.values() for n in names] for _, outs in slots]
    depends = {n for n in requested if n not in blocked}
    for outs, diff in zip(outputs, diff_inputs):
        if any(n in depends and flows_into(n) for _, _, n in diff):
            depends.update(n for n in outs if flows_into(n))
    needed = {t for t in targets if t in depends}
    relevant = []
    for idx in range(n_forward - 1, -1, -1):
        if any(n in needed for n in outputs[idx]):
            relevant.append(idx)
            needed.update(n for _, _, n in diff_inputs[idx] if n in depends)

    # how many gradient contributions each variable receives
    consumers = {}
    for t in targets:
        consumers[t] = consumers.get(t, 0) + 1
    for idx in relevant:
        for _, _, n in diff_inputs[idx]:
            if n in needed and flows_into(n):
                consumers[n] = consumers.get(n, 0) + 1

    contributions, final, appended = {}, {}, []

    def contribution_name(var):
        if consumers.get(var, 0) <= 1:
            return _unique_grad_name(block, var)
        return block.program.unique_name(f"{grad_name(var)}@RENAME")

    def finalize(var):
        if var in final:
            return final[var]
        names = contributions.get(var)
        if not names:
            return None
        if len(names) == 1:
            final[var] = names[0]
        else:
            out = _unique_grad_name(block, var)
            appended.append(OpSpec("sum", {"X": names}, {"Out": [out]}))
            _append(block, appended[-1])
            final[var] = out
        return final[var]

    for t, seed in zip(targets, target_grads):
        if t not in depends:
            continue
        if seed is None:
            seed = _ones_like(block, t, appended)
        contributions.setdefault(t, []).append(seed)
    for idx in relevant:
        op_desc = ops[idx]
        out_grads = {}
        for n in outputs[idx]:
            g = finalize(n) if n in depends else None
            if g is not None:
                out_grads[n] = g
        if not out_grads:
            continue
        in_targets, aliasable = {}, set()
        for slot, i, n in diff_inputs[idx]:
            if n in needed and flows_into(n):
                in_targets[(slot, i)] = contribution_name(n)
                if n not in requested:   # requested gradients keep their conventional names
                    aliasable.add((slot, i))
        if not in_targets:
            continue
        aliases, specs = emit_grad_ops(block, op_desc, idx, in_targets, out_grads, aliasable,
                                       slots[idx])
        appended.extend(specs)
        # a maker may leave a wanted input without a gradient (mode_select's value not
        # taken): no gradient flows into it from this op
        written = {a for spec in specs for names in spec.outputs.values()
                   for a in ([names] if isinstance(names, str) else names)}
        for slot, i, n in diff_inputs[idx]:
            name = in_targets.get((slot, i))
            if (slot, i) in aliases:
                contributions.setdefault(n, []).append(aliases[(slot, i)])
            elif name is not None and name in written:
                contributions.setdefault(n, []).append(name)
    result = {n: finalize(n) for n in inputs}
    _prune(block, n_forward, appended, {g for g in result.values() if g})
    return result


def _ones_like(block, name, appended):
    var = block.var(name)
    out = _unique_grad_name(block, name)
    if all(d >= 0 for d in var.shape):
        appended.append(OpSpec("fill_constant", {}, {"Out": [out]},
                               {"shape": list(var.shape), "dtype": var.dtype, "value": 1.0}))
    else:
        zeros = block.program.unique_name("fill_zeros_like.grad")
        appended.append(OpSpec("fill_zeros_like", {"X": [name]}, {"Out": [zeros]}))
        _append(block, appended[-1])
        appended.append(OpSpec("scale", {"X": [zeros]}, {"Out": [out]},
                               {"scale": 1.0, "bias": 1.0}))
    _append(block, appended[-1])
    return out


def _prune(block, start, appended, keep):
    """Drop the gradient ops `appended` from index `start` on whose results nothing needs,
    and their variables."""
    assert len(block.desc.ops) == start + len(appended), "gradient ops appended elsewhere"
    needed, drop = set(keep), []
    for j in range(len(appended) - 1, -1, -1):
        spec = appended[j]
        if any(n in needed for names in spec.outputs.values() for n in names):
            for names in spec.inputs.values():
                needed.update(names)
        else:
            drop.append(start + j)
    if not drop:
        return
    dead = {n for idx in drop for n in _outputs(block.desc.ops[idx])}
    for idx in drop:  # descending, so earlier indices stay valid
        del block.desc.ops[idx]
    dead -= {n for op_desc in block.desc.ops for s in op_desc.outputs for n in s.arguments}
    for idx in range(len(block.desc.vars) - 1, -1, -1):
        if block.desc.vars[idx].name in dead:
            del block.desc.vars[idx]
    block.sync()


def _var_name(block, target, what):
    from progdesc.framework import Variable
    name = target.name if isinstance(target, Variable) else target
    if not isinstance(name, str) or block.find_var(name) is None:
        raise BackwardError(f"{what} is not a variable of this program", var=str(name))
    if what == "loss" and not any(name in _outputs(d) for d in reversed(block.desc.ops)):
        raise BackwardError("no op of the program computes the loss", var=name)
    return name


def _names_the_call(fn):
    """`fn`, its BackwardErrors that name no op naming the user's call ('minimize called at
    train.py:9')."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except BackwardError as e:
            if e.callsite or e.during:
                raise
            raise BackwardError(e.detail, op_type=e.op_type, op_index=e.op_index,
                                block_idx=e.block_idx, var=e.var, slot=e.slot,
                                during=user_call() or None) from None
    return call


@_names_the_call
def append_backward(loss, parameter_list=None, no_grad_set=None):
    """Append the gradient ops of scalar `loss` w.r.t. trainable parameters.

    `parameter_list` limits the parameters (Variables or names; default:
    every parameter that is not stop_gradient); `no_grad_set` names
    variables gradients must not flow through. Returns
    [(parameter, gradient Variable)] for every parameter the loss depends on.
    """
    from progdesc.framework import Variable
    if not isinstance(loss, Variable):
        raise BackwardError("append_backward expects the loss Variable", var=str(loss))
    block = loss.block
    name = _var_name(block, loss, "loss")
    if any(d != 1 for d in loss.shape):
        raise BackwardError(f"loss must be a scalar (shape [] or [1]), got shape "
                            f"{list(loss.shape)}; reduce it with mean or reduce_sum", var=name)
    if parameter_list is None:
        params = [v.name for v in block.program.all_parameters() if not v.stop_gradient]
    else:
        params = [_var_name(block, p, "parameter") for p in parameter_list]
    if not params:
        raise BackwardError("the program has no trainable parameter to differentiate", var=name)
    no_grad = {_var_name(block, v, "no_grad_set entry") for v in (no_grad_set or ())}
    grads = _grad_ops(block, [name], [None], params, no_grad)
    pairs = [(block.var(p), block.var(g)) for p, g in grads.items() if g is not None]
    if not pairs:
        raise BackwardError("the loss does not depend on any trainable parameter", var=name)
    return pairs


@_names_the_call
def gradients(targets, inputs, target_gradients=None, no_grad_set=None):
    """Append ops computing d(sum of targets)/d(inputs); returns one Variable (or None) per input.

    `target_gradients` gives the gradient flowing into each target (default
    ones). Works on programs that already hold gradient ops, so calling it
    on its own results gives second-order gradients.
    """
    from progdesc.framework import Variable
    targets = list(targets) if isinstance(targets, (list, tuple)) else [targets]
    inputs = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
    if not targets or not isinstance(targets[0], Variable):
        raise BackwardError("gradients expects target Variables")
    block = targets[0].block
    t_names = [_var_name(block, t, "target") for t in targets]
    in_names = [_var_name(block, v, "input") for v in inputs]
    if target_gradients is None:
        seeds = [None] * len(t_names)
    else:
        seeds = [None if g is None else _var_name(block, g, "target gradient")
                 for g in (target_gradients if isinstance(target_gradients, (list, tuple))
                           else [target_gradients])]
        if len(seeds) != len(t_names):
            raise BackwardError(f"{len(seeds)} target gradients for {len(t_names)} targets")
    no_grad = {_var_name(block, v, "no_grad_set entry") for v in (no_grad_set or ())}
    grads = _grad_ops(block, t_names, seeds, in_names, no_grad)
    return [block.var(grads[n]) if grads.get(n) else None for n in in_names]
