"""Optimizer updates, gradient clipping, step counters and learning-rate schedules.

Every update op reads a parameter, its gradient, its optimizer state and the
learning rate, and writes the new parameter and state; the optimizer binds
each output to the same persistable variable as the matching input, so a run
of the program updates them in place. The math is optax's: each rule
rebuilds the optax state from its inputs and calls the transformation's
`update`; the op's attributes carry every hyperparameter (as float64, so
0.9 stays 0.9), so the program stays serializable. None of these ops is
differentiable.

LearningRate and Step are scalars of shape [] or [1]. Step is the count of
updates already applied (int or float), the `count` of optax's states.

Each rule imports optax itself: it loads (with the jax.scipy it imports) when a program
with an optimizer op is first lowered, not with progdesc.
"""
import jax.numpy as jnp

from lowering import dtypes
from lowering.constraints import between, non_negative, positive
from lowering.errors import ProgramError
from lowering.registry import REQUIRED, Attr, In, Out, op

_PARAM = [In("Param", "float"), In("Grad", "float")]


def _f64(name, default, doc="", where=None):
    """A float64 attribute: hyperparameters keep the exact value the user gave."""
    return Attr(name, "float64", default, doc=doc, where=where)


def _scalar(x, dtype):
    """A [] or [1] input as a 0-d value of `dtype`."""
    return jnp.reshape(x, ()).astype(dtype)


def _descend(param, updates, lr):
    """param - lr * updates, in the parameter's dtype (optax.apply_updates)."""
    import optax
    scaled, _ = optax.scale_by_learning_rate(_scalar(lr, param.dtype)).update(
        updates, optax.EmptyState())
    return optax.apply_updates(param, scaled)


@op("sgd", inputs=[*_PARAM, In("LearningRate", "float")], outputs=[Out("ParamOut")],
    same_dtype=("Param", "Grad"), differentiable=False)
def sgd(Param, Grad, LearningRate):
    """Gradient descent: ParamOut = Param - lr * Grad (optax.sgd)."""
    return _descend(Param, Grad, LearningRate)


@op("momentum", inputs=[*_PARAM, In("Velocity", "float"), In("LearningRate", "float")],
    outputs=[Out("ParamOut"), Out("VelocityOut")],
    attrs={"mu": _f64("mu", 0.9, where=non_negative), "use_nesterov": False},
    same_dtype=("Param", "Grad", "Velocity"), differentiable=False)
def momentum(Param, Grad, Velocity, LearningRate, *, mu, use_nesterov):
    """Heavy-ball or Nesterov momentum: velocity = mu * velocity + grad (optax.sgd with momentum)."""
    import optax
    updates, state = optax.trace(decay=mu, nesterov=use_nesterov).update(
        Grad, optax.TraceState(trace=Velocity))
    return _descend(Param, updates, LearningRate), state.trace.astype(Velocity.dtype)


_ADAM_INPUTS = [*_PARAM, In("Moment1", "float"), In("Moment2", "float"),
                In("LearningRate", "float"), In("Step", "number")]
_ADAM_OUTPUTS = [Out("ParamOut"), Out("Moment1Out"), Out("Moment2Out")]
_ADAM_ATTRS = {"beta1": _f64("beta1", 0.9, where=between(0, 1, open_hi=True)),
               "beta2": _f64("beta2", 0.999, where=between(0, 1, open_hi=True)),
               "epsilon": _f64("epsilon", 1e-8, where=non_negative)}


def _adam(Param, Grad, Moment1, Moment2, Step, beta1, beta2, epsilon):
    """optax.scale_by_adam's direction and new moments, from the op's inputs."""
    import optax
    # the count in the parameter's dtype: bias corrections computed as optax does in float32
    state = optax.ScaleByAdamState(count=_scalar(Step, Param.dtype), mu=Moment1, nu=Moment2)
    updates, state = optax.scale_by_adam(beta1, beta2, epsilon).update(Grad, state)
    return updates, state.mu.astype(Moment1.dtype), state.nu.astype(Moment2.dtype)


@op("adam", inputs=_ADAM_INPUTS, outputs=_ADAM_OUTPUTS, attrs=_ADAM_ATTRS,
    same_dtype=("Param", "Grad", "Moment1", "Moment2"), differentiable=False)
def adam(Param, Grad, Moment1, Moment2, LearningRate, Step, *, beta1, beta2, epsilon):
    """Adam with bias correction for update number Step + 1 (optax.adam)."""
    updates, m1, m2 = _adam(Param, Grad, Moment1, Moment2, Step, beta1, beta2, epsilon)
    return _descend(Param, updates, LearningRate), m1, m2


@op("adamw", inputs=_ADAM_INPUTS, outputs=_ADAM_OUTPUTS,
    attrs={**_ADAM_ATTRS, "weight_decay": _f64("weight_decay", 1e-4, where=non_negative)},
    same_dtype=("Param", "Grad", "Moment1", "Moment2"), differentiable=False)
def adamw(Param, Grad, Moment1, Moment2, LearningRate, Step, *, beta1, beta2, epsilon,
          weight_decay):
    """Adam with decoupled weight decay: step along adam + weight_decay * Param (optax.adamw)."""
    import optax
    updates, m1, m2 = _adam(Param, Grad, Moment1, Moment2, Step, beta1, beta2, epsilon)
    updates, _ = optax.add_decayed_weights(weight_decay).update(
        updates, optax.EmptyState(), Param)
    return _descend(Param, updates, LearningRate), m1, m2


@op("rmsprop",
    inputs=[*_PARAM, In("MeanSquare", "float"), In("LearningRate", "float"),
            In("MeanGrad", "float", optional=True), In("Moment", "float", optional=True)],
    outputs=[Out("ParamOut"), Out("MeanSquareOut"), Out("MeanGradOut"), Out("MomentOut")],
    attrs={"decay": _f64("decay", 0.9, where=between(0, 1)),
           "epsilon": _f64("epsilon", 1e-8, where=non_negative),
           "momentum": _f64("momentum", 0.0, where=non_negative), "centered": False},
    same_dtype=("Param", "Grad", "MeanSquare", "MeanGrad", "Moment"), differentiable=False)
def rmsprop(Param, Grad, MeanSquare, LearningRate, MeanGrad=None, Moment=None, *, decay,
            epsilon, momentum, centered):
    """RMSProp (optax.rmsprop): grad / sqrt(mean square [- mean grad ** 2] + epsilon).

    `centered` needs MeanGrad; a nonzero `momentum` needs Moment, which then
    accumulates lr-scaled steps (Moment = momentum * Moment + lr * step) and
    is subtracted from the parameter.
    """
    import optax
    if centered and MeanGrad is None:
        raise ProgramError("centered rmsprop needs the MeanGrad input")
    if momentum and Moment is None:
        raise ProgramError("rmsprop with momentum needs the Moment input")
    if centered:
        updates, state = optax.scale_by_stddev(decay, epsilon).update(
            Grad, optax.ScaleByRStdDevState(mu=MeanGrad, nu=MeanSquare))
        mean_grad = state.mu.astype(MeanGrad.dtype)
    else:
        updates, state = optax.scale_by_rms(decay, epsilon).update(
            Grad, optax.ScaleByRmsState(nu=MeanSquare))
        mean_grad = None
    mean_square = state.nu.astype(MeanSquare.dtype)
    if Moment is None:
        return _descend(Param, updates, LearningRate), mean_square, mean_grad, None
    steps = _scalar(LearningRate, Param.dtype) * updates
    steps, trace = optax.trace(decay=momentum).update(steps, optax.TraceState(trace=Moment))
    return (optax.apply_updates(Param, -steps), mean_square, mean_grad,
            trace.trace.astype(Moment.dtype))


@op("increment", inputs=[In("X", "number")], outputs=[Out("Out")], attrs={"step": 1.0},
    differentiable=False)
def increment(X, *, step):
    """X + step, in X's dtype (step counters)."""
    return X + jnp.asarray(step, X.dtype)


@op("clip_by_global_norm", inputs=[In("X", "float", many=True)],
    outputs=[Out("Out", many=True)], attrs={"max_norm": _f64("max_norm", REQUIRED, where=positive)},
    differentiable=False)
def clip_by_global_norm(X, *, max_norm):
    """Scale every X by max_norm / (global norm of all X) when that norm exceeds max_norm."""
    import optax
    clipped, _ = optax.clip_by_global_norm(max_norm).update(list(X), optax.EmptyState())
    return [c.astype(x.dtype) for c, x in zip(clipped, X)]


# --- learning-rate schedules: functions of the step counter, elementwise over Step ---

_KINDS = ("constant", "exponential_decay", "cosine", "polynomial", "piecewise")


def _schedule(kind, *, learning_rate, decay_steps, decay_rate, staircase, alpha, end_value,
              power, boundaries, values):
    """The optax schedule an lr_schedule op's attributes describe."""
    import optax
    sched = optax.schedules
    if kind == "constant":
        return sched.constant_schedule(learning_rate)
    if kind == "exponential_decay":
        return sched.exponential_decay(learning_rate, decay_steps, decay_rate,
                                       staircase=staircase)
    if kind == "cosine":
        return sched.cosine_decay_schedule(learning_rate, decay_steps, alpha)
    if kind == "polynomial":
        return sched.polynomial_schedule(learning_rate, end_value, power, decay_steps)
    return sched.join_schedules([sched.constant_schedule(v) for v in values], boundaries)


@op("lr_schedule", inputs=[In("Step", "number")], outputs=[Out("Out")],
    attrs={"kind": Attr("kind", "string", REQUIRED, doc=" | ".join(_KINDS)),
           "learning_rate": _f64("learning_rate", 0.0, "value at count 0"),
           "decay_steps": 1, "decay_rate": _f64("decay_rate", 1.0), "staircase": False,
           "alpha": _f64("alpha", 0.0, "cosine: final fraction of the rate"),
           "end_value": _f64("end_value", 0.0), "power": _f64("power", 1.0),
           "boundaries": Attr("boundaries", "ints", (), doc="piecewise: ascending steps"),
           "values": Attr("values", "float64s", (), doc="piecewise: one more than boundaries"),
           "offset": Attr("offset", "int", 0, doc="evaluate at count max(Step - offset, 0)"),
           "dtype": Attr("dtype", "dtype", "float32")},
    differentiable=False)
def lr_schedule(Step, *, kind, offset, dtype, **params):
    """The learning rate at step count max(Step - offset, 0) (optax.schedules).

    kind: constant (learning_rate); exponential_decay (learning_rate *
    decay_rate ** (count / decay_steps), floored exponent if staircase);
    cosine (decay to alpha * learning_rate over decay_steps); polynomial
    (learning_rate to end_value over decay_steps, with `power`); piecewise
    (values[i] from boundaries[i - 1] on).
    """
    count = jnp.maximum(Step - jnp.asarray(offset, Step.dtype), jnp.zeros((), Step.dtype))
    value = _schedule(kind, **params)(count)
    return jnp.broadcast_to(jnp.asarray(value), Step.shape).astype(dtypes.to_numpy(dtype))


@lr_schedule.shape_rule
def _(inputs, attrs):
    kind = attrs["kind"]
    if kind not in _KINDS:
        raise ProgramError(f"unknown schedule kind '{kind}' (one of {', '.join(_KINDS)})")
    if kind != "constant" and kind != "piecewise" and attrs["decay_steps"] <= 0:
        raise ProgramError(f"decay_steps must be positive, got {attrs['decay_steps']}")
    if kind == "piecewise":
        bounds, values = attrs["boundaries"], attrs["values"]
        if len(values) != len(bounds) + 1 or list(bounds) != sorted(bounds):
            raise ProgramError("piecewise needs ascending boundaries and one more value "
                               f"than boundaries, got {list(bounds)} and {list(values)}")
    (dims, _), = inputs["Step"]
    return {"Out": [(tuple(dims), dtypes.name_of(attrs["dtype"]))]}


@op("linear_warmup", inputs=[In("Step", "number"), In("LearningRate", "float")],
    outputs=[Out("Out")],
    attrs={"warmup_steps": Attr("warmup_steps", "int", REQUIRED, where=non_negative),
           "start_value": _f64("start_value", 0.0), "end_value": _f64("end_value", REQUIRED),
           "offset": Attr("offset", "int", 0, doc="evaluate at count max(Step - offset, 0)")},
    differentiable=False)
def linear_warmup(Step, LearningRate, *, warmup_steps, start_value, end_value, offset):
    """Ramp linearly from start_value to end_value over warmup_steps, then LearningRate.

    LearningRate is the wrapped schedule, evaluated by its own op at
    count - warmup_steps (optax.join_schedules).
    """
    import optax
    count = jnp.maximum(Step - jnp.asarray(offset, Step.dtype), jnp.zeros((), Step.dtype))
    warm = optax.schedules.linear_schedule(start_value, end_value, warmup_steps)
    joined = optax.schedules.join_schedules([warm, lambda _: LearningRate], [warmup_steps])
    return joined(count).astype(LearningRate.dtype)
