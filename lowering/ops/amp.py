"""Dynamic loss scaling for float16 mixed precision (see progdesc.amp).

A float16 training step multiplies the loss by a loss scale before the
backward pass, so that small gradients survive float16's narrow range. After
the backward pass, `check_finite_and_unscale` divides the gradients by the
scale and reports whether any of them is infinite or NaN, and
`update_loss_scaling` moves the scale: down after bad steps, up after a run
of good ones (the rule of Paddle's `update_loss_scaling`, PyTorch's
GradScaler and optax/Flax's `DynamicScale`). Both run after the backward
pass and are not differentiable. The loss scale is float32 of shape [] or
[1]; the step counters are integers of the same shape.
"""
import functools

import jax.numpy as jnp

from lowering.constraints import Range, positive
from lowering.registry import Attr, In, Out, op


@op("check_finite_and_unscale", inputs=[In("X", "float", many=True), In("Scale", "float")],
    outputs=[Out("Out", many=True), Out("FoundInfinite")], differentiable=False)
def check_finite_and_unscale(X, Scale):
    """Out[i] = X[i] / Scale; FoundInfinite (bool, shape []) = any Out holds an inf or NaN.

    The division runs in float32 (or X's dtype, if wider) and the result has
    X's dtype.
    """
    outs = []
    for x in X:
        wide = jnp.promote_types(x.dtype, jnp.float32)
        outs.append((x.astype(wide) / jnp.reshape(Scale, ()).astype(wide)).astype(x.dtype))
    found = functools.reduce(jnp.logical_or, [jnp.any(~jnp.isfinite(o)) for o in outs],
                             jnp.zeros((), bool))
    return outs, found


@op("update_loss_scaling",
    inputs=[In("FoundInfinite", "bool"), In("PrevLossScaling", "float"),
            In("InGoodSteps", "int"), In("InBadSteps", "int")],
    outputs=[Out("LossScaling"), Out("OutGoodSteps"), Out("OutBadSteps")],
    attrs={"incr_every_n_steps": Attr("incr_every_n_steps", "int", 2000,
                                      doc="good steps in a row before the scale grows", where=positive),
           "decr_every_n_nan_or_inf": Attr("decr_every_n_nan_or_inf", "int", 1,
                                           doc="bad steps in a row before the scale shrinks", where=positive),
           "incr_ratio": Attr("incr_ratio", "float64", 2.0, doc="growth factor",
                              where=Range(1, open_lo=True)),
           "decr_ratio": Attr("decr_ratio", "float64", 0.5, doc="backoff factor",
                              where=Range(0, 1, open_lo=True, open_hi=True))},
    differentiable=False)
def update_loss_scaling(FoundInfinite, PrevLossScaling, InGoodSteps, InBadSteps, *,
                        incr_every_n_steps, decr_every_n_nan_or_inf, incr_ratio, decr_ratio):
    """The next loss scale and counts of good and bad steps in a row.

    A bad step (FoundInfinite) zeroes the good count and adds one to the bad
    count; when that reaches decr_every_n_nan_or_inf the scale is multiplied
    by decr_ratio and the bad count restarts at 0. A good step does the
    mirror image with incr_every_n_steps and incr_ratio, except that a grown
    scale that would be infinite leaves the scale as it was.
    """
    found = jnp.reshape(FoundInfinite, ())
    scale = PrevLossScaling
    zero_good, zero_bad = jnp.zeros_like(InGoodSteps), jnp.zeros_like(InBadSteps)
    good = jnp.where(found, zero_good, InGoodSteps + 1)
    bad = jnp.where(found, InBadSteps + 1, zero_bad)
    shrink = bad >= decr_every_n_nan_or_inf
    grow = good >= incr_every_n_steps
    grown = scale * jnp.asarray(incr_ratio, scale.dtype)
    grown = jnp.where(jnp.isfinite(grown), grown, scale)
    scale = jnp.where(shrink, scale * jnp.asarray(decr_ratio, scale.dtype),
                      jnp.where(grow, grown, scale))
    return scale, jnp.where(grow, zero_good, good), jnp.where(shrink, zero_bad, bad)
