"""What a gradient maker sees: one forward op, and a way to emit gradient ops.

A gradient maker is a function `maker(g)` registered next to its op
(`@opdef.gradient`). It reads the forward op through `g` and emits the ops
that compute the gradients of the op's inputs from the gradients of its
outputs, as `OpSpec`s: plain descriptions that the backward pass appends to
the program like any other op. It never computes anything itself.

    @matmul.gradient
    def _(g):
        dout = g.out_grad("Out")
        g.call("matmul", dout, g.input("Y"), transpose_y=True, out=g.in_grad("X"))
        ...
"""
from dataclasses import dataclass, field

from lowering import registry

GRAD_SUFFIX = "@GRAD"


def grad_name(name):
    """The conventional name of the gradient of variable `name`."""
    return name + GRAD_SUFFIX


@dataclass
class OpSpec:
    """An op to append: type, {slot: [names]} inputs and outputs, attributes."""
    type: str
    inputs: dict
    outputs: dict
    attrs: dict = field(default_factory=dict)


class GradContext:
    """The forward op seen by a gradient maker, and the gradient ops it emitted.

    `in_grad_targets` maps (input slot, position) to the variable name that
    the gradient of that input must be written to, for wanted inputs only;
    `out_grads` maps forward output variable names to their gradient names,
    for outputs that have one. `attrs` is the forward op's {name: value}, or a
    function returning it, called the first time a maker reads an attribute.
    `var(name)` returns (dims, dtype name). `aliasable` holds the (slot,
    position) keys whose gradient `pass_through` may alias to an existing
    variable instead of copying it; `aliases` maps those keys to the variable
    each one was aliased to. `sub_blocks` (for ops with sub-blocks) provides
    `backward(block_idx, targets, seeds, wrt, declare, given, then)`, `reads(block_idx,
    results)` and `append(block_idx, spec)`, see `backward_block`, `block_reads`
    and `block_call`.
    """

    def __init__(self, opdef, inputs, outputs, attrs, *, in_grad_targets, out_grads,
                 var, new_name, aliasable=frozenset(), sub_blocks=None):
        self.opdef = opdef
        self.inputs = inputs
        self.outputs = outputs
        self._attrs = attrs
        self._targets = in_grad_targets
        self._wanted_slots = {slot for slot, _ in in_grad_targets}
        self._out_grads = dict(out_grads)
        self._var = var
        self._new_name = new_name
        self._aliasable = aliasable
        self._sub_blocks = sub_blocks
        self.aliases = {}
        self.ops = []

    # --- reading the forward op ---
    def input(self, slot):
        """The variable bound to a single-variable input slot (None if unbound)."""
        names = self.inputs.get(slot, [])
        return names[0] if names else None

    def input_list(self, slot):
        """The variables bound to an input slot."""
        return list(self.inputs.get(slot, []))

    def output(self, slot):
        """The variable bound to a single-variable output slot (None if unbound)."""
        names = self.outputs.get(slot, [])
        return names[0] if names else None

    def output_list(self, slot):
        """The variables bound to an output slot."""
        return list(self.outputs.get(slot, []))

    @property
    def attrs(self):
        """{name: value} of the forward op's attributes."""
        if callable(self._attrs):
            self._attrs = self._attrs()
        return self._attrs

    def attr(self, name):
        """A forward attribute's value."""
        return self.attrs[name]

    def var(self, name):
        """(dims, dtype name) of a forward variable."""
        return self._var(name)

    # --- gradients in and out ---
    def out_grad(self, slot, index=0):
        """Gradient of an output; a zero-filled one is emitted if none flows back."""
        name = self.outputs[slot][index]
        if name not in self._out_grads:
            self._out_grads[name] = self.call("fill_zeros_like", name, out=self.tmp(grad_name(name)))
        return self._out_grads[name]

    def has_out_grad(self, slot, index=0):
        """Whether a gradient flows back into this output."""
        names = self.outputs.get(slot, [])
        return index < len(names) and names[index] in self._out_grads

    def in_grad(self, slot, index=0):
        """Name to write the gradient of an input to, or None if it is not wanted."""
        return self._targets.get((slot, index))

    def in_grad_list(self, slot):
        """`in_grad` for each variable of a many-input slot."""
        return [self.in_grad(slot, i) for i in range(len(self.inputs.get(slot, [])))]

    def wants(self, slot):
        """Whether any variable of an input slot needs its gradient."""
        return slot in self._wanted_slots

    def pass_through(self, slot, grad, index=0):
        """Make `grad` (same shape and dtype) the gradient of an input, if it is wanted.

        The input's gradient becomes `grad` itself where the backward pass allows
        it (intermediate variables), and an `assign` copy of it otherwise.
        """
        key = (slot, index)
        target = self._targets.get(key)
        if target is None:
            return
        if key in self._aliasable:
            self.aliases[key] = grad
        else:
            self.call("assign", grad, out=target)

    # --- sub-blocks ---
    def backward_block(self, block_idx, targets, seeds, wrt, declare=(), given=(), then=()):
        """Differentiate sub-block `block_idx` with the backward pass of the global block.

        Makes a new sub-block (a child of the block the gradient ops go to)
        declaring `declare` ([(name, dims, dtype name)]: what a scan binds in
        it), holding a copy of the sub-block's ops, recomputed there, then the
        gradient ops of `targets` (its result names) seeded with `seeds` (names
        visible from the new block) w.r.t. `wrt`. The copied ops that write
        only names in `given` (values the op binds in the new block: a scan's
        saved step values) are dropped again once differentiated. `then` ([OpSpec])
        are appended to the copy before differentiating it (a bounded while's mask). Returns (the
        new block's index, {name in wrt: its gradient's name}); a name the
        targets do not depend on gets zeros.
        """
        return self._sub_blocks.backward(block_idx, targets, seeds, wrt, declare, given, then)

    def block_call(self, block_idx, op_type, *args, **attrs):
        """Like `call`, but append the op to sub-block `block_idx` at once."""
        opdef = registry.get(op_type)
        out = self._new_name(f"{op_type}.grad")
        inputs = {slot.name: _as_list(arg) for slot, arg in zip(opdef.inputs, args)
                  if arg is not None}
        self._sub_blocks.append(block_idx, OpSpec(op_type, inputs,
                                                  {opdef.outputs[0].name: [out]}, attrs))
        return out

    def block_reads(self, block_idx, results):
        """The variables of enclosing blocks a sub-block reads to compute `results`."""
        return self._sub_blocks.reads(block_idx, results)

    # --- emitting ops ---
    def tmp(self, hint="tmp"):
        """A fresh variable name."""
        return self._new_name(hint)

    def op(self, op_type, inputs, outputs, **attrs):
        """Emit an op with explicit {slot: name or [names]} inputs and outputs."""
        spec = OpSpec(op_type, _slot_lists(inputs), _slot_lists(outputs), attrs)
        self.ops.append(spec)
        return spec

    def call(self, op_type, *args, out=None, **attrs):
        """Emit a single-output op, binding `args` to its input slots in order.

        Returns the output variable's name (`out` if given, else a fresh one).
        """
        opdef = registry.get(op_type)
        if len(opdef.outputs) != 1:
            raise ValueError(f"g.call: '{op_type}' has several outputs; use g.op")
        out = out or self._new_name(f"{op_type}.grad")
        inputs = {}
        for slot, arg in zip(opdef.inputs, args):
            if arg is not None:
                inputs[slot.name] = [arg] if arg.__class__ is str else _as_list(arg)
        self.ops.append(OpSpec(op_type, inputs, {opdef.outputs[0].name: [out]}, attrs))
        return out


def _as_list(value):
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _slot_lists(bound):
    """{slot: [names]} of {slot: name, [names] or None}, unbound slots left out."""
    return {k: _as_list(v) for k, v in bound.items() if v is not None}
