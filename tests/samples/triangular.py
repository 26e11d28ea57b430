"""Samples of lowering/ops/triangular.py."""
import numpy as np

from op_table import Sample, rand


def _tri(X, diagonal, lower):
    rows, cols = X.shape[-2:]
    i, j = np.arange(rows)[:, None], np.arange(cols)[None, :]
    keep = (j - i <= diagonal) if lower else (j - i >= diagonal)
    return np.where(keep, X, np.zeros((), X.dtype))


SAMPLES = [
    Sample("tril", {"X": rand(4, 4)}, lambda X, diagonal=0: _tri(X, diagonal, True)),
    Sample("tril", {"X": rand(2, 3, 5)}, lambda X, diagonal=0: _tri(X, diagonal, True),
           attrs={"diagonal": -1}, name="batched_below"),
    Sample("triu", {"X": rand(4, 4)}, lambda X, diagonal=0: _tri(X, diagonal, False)),
    Sample("triu", {"X": rand(3, 5)}, lambda X, diagonal=0: _tri(X, diagonal, False),
           attrs={"diagonal": 2}, name="above"),
    Sample("tril", {"X": np.arange(9).reshape(3, 3)}, lambda X, diagonal=0: _tri(X, diagonal, True),
           name="int"),
]
