"""The text of the user's line an op's callsite names, for the viewer's op panel.

Callsites name a file by its base name ('train.py:12') or an IPython cell by its
prompt ('In[3]:2'), as progdesc.callsites writes them; the file is found among the
files Python has loaded and IPython's cells, and the line read with linecache.
"""
import linecache
import os
import sys

from progdesc.callsites import cell_name

__all__ = ["SourceLines"]


class SourceLines:
    """Callsites with their source text: calling it with 'train.py:12' gives
    'train.py:12  h = layers.fc(x, 128)' when the file can be found among the loaded
    modules, the script and IPython's cells (by base name, as callsites name them), else
    the callsite as it is. Files are looked for once, lines once per callsite."""

    def __init__(self):
        self._files = None
        self._lines = {}

    def _index(self):
        files = {}
        candidates = list(linecache.cache)
        candidates += [getattr(m, "__file__", None) for m in list(sys.modules.values())]
        candidates.append(sys.argv[0] if sys.argv else None)
        for path in candidates:
            if not isinstance(path, str) or not path:
                continue
            files.setdefault(os.path.basename(path), path)
            label = cell_name(path) if path.startswith("<") or "ipykernel" in path else None
            if label:
                files[label] = path   # the newest cell of that number wins
        return files

    def __call__(self, callsite):
        """`callsite` followed by two spaces and its line's text, or `callsite` alone."""
        if not callsite:
            return ""
        if callsite not in self._lines:
            file, _, line = callsite.rpartition(":")
            text = ""
            if line.isdigit():
                if self._files is None:
                    self._files = self._index()
                path = self._files.get(file) or (file if os.path.isfile(file) else None)
                if path:
                    text = linecache.getline(path, int(line)).strip()
            self._lines[callsite] = f"{callsite}  {text}" if text else callsite
        return self._lines[callsite]
