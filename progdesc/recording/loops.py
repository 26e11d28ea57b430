"""Eager code run again and again in a loop: the errors and the warning that say what to do.

Eager mode appends every op it runs to the program, as static mode does. A PyTorch-style
training loop written in eager mode (forward, loss, `minimize`, once per batch) therefore
appends the whole model again on every iteration: a parameter named by
`ParamAttr(name=...)` or a data variable declared inside the loop is declared a second
time (an error), and unnamed layers make new parameters each time while the program
grows by one training step per iteration (a warning, once per program). Both name the
two ways to write the step once: `pd.Model` (its `train_one_batch` is recorded on the
first call and replayed compiled afterwards) and `pd.capture` (record it once, then train
the program with `Executor.run`).

What tells a training loop from a long program built with a Python loop (twelve
transformer layers appended by a `for` over layers): a training step is a backward pass
followed by the optimizer's updates, and one program holds one such step (two for a GAN's
two optimizers), while gradients alone (`pd.gradients`) update nothing. `framework`
counts the optimizer updates that follow a backward pass
(`ProgramListener.training_step_appended`); at `LOOP_STEPS` of them in eager mode the
warning is given.
"""
import warnings
import weakref

from progdesc.callsites import user_callsite, user_stacklevel

LOOP_STEPS = 3
"""How many training steps (backward passes after an optimizer's updates) one program may
hold before eager mode warns that a loop is appending the model again."""

WAYS = ("write the training step once instead, as a pd.Model subclass (its "
        "train_one_batch is recorded on the first call and replayed compiled on every later "
        "one), or record the step once with pd.capture (or build it once under pd.eager()) "
        "and train the recorded program with Executor.run in your loop")


_warned = weakref.WeakSet()   # programs warned about
_checks = []   # how to tell whether eager mode is on: progdesc.recording.mode adds it


def set_eager_check(active):
    """Use `active()` (True while eager mode is on in this thread) for the checks here;
    progdesc.recording.mode sets it when it loads."""
    _checks[:] = [active]


def _eager():
    return bool(_checks) and _checks[0]()


class EagerLoopWarning(UserWarning):
    """A program that grows by one training step per iteration of a loop in eager mode."""


def why_redeclared():
    """The reason to add to a 'name already exists' error raised in eager mode: eager mode
    appends to the program, so a loop builds the model again ('' outside eager mode)."""
    if not _eager():
        return ""
    return (". In eager mode every op and variable is appended to the program, so code run "
            "again in a loop (a training loop) declares the same names again; " + WAYS)


def warn_training_loop(program, steps):
    """Warn (EagerLoopWarning, once per program) when `program` holds `steps` training
    steps in eager mode and `steps` reached LOOP_STEPS."""
    if steps < LOOP_STEPS or not _eager() or program in _warned:
        return
    _warned.add(program)
    warnings.warn(
        f"this program now holds {steps} training steps (a backward pass and optimizer "
        f"updates, appended {steps} times, the last at {user_callsite()}): in eager mode a "
        "loop that runs the forward pass, the loss and minimize appends the whole model "
        "to the program again on every iteration, so it grows and each iteration trains "
        f"new copies of the parameters. To train in a loop, {WAYS}",
        EagerLoopWarning, stacklevel=user_stacklevel())
