"""Rows of the Paddle table for the losses of training programs (registered into
`progdesc.paddle.rules.RULES`; see that module's guide)."""
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
