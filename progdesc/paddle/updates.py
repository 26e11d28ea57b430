"""Paddle's optimizer update ops (`sgd`, `momentum`, `adam`, `adamw`) as our optimizers
(progdesc.optimizer) of the same rule, hyperparameters and learning rate, and Paddle's
accumulators as their state.

Paddle's Adam keeps per-parameter powers of beta1 and beta2 (its bias corrections); ours
counts updates in one step counter, so that count is read from the powers
(beta1_pow = beta1 ** (updates + 1)), which must agree across parameters. The update
rules are the same: Paddle's lr * sqrt(1 - beta2_pow) / (1 - beta1_pow) * m1 /
(sqrt(m2) + epsilon * sqrt(1 - beta2_pow)) is lr * m1_hat / (sqrt(m2_hat) + epsilon),
optax's Adam; AdamW's decay is lr * lr_ratio * coeff * param in both.
"""
import math
from typing import NamedTuple

import numpy as np

from lowering.errors import FormatError
from progdesc import optimizer as opt
from progdesc.paddle.graph import Op
from progdesc.paddle.rules import RULES

UPDATE_OPS = ("sgd", "momentum", "adam", "adamw")


class Update(NamedTuple):
    """One of Paddle's update ops, read: its parameter, rule, hyperparameters, learning
    rate and the L2 coefficient the op applies itself (momentum's regularization
    attributes), and the op itself (its accumulators' names)."""
    op: Op
    param: str
    kind: str
    hyper: tuple
    lr: float
    l2: float

    def key(self):
        return (self.kind, self.hyper, self.lr, self.l2)

    def optimizer(self):
        """Our optimizer of the same rule and hyperparameters."""
        h = dict(self.hyper)
        if self.kind == "sgd":
            return opt.SGD(self.lr, weight_decay=self.l2)
        if self.kind == "momentum":
            return opt.Momentum(self.lr, momentum=h["mu"], use_nesterov=h["use_nesterov"],
                                weight_decay=self.l2)
        if self.kind == "adam":
            return opt.Adam(self.lr, h["beta1"], h["beta2"], h["epsilon"],
                            weight_decay=self.l2)
        return opt.AdamW(self.lr, h["beta1"], h["beta2"], h["epsilon"],
                         weight_decay=h["coeff"])


def read_updates(optimize, values, paddle):
    """([Update], the other ops of the optimizer part, refused [(type, index, why)]) of
    the optimizer-part ops `optimize`, whose learning rates and accumulators `values`
    hold."""
    refused, updates, grad_ops = [], [], []
    rates = _param_rates(optimize, values)
    for op in optimize:
        if op.type in UPDATE_OPS:
            try:
                updates.append(_update(op, values, rates))
            except _Refused as e:
                refused.append((op.type, op.index, str(e)))
        elif any(op is rate_op for rate_op, _ in rates.values()):
            continue
        elif RULES.lookup(op.type, paddle.op_versions.get(op.type)) is None:
            refused.append((op.type, op.index, "an optimizer-part op the table has no row "
                            "for (not an update of sgd, momentum, adam, adamw)"))
        else:
            grad_ops.append(op)
    if not updates and not refused:
        refused.append(("", -1, "the program has no optimizer update op (sgd, momentum, "
                        "adam, adamw): save it after minimize"))
    return updates, grad_ops, refused


def _param_rates(optimize, values):
    """{name: (op, learning rate)} of the per-parameter learning rates (ParamAttr's
    learning_rate): a `scale` of the saved learning rate that an update reads as its
    LearningRate, computed here in float32 as Paddle's op does."""
    read = {n for op in optimize if op.type in UPDATE_OPS
            for n in op.inputs.get("LearningRate", [])}
    rates = {}
    for op in optimize:
        ins, outs = op.inputs.get("X", []), op.outputs.get("Out", [])
        if (op.type != "scale" or len(ins) != 1 or len(outs) != 1 or outs[0] not in read
                or ins[0] not in values or op.inputs.get("ScaleTensor")):
            continue
        lr = np.asarray(values[ins[0]], np.float32).reshape(-1)
        scale, bias = np.float32(op.attrs.get("scale", 1.0)), np.float32(op.attrs.get("bias", 0.0))
        if lr.size == 1:
            rate = lr[0] * scale + bias if op.attrs.get("bias_after_scale", True) else (
                (lr[0] + bias) * scale)
            rates[outs[0]] = (op, float(np.float32(rate)))
    return rates


class _Refused(Exception):
    pass


def one_input(op, slot):
    """The one variable in input slot `slot` of the Paddle op `op`."""
    names = op.inputs.get(slot, [])
    if len(names) != 1:
        raise _Refused(f"input slot {slot} holds {len(names)} variables, expected 1")
    return names[0]


def _update(op, values, rates):
    a = op.attrs
    param = one_input(op, "Param")
    one_input(op, "Grad")
    for slot in ("MasterParam", "SkipUpdate", "Beta1Tensor", "Beta2Tensor", "EpsilonTensor",
                 "Moment2Max"):
        if op.inputs.get(slot):
            raise _Refused(f"input slot {slot} is used")
    if a.get("multi_precision"):
        raise _Refused("multi_precision (master weights)")
    lr = _learning_rate(one_input(op, "LearningRate"), values, rates)
    decay = 0.0     # Paddle's L2 regularization ops are translated with the gradients
    if op.type == "sgd":
        hyper = {}
    elif op.type == "momentum":
        if a.get("rescale_grad", 1.0) != 1.0:
            raise _Refused(f"rescale_grad={a['rescale_grad']}")
        method = a.get("regularization_method", "")
        if method not in ("", "l2_decay"):
            raise _Refused(f"regularization_method={method!r}")
        if method == "l2_decay":
            decay += float(a.get("regularization_coeff", 0.0))
        hyper = {"mu": float(a.get("mu", 0.9)), "use_nesterov": bool(a.get("use_nesterov"))}
    else:
        if a.get("amsgrad"):
            raise _Refused("amsgrad")
        if a.get("use_global_beta_pow"):
            raise _Refused("use_global_beta_pow")
        hyper = {k: float(a.get(k, d)) for k, d in
                 (("beta1", 0.9), ("beta2", 0.999), ("epsilon", 1e-8))}
        if op.type == "adamw":
            hyper["coeff"] = float(a.get("coeff", 0.01)) if a.get("with_decay", True) else 0.0
            lr *= float(a.get("lr_ratio", 1.0))
    return Update(op, param, op.type, tuple(sorted(hyper.items())), lr, decay)


def _learning_rate(name, values, rates):
    """The learning rate an update op reads: a saved value, or a parameter's rate."""
    if name in rates:
        return rates[name][1]
    if name not in values:
        raise _Refused(f"its learning rate '{name}' has no value in .pdopt/.pdparams "
                       "(computed by ops: a schedule?)")
    value = np.asarray(values[name])
    if value.size != 1 or value.dtype.kind != "f":
        raise _Refused(f"its learning rate '{name}' is {value.dtype}{list(value.shape)}, "
                       "not one float")
    return float(value.reshape(()))


def groups(updates):
    """The updates grouped by rule, hyperparameters and learning rate, in file order."""
    groups = {}
    for u in updates:
        groups.setdefault(u.key(), []).append(u)
    return list(groups.values())


def state_of(ours, ops, group, values):
    """{our state variable: Paddle's value} for the update ops `ops` our optimizer `ours`
    appended for `group`: each accumulator under the slot both ops share ('Moment1',
    'Velocity'), and Adam's step count from Paddle's beta powers."""
    by_param = {u.param: u for u in group}
    state = {}
    for op in ops:
        if op.type != ours.op_type:
            continue
        update = by_param[op.input("Param")[0]]
        for _, slot, _ in ours.state:
            paddle_name = one_input(update.op, slot)
            if paddle_name not in values:
                raise FormatError(f"the accumulator '{paddle_name}' ({slot} of "
                                  f"'{update.param}') has no value in the .pdopt file",
                                  var=paddle_name)
            state[op.input(slot)[0]] = values[paddle_name]
        if ours.uses_step:
            steps = {_adam_steps(u, values) for u in group}
            if len(steps) != 1:
                raise FormatError(f"Adam's beta powers of {[u.param for u in group]} are at "
                                  f"different steps {sorted(steps)}; ours count one step "
                                  "for all parameters")
            step = op.input("Step")[0]
            state[step] = np.array([steps.pop()], dtype=np.int64)
    return state


def _adam_steps(update, values):
    """The number of updates Paddle's Adam has applied, from beta1_pow = beta1 ** (n + 1)
    (checked against beta2_pow)."""
    counts = []
    for slot, beta in (("Beta1Pow", "beta1"), ("Beta2Pow", "beta2")):
        name = one_input(update.op, slot)
        if name not in values:
            raise FormatError(f"the accumulator '{name}' ({slot} of '{update.param}') has no "
                              "value in the .pdopt file", var=name)
        power = float(np.asarray(values[name]).reshape(-1)[0])
        b = dict(update.hyper)[beta]
        if not (0.0 < power <= 1.0 and 0.0 < b < 1.0):
            raise FormatError(f"'{name}' = {power} is not a power of {beta} = {b}", var=name)
        counts.append(math.log(power) / math.log(b) - 1.0)
    n = round(counts[0])
    if n < 0 or abs(counts[0] - n) > 1e-2 or abs(counts[1] - n) > max(0.5, 1e-3 * n):
        raise FormatError(f"the beta powers of '{update.param}' give {counts[0]:.3f} and "
                          f"{counts[1]:.3f} updates, not one whole number")
    return n
