"""What keeps `progdesc launch`'s processes from outliving a launcher killed outright (SIGKILL:
the OOM killer, a scheduler's limit), which can run no code of its own to stop them.

- `Guard`: a small process in a session of its own that the launcher tells of each process
  group it starts and stops, through a pipe. When the pipe closes while groups are still
  listed (the launcher ended without stopping them), it SIGKILLs those groups: the
  processes and what they started, short of what left its group.
- `dying_with_launcher`: on Linux each process also gets PR_SET_PDEATHSIG, so that the
  kernel SIGKILLs it when the launcher ends, should the guard be gone too.
"""
import os
import subprocess
import sys

_GUARD = """\
import os, sys
groups = set()
for line in sys.stdin:
    (groups.add if line[0] == "+" else groups.discard)(int(line[1:]))
for group in groups:         # the launcher ended without stopping them
    try:
        os.killpg(group, 9)
    except OSError:
        pass
"""

_DIE_WITH_PARENT = """\
import ctypes, os, sys
ctypes.CDLL(None).prctl(1, 9, 0, 0, 0)      # PR_SET_PDEATHSIG, SIGKILL
if os.getppid() != int(sys.argv[1]):        # the launcher ended before it took hold
    os._exit(128 + 9)
os.execvp(sys.argv[2], sys.argv[2:])
"""


class Guard:
    """The guard process of one launcher; `watch` a group once started, `forget` it once
    stopped, `close` at the launcher's end."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", _GUARD],
                                     stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)

    def watch(self, group):
        """Kill process group `group` should the launcher end without stopping it."""
        self._tell(f"+{group}\n")

    def forget(self, group):
        """`group` was stopped (its leader waited for): leave it alone from now on."""
        self._tell(f"-{group}\n")

    def close(self):
        """End the guard (every group forgotten: it kills nothing)."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        self.proc.wait()

    def _tell(self, line):
        try:
            self.proc.stdin.write(line.encode())
            self.proc.stdin.flush()
        except OSError:      # the guard is gone: PR_SET_PDEATHSIG still holds on Linux
            pass


def dying_with_launcher(command):
    """`command` started so that the kernel SIGKILLs it when the launcher ends (Linux's
    PR_SET_PDEATHSIG, which lasts through exec); `command` itself elsewhere.

    A small Python program sets it and execs `command` (a preexec_fn would need a fork of
    the launcher, unsafe once JAX's threads run in it); it ends at once if the launcher
    ended before. The kernel ties the signal to the thread that started the process: the
    launcher starts them from its main thread, which lives as long as it does.
    """
    if not sys.platform.startswith("linux"):
        return command
    return [sys.executable, "-I", "-S", "-c", _DIE_WITH_PARENT, str(os.getpid()), *command]
