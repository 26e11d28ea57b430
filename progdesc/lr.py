"""Learning-rate schedules: the rate as a function of the optimizer's step counter.

A schedule is a plain description; the optimizer calls `append(block, step)`
once, which appends the `lr_schedule` (and `linear_warmup`) ops computing
the rate from the persistable step counter and returns the rate Variable.
The counter holds the number of runs of the main program so far, so the
first run uses the rate at count 0, as optax's schedules do.

    opt = Adam(learning_rate=LinearWarmup(CosineDecay(0.1, 1000), warmup_steps=100))
"""
from lowering import progdesc_pb2 as pb


class LRSchedule:
    """Base class: `attrs()` gives the lr_schedule op's attributes (kind and its parameters)."""

    def attrs(self):
        """{attribute: value} of the lr_schedule op, without `offset`."""
        raise NotImplementedError

    @property
    def initial_value(self):
        """The rate at count 0."""
        return self.attrs()["learning_rate"]

    def append(self, block, step, offset=0):
        """Append the ops computing the rate at count max(step - offset, 0); returns its Variable."""
        op = block.append_op("lr_schedule", {"Step": step}, None,
                             dict(self.attrs(), offset=int(offset)), role=pb.LR_SCHED,
                             name="learning_rate")
        return block.var(op.output("Out")[0])

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({args})"


class Constant(LRSchedule):
    """The same rate at every step."""

    def __init__(self, learning_rate):
        self.learning_rate = float(learning_rate)

    def attrs(self):
        return {"kind": "constant", "learning_rate": self.learning_rate}


class ExponentialDecay(LRSchedule):
    """learning_rate * decay_rate ** (count / decay_steps); the exponent floored if staircase."""

    def __init__(self, learning_rate, decay_steps, decay_rate, staircase=False):
        self.learning_rate, self.decay_steps = float(learning_rate), _positive(decay_steps)
        self.decay_rate, self.staircase = float(decay_rate), bool(staircase)

    def attrs(self):
        return {"kind": "exponential_decay", "learning_rate": self.learning_rate,
                "decay_steps": self.decay_steps, "decay_rate": self.decay_rate,
                "staircase": self.staircase}


class StepDecay(ExponentialDecay):
    """learning_rate * gamma ** (count // step_size)."""

    def __init__(self, learning_rate, step_size, gamma=0.1):
        super().__init__(learning_rate, step_size, gamma, staircase=True)


class CosineDecay(LRSchedule):
    """Cosine decay from learning_rate to alpha * learning_rate over decay_steps, then flat."""

    def __init__(self, learning_rate, decay_steps, alpha=0.0):
        self.learning_rate, self.decay_steps = float(learning_rate), _positive(decay_steps)
        self.alpha = float(alpha)

    def attrs(self):
        return {"kind": "cosine", "learning_rate": self.learning_rate,
                "decay_steps": self.decay_steps, "alpha": self.alpha}


class PolynomialDecay(LRSchedule):
    """From learning_rate to end_value over decay_steps along (1 - count / decay_steps) ** power."""

    def __init__(self, learning_rate, decay_steps, end_value=0.0, power=1.0):
        self.learning_rate, self.decay_steps = float(learning_rate), _positive(decay_steps)
        self.end_value, self.power = float(end_value), float(power)

    def attrs(self):
        return {"kind": "polynomial", "learning_rate": self.learning_rate,
                "decay_steps": self.decay_steps, "end_value": self.end_value,
                "power": self.power}


class PiecewiseDecay(LRSchedule):
    """values[0] before boundaries[0], values[i] from boundaries[i - 1] on."""

    def __init__(self, boundaries, values):
        self.boundaries, self.values = [int(b) for b in boundaries], [float(v) for v in values]
        if len(self.values) != len(self.boundaries) + 1 or self.boundaries != sorted(
                self.boundaries):
            raise ValueError("PiecewiseDecay needs ascending boundaries and one more value "
                             "than boundaries")

    @property
    def initial_value(self):
        return self.values[0]

    def attrs(self):
        return {"kind": "piecewise", "boundaries": self.boundaries, "values": self.values}


class LinearWarmup(LRSchedule):
    """Ramp linearly from start_value to end_value over warmup_steps, then follow `learning_rate`.

    `learning_rate` is a float or another schedule, which starts at its own
    count 0 when the warmup ends; `end_value` defaults to its initial value.
    """

    def __init__(self, learning_rate, warmup_steps, start_value=0.0, end_value=None):
        self.learning_rate = as_schedule(learning_rate)
        self.warmup_steps = _positive(warmup_steps)
        self.start_value = float(start_value)
        self.end_value = float(self.learning_rate.initial_value if end_value is None
                               else end_value)

    @property
    def initial_value(self):
        return self.start_value

    def attrs(self):
        raise TypeError("LinearWarmup is made of several ops; use append()")

    def append(self, block, step, offset=0):
        inner = self.learning_rate.append(block, step, offset + self.warmup_steps)
        op = block.append_op("linear_warmup", {"Step": step, "LearningRate": inner}, None,
                             {"warmup_steps": self.warmup_steps, "start_value": self.start_value,
                              "end_value": self.end_value, "offset": int(offset)},
                             role=pb.LR_SCHED, name="learning_rate")
        return block.var(op.output("Out")[0])


def as_schedule(learning_rate):
    """A schedule from a schedule or a number (a Constant)."""
    if isinstance(learning_rate, LRSchedule):
        return learning_rate
    if isinstance(learning_rate, (int, float)) and not isinstance(learning_rate, bool):
        return Constant(learning_rate)
    raise TypeError(f"expected a learning rate or an LRSchedule, got {type(learning_rate).__name__}")


def _positive(steps):
    if isinstance(steps, bool) or int(steps) != steps or steps <= 0:
        raise ValueError(f"step counts must be positive integers, got {steps!r}")
    return int(steps)
