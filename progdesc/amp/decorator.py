"""`decorate`: an optimizer whose minimize trains in mixed precision."""
from progdesc.amp.lists import AmpLists
from progdesc.amp.loss_scaling import LossScaler, LossScaling
from progdesc.amp.rewrite import low_dtype, rewrite_program
from progdesc.backward import append_backward
from progdesc.distributed.accumulate import accumulate, check_can_accumulate
from progdesc.distributed.data_parallel import minimize_option
from progdesc.framework import default_startup_program, program_guard
from progdesc.optimizer import check_not_updated


class MixedPrecisionOptimizer:
    """An optimizer wrapped by `decorate`; see there.

    After `minimize`, `loss_scaler` is the LossScaler of the program (None
    without loss scaling): its `scale`, `good_steps`, `bad_steps` and
    `found_inf` Variables can be fetched.
    """

    def __init__(self, optimizer, dtype, lists, loss_scaling):
        self.optimizer = optimizer
        self.dtype = dtype
        self.lists = lists
        self.loss_scaling = loss_scaling
        self.loss_scaler = None

    @property
    def lr_var(self):
        """The learning-rate Variable of the last `minimize`."""
        return self.optimizer.lr_var

    def minimize(self, loss, startup_program=None, parameter_list=None, no_grad_set=None,
                 data_parallel=False, accumulate_steps=1):
        """Rewrite the forward program, then append backward, loss scaling and update ops.

        Returns (optimize ops, [(parameter, gradient)]) like Optimizer.minimize;
        with loss scaling the gradients are the unscaled ones. Like it, raises
        ProgramError, leaving the program as it was, when an earlier minimize
        already updates one of the parameters, and takes `data_parallel`: the
        gradients are all-reduced before they are unscaled and checked, so an inf
        on one device skips the step on every device. And `accumulate_steps`: the
        scaled gradients are accumulated, then unscaled and checked once per update, so
        an inf in any micro-batch skips the update and moves the loss scale once.
        """
        main = loss.block.program
        startup = startup_program or default_startup_program()
        check_can_accumulate(loss.block, accumulate_steps)
        check_not_updated(loss, parameter_list, no_grad_set)
        rewrite_program(main, self.dtype, self.lists)
        block = loss.block
        with program_guard(main, startup):
            if self.loss_scaling is None:
                params_grads = accumulated = append_backward(loss, parameter_list,
                                                             no_grad_set)
                minimize_option(block, params_grads, data_parallel)
                ops = self.optimizer.apply_gradients(params_grads, startup)
            else:
                scaler = self.loss_scaler = LossScaler(self.loss_scaling, block)
                accumulated = append_backward(scaler.scale_loss(loss), parameter_list,
                                              no_grad_set)
                minimize_option(block, accumulated, data_parallel)
                unscale_op, params_grads = scaler.unscale(accumulated)
                ops = [unscale_op, *scaler.update()]
                update_ops = self.optimizer.apply_gradients(params_grads, startup)
                ops += update_ops + scaler.skip_step_if_found_inf(update_ops)
            if accumulate_steps > 1:
                accumulate(block, accumulated, accumulate_steps, startup)
        return ops, params_grads


def decorate(optimizer, dtype="bfloat16", lists=None, *, init_loss_scaling=2.0 ** 15,
             use_dynamic_loss_scaling=None, incr_every_n_steps=2000, decr_every_n_nan_or_inf=1,
             incr_ratio=2.0, decr_ratio=0.5):
    """Wrap `optimizer` so that its `minimize(loss)` trains in mixed precision.

        opt = progdesc.amp.decorate(progdesc.optimizer.Adam(1e-3), dtype="float16")
        opt.minimize(loss)

    `dtype` is 'bfloat16' (default) or 'float16'; `lists` an AmpLists.
    minimize rewrites the forward program (rewrite_program), then appends
    the backward pass and the optimizer's update ops; parameters and
    optimizer state stay float32.

    Loss scaling: float16 uses it, dynamic by default (use_dynamic_loss_scaling
    False keeps the scale at init_loss_scaling); bfloat16, with float32's
    range, uses none unless use_dynamic_loss_scaling is True. With loss
    scaling, a step whose gradients hold an inf or NaN changes no parameter
    and no optimizer state (Adam's moments and step count included), and the
    dynamic scale moves as LossScaling describes, from `init_loss_scaling`
    with `incr_every_n_steps`, `decr_every_n_nan_or_inf`, `incr_ratio` and
    `decr_ratio` (PyTorch's GradScaler: growth_interval, backoff after every
    bad step, growth_factor, backoff_factor).
    """
    dtype = low_dtype(dtype)
    if use_dynamic_loss_scaling is None:
        use_dynamic_loss_scaling = dtype == "float16"
    scaling = None
    if use_dynamic_loss_scaling or dtype == "float16":
        scaling = LossScaling(float(init_loss_scaling), bool(use_dynamic_loss_scaling),
                              int(incr_every_n_steps), int(decr_every_n_nan_or_inf),
                              float(incr_ratio), float(decr_ratio))
    return MixedPrecisionOptimizer(optimizer, dtype, lists or AmpLists(), scaling)
