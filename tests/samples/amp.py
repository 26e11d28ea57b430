"""Samples of lowering/ops/amp.py, the loss-scaling rules written out in NumPy."""
import numpy as np

from op_table import Sample, rand

F32, I32 = np.float32, np.int32


def _unscale(X, Scale):
    scale = float(np.reshape(Scale, ()))
    outs = [(x.astype(np.float64) / scale).astype(x.dtype) for x in X]
    found = any(not np.all(np.isfinite(o)) for o in outs)
    return outs, np.array(found)


def _update(FoundInfinite, PrevLossScaling, InGoodSteps, InBadSteps, incr_every_n_steps=2000,
            decr_every_n_nan_or_inf=1, incr_ratio=2.0, decr_ratio=0.5):
    scale, good, bad = float(PrevLossScaling[0]), int(InGoodSteps[0]), int(InBadSteps[0])
    if bool(FoundInfinite):
        good, bad = 0, bad + 1
        if bad == decr_every_n_nan_or_inf:
            scale, bad = scale * decr_ratio, 0
    else:
        good, bad = good + 1, 0
        if good == incr_every_n_steps:
            with np.errstate(over="ignore"):
                grown = np.float32(scale) * np.float32(incr_ratio)
            scale, good = (float(grown) if np.isfinite(grown) else scale), 0
    return np.array([scale], F32), np.array([good], I32), np.array([bad], I32)


def _state(found, scale, good, bad):
    return {"FoundInfinite": np.array(found), "PrevLossScaling": np.array([scale], F32),
            "InGoodSteps": np.array([good], I32), "InBadSteps": np.array([bad], I32)}


_GRADS = [rand(3, 4) * 1000, rand(5, seed=1) * 1000]
_INF = [rand(3, 4), np.array([1.0, np.inf, 2.0, 3.0, 4.0], F32)]
_NAN = [np.array([[0.5, np.nan], [1.0, 2.0]], F32)]
_TAKES = {"incr_every_n_steps": 3, "decr_every_n_nan_or_inf": 2}

SAMPLES = [
    Sample("check_finite_and_unscale", {"X": _GRADS, "Scale": np.array([1024.0], F32)},
           _unscale, name="finite"),
    Sample("check_finite_and_unscale", {"X": _INF, "Scale": np.array(8.0, F32)}, _unscale,
           name="inf_scalar_scale"),
    Sample("check_finite_and_unscale", {"X": _NAN, "Scale": np.array([2.0], F32)}, _unscale,
           name="nan"),
    Sample("check_finite_and_unscale",
           {"X": [rand(4, dtype="float64") * 3], "Scale": np.array([3.0], F32)}, _unscale,
           name="float64"),
    Sample("update_loss_scaling", _state(False, 1024.0, 5, 0), _update, name="good_step"),
    Sample("update_loss_scaling", _state(False, 1024.0, 2, 0), _update, attrs=_TAKES,
           name="grows"),
    Sample("update_loss_scaling", _state(False, 3e38, 2, 0), _update, attrs=_TAKES,
           name="growth_would_overflow"),
    Sample("update_loss_scaling", _state(True, 1024.0, 7, 0), _update, attrs=_TAKES,
           name="first_bad_step"),
    Sample("update_loss_scaling", _state(True, 1024.0, 0, 1), _update,
           attrs={**_TAKES, "incr_ratio": 4.0, "decr_ratio": 0.25}, name="shrinks"),
    Sample("update_loss_scaling", _state(True, 1024.0, 3, 0), _update, name="default_shrinks"),
    Sample("update_loss_scaling", _state(False, 1024.0, 1999, 0), _update, name="default_grows"),
]
