"""Reading data (seed 004): readers yield samples, batching groups them, DataFeeder maps columns.

A *reader* is a function with no arguments that returns an iterator of
samples, each a tuple with one entry per column (image, label, ...).
"""
import numpy as np

from lowering.errors import FeedError
from progdesc.feeding import convert_feed
from progdesc.framework import Variable


def from_arrays(*columns):
    """A reader over the rows of equally long arrays (one array per column)."""
    n = len(columns[0])
    if any(len(c) != n for c in columns):
        raise ValueError(f"columns have different lengths: {[len(c) for c in columns]}")

    def reader():
        for i in range(n):
            yield tuple(c[i] for c in columns)
    return reader


def shuffle(reader, buf_size, seed=None):
    """A reader yielding `reader`'s samples shuffled within windows of `buf_size`."""
    def shuffled():
        rng = np.random.default_rng(seed)
        buf = []
        for sample in reader():
            buf.append(sample)
            if len(buf) >= buf_size:
                rng.shuffle(buf)
                yield from buf
                buf = []
        rng.shuffle(buf)
        yield from buf
    return shuffled


def batch(reader, batch_size, drop_last=False):
    """A reader yielding lists of `batch_size` samples (the last one may be shorter)."""
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")

    def batched():
        buf = []
        for sample in reader():
            buf.append(sample)
            if len(buf) == batch_size:
                yield buf
                buf = []
        if buf and not drop_last:
            yield buf
    return batched


class DataFeeder:
    """Turns a mini-batch (a list of sample tuples) into a feed dict, column by column."""

    def __init__(self, feed_list):
        self.feed_vars = list(feed_list)
        if not all(isinstance(v, Variable) for v in self.feed_vars):
            raise TypeError("DataFeeder expects the data Variables to feed")

    def feed(self, minibatch):
        """{variable name: stacked array} for one mini-batch."""
        if not minibatch:
            raise FeedError("empty mini-batch")
        width = len(self.feed_vars)
        for i, sample in enumerate(minibatch):
            if len(sample) != width:
                raise FeedError(f"sample {i} has {len(sample)} columns, the feeder has {width} "
                                f"({', '.join(v.name for v in self.feed_vars)})")
        out = {}
        for col, var in enumerate(self.feed_vars):
            stacked = np.stack([np.asarray(sample[col]) for sample in minibatch])
            want = var.shape
            if len(want) == stacked.ndim + 1 and want[-1] == 1:
                stacked = stacked[..., None]            # labels given as scalars
            out[var.name] = convert_feed(var, stacked)
        return out
