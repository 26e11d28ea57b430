"""Mixed-precision training as a program transformation (automatic mixed precision).

    opt = progdesc.amp.decorate(progdesc.optimizer.Adam(1e-3), dtype="bfloat16")
    opt.minimize(loss)                  # or: rewrite_program(main, "float16") on its own

Everything is ops in the program, so `print(program)` shows it, and clone,
save, load, checkpoints and export carry it like any other op:

- `rewrite_program` (rewrite.py) gives each forward op a precision from the
  allow and deny lists (lists.py) or, for the rest, from its inputs, and
  inserts explicit `cast` ops. Parameters stay float32 master weights in the
  Scope: a low-precision reader reads a cast copy.
- `decorate` (decorator.py) wraps an optimizer: its `minimize` rewrites the
  program, appends the backward pass, and, for float16, dynamic loss scaling
  (loss_scaling.py) around the optimizer's own update ops, whose state
  (moments, step counter) stays float32 as its parameters are.

Where the pass runs: on the forward program, before `append_backward`.
Casts are then ordinary forward ops, and the backward pass differentiates
them with the `cast` op's gradient maker like any op: the gradient of a
cast copy of a float32 parameter is cast back to float32, so parameter
gradients and updates are float32 with nothing special in the backward
pass or the optimizers. Rewriting after backward would mean deciding a
precision for every gradient op as well and keeping it in step with its
forward op. A program that already holds backward or optimizer ops is
refused, with the op named.

Roles: casts take the role of the op that reads them (forward or loss), so
`clone(for_test=True)` keeps them and inference runs the same low-precision
ops as training. The loss scaling is backward-role (`loss * scale`, the
start of the backward pass) and optimize-role (unscale and check, update the
scale, skip the step) ops, which a test clone drops.

Skipping a step: instead of giving every optimizer op a "skip" input, the
update ops of a float16 step write to fresh variables, and one
`where(found_inf, old, new)` per persistable writes the result back. Any
optimizer, present or future, is skipped the same way, including Adam's
moments and the step counter that Adam's bias correction and the
learning-rate schedules read (as optax's apply_if_finite and Flax's
DynamicScale keep the whole optimizer state).
"""
from progdesc.amp.decorator import MixedPrecisionOptimizer, decorate
from progdesc.amp.lists import DEFAULT_ALLOW, DEFAULT_DENY, AmpLists
from progdesc.amp.loss_scaling import LossScaler, LossScaling
from progdesc.amp.rewrite import rewrite_program

__all__ = ["AmpLists", "DEFAULT_ALLOW", "DEFAULT_DENY", "LossScaler", "LossScaling",
           "MixedPrecisionOptimizer", "decorate", "rewrite_program"]
