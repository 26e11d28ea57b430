"""Samples of lowering/ops/optimizer.py, with the update rules written out in NumPy."""
import numpy as np

from op_table import Sample, positive, rand

F32 = np.float32
LR = np.array([0.1], F32)
LR_SCALAR = np.array(0.05, F32)


def _f32(*arrays):
    out = tuple(np.asarray(a).astype(F32) for a in arrays)
    return out if len(out) > 1 else out[0]


def _lr(lr):
    return float(np.reshape(lr, ()))


def _sgd(Param, Grad, LearningRate):
    return _f32(Param - _lr(LearningRate) * Grad)


def _momentum(Param, Grad, Velocity, LearningRate, mu=0.9, use_nesterov=False):
    v = mu * Velocity + Grad
    step = Grad + mu * v if use_nesterov else v
    return _f32(Param - _lr(LearningRate) * step, v)


def _adam_dir(Grad, Moment1, Moment2, Step, beta1, beta2, epsilon):
    m = beta1 * Moment1.astype(np.float64) + (1 - beta1) * Grad
    v = beta2 * Moment2.astype(np.float64) + (1 - beta2) * Grad ** 2
    t = float(np.reshape(Step, ())) + 1
    m_hat, v_hat = m / (1 - beta1 ** t), v / (1 - beta2 ** t)
    return m_hat / (np.sqrt(v_hat) + epsilon), m, v


def _adam(Param, Grad, Moment1, Moment2, LearningRate, Step, beta1=0.9, beta2=0.999,
          epsilon=1e-8):
    d, m, v = _adam_dir(Grad, Moment1, Moment2, Step, beta1, beta2, epsilon)
    return _f32(Param - _lr(LearningRate) * d, m, v)


def _adamw(Param, Grad, Moment1, Moment2, LearningRate, Step, beta1=0.9, beta2=0.999,
           epsilon=1e-8, weight_decay=1e-4):
    d, m, v = _adam_dir(Grad, Moment1, Moment2, Step, beta1, beta2, epsilon)
    return _f32(Param - _lr(LearningRate) * (d + weight_decay * Param), m, v)


def _rmsprop(Param, Grad, MeanSquare, LearningRate, MeanGrad=None, Moment=None, decay=0.9,
             epsilon=1e-8, momentum=0.0, centered=False):
    ms = decay * MeanSquare + (1 - decay) * Grad ** 2
    mg = decay * MeanGrad + (1 - decay) * Grad if centered else None
    step = Grad / np.sqrt(ms - (mg ** 2 if centered else 0) + epsilon) * _lr(LearningRate)
    mom = None if Moment is None else momentum * Moment + step
    new_param = Param - (step if Moment is None else mom)
    return (_f32(new_param), _f32(ms), None if mg is None else _f32(mg),
            None if mom is None else _f32(mom))


def _clip(X, max_norm):
    norm = np.sqrt(sum(float(np.sum(np.square(x, dtype=np.float64))) for x in X))
    return [x if norm < max_norm else (x * (max_norm / norm)).astype(x.dtype) for x in X]


def _count(Step, offset=0):
    return np.maximum(Step.astype(np.float64) - offset, 0)


def _schedule(Step, kind, learning_rate=0.0, decay_steps=1, decay_rate=1.0, staircase=False,
              alpha=0.0, end_value=0.0, power=1.0, boundaries=(), values=(), offset=0,
              dtype="float32"):
    c = _count(Step, offset)
    if kind == "constant":
        out = np.full(c.shape, learning_rate)
    elif kind == "exponential_decay":
        p = np.floor(c / decay_steps) if staircase else c / decay_steps
        out = learning_rate * decay_rate ** p
    elif kind == "cosine":
        cos = 0.5 * (1 + np.cos(np.pi * np.minimum(c, decay_steps) / decay_steps))
        out = learning_rate * ((1 - alpha) * cos + alpha)
    elif kind == "polynomial":
        frac = 1 - np.minimum(c, decay_steps) / decay_steps
        out = (learning_rate - end_value) * frac ** power + end_value
    else:
        out = np.asarray(values)[np.searchsorted(boundaries, c, side="right")]
    return out.astype(dtype)


def _warmup(Step, LearningRate, warmup_steps, end_value, start_value=0.0, offset=0):
    c = _count(Step, offset)
    ramp = start_value + (end_value - start_value) * np.minimum(c, warmup_steps) / warmup_steps
    return np.where(c < warmup_steps, ramp, LearningRate).astype(LearningRate.dtype)


P, G = rand(3, 4), rand(3, 4, seed=1)
STEPS = np.array([0, 1, 3, 7, 10, 25], np.int64)
ADAM_STATE = {"Moment1": rand(3, 4, seed=2) * 0.1, "Moment2": positive(3, 4, seed=3) * 0.01}

SAMPLES = [
    Sample("sgd", {"Param": P, "Grad": G, "LearningRate": LR}, _sgd),
    Sample("sgd", {"Param": rand(5), "Grad": rand(5, seed=1), "LearningRate": LR_SCALAR},
           _sgd, name="scalar_lr"),
    Sample("momentum", {"Param": P, "Grad": G, "Velocity": rand(3, 4, seed=2),
                        "LearningRate": LR}, _momentum),
    Sample("momentum", {"Param": P, "Grad": G, "Velocity": rand(3, 4, seed=2),
                        "LearningRate": LR}, _momentum,
           attrs={"mu": 0.5, "use_nesterov": True}, name="nesterov"),
    Sample("adam", {"Param": P, "Grad": G, **ADAM_STATE, "LearningRate": LR,
                    "Step": np.array([0], np.int64)}, _adam, name="first_step"),
    Sample("adam", {"Param": P, "Grad": G, **ADAM_STATE, "LearningRate": LR,
                    "Step": np.array([4.0], F32)}, _adam,
           attrs={"beta1": 0.8, "beta2": 0.99, "epsilon": 1e-6}, name="float_step"),
    Sample("adam", {"Param": rand(2, 3), "Grad": rand(2, 3, seed=1),
                    "Moment1": np.zeros((2, 3), F32), "Moment2": np.zeros((2, 3), F32),
                    "LearningRate": LR_SCALAR, "Step": np.array(9, np.int32)}, _adam,
           name="scalar_step_int32"),
    Sample("adamw", {"Param": P, "Grad": G, **ADAM_STATE, "LearningRate": LR,
                     "Step": np.array([2], np.int64)}, _adamw,
           attrs={"weight_decay": 0.1}, name="decay"),
    Sample("adamw", {"Param": P, "Grad": G, **ADAM_STATE, "LearningRate": LR,
                     "Step": np.array([0], np.int64)}, _adamw, name="default"),
    Sample("rmsprop", {"Param": P, "Grad": G, "MeanSquare": positive(3, 4, seed=2) * 0.1,
                       "LearningRate": LR}, _rmsprop, name="plain"),
    Sample("rmsprop", {"Param": P, "Grad": G, "MeanSquare": positive(3, 4, seed=2),
                       "LearningRate": LR, "MeanGrad": rand(3, 4, seed=3) * 0.5},
           _rmsprop, attrs={"centered": True, "decay": 0.8, "epsilon": 1e-6},
           name="centered"),
    Sample("rmsprop", {"Param": P, "Grad": G, "MeanSquare": positive(3, 4, seed=2),
                       "LearningRate": LR, "Moment": rand(3, 4, seed=4)},
           _rmsprop, attrs={"momentum": 0.9}, name="momentum"),
    Sample("rmsprop", {"Param": P, "Grad": G, "MeanSquare": positive(3, 4, seed=2),
                       "LearningRate": LR, "MeanGrad": rand(3, 4, seed=3) * 0.5,
                       "Moment": rand(3, 4, seed=4)},
           _rmsprop, attrs={"momentum": 0.5, "centered": True}, name="centered_momentum"),
    Sample("increment", {"X": np.array([3], np.int64)}, lambda X, step=1.0: X + np.int64(step),
           name="int64"),
    Sample("increment", {"X": np.array([1.5, 2.0], F32)},
           lambda X, step: (X + step).astype(F32), attrs={"step": -0.5}, name="float32"),
    Sample("clip_by_global_norm", {"X": [rand(3, 4), rand(4, seed=1) * 3]}, _clip,
           attrs={"max_norm": 1.0}, name="clipped"),
    Sample("clip_by_global_norm", {"X": [rand(3, 4), rand(4, seed=1)]}, _clip,
           attrs={"max_norm": 100.0}, name="within"),
    Sample("lr_schedule", {"Step": STEPS}, _schedule,
           attrs={"kind": "constant", "learning_rate": 0.3}, name="constant"),
    Sample("lr_schedule", {"Step": STEPS}, _schedule,
           attrs={"kind": "exponential_decay", "learning_rate": 0.1, "decay_steps": 4,
                  "decay_rate": 0.5}, name="exponential"),
    Sample("lr_schedule", {"Step": STEPS}, _schedule,
           attrs={"kind": "exponential_decay", "learning_rate": 0.1, "decay_steps": 3,
                  "decay_rate": 0.1, "staircase": True, "offset": 2}, name="step_decay_offset"),
    Sample("lr_schedule", {"Step": STEPS}, _schedule,
           attrs={"kind": "cosine", "learning_rate": 0.2, "decay_steps": 10, "alpha": 0.1},
           name="cosine"),
    Sample("lr_schedule", {"Step": STEPS.astype(F32)}, _schedule,
           attrs={"kind": "polynomial", "learning_rate": 0.2, "decay_steps": 8,
                  "end_value": 0.01, "power": 2.0}, name="polynomial_float_step"),
    Sample("lr_schedule", {"Step": STEPS}, _schedule,
           attrs={"kind": "piecewise", "boundaries": [3, 10], "values": [1.0, 0.5, 0.1],
                  "dtype": "float64"}, name="piecewise_float64"),
    Sample("linear_warmup", {"Step": STEPS, "LearningRate": rand(6, seed=5)}, _warmup,
           attrs={"warmup_steps": 5, "end_value": 0.5, "start_value": 0.1}, name="ramp"),
    Sample("linear_warmup", {"Step": STEPS, "LearningRate": rand(6, seed=5)}, _warmup,
           attrs={"warmup_steps": 4, "end_value": 1.0, "offset": 3}, name="offset"),
]
