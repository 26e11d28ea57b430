"""The parts of a Paddle 3 PIR training program (`paddle.static.save` in PIR mode writes
`prefix.json`): PIR ops carry no `op_role`, so the parts are found from the program's
structure, the way `paddle.static.Optimizer.minimize` lays them out:

    forward ops | the seed: full_like(loss, 1) | *_grad ops (and their add_n sums)
                | gradient transformations (clipping, regularization) | updates

- the loss is the operand of the seed, the `full_like` whose result the first `*_grad`
  op reads;
- the gradient of a parameter P is the result of the `*_grad` op that reads P and has
  P's shape (its slot lines up with P's operand slot where several do), or the add_n
  summing those results when P is read by several ops;
- the optimizer's accumulators and learning rate are `pd_op.data` ops marked
  persistable, which the reader reads as feeds: they become persistable variables.

This module also adds the rows the PIR reader (`progdesc.paddle.pir_ops`) needs for
training programs: the update ops (`pd_op.sgd_`, `momentum_`, `adam_`, `adamw_`, read
as the legacy ops with their legacy slots) and the ops of gradient clipping and
regularization (`add_n`, `squared_l2_norm`, `clip_by_norm`).
"""
import dataclasses

from progdesc.paddle import pir_ops
from progdesc.paddle.graph import Block, PaddleProgram
from progdesc.paddle.pir_ops import Fold, Row

_ADAM_OPERANDS = ("Param", "Grad", "LearningRate", "Moment1", "Moment2", "Moment2Max",
                  "Beta1Pow", "Beta2Pow", "MasterParam", "SkipUpdate",
                  Fold("beta1", "float", tensor="Beta1Tensor"),
                  Fold("beta2", "float", tensor="Beta2Tensor"),
                  Fold("epsilon", "float", tensor="EpsilonTensor"))
_ADAM_RESULTS = ("ParamOut", "Moment1Out", "Moment2Out", "Moment2MaxOut", "Beta1PowOut",
                 "Beta2PowOut", "MasterParamOut")
ROWS = {
    "pd_op.sgd_": Row("sgd", ("Param", "LearningRate", "Grad", "MasterParam"),
                      ("ParamOut", "MasterParamOut")),
    "pd_op.momentum_": Row("momentum", ("Param", "Grad", "Velocity", "LearningRate",
                                        "MasterParam"),
                           ("ParamOut", "VelocityOut", "MasterParamOut")),
    "pd_op.adam_": Row("adam", _ADAM_OPERANDS, _ADAM_RESULTS),
    "pd_op.adamw_": Row("adamw", _ADAM_OPERANDS, _ADAM_RESULTS),
    "pd_op.add_n": Row("sum", ("X*",)),
    "pd_op.squared_l2_norm": Row("squared_l2_norm"),
    "pd_op.clip_by_norm": Row("clip_by_norm"),
}
"""PIR op -> legacy op rows for training programs (Paddle 3.3.1's operand order: adam_
takes moment2_max after moment2, skip_update (found_inf) after master_param)."""
for _name, _row in ROWS.items():
    pir_ops.ROWS.setdefault(_name, _row)


def _names(slots):
    return [n for ns in slots.values() for n in ns]


def is_grad(op):
    """Whether `op` is one of Paddle's gradient ops."""
    return op.type.endswith("_grad")


def as_training(paddle, values):
    """The PaddleProgram with the feeds of saved values (accumulators, learning rate)
    made persistable variables, and no feed ops (the caller finds the data variables)."""
    block0 = paddle.blocks[0]
    vars_ = dict(block0.vars)
    for op in block0.ops:
        if op.type == "feed":
            for name in _names(op.outputs):
                if name in values and name in vars_:
                    vars_[name] = dataclasses.replace(vars_[name], persistable=True,
                                                      stop_gradient=True)
    ops = [op for op in block0.ops if op.type != "feed"]
    blocks = [Block(0, -1, vars_, ops)] + list(paddle.blocks[1:])
    return PaddleProgram(blocks, paddle.format, paddle.op_versions)


def split(block0, update_types):
    """(forward ops, optimizer-part ops, loss name, why not) of a PIR training block;
    `why not` is '' when the structure is the one described in the module's text."""
    ops = block0.ops
    first = next((i for i, op in enumerate(ops) if is_grad(op)), None)
    if first is None:
        return [], [], None, "no *_grad op: not a training program"
    producers = {n: i for i, op in enumerate(ops[:first]) for n in _names(op.outputs)}
    seeds = [producers[n] for n in _names(ops[first].inputs)
             if n in producers and ops[producers[n]].type == "fill_any_like"]
    if len(seeds) != 1:
        return [], [], None, (f"the first gradient op (#{ops[first].index} "
                              f"{ops[first].type}) reads no full_like of the loss")
    seed = ops[seeds[0]]
    loss = _names(seed.inputs)[0]
    forward = _live(ops[:seeds[0]], {loss})
    last = max(i for i, op in enumerate(ops) if is_grad(op))
    rest = ops[last + 1:]
    optimize = _live(rest, set(), keep=lambda op: op.type in update_types)
    return forward, optimize, loss, ""


def _live(ops, wanted, keep=lambda op: False):
    """`ops` without those whose results neither a later op of `ops` reads nor `wanted`
    holds (constants folded into attributes), keeping ops `keep` accepts."""
    live, needed = [], set(wanted)
    for op in reversed(ops):
        outs = _names(op.outputs)
        if keep(op) or not outs or any(n in needed for n in outs):
            live.append(op)
            needed.update(_names(op.inputs))
    return live[::-1]


def raw_gradients(block0, params, accumulations=("sum",)):
    """{parameter: the name of Paddle's gradient of it} for the parameters `params`
    (see the module's text), and [why not] for those it cannot tell."""
    shapes = {p: tuple(block0.vars[p].shape) for p in params if p in block0.vars}
    partial = {p: [] for p in params}
    for op in block0.ops:
        if not is_grad(op):
            continue
        for slot, names in op.inputs.items():
            for p in names:
                if p not in partial:
                    continue
                fits = [(s, n) for s, ns in op.outputs.items() for n in ns
                        if n in block0.vars and tuple(block0.vars[n].shape) == shapes.get(p)]
                aligned = [n for s, n in fits if s == slot]
                if aligned or len(fits) == 1:
                    partial[p].append((aligned or [fits[0][1]])[0])
    found, problems = {}, []
    for p in params:
        grads = partial[p]
        if len(grads) == 1:
            found[p] = grads[0]
            continue
        sums = [op for op in block0.ops if op.type in accumulations
                and sorted(_names(op.inputs)) == sorted(grads) and grads]
        if len(sums) == 1:
            found[p] = _names(sums[0].outputs)[0]
        else:
            problems.append(f"the gradient of '{p}' ({len(grads)} gradient op results)")
    return found, problems
