"""Samples of lowering/ops/loss.py."""
import numpy as np

from op_table import Invalid, Sample, rand, spec


def _log_softmax(x, axis):
    shifted = x - x.max(axis=axis, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


def _swce_ref(Logits, Label, soft_label, ignore_index, axis):
    logp = _log_softmax(Logits.astype(np.float64), axis)
    if soft_label:
        loss = -(Label * logp).sum(axis=axis, keepdims=True)
    else:
        kept = Label != ignore_index
        loss = np.where(kept, -np.take_along_axis(logp, np.where(kept, Label, 0), axis), 0)
    return np.exp(logp).astype(Logits.dtype), loss.astype(Logits.dtype)


def _swce_grad_ref(Label, Softmax, DLoss, soft_label, ignore_index, axis):
    if soft_label:
        return (Softmax - Label) * DLoss
    classes = np.arange(Softmax.shape[axis]).reshape(
        [-1 if a == axis % Softmax.ndim else 1 for a in range(Softmax.ndim)])
    onehot = (classes == Label).astype(Softmax.dtype)
    return np.where(Label != ignore_index, (Softmax - onehot) * DLoss, 0).astype(Softmax.dtype)


def _soft_labels(*shape, axis=-1, seed=0):
    p = rand(*shape, low=0.1, high=1.0, seed=seed)
    return p / p.sum(axis=axis, keepdims=True)


def _swce(logits, label, name, **attrs):
    attrs = {"soft_label": False, "ignore_index": -100, "axis": -1, **attrs}
    return Sample("softmax_with_cross_entropy", {"Logits": logits, "Label": label}, _swce_ref,
                  attrs, name=name)


def _swce_grad(label, softmax, name, **attrs):
    attrs = {"soft_label": False, "ignore_index": -100, "axis": -1, **attrs}
    axis = attrs["axis"]
    dloss = rand(*[1 if a == axis % softmax.ndim else d for a, d in enumerate(softmax.shape)],
                 seed=3)
    return Sample("softmax_with_cross_entropy_grad",
                  {"Label": label, "Softmax": softmax, "DLoss": dloss}, _swce_grad_ref, attrs,
                  name=name)


def _sce_ref(X, Label, ignore_index, normalize):
    x = X.astype(np.float64)
    loss = np.maximum(x, 0) - x * Label + np.log1p(np.exp(-np.abs(x)))
    kept = Label != ignore_index
    loss = np.where(kept, loss, 0)
    if normalize:
        loss = loss / max(kept.sum(), 1)
    return loss.astype(X.dtype)


_hard = np.array([[2], [0], [-100], [4]], dtype=np.int64)
_sce_label = rand(3, 4, low=0.0, high=1.0, seed=5)
_sce_label[0, 1] = _sce_label[2, 3] = -100.0
_sce_label_neg1 = _sce_label.copy()
_sce_label_neg1[1, 2] = -1.0

SAMPLES = [
    _swce(rand(4, 5, low=-2, high=2), _hard, "hard_with_ignored"),
    _swce(rand(4, 5, low=-2, high=2), np.array([[1], [3], [0], [2]], dtype=np.int32),
          "hard_int32"),
    _swce(rand(4, 5, low=-2, high=2), np.array([[2], [0], [1], [0]]), "ignore_index",
          ignore_index=0),
    _swce(rand(2, 4, 3), np.array([[[0, 3, 1]], [[2, 2, -100]]]), "hard_axis1", axis=1),
    _swce(rand(4, 5, low=-50, high=50), _hard, "large_logits"),
    _swce(rand(4, 5), _soft_labels(4, 5), "soft", soft_label=True),
    _swce(rand(3, 2, 4), _soft_labels(3, 2, 4, axis=1), "soft_axis1", soft_label=True, axis=1),
    _swce_grad(_hard, np.exp(_log_softmax(rand(4, 5), -1)).astype(np.float32),
               "hard_with_ignored"),
    _swce_grad(np.array([[[0, 3, 1]], [[2, 2, -100]]]),
               np.exp(_log_softmax(rand(2, 4, 3), 1)).astype(np.float32), "hard_axis1", axis=1),
    _swce_grad(_soft_labels(4, 5, seed=1), np.exp(_log_softmax(rand(4, 5), -1)).astype(np.float32),
               "soft", soft_label=True),
    Sample("sigmoid_cross_entropy_with_logits", {"X": rand(3, 4, low=-4, high=4),
                                                  "Label": _sce_label}, _sce_ref,
           {"ignore_index": -100, "normalize": False}, name="default"),
    Sample("sigmoid_cross_entropy_with_logits", {"X": rand(3, 4, low=-4, high=4),
                                                  "Label": _sce_label}, _sce_ref,
           {"ignore_index": -100, "normalize": True}, name="normalize"),
    Sample("sigmoid_cross_entropy_with_logits", {"X": rand(3, 4, low=-4, high=4),
                                                  "Label": _sce_label_neg1}, _sce_ref,
           {"ignore_index": -1, "normalize": True}, name="ignore_index"),
    Sample("sigmoid_cross_entropy_with_logits", {"X": rand(2, 3, low=-40, high=40),
                                                  "Label": rand(2, 3, low=0, high=1, seed=2)},
           _sce_ref, {"ignore_index": -100, "normalize": False}, name="large_logits"),
]

INVALID = [
    Invalid("softmax_with_cross_entropy", {"Logits": spec(4, 3), "Label": spec(4, dtype="int64")},
            name="label_without_class_axis",
            expect=["Label must have shape [4, 1]", "hard labels have the logits' shape with "
                    "size 1 on axis -1", "got int64[4]"]),
    Invalid("softmax_with_cross_entropy",
            {"Logits": spec(-1, 3), "Label": spec(-1, dtype="int64")}, name="unknown_batch",
            expect=["Label must have shape [-1, 1]", "got int64[-1]"]),
    Invalid("softmax_with_cross_entropy",
            {"Logits": spec(4, 3), "Label": spec(5, 1, dtype="int64")}, name="label_batch",
            expect=["Label must have shape [4, 1]", "got int64[5, 1]"]),
    Invalid("softmax_with_cross_entropy", {"Logits": spec(4, 3), "Label": spec(4, 1)},
            name="float_hard_label", expect=["hard labels must be integers, got Label float32"]),
    Invalid("softmax_with_cross_entropy", {"Logits": spec(4, 3), "Label": spec(4, 2)},
            attrs={"soft_label": True}, name="soft_label_shape",
            expect=["Label must have shape [4, 3] (soft labels have the logits' shape), "
                    "got float32[4, 2]"]),
    Invalid("sigmoid_cross_entropy_with_logits", {"X": spec(4, 3), "Label": spec(4)},
            name="label_shape", expect=["Label must have shape [4, 3]", "got float32[4]"]),
]
