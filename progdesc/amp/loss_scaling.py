"""Loss scaling as ops: scale the loss, unscale and check the gradients, move the scale,
and skip the update of a step whose gradients hold an inf or NaN.

The scale and the counts of good and bad steps in a row are persistable
variables (`loss_scaling_0`, `num_good_steps_0`, `num_bad_steps_0`), set by
the startup program and saved in checkpoints like any optimizer state.
"""
from dataclasses import dataclass

from lowering import progdesc_pb2 as pb
from lowering.errors import ProgramError
from progdesc.distributed.accumulate import select_writes
from progdesc.param import create_global_var


@dataclass(frozen=True)
class LossScaling:
    """Settings of (dynamic) loss scaling; the ops' names for them are Paddle's.

    `init_loss_scaling` is the first scale. With `dynamic`, the scale is
    multiplied by `incr_ratio` (PyTorch's growth_factor) after
    `incr_every_n_steps` good steps in a row (growth_interval), and by
    `decr_ratio` (backoff_factor) after `decr_every_n_nan_or_inf` bad steps
    in a row. Without it the scale stays fixed. Either way, a step whose
    gradients hold an inf or NaN leaves parameters and optimizer state as
    they were.
    """
    init_loss_scaling: float = 2.0 ** 15
    dynamic: bool = True
    incr_every_n_steps: int = 2000
    decr_every_n_nan_or_inf: int = 1
    incr_ratio: float = 2.0
    decr_ratio: float = 0.5

    def __post_init__(self):
        checks = (("init_loss_scaling", self.init_loss_scaling > 0, "positive"),
                  ("incr_every_n_steps", self.incr_every_n_steps >= 1, "at least 1"),
                  ("decr_every_n_nan_or_inf", self.decr_every_n_nan_or_inf >= 1, "at least 1"),
                  ("incr_ratio", self.incr_ratio > 1, "above 1"),
                  ("decr_ratio", 0 < self.decr_ratio < 1, "between 0 and 1"))
        for name, ok, want in checks:
            if not ok:
                raise ProgramError(f"loss scaling: {name} must be {want}, got "
                                   f"{getattr(self, name)!r}")


class LossScaler:
    """The loss-scaling ops of one program, appended step by step by `decorate`'s minimize.

    `scale`, `good_steps` and `bad_steps` are the persistable state
    Variables; `found_inf` is the bool Variable that tells whether this
    run's gradients held an inf or NaN (fetch it to watch skipped steps).
    Call inside program_guard(main, startup).
    """

    def __init__(self, settings, block):
        self.settings = settings
        self.block = block
        names = block.program.unique_name
        self.scale = create_global_var(names("loss_scaling"), [1], settings.init_loss_scaling)
        self.good_steps = create_global_var(names("num_good_steps"), [1], 0, "int32")
        self.bad_steps = create_global_var(names("num_bad_steps"), [1], 0, "int32")
        self.found_inf = None

    def scale_loss(self, loss):
        """Append loss * scale (float32) as the start of the backward pass; returns it."""
        if loss.dtype != "float32":
            loss = self._append("cast", {"X": loss}, {"dtype": "float32"}, f"{loss.name}.fp32")
        return self._append("mul", {"X": loss, "Y": self.scale}, {}, f"{loss.name}.scaled",
                            role=pb.BACKWARD)

    def unscale(self, params_grads):
        """Append check_finite_and_unscale; returns (its op, [(param, unscaled gradient)])."""
        block = self.block
        outs = [block.unused_name(f"{g.name}.unscaled") for _, g in params_grads]
        found_inf = block.unused_name("found_inf")
        op = block.append_op("check_finite_and_unscale",
                             {"X": [g for _, g in params_grads], "Scale": self.scale},
                             {"Out": outs, "FoundInfinite": found_inf}, role=pb.OPTIMIZE)
        self.found_inf = block.var(found_inf)
        return op, [(p, block.var(n)) for (p, _), n in zip(params_grads, outs)]

    def update(self):
        """Append update_loss_scaling, moving the scale in place, when dynamic; returns [ops]."""
        s = self.settings
        if not s.dynamic:
            return []
        return [self.block.append_op(
            "update_loss_scaling",
            {"FoundInfinite": self.found_inf, "PrevLossScaling": self.scale,
             "InGoodSteps": self.good_steps, "InBadSteps": self.bad_steps},
            {"LossScaling": self.scale, "OutGoodSteps": self.good_steps,
             "OutBadSteps": self.bad_steps},
            {"incr_every_n_steps": s.incr_every_n_steps,
             "decr_every_n_nan_or_inf": s.decr_every_n_nan_or_inf,
             "incr_ratio": float(s.incr_ratio), "decr_ratio": float(s.decr_ratio)},
            role=pb.OPTIMIZE)]

    def skip_step_if_found_inf(self, ops):
        """Make the update `ops` leave every persistable as it was when found_inf is set.

        Each persistable the ops write is written to a fresh variable instead
        (later ops of `ops` read that one), and one `where(found_inf, old,
        new)` per persistable writes it back: parameters, optimizer moments,
        the step counter of Adam and the learning-rate schedules alike.
        Returns the `where` ops.
        """
        return select_writes(self.block, [op.desc for op in ops], self.found_inf,
                             keep_old_if=True)

    def _append(self, op_type, inputs, attrs, name, role=pb.BACKWARD):
        out = self.block.unused_name(name)
        self.block.append_op(op_type, inputs, {"Out": out}, attrs, role=role)
        return self.block.var(out)
