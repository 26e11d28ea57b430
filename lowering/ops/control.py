"""Control flow: ops that run sub-blocks (cond, switch, scan).

A sub-block is a block of the program whose parent is the block of its op. It
reads variables of enclosing blocks only through the op's inputs (`Input`: the
captures the builder lists) and writes only its own variables; the names it
hands back are attributes of the op (`true_outputs`, `carry_out`, ...) and
their values become the op's outputs. The lowering pass gives each lowering
rule below its sub-blocks as `lowering.lower.SubBlock` functions, lowered by
the pass itself inside `lax.cond` / `lax.switch` / `lax.scan`.

The gradient of an op with sub-blocks is the same op over gradient sub-blocks:
`g.backward_block` differentiates a sub-block with the backward pass that
differentiates the global block, in a new sub-block that recomputes the
forward ops it needs (a copy of them) and then runs their gradient ops.
"""
import jax
import jax.numpy as jnp
from jax import lax

from lowering import dtypes
from lowering.blocks import check_sub_block, var_type
from lowering.errors import ShapeError
from lowering.registry import Attr, In, Out, op


def _scalar_dims(dims):
    return tuple(dims) in ((), (1,))


def _types(program_desc, block_idx, names, what):
    """[(dims, dtype name)] of `names` as sub-block `block_idx` sees them."""
    out = []
    for n in names:
        t = var_type(program_desc, block_idx, n)
        if t is None:
            raise ShapeError(f"{what} '{n}' is not a variable of sub-block {block_idx} or of "
                             "an enclosing block", var=n)
        out.append((list(t[0]), dtypes.name_of(t[1])))
    return out


def _branch_types(program_desc, block_idx, branches, labels):
    """The (dims, dtype name) of each output, checked to agree across `branches`
    ([(sub-block index, [result names])], named by `labels`)."""
    for sub, _ in branches:
        check_sub_block(program_desc, sub, block_idx, "branch")
    counts = {len(results) for _, results in branches}
    if len(counts) > 1:
        raise ShapeError("branches hand back different numbers of outputs: " + ", ".join(
            f"{label} {len(r)}" for label, (_, r) in zip(labels, branches)))
    typed = [_types(program_desc, sub, results, f"{label} output")
             for label, (sub, results) in zip(labels, branches)]
    for i, first in enumerate(typed[0]):
        for label, other, (_, results) in zip(labels[1:], typed[1:], branches[1:]):
            if other[i] != first:
                raise ShapeError(
                    f"output {i}: the {labels[0]} gives {first[1]}{first[0]} "
                    f"('{branches[0][1][i]}') but the {label} gives {other[i][1]}{other[i][0]} "
                    f"('{results[i]}'); every branch must hand back the same shapes and dtypes",
                    var=results[i])
    return {"Out": [(tuple(d), t) for d, t in typed[0]]}


def _grad_of_branches(g, branches):
    """Emit the gradient of a cond/switch: the same op over the backward of each branch.

    Returns (gradient sub-block indices, [their result names], captured inputs,
    gradient targets) for the caller to emit the op with.
    """
    outs = g.output_list("Out")
    with_grad = [i for i in range(len(outs)) if g.has_out_grad("Out", i)]
    seeds = [g.out_grad("Out", i) for i in with_grad]
    inputs = g.input_list("Input")
    wanted = [i for i, t in enumerate(g.in_grad_list("Input")) if t is not None]
    wrt = [inputs[i] for i in wanted]
    blocks, results = [], []
    for sub, names in branches:
        idx, grads = g.backward_block(sub, [names[i] for i in with_grad], seeds, wrt)
        blocks.append(idx)
        results.append([grads[n] for n in wrt])
    captured = []
    for idx, names in zip(blocks, results):
        captured += [n for n in g.block_reads(idx, names) if n not in captured]
    return blocks, results, captured, [g.in_grad("Input", i) for i in wanted]


# --- cond ---

@op("cond", inputs=[In("Cond", "bool", differentiable=False, doc="bool scalar: which branch"),
                    In("Input", many=True, optional=True,
                       doc="variables of enclosing blocks the branches read")],
    outputs=[Out("Out", many=True)],
    attrs={"true_block": Attr("true_block", "block", doc="run when Cond is true"),
           "false_block": Attr("false_block", "block", doc="run when Cond is false"),
           "true_outputs": Attr("true_outputs", "strings", (), "what true_block hands back"),
           "false_outputs": Attr("false_outputs", "strings", (), "what false_block hands back")})
def cond(Cond, Input, *, true_block, false_block, true_outputs, false_outputs):
    """Run `true_block` if the scalar `Cond` is true, else `false_block` (lax.cond); both
    hand back outputs of the same shapes and dtypes."""
    return lax.cond(jnp.reshape(Cond, ()), lambda: true_block({}, true_outputs),
                    lambda: false_block({}, false_outputs))


@cond.shape_rule
def _(inputs, attrs, program_desc, block_idx):
    dims, dtype = inputs["Cond"][0]
    if dtype != "bool" or not _scalar_dims(dims):
        raise ShapeError(f"the predicate must be a bool scalar (shape [] or [1]), got "
                         f"{dtype}{list(dims)}", slot="Cond")
    return _branch_types(program_desc, block_idx,
                         [(attrs["true_block"], attrs["true_outputs"]),
                          (attrs["false_block"], attrs["false_outputs"])],
                         ["true branch", "false branch"])


@cond.gradient
def _(g):
    blocks, results, captured, targets = _grad_of_branches(
        g, [(g.attr("true_block"), g.attr("true_outputs")),
            (g.attr("false_block"), g.attr("false_outputs"))])
    if targets:
        g.op("cond", {"Cond": g.input("Cond"), "Input": captured}, {"Out": targets},
             true_block=blocks[0], false_block=blocks[1], true_outputs=results[0],
             false_outputs=results[1])


# --- switch ---

@op("switch", inputs=[In("Index", "int", differentiable=False,
                         doc="int scalar: which branch (clamped to 0..N-1)"),
                      In("Input", many=True, optional=True,
                         doc="variables of enclosing blocks the branches read")],
    outputs=[Out("Out", many=True)],
    attrs={"blocks": Attr("blocks", "blocks", doc="the N branches"),
           "branch_outputs": Attr("branch_outputs", "strings", (),
                                  "what each branch hands back, branch after branch")})
def switch(Index, Input, *, blocks, branch_outputs):
    """Run branch `Index` of `blocks` (lax.switch: an index out of range is clamped)."""
    per = len(branch_outputs) // len(blocks)
    fns = [lambda b=b, k=k: b({}, branch_outputs[k * per:(k + 1) * per])
           for k, b in enumerate(blocks)]
    return lax.switch(jnp.reshape(Index, ()).astype(jnp.int32), fns)


def _switch_branches(attrs):
    blocks, outs = attrs["blocks"], attrs["branch_outputs"]
    if not blocks or len(outs) % len(blocks):
        raise ShapeError(f"{len(outs)} branch outputs do not split evenly over "
                         f"{len(blocks)} branches")
    per = len(outs) // len(blocks)
    return [(b, outs[k * per:(k + 1) * per]) for k, b in enumerate(blocks)]


@switch.shape_rule
def _(inputs, attrs, program_desc, block_idx):
    dims, dtype = inputs["Index"][0]
    if not _scalar_dims(dims):
        raise ShapeError(f"the index must be an int scalar (shape [] or [1]), got "
                         f"{dtype}{list(dims)}", slot="Index")
    branches = _switch_branches(attrs)
    return _branch_types(program_desc, block_idx, branches,
                         [f"branch {k}" for k in range(len(branches))])


@switch.gradient
def _(g):
    blocks, results, captured, targets = _grad_of_branches(g, _switch_branches(g.attrs))
    if targets:
        g.op("switch", {"Index": g.input("Index"), "Input": captured}, {"Out": targets},
             blocks=blocks, branch_outputs=[n for r in results for n in r])
