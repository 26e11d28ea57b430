"""Paddle training programs continue training here.

`paddle.static.save(main_program, prefix)` writes the whole main program (forward, backward
and optimizer ops) to `prefix.pdmodel` (legacy mode: each op marked by its `op_role`
attribute) or `prefix.json` (Paddle 3's PIR: no roles, the parts are found by structure,
see `training_pir`), the parameters to `prefix.pdparams` and the optimizer's variables
(learning rate, moments, beta-power accumulators, velocities) to `prefix.pdopt`, both
Python pickles.
`load_training_program` imports the forward part through the Paddle translator, lets our
backward pass differentiate it, re-creates Paddle's optimizer as ours (progdesc.optimizer,
the same update rule) and loads Paddle's accumulators as our optimizer's state, so the next
run of the program takes the step Paddle would have taken next.

    prog = progdesc.paddle.load_training_program("ckpt/model", exe)
    loss, = exe.run(prog.program, feed={"x": xb, "label": yb}, fetch_list=[prog.loss])

What is re-created:

- the update ops `sgd`, `momentum` (mu, use_nesterov, its `l2_decay` regularization),
  `adam` (beta1, beta2, epsilon; `lazy_mode` only matters for sparse gradients, which
  these programs do not have), `adamw` (coeff, with_decay, lr_ratio), as our optimizers,
  with the learning rate the file holds in the update op's LearningRate variable, times
  a parameter's own factor (ParamAttr's learning_rate: a `scale` op Paddle adds);
- the other ops of the optimizer part, which transform the gradients before the updates
  (ClipGradByGlobalNorm, ClipGradByNorm, ClipGradByValue, L2Decay regularization: plain
  ops on `P@GRAD`), through the table like the forward ops, from our gradient of P to
  the Grad input of P's update.

Refused, by op, in one UnsupportedOpError: other update ops (lamb, lars, ...), update
attributes we do not model (amsgrad, multi_precision, rescale_grad, global beta powers),
optimizer-part ops without a row, learning-rate schedule ops (the learning rate is the
saved one; schedule it with progdesc.lr), distributed ops.

The update ops become our optimizers in `progdesc.paddle.updates`.
"""
import os
from typing import NamedTuple

import numpy as np

from lowering import progdesc_pb2 as pb
from lowering.errors import FormatError, ProgramError, UnsupportedOpError
from progdesc import io
from progdesc.backward import append_backward
from progdesc.framework import Program, Variable, program_guard
from progdesc.paddle import pickles, training_pir
from progdesc.paddle import rules_training  # noqa: F401  (registers the rows it adds)
from progdesc.paddle import updates as upd
from progdesc.paddle.graph import Block, Op, PaddleProgram
from progdesc.paddle.pdmodel import read_pdmodel
from progdesc.paddle.pir import read_pir
from progdesc.paddle.translate import PaddleTranslator, translate
from progdesc.translate import Environment, Node, Unsupported

# Paddle's OpRole bits (paddle/fluid/framework/op_proto_maker.h)
BACKWARD, OPTIMIZE, RPC, DIST, LR_SCHED, LOSS = 0x1, 0x2, 0x4, 0x8, 0x10, 0x100
_NOT_FORWARD = BACKWARD | OPTIMIZE | RPC | DIST | LR_SCHED



class TrainingProgram(NamedTuple):
    """What `load_training_program` returns.

    - `program`: ours: Paddle's forward ops translated, our backward pass, and our
      optimizer's update ops; each run trains one step on the fed batch.
    - `startup_program`: the initializers of our optimizer's variables; it has already
      run, and the scope holds Paddle's values since: running it again would reset the
      moments, the step count and the learning rate.
    - `feed_names`: the variables to feed (Paddle's data variables, in the order the
      forward ops first read them).
    - `loss`: the loss Variable (the output of Paddle's op marked as the loss).
    - `optimizers`: our Optimizer objects, one per set of parameters Paddle updated with
      the same rule and hyperparameters (usually one; AdamW excluding some parameters
      from decay gives two); `optimizers[i].lr_var` is its learning-rate variable.
    """
    program: Program
    startup_program: Program
    feed_names: list
    loss: Variable
    optimizers: list


def load_training_program(path_prefix, executor, scope=None, *, overwrite=False):
    """Import the training program `paddle.static.save(main, path_prefix)` wrote, with its
    parameters and optimizer state, so that training continues where Paddle left off.

    Reads `path_prefix.pdmodel`, `.pdparams` and `.pdopt` (the pickles without executing
    them: progdesc.paddle.pickles), runs the optimizer's startup program with `executor`
    and stores every value in `scope` (default: the global one). Returns a
    `TrainingProgram` (program, startup_program, feed_names, loss, optimizers).

    Batch norm and dropout run in training mode, as in Paddle's program (dropout draws
    from our random stream, not Paddle's); `program.clone(for_test=True)` gives eval.

    Raises FormatError for files that are missing, malformed or disagree with the program
    (an accumulator without a value, Adam's beta powers at different steps),
    UnsupportedOpError listing the ops that cannot be translated or re-created (an
    unknown optimizer, learning-rate schedule ops), ScopeError (before anything is
    written) when `scope` holds one of the imported variables with other values, unless
    `overwrite`.
    """
    from progdesc.interop.from_jax import check_not_held
    prefix = os.fspath(path_prefix)
    values = _arrays(prefix + ".pdparams")
    if os.path.exists(prefix + ".pdopt"):   # absent: the updates say what they miss
        values.update(_arrays(prefix + ".pdopt"))
    paddle = _read_program(prefix, values)
    block0 = paddle.blocks[0]
    forward, optimize, loss_name, refused = _parts(paddle, prefix)
    feeds = _feeds(block0, forward)
    updates, grad_ops, more_refused = upd.read_updates(optimize, values, paddle)
    raw_grads, problems = _raw_gradients(paddle, updates)
    refused += more_refused + [("", -1, f"cannot tell {why}") for why in problems]
    if refused:
        raise UnsupportedOpError(
            f"the training program has {len(refused)} op(s) that cannot be re-created here: "
            + "; ".join(f"#{i} {t}: {why}" for t, i, why in refused),
            unsupported=[(t, "", why) for t, _, why in refused],
            places=[(t, 0, i, "", why) for t, i, why in refused])
    program, feed_names, fetches, state = translate(
        _forward_program(paddle, forward, feeds, loss_name), values, for_training=True)
    block = program.global_block()
    loss = block.var(fetches[0])
    startup = Program()
    with program_guard(program, startup):
        grads = {p.name: g for p, g in append_backward(
            loss, parameter_list=[u.param for u in updates])}
        missing = [u.param for u in updates if u.param not in grads]
        if missing:
            raise ProgramError(f"Paddle updates {', '.join(missing)}, but the loss "
                               f"'{loss_name}' does not depend on them")
        grads = _paddle_gradients(program, paddle, grad_ops, updates,
                                  {raw_grads[p]: g for p, g in grads.items()}, state)
    optimizers = []
    for group in upd.groups(updates):
        ours = group[0].optimizer()
        ops = ours.apply_gradients([(block.var(u.param), grads[u.param]) for u in group],
                                   startup)
        state.update(upd.state_of(ours, ops, group, values))
        optimizers.append(ours)
    io.check_values(program, state, allow_missing=True, where=f"'{prefix}'")
    if not overwrite:
        check_not_held(scope, state.items())
    executor.run(startup, scope=scope)
    io.set_values(program, state, scope)
    return TrainingProgram(program, startup, feed_names, loss, optimizers)


class _Names(Environment):
    """Paddle names -> ours for the optimizer part; a name it was not given is refused."""

    def read(self, key):
        try:
            return super().read(key)
        except KeyError:
            raise Unsupported(f"it reads '{key}', which is neither a gradient, a "
                              "persistable nor written by an op before it") from None


def _paddle_gradients(program, paddle, grad_ops, updates, grads, state):
    """Our gradient Variable of each updated parameter after Paddle's own transformations
    of the gradients (clipping, regularization: the optimizer part's ops other than the
    updates), translated by the table from Paddle's gradient of P (`P@GRAD` in a legacy
    program; `grads` maps it to ours) to the Grad input of P's update op. The ops
    appended have the optimizer role (clone(for_test) drops them); the constants they
    make join `state`."""
    block = program.global_block()
    translator = PaddleTranslator(program, paddle, for_training=True)
    names = _Names(translator)
    for name, var in block.vars.items():
        if var.persistable:
            names.bind([name], [name])
    for paddle_name, ours in grads.items():
        names.bind([paddle_name], [ours.name])
    start = len(block.ops)
    translator.walk(Block(0, -1, paddle.blocks[0].vars, grad_ops), names)
    out = {}
    for u in updates:
        try:
            out[u.param] = block.var(names.read(upd.one_input(u.op, "Grad")))
        except Unsupported as e:
            translator.note(_node(u.op), f"its gradient: {e}")
    translator.check()
    for op in block.ops[start:]:
        op.desc.role = pb.OPTIMIZE
    state.update(translator.values)
    return out


def _node(op):
    return Node(op.type, (), (), op.attrs, block=op.block, index=op.index)


def _read_program(prefix, values):
    """The PaddleProgram of `prefix.pdmodel`, else of the PIR `prefix.json` (all its ops
    kept, the saved values' feeds made persistables)."""
    if os.path.exists(prefix + ".pdmodel") or not os.path.exists(prefix + ".json"):
        return read_pdmodel(io.read_file(prefix + ".pdmodel", "Paddle program"))
    paddle = read_pir(io.read_file(prefix + ".json", "Paddle program"), prune=False)
    return training_pir.as_training(paddle, values)


def _arrays(path):
    """{name: array} of a .pdparams / .pdopt pickle."""
    value = pickles.load(path)
    if not isinstance(value, dict):
        raise FormatError(f"'{path}' holds a {type(value).__name__}, not a dict of arrays")
    out = {}
    for name, array in value.items():
        if isinstance(array, np.generic):
            array = np.asarray(array)
        if not isinstance(name, str) or not isinstance(array, np.ndarray):
            continue   # Paddle's bookkeeping entries ('StructuredToParameterName@@', ...)
        out[name] = array
    return out


def _role(op):
    role = op.attrs.get("op_role", 0)
    return role if isinstance(role, int) else 0


def _parts(paddle, prefix):
    """(forward ops, optimizer-part ops, loss name, refused [(type, index, why)]) of the
    program's block 0: by op_role in a legacy program, by structure in a PIR one."""
    block0 = paddle.blocks[0]
    if paddle.format == "pir":
        forward, optimize, loss, why = training_pir.split(block0, upd.UPDATE_OPS)
        if why:
            raise FormatError(f"'{prefix}.json' is not a training program as Paddle's "
                              f"minimize writes one: {why}")
        return forward, optimize, loss, []
    forward, optimize, refused = _split(block0)
    return forward, optimize, _loss(block0, forward), refused


def _raw_gradients(paddle, updates):
    """({parameter: Paddle's name of its gradient}, [problems]) of the updated
    parameters: `P@GRAD` in a legacy program, found by structure in a PIR one."""
    if paddle.format == "pir":
        return training_pir.raw_gradients(paddle.blocks[0], [u.param for u in updates])
    return {u.param: u.param + "@GRAD" for u in updates}, []


def _split(block0):
    """(forward ops, optimizer-part ops, refused [(type, index, why)]) of block 0."""
    forward, optimize, refused = [], [], []
    for op in block0.ops:
        role = _role(op)
        if op.type in ("feed", "fetch"):
            continue
        if not role & _NOT_FORWARD:
            forward.append(op)
        elif role & OPTIMIZE:
            optimize.append(op)
        elif role & LR_SCHED:
            refused.append((op.type, op.index, "a learning-rate schedule op (the learning "
                            "rate is taken as the file holds it; schedule it with progdesc.lr)"))
        elif role & (RPC | DIST):
            refused.append((op.type, op.index, "a distributed-training op"))
    return forward, optimize, refused


def _loss(block0, forward):
    """The name of the loss: the output of the forward op marked Loss, else the variable
    whose gradient the backward part seeds."""
    marked = [op for op in forward if _role(op) & LOSS]
    names = [n for op in marked for ns in op.outputs.values() for n in ns]
    if len(names) == 1:
        return names[0]
    seeds = [n for op in block0.ops if _role(op) == (LOSS | BACKWARD)
             for ns in op.outputs.values() for n in ns if n.endswith("@GRAD")]
    if len(seeds) == 1 and seeds[0][:-len("@GRAD")] in block0.vars:
        return seeds[0][:-len("@GRAD")]
    raise FormatError(f"cannot tell the loss of the training program: {len(names)} "
                      f"output(s) of ops marked as the loss ({names[:4]}) and "
                      f"{len(seeds)} loss-gradient seed(s)")


def _feeds(block0, forward):
    """Paddle's data variables: what the forward ops read before any op writes it and
    that is not persistable, in the order of first read."""
    written, feeds = set(), []
    for op in forward:
        for names in op.inputs.values():
            for n in names:
                var = block0.vars.get(n)
                if (n not in written and n not in feeds and var is not None
                        and not var.persistable and var.kind == "dense"):
                    feeds.append(n)
        written.update(n for names in op.outputs.values() for n in names)
    return feeds


def _forward_program(paddle, forward, feeds, loss):
    """The PaddleProgram of the forward part: feed ops for `feeds`, the forward ops of
    block 0, a fetch of the loss; block 0 declares only the variables these ops or the
    sub-blocks use (not the gradients and optimizer accumulators)."""
    block0 = paddle.blocks[0]
    used = set(feeds) | {loss}
    for op in forward:
        used.update(n for slots in (op.inputs, op.outputs) for ns in slots.values() for n in ns)
    for block in paddle.blocks[1:]:
        for op in block.ops:
            used.update(n for slots in (op.inputs, op.outputs) for ns in slots.values()
                        for n in ns)
    ops = [Op("feed", {"X": ["feed"]}, {"Out": [n]}, {"col": i}, index=-1)
           for i, n in enumerate(feeds)]
    ops += forward
    ops.append(Op("fetch", {"X": [loss]}, {"Out": ["fetch"]}, {"col": 0}, index=-1))
    vars_ = {n: v for n, v in block0.vars.items() if n in used}
    blocks = [Block(0, -1, vars_, ops)] + list(paddle.blocks[1:])
    return PaddleProgram(blocks, paddle.format, paddle.op_versions)
