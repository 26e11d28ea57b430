"""Rows of the Paddle table for training programs: their losses, and the gradient
clipping ops of their optimizer part (registered into `progdesc.paddle.rules.RULES`;
see that module's guide). L2 regularization's `sum` is the table's own row."""
import numpy as np

from progdesc.paddle.rules import RULES
from progdesc.translate import Unsupported


@RULES.rule("softmax_with_cross_entropy", inputs=("Logits", "Label"),
            outputs=("Softmax", "Loss"))
def softmax_with_cross_entropy(t, logits, label, *, soft_label=False, ignore_index=-100,
                               axis=-1, use_softmax=True):
    """paddle.nn.functional.cross_entropy in a static program: softmax of the logits and
    the cross entropy of the labels (ints with size 1 on `axis`, or soft labels)."""
    if not use_softmax:
        raise Unsupported("use_softmax=False (cross entropy of given probabilities)")
    return t.call("softmax_with_cross_entropy", logits, label, soft_label=soft_label,
                  ignore_index=ignore_index, axis=axis)


# -- the gradient transformations of Paddle's optimizer part (clipping, regularization) --

def _squared_norm(t, x, dims):
    """sum(x ** 2) over all elements, shaped `dims` ([] or [1])."""
    total = t.call("reduce_sum", t.call("square", x))   # no axis: all of them
    return t.call("reshape", total, shape=list(dims)) if dims else total


@RULES.rule("squared_l2_norm")
def squared_l2_norm(t, x, *, out_types=None):
    """The sum of squares of all elements (ClipGradByGlobalNorm's per-gradient part)."""
    out = out_types[0] if out_types else None
    dims = [1] if out is not None and list(out.shape) == [1] else []
    return _squared_norm(t, x, dims)


@RULES.rule("clip_by_norm")
def clip_by_norm(t, x, *, max_norm):
    """x * max_norm / max(l2 norm of x, max_norm): x unchanged when its norm is within
    max_norm (ClipGradByNorm)."""
    dtype = t.var(x)[1]
    limit = t.constant(np.asarray(max_norm, dtype))
    norm = t.call("sqrt", _squared_norm(t, x, []))
    factor = t.call("div", limit, t.call("maximum", norm, limit))
    return t.call("mul", x, factor)
