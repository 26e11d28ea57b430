"""Control flow: ops that run sub-blocks (cond, switch, scan, while).

A sub-block is a block of the program whose parent is the block of its op. It
reads variables of enclosing blocks only through the op's inputs (`Input`: the
captures the builder lists) and writes only its own variables; the names it
hands back are attributes of the op (`true_outputs`, `carry_out`, ...) and
their values become the op's outputs. The lowering pass gives each lowering
rule below its sub-blocks as `lowering.lower.SubBlock` functions, lowered by
the pass itself inside `lax.cond` / `lax.switch` / `lax.scan`.

The gradient of an op with sub-blocks is the same op over gradient sub-blocks:
`g.backward_block` differentiates a sub-block with the backward pass that
differentiates the global block, in a new sub-block that holds a copy of the
forward ops followed by their gradient ops. A gradient branch of cond/switch
recomputes its forward values; a gradient step of scan reads the values the
forward scan saved (its `Saved` outputs) and keeps no copy of the ops writing them.
A `while` with `max_iters` lowers to a masked scan, and its gradient is the gradient
scan's maker emits for that scan; an unbounded `while` has none.
"""
import jax.numpy as jnp
from jax import lax

from lowering import dtypes
from lowering.blocks import check_sub_block, var_type
from lowering.constraints import at_least
from lowering.errors import BackwardError, ShapeError
from lowering.gradients import OpSpec
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


def _branch_types(op_type, program_desc, block_idx, branches, labels):
    """The (dims, dtype name) of each output of a cond/switch in block `block_idx`, checked
    to agree across `branches` ([(sub-block index, [result names])], named by `labels`)."""
    for sub, _ in branches:
        check_sub_block(program_desc, sub, block_idx, op_type)
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
    return _branch_types("cond", program_desc, block_idx,
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
    return _branch_types("switch", program_desc, block_idx, branches,
                         [f"branch {k}" for k in range(len(branches))])


@switch.gradient
def _(g):
    blocks, results, captured, targets = _grad_of_branches(g, _switch_branches(g.attrs))
    if targets:
        g.op("switch", {"Index": g.input("Index"), "Input": captured}, {"Out": targets},
             blocks=blocks, branch_outputs=[n for r in results for n in r])


# --- scan ---

@op("scan", inputs=[In("Init", many=True, optional=True, doc="initial carried values"),
                    In("X", many=True, optional=True, doc="sequences, scanned along axis 0"),
                    In("Input", many=True, optional=True,
                       doc="variables of enclosing blocks the step reads")],
    outputs=[Out("Carry", many=True, doc="final carried values"),
             Out("Y", many=True, doc="per-step outputs, stacked along axis 0"),
             Out("StepCarry", many=True,
                 doc="the carried values at the start of each step, stacked (the gradient "
                     "reads them)"),
             Out("Saved", many=True,
                 doc="the step values named by `saved`, stacked (the gradient reads them)")],
    attrs={"block": Attr("block", "block", doc="the step"),
           "carry_in": Attr("carry_in", "strings", (), "step variables holding the carry"),
           "x_in": Attr("x_in", "strings", (), "step variables holding each sequence's slice"),
           "carry_out": Attr("carry_out", "strings", (), "what the step hands on as the carry"),
           "y_out": Attr("y_out", "strings", (), "what the step hands back as its outputs"),
           "saved": Attr("saved", "strings", (), "step variables output stacked as Saved"),
           "reverse": Attr("reverse", "bool", False, "scan from the last element to the first"),
           "length": Attr("length", "int", -1, "number of steps when there is no sequence")})
def scan(Init, X, Input, *, block, carry_in, x_in, carry_out, y_out, saved, reverse, length):
    """Run the step `block` once per element of the sequences `X` (or `length` times), its
    carry passed from step to step (lax.scan); returns the final carry, the stacked
    per-step outputs, the stacked carries each step started from and the stacked `saved`
    step values (what nothing reads, XLA does not compute)."""
    n_carry, n_y = len(carry_out), len(y_out)

    def step(state, xs):
        i, carry = state
        bound = dict(zip(carry_in, carry))
        bound.update(zip(x_in, xs))
        values = block(bound, list(carry_out) + list(y_out) + list(saved), step=i)
        return (i + 1, values[:n_carry]), (values[n_carry:n_carry + n_y], carry,
                                           values[n_carry + n_y:])

    (_, final), (ys, started, kept) = lax.scan(
        step, (jnp.zeros((), jnp.int32), list(Init)), list(X),
        length=None if X else length, reverse=reverse)
    return final, ys, started, kept


def _dims_agree(a, b):
    return len(a) == len(b) and all(x == y or x < 0 or y < 0 for x, y in zip(a, b))


def _scan_length(inputs, attrs):
    """The number of steps: the sequences' common length (-1 if unknown)."""
    lengths = [dims[0] for dims, _ in inputs.get("X", ()) if dims]
    if any(not dims for dims, _ in inputs.get("X", ())):
        raise ShapeError("a sequence must have at least one dim (the scanned axis 0)", slot="X")
    known = sorted({n for n in lengths if n >= 0})
    if len(known) > 1:
        raise ShapeError("sequences of different lengths: " + ", ".join(
            f"X[{i}] has {n} steps" for i, n in enumerate(lengths)), slot="X")
    if not lengths:
        if attrs["length"] < 0:
            raise ShapeError("a scan without sequences needs the `length` attribute")
        return attrs["length"]
    if known and attrs["length"] >= 0 and attrs["length"] != known[0]:
        raise ShapeError(f"length={attrs['length']} but the sequences have {known[0]} steps")
    return known[0] if known else -1


@scan.shape_rule
def _(inputs, attrs, program_desc, block_idx):
    sub = attrs["block"]
    check_sub_block(program_desc, sub, block_idx, "scan")
    init, xs = inputs.get("Init", []), inputs.get("X", [])
    for slot, given, names in (("Init", init, attrs["carry_in"]), ("X", xs, attrs["x_in"]),
                               ("Init", init, attrs["carry_out"])):
        if len(given) != len(names):
            raise ShapeError(f"{len(given)} variables in slot '{slot}' but {len(names)} "
                             f"step variables bind them", slot=slot)
    steps = _scan_length(inputs, attrs)
    carry_in = _types(program_desc, sub, attrs["carry_in"], "carried variable")
    for k, ((dims, dtype), (idims, idtype)) in enumerate(zip(init, carry_in)):
        if dtype != idtype or not _dims_agree(dims, idims):
            raise ShapeError(f"carried value {k} starts as {dtype}{list(dims)} but the step "
                             f"reads it as {idtype}{idims}", var=attrs["carry_in"][k])
    for k, ((dims, dtype), (sdims, sdtype)) in enumerate(
            zip(xs, _types(program_desc, sub, attrs["x_in"], "sequence slice"))):
        if dtype != sdtype or not _dims_agree(dims[1:], sdims):
            raise ShapeError(f"sequence {k} is {dtype}{list(dims)} but the step reads its "
                             f"slices as {sdtype}{sdims}", var=attrs["x_in"][k])
    carry_out = _types(program_desc, sub, attrs["carry_out"], "carried variable")
    for k, (before, after) in enumerate(zip(carry_in, carry_out)):
        if before[1] != after[1] or not _dims_agree(before[0], after[0]):
            raise ShapeError(f"the step changes carried value {k} from {before[1]}{before[0]} "
                             f"('{attrs['carry_in'][k]}') to {after[1]}{after[0]} "
                             f"('{attrs['carry_out'][k]}'); a carry keeps its shape and dtype",
                             var=attrs["carry_out"][k])
    ys = _types(program_desc, sub, attrs["y_out"], "step output")
    saved = _types(program_desc, sub, attrs["saved"], "saved step value")
    return {"Carry": [(tuple(d), t) for d, t in init],
            "Y": [((steps, *d), t) for d, t in ys],
            "StepCarry": [((steps, *d), t) for d, t in init],
            "Saved": [((steps, *d), t) for d, t in saved]}


@scan.gradient
def _scan_grad(g):
    """A reverse scan over the gradient of the step: its carry is the gradient of the
    forward carry (and the gradients of the captured inputs, summed over the steps); it
    scans the carries each forward step started from, the sequences and the gradients of
    the per-step outputs (and of StepCarry and Saved, which a second order reaches). The
    step's forward values come from the forward scan's Saved outputs where it has them
    (the ops writing them are then left out); otherwise the gradient step recomputes
    them from the carries, as `jax.checkpoint` around the step would."""
    carry_in, x_in = list(g.attr("carry_in")), list(g.attr("x_in"))
    carry_out, y_out = list(g.attr("carry_out")), list(g.attr("y_out"))
    init, xs, captured = g.input_list("Init"), g.input_list("X"), g.input_list("Input")
    started = g.output_list("StepCarry")
    saved = list(g.attr("saved")) if len(g.output_list("Saved")) == len(g.attr("saved")) else []
    if len(started) != len(init):
        raise ShapeError("this scan does not output StepCarry, which its gradient reads")
    sub = g.attr("block")
    d_carry = [g.tmp(f"{n}@GRAD") for n in carry_in]
    y_grad = [j for j in range(len(y_out)) if g.has_out_grad("Y", j)]
    d_y = [g.tmp(f"{y_out[j]}@GRAD") for j in y_grad]
    x_wanted = [k for k in range(len(xs)) if g.in_grad("X", k) is not None]
    c_wanted = [k for k in range(len(captured)) if g.in_grad("Input", k) is not None]
    s_grad = [k for k in range(len(init)) if g.has_out_grad("StepCarry", k)]
    d_started = [g.tmp(f"{carry_in[k]}@GRAD@STEP") for k in s_grad]
    v_grad = [k for k in range(len(saved)) if g.has_out_grad("Saved", k)]
    d_saved = [g.tmp(f"{saved[k]}@GRAD@STEP") for k in v_grad]
    acc = [g.tmp(f"{captured[k]}@GRAD@ACC") for k in c_wanted]
    declare = [(n, *g.var(i)) for n, i in zip(d_carry, init)]
    stacked = [g.var(g.output_list("Y")[j]) for j in y_grad]
    declare += [(n, dims[1:], dtype) for n, (dims, dtype) in zip(d_y, stacked)]
    declare += [(n, *g.var(init[k])) for n, k in zip(d_started, s_grad)]
    stacked = [g.var(g.output_list("Saved")[k]) for k in v_grad]
    declare += [(n, dims[1:], dtype) for n, (dims, dtype) in zip(d_saved, stacked)]
    declare += [(n, *g.var(captured[k])) for n, k in zip(acc, c_wanted)]
    wrt = carry_in + [x_in[k] for k in x_wanted] + [captured[k] for k in c_wanted]
    targets = carry_out + [y_out[j] for j in y_grad] + [carry_in[k] for k in s_grad]
    targets += [saved[k] for k in v_grad]
    idx, grads = g.backward_block(sub, targets, d_carry + d_y + d_started + d_saved, wrt,
                                  declare, given=saved)
    acc_out = [g.block_call(idx, "sum", [a, grads[captured[k]]])
               for a, k in zip(acc, c_wanted)]
    new_carry = [grads[n] for n in carry_in] + acc_out
    new_y = [grads[x_in[k]] for k in x_wanted]
    seqs = started + xs + [g.out_grad("Y", j) for j in y_grad]
    seqs += [g.out_grad("StepCarry", k) for k in s_grad]   # reached by a second order
    seqs += [g.out_grad("Saved", k) for k in v_grad] + g.output_list("Saved")[:len(saved)]
    carry_init = [g.out_grad("Carry", k) for k in range(len(init))]
    carry_init += [g.call("fill_zeros_like", captured[k]) for k in c_wanted]
    d_init = [g.in_grad("Init", k) or g.tmp("unused@GRAD") for k in range(len(init))]
    g.op("scan", {"Init": carry_init, "X": seqs, "Input": g.block_reads(idx, new_carry + new_y)},
         {"Carry": d_init + [g.in_grad("Input", k) for k in c_wanted],
          "Y": [g.in_grad("X", k) for k in x_wanted],
          "StepCarry": [g.tmp("scan.grad.started") for _ in d_init + acc]},
         block=idx, carry_in=d_carry + acc,
         x_in=carry_in + x_in + d_y + d_started + d_saved + saved,
         carry_out=new_carry, y_out=new_y, reverse=not g.attr("reverse"), length=g.attr("length"))


# --- while ---

@op("while", inputs=[In("Init", many=True, optional=True, doc="initial loop variables"),
                     In("Input", many=True, optional=True,
                        doc="variables of enclosing blocks the body reads")],
    outputs=[Out("Carry", many=True, doc="final loop variables"),
             Out("StepCarry", many=True,
                 doc="with max_iters: the loop variables at the start of each of the "
                     "max_iters steps, stacked (the gradient reads them)")],
    attrs={"block": Attr("block", "block", doc="the body, which also computes the condition"),
           "carry_in": Attr("carry_in", "strings", (), "body variables holding the loop variables"),
           "carry_out": Attr("carry_out", "strings", (), "the loop variables' next values"),
           "cond": Attr("cond", "string", "", "the body's bool scalar: whether to run the body "
                                              "on the loop variables it was computed from"),
           "max_iters": Attr("max_iters", "int", -1,
                             "at most this many iterations (-1: unbounded, not differentiable)",
                             where=at_least(-1))})
def while_(Init, Input, *, block, carry_in, carry_out, cond, max_iters):
    """Replace the loop variables by the body's `carry_out` while the body's `cond`, computed
    from them, holds. Unbounded: lax.while_loop. With `max_iters`: a lax.scan of max_iters
    steps, each applying the body only while the condition holds (differentiable), which
    also outputs the loop variables each step started from."""
    def run(i, carry, results):
        return block(dict(zip(carry_in, carry)), results, step=i)

    def scalar(holds):
        if holds.dtype != jnp.bool_ or holds.size != 1:
            raise ShapeError(f"the condition '{cond}' of block {block.idx} must be a bool scalar, "
                             f"got {holds.dtype}{list(holds.shape)}", var=cond)
        return jnp.reshape(holds, ())

    start = (jnp.zeros((), jnp.int32), list(Init))
    if max_iters < 0:
        _, final = lax.while_loop(
            lambda s: scalar(run(*s, [cond])[0]),
            lambda s: (s[0] + 1, run(*s, carry_out)), start)
        return final, []

    def step(state, _):
        i, carry = state
        holds, *new = run(i, carry, [cond, *carry_out])
        holds = scalar(holds)
        return (i + 1, [jnp.where(holds, n, c) for n, c in zip(new, carry)]), carry

    (_, final), started = lax.scan(step, start, None, length=max_iters)
    return final, started


@while_.shape_rule
def _(inputs, attrs, program_desc, block_idx):
    sub = attrs["block"]
    check_sub_block(program_desc, sub, block_idx, "while")
    init = inputs.get("Init", [])
    for names in (attrs["carry_in"], attrs["carry_out"]):
        if len(init) != len(names):
            raise ShapeError(f"{len(init)} loop variables in slot 'Init' but {len(names)} body "
                             "variables bind them", slot="Init")
    (dims, dtype), = _types(program_desc, sub, [attrs["cond"]], "condition")
    if dtype != "bool" or not _scalar_dims(dims):
        raise ShapeError(f"the condition '{attrs['cond']}' of block {sub} must be a bool scalar "
                         f"(shape [] or [1]), got {dtype}{dims}", var=attrs["cond"])
    carry_in = _types(program_desc, sub, attrs["carry_in"], "loop variable")
    carry_out = _types(program_desc, sub, attrs["carry_out"], "loop variable")
    for k, ((d, t), before, after) in enumerate(zip(init, carry_in, carry_out)):
        if t != before[1] or not _dims_agree(d, before[0]):
            raise ShapeError(f"loop variable {k} starts as {t}{list(d)} but the body reads it "
                             f"as {before[1]}{before[0]}", var=attrs["carry_in"][k])
        if before[1] != after[1] or not _dims_agree(before[0], after[0]):
            raise ShapeError(f"the body of block {sub} changes loop variable {k} from "
                             f"{before[1]}{before[0]} ('{attrs['carry_in'][k]}') to "
                             f"{after[1]}{after[0]} ('{attrs['carry_out'][k]}'); a loop variable "
                             "keeps its shape and dtype", var=attrs["carry_out"][k])
    steps = attrs["max_iters"]
    return {"Carry": [(tuple(d), t) for d, t in init],
            "StepCarry": [((steps, *d), t) for d, t in init] if steps >= 0 else []}


class _MaskedScan:
    """A bounded `while` as scan's gradient maker sees it: a scan of max_iters steps without
    sequences whose step is the body followed by `where(cond, carry_out, carry_in)`."""

    def __init__(self, g):
        self._g = g
        carry_in, carry_out = g.attr("carry_in"), g.attr("carry_out")
        holds = g.tmp(f"{g.attr('cond')}.scalar")
        masked = [g.tmp(f"{n}.masked") for n in carry_in]
        self._mask = [OpSpec("reshape", {"X": [g.attr("cond")]}, {"Out": [holds]}, {"shape": []})]
        self._mask += [OpSpec("where", {"Condition": [holds], "X": [new], "Y": [old]},
                              {"Out": [out]}) for new, old, out in zip(carry_out, carry_in, masked)]
        self._attrs = {"block": g.attr("block"), "carry_in": carry_in, "x_in": [],
                       "carry_out": masked, "y_out": [], "saved": [], "reverse": False,
                       "length": g.attr("max_iters")}

    def attr(self, name):
        return self._attrs[name]

    def backward_block(self, block_idx, targets, seeds, wrt, declare=(), given=()):
        return self._g.backward_block(block_idx, targets, seeds, wrt, declare, given,
                                      then=self._mask)

    def __getattr__(self, name):
        return getattr(self._g, name)


@while_.gradient
def _(g):
    """With max_iters, the gradient of the masked scan the op lowers to, made by scan's
    gradient maker: a reverse scan over the gradient of body-then-mask, reading the loop
    variables each step started from. An unbounded loop has no trip count to reverse."""
    if g.attr("max_iters") < 0:
        raise BackwardError("the gradient of a 'while' loop needs max_iters (an unbounded "
                            "loop has no trip count to reverse); give while_loop max_iters")
    _scan_grad(_MaskedScan(g))
