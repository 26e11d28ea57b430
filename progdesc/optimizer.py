"""Optimizers: append the gradient and update ops that train a program's parameters.

    loss = ...
    opt = Adam(learning_rate=1e-3, grad_clip=ClipGradByGlobalNorm(1.0))
    optimize_ops, params_grads = opt.minimize(loss)

`minimize` appends the backward pass, then (role OPTIMIZE) optional
global-norm clipping, L2 regularization added to the gradients, and one
update op per parameter whose outputs are the parameter and its state
themselves, so each run of the main program updates them in place in the
Scope. Optimizer state is persistable, initialized to zero by the startup
program and named after its parameter ('fc_0.w_0.moment1'). Learning-rate
schedules (progdesc.lr) and Adam read the shared step counter '@LR_STEP@',
which one `increment` op at the end of the program advances once per run.
"""
from lowering import progdesc_pb2 as pb
from lowering.errors import ProgramError
from progdesc import lr as lr_sched
from progdesc.backward import append_backward
from progdesc.distributed.accumulate import accumulate, check_can_accumulate, check_steps
from progdesc.distributed.data_parallel import minimize_option
from progdesc.distributed.sharding import sharding_of
from progdesc.framework import Variable, default_startup_program, program_guard
from progdesc.param import create_global_var, param_settings

STEP_VAR = "@LR_STEP@"


class ClipGradByGlobalNorm:
    """Scale all gradients by clip_norm / global norm when their global norm exceeds clip_norm."""

    def __init__(self, clip_norm):
        self.clip_norm = float(clip_norm)

    def append(self, block, params_grads):
        """Append the clipping op; returns [(param, clipped gradient)]."""
        outs = [block.unused_name(f"{g.name}.clipped") for _, g in params_grads]
        block.append_op("clip_by_global_norm", {"X": [g for _, g in params_grads]},
                        {"Out": outs}, {"max_norm": self.clip_norm}, role=pb.OPTIMIZE)
        return [(p, block.var(n)) for (p, _), n in zip(params_grads, outs)]


class Optimizer:
    """Base class; subclasses name their update op, its state, and its attributes.

    `learning_rate` is a float, an LRSchedule (progdesc.lr) or a float
    Variable of shape [] or [1]. `weight_decay` is an L2 coefficient added
    to the gradient of every parameter without a regularizer of its own
    (ParamAttr.regularizer). `grad_clip` is a ClipGradByGlobalNorm or None.
    """
    op_type = None
    state = ()           # (state suffix, input slot, output slot)
    uses_step = False    # whether the update op reads the step counter

    def __init__(self, learning_rate=0.001, *, weight_decay=0.0, grad_clip=None):
        if not isinstance(learning_rate, Variable):
            learning_rate = lr_sched.as_schedule(learning_rate)
        self.learning_rate = learning_rate
        self.weight_decay = float(weight_decay)
        self.grad_clip = grad_clip
        self.lr_var = None
        """The learning-rate Variable of the last `minimize` (fetch it to watch the schedule)."""

    def attrs(self):
        """Attributes of the update op."""
        return {}

    def minimize(self, loss, startup_program=None, parameter_list=None, no_grad_set=None,
                 data_parallel=False, accumulate_steps=1):
        """Append backward and update ops for `loss`; returns (optimize ops, params_grads).

        With `data_parallel=True` (or a mesh axis name, default "data") each parameter
        gradient is all-reduced (averaged) over the devices of that mesh axis before the
        updates (progdesc.distributed.all_reduce_gradients): run the program with
        `Executor(mesh=...)` to train one copy per device on its share of the batch.

        With `accumulate_steps=k` (an int >= 1) the program updates the parameters once
        every k runs, with the mean of the k runs' gradients: k micro-batches make the
        step of their whole batch (progdesc.distributed.accumulate_gradients).

        `params_grads` are the [(parameter, gradient)] pairs of the backward
        pass, before clipping and regularization. Raises BackwardError when
        the loss depends on no trainable parameter, and ProgramError (leaving the
        program as it was) when an earlier `minimize` already updates one of them.
        """
        check_steps(accumulate_steps)
        if isinstance(loss, Variable):
            check_can_accumulate(loss.block, accumulate_steps)
            check_not_updated(loss, parameter_list, no_grad_set)
        params_grads = append_backward(loss, parameter_list, no_grad_set)
        minimize_option(loss.block, params_grads, data_parallel)
        ops = self.apply_gradients(params_grads, startup_program)
        if accumulate_steps > 1:
            accumulate(loss.block, params_grads, accumulate_steps, startup_program)
        return ops, params_grads

    def apply_gradients(self, params_grads, startup_program=None):
        """Append clipping, regularization and update ops for [(param, grad)]; returns the ops.

        Raises ProgramError if an update op of the program already writes one of the
        parameters: two optimizers must train disjoint sets of parameters.
        """
        block = params_grads[0][0].block
        _check_not_updated(block, params_grads)
        main = block.program
        startup = startup_program or default_startup_program()
        with program_guard(main, startup):
            needs_step = self.uses_step or (isinstance(self.learning_rate, lr_sched.LRSchedule)
                                            and not isinstance(self.learning_rate,
                                                               lr_sched.Constant))
            step = _take_step_counter(block) if needs_step else None
            start = len(block.desc.ops)
            lr = self.lr_var = self._learning_rate(block, step)
            if self.grad_clip is not None:
                params_grads = self.grad_clip.append(block, list(params_grads))
            for param, grad in params_grads:
                attr = param_settings(param)
                grad = self._regularize(block, param, grad, attr)
                param_lr = lr if attr.learning_rate == 1.0 else _op(
                    block, "scale", {"X": lr}, {"scale": attr.learning_rate},
                    f"{param.name}.learning_rate")
                self._append_update(block, param, grad, param_lr, step)
            if step is not None:
                block.append_op("increment", {"X": step}, {"Out": step}, {"step": 1.0},
                                role=pb.LR_SCHED)
        return block.ops[start:]

    def _learning_rate(self, block, step):
        if isinstance(self.learning_rate, Variable):
            return self.learning_rate
        if isinstance(self.learning_rate, lr_sched.Constant):
            return create_global_var(block.program.unique_name("learning_rate"), [1],
                                     self.learning_rate.learning_rate, "float32")
        return self.learning_rate.append(block, step)

    def _l2(self, attr):
        return attr.regularizer or self.weight_decay

    def _regularize(self, block, param, grad, attr):
        coeff = self._l2(attr)
        if not coeff:
            return grad
        decay = _op(block, "scale", {"X": param}, {"scale": float(coeff)}, f"{param.name}.l2_decay")
        return _op(block, "sum", {"X": [grad, decay]}, {}, f"{grad.name}.regularized")

    def _append_update(self, block, param, grad, lr, step):
        inputs = {"Param": param, "Grad": grad, "LearningRate": lr}
        outputs = {"ParamOut": param}
        for suffix, slot, out_slot in self.state:
            var = create_global_var(f"{param.name}.{suffix}", param.shape, 0.0, param.dtype,
                                    sharding=sharding_of(param.desc))
            inputs[slot], outputs[out_slot] = var, var
        if self.uses_step:
            inputs["Step"] = step
        return block.append_op(self.op_type, inputs, outputs, self.attrs(), role=pb.OPTIMIZE)


def check_not_updated(loss, parameter_list=None, no_grad_set=None):
    """Raise the ProgramError of a second `minimize` if an optimizer of `loss`'s program
    already updates a parameter that minimize(loss, parameter_list, no_grad_set) would
    train, before anything is appended (minimize, and wrappers that change the program
    first such as progdesc.amp); the program is left as it was."""
    block = loss.block
    if not any(op_desc.role == pb.OPTIMIZE for op_desc in block.desc.ops):
        return
    sizes = len(block.desc.ops), len(block.desc.vars)
    try:   # the parameters the loss depends on are those its backward pass finds
        _check_not_updated(block, append_backward(loss, parameter_list, no_grad_set))
    finally:
        _take_out_appended(block, sizes)


def _take_out_appended(block, sizes):
    """Remove the ops and variables appended to `block` since it held `sizes` (ops, vars)."""
    del block.desc.ops[sizes[0]:]
    del block.desc.vars[sizes[1]:]
    block.sync()


def _check_not_updated(block, params_grads):
    """ProgramError naming the parameters of `params_grads` an optimizer-role op already
    writes (an update op, or the `where` that writes back a loss-scaled AMP step)."""
    updated = {name for op_desc in block.desc.ops if op_desc.role == pb.OPTIMIZE
               for slot in op_desc.outputs for name in slot.arguments}
    clash = [p.name for p, _ in params_grads if p.name in updated]
    if clash:
        raise ProgramError(
            f"parameters {', '.join(clash)} are already updated by an optimizer of this "
            "program: a second minimize would update them twice per run. Give each optimizer "
            "its own parameters (minimize's parameter_list), or minimize the sum of the losses"
            + _why_repeated())


def _why_repeated():
    from progdesc.recording.loops import why_redeclared   # lazy: recording imports this module
    return why_redeclared().replace("declares the same names again", "minimizes again")


def _op(block, op_type, inputs, attrs, name):
    """Append one OPTIMIZE-role op with a single output named after `name`; returns it."""
    out = block.unused_name(name)
    block.append_op(op_type, inputs, {"Out": [out]}, attrs, role=pb.OPTIMIZE)
    return block.var(out)


def _take_step_counter(block):
    """The step counter, its increment op removed so that it can be appended again at the end."""
    step = create_global_var(STEP_VAR, [1], 0.0, "int64")
    for i, op_desc in enumerate(block.desc.ops):
        if op_desc.type == "increment" and any(
                STEP_VAR in s.arguments for s in op_desc.outputs):
            block.remove_op(i)
            break
    return step


class SGD(Optimizer):
    """param -= lr * grad."""
    op_type = "sgd"


class Momentum(Optimizer):
    """velocity = momentum * velocity + grad; param -= lr * velocity (or the Nesterov step)."""
    op_type = "momentum"
    state = (("velocity", "Velocity", "VelocityOut"),)

    def __init__(self, learning_rate=0.001, momentum=0.9, use_nesterov=False, **kw):
        super().__init__(learning_rate, **kw)
        self.momentum, self.use_nesterov = float(momentum), bool(use_nesterov)

    def attrs(self):
        return {"mu": self.momentum, "use_nesterov": self.use_nesterov}


class Adam(Optimizer):
    """Adam (optax.adam); `weight_decay` is L2 added to the gradient (use AdamW to decouple it)."""
    op_type = "adam"
    state = (("moment1", "Moment1", "Moment1Out"), ("moment2", "Moment2", "Moment2Out"))
    uses_step = True

    def __init__(self, learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8, **kw):
        super().__init__(learning_rate, **kw)
        self.beta1, self.beta2, self.epsilon = float(beta1), float(beta2), float(epsilon)

    def attrs(self):
        return {"beta1": self.beta1, "beta2": self.beta2, "epsilon": self.epsilon}


class AdamW(Adam):
    """Adam with decoupled weight decay (optax.adamw): param -= lr * (adam step + wd * param).

    `weight_decay` here is the decoupled coefficient, not an L2 term in the
    gradient; ParamAttr.regularizer still adds L2 to a parameter's gradient.
    """
    op_type = "adamw"

    def __init__(self, learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8,
                 weight_decay=0.01, **kw):
        super().__init__(learning_rate, beta1, beta2, epsilon, **kw)
        self.decoupled_decay = float(weight_decay)

    def _l2(self, attr):
        return attr.regularizer

    def attrs(self):
        return dict(super().attrs(), weight_decay=self.decoupled_decay)


class RMSProp(Optimizer):
    """RMSProp (optax.rmsprop): grad / sqrt(EMA of grad ** 2 [- EMA of grad ** 2 if centered] + eps).

    `rho` is the decay of the moving averages; with `momentum` the scaled
    steps accumulate in a velocity-like 'moment' state.
    """
    op_type = "rmsprop"

    def __init__(self, learning_rate=0.001, rho=0.9, epsilon=1e-8, momentum=0.0,
                 centered=False, **kw):
        super().__init__(learning_rate, **kw)
        self.rho, self.epsilon = float(rho), float(epsilon)
        self.momentum, self.centered = float(momentum), bool(centered)
        self.state = (("mean_square", "MeanSquare", "MeanSquareOut"),)
        if centered:
            self.state += (("mean_grad", "MeanGrad", "MeanGradOut"),)
        if momentum:
            self.state += (("moment", "Moment", "MomentOut"),)

    def attrs(self):
        return {"decay": self.rho, "epsilon": self.epsilon, "momentum": self.momentum,
                "centered": self.centered}
