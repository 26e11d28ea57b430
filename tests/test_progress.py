"""progdesc.progress: a bar on a terminal, one line replaced in place in a notebook kernel
without ipywidgets, nothing in a pipe; each seen where a person would see it (a pseudo
terminal, a pipe, the outputs of an executed notebook)."""
import fcntl
import os
import pathlib
import pty
import re
import select
import struct
import subprocess
import sys
import termios

import pytest

from test_notebooks import kernel_env, monkeypatch_module  # noqa: F401  (fixtures)

ROOT = pathlib.Path(__file__).resolve().parent.parent
FINISHED = re.compile(r"100%\|.*\| (\d+)/\1 ")   # tqdm's line of a finished bar: "20/20"

SCRIPT = """
import sys
from progdesc.progress import progress_bar
for _ in progress_bar(range(40), desc="on the terminal", mininterval=0):
    pass
for _ in progress_bar(range(40), desc="into a pipe", file=sys.stdout, mininterval=0):
    pass
print("done")
"""


def _read_all(fd):
    chunks = []
    while select.select([fd], [], [], 0.5)[0]:
        try:
            chunk = os.read(fd, 65536)
        except OSError:   # the other end closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


def test_a_terminal_gets_a_bar_and_a_pipe_gets_none():
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))   # 100 columns
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    try:
        done = subprocess.run([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE,
                              stderr=slave, env=env, timeout=120, text=True)
        os.close(slave)
        terminal = _read_all(master)
    finally:
        os.close(master)
    assert done.returncode == 0, terminal
    assert done.stdout == "done\n"   # the bar drawn into a pipe: nothing at all
    # the terminal's bar rewrites one line (carriage returns) and ends at 40/40
    assert terminal.count("\n") <= 1 and terminal.count("\r") > 1, terminal
    assert "on the terminal: 100%" in terminal and FINISHED.search(terminal), terminal


@pytest.mark.slow   # make test checks the same in notebooks 01 and 02 (test_notebooks.py)
def test_a_kernel_without_widgets_updates_one_output_in_place(kernel_env, tmp_path):  # noqa: F811
    import nbclient
    import nbformat
    try:
        import ipywidgets  # noqa: F401
        pytest.skip("ipywidgets is installed: tqdm's widget draws the bar there")
    except ImportError:
        pass
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("import time\nfrom progdesc.progress import progress_bar"),
        nbformat.v4.new_code_cell(
            "for _ in progress_bar(range(60), unit='step', mininterval=0.05):\n"
            "    time.sleep(0.005)"),
        nbformat.v4.new_code_cell(
            "with progress_bar(total=30, desc='by hand') as bar:\n"
            "    for i in range(30):\n"
            "        bar.set_postfix(i=i)\n"
            "        bar.update()"),
    ])
    nbclient.NotebookClient(nb, kernel_name=kernel_env, timeout=120,
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    for cell, total in ((nb.cells[1], 60), (nb.cells[2], 30)):
        assert [o.output_type for o in cell.outputs] == ["display_data"], cell.outputs
        shown = cell.outputs[0]["data"]["text/plain"]
        assert "\n" not in shown.strip() and FINISHED.search(shown), shown
        assert f"{total}/{total}" in shown, shown
    assert "by hand: 100%" in nb.cells[2].outputs[0]["data"]["text/plain"]
