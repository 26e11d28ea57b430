"""Where a test file's own lines are, for tests that check an error names the user's line."""
import os


def line_of(path, fragment):
    """'<file name>:<n>' of the first line of the file at `path` that holds `fragment`
    (lines that call this function are skipped)."""
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if fragment in line and "line_of(" not in line:
                return f"{os.path.basename(path)}:{n}"
    raise AssertionError(f"no line of {path} holds {fragment!r}")
