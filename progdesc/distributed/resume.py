"""What a training script needs to resume after `progdesc launch` restarted it.

The launcher only restarts; the script resumes. It saves a checkpoint every few steps
under a name that holds the step (`checkpoint_path`), and when it starts it loads the
latest one (`latest_checkpoint`), if any, and goes on from that step:

    dist.initialize()
    exe.run(startup, scope=scope)
    step, path = dist.latest_checkpoint("ckpt")
    if path:
        pd.io.load_checkpoint(path, main, scope)
    for step in range(step, STEPS):
        exe.run(main, feed=batch(step), scope=scope)
        if (step + 1) % EVERY == 0:
            dist.save_checkpoint(dist.checkpoint_path("ckpt", step + 1), main, scope)

Checkpoint files are written whole or not at all (an atomic rename), so a process killed
while one is written leaves the previous ones. `restart_count()` says how many times the
launcher restarted the job (0 on its first start).
"""
import os
import re

RESTART_COUNT = "PROGDESC_RESTART_COUNT"
_NAME = "step-{:09d}.safetensors"
_NAME_RE = re.compile(r"step-(\d{9})\.safetensors")


def restart_count():
    """How many times `progdesc launch` restarted this job before this start: 0 on the first
    start, and outside the launcher."""
    return int(os.environ.get(RESTART_COUNT, "0"))


def checkpoint_path(dirname, step):
    """The file under `dirname` for the checkpoint taken after `step` steps
    (`dirname/step-<step>.safetensors`); `latest_checkpoint` finds it."""
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"step must be an int >= 0, got {step!r}")
    return os.path.join(dirname, _NAME.format(step))


def latest_checkpoint(dirname):
    """(step, path) of the checkpoint under `dirname` with the most steps (written by
    `checkpoint_path`'s names), or (0, None) when there is none (or no `dirname`)."""
    try:
        names = os.listdir(dirname)
    except FileNotFoundError:
        return 0, None
    steps = [int(m.group(1)) for m in map(_NAME_RE.fullmatch, names) if m]
    if not steps:
        return 0, None
    step = max(steps)
    return step, os.path.join(dirname, _NAME.format(step))
