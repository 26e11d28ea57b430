"""Einsum, as our dot_general, reduce_sum, transpose (and a mask for a repeated index);
Det, as our det.

Operands are taken left to right: in each, a label written twice keeps its diagonal,
a label no other operand nor the output names is summed out; two operands meet in one
dot_general (labels they share and nothing later needs are contracted, the others are
batch dims); the result is transposed into the output's order. `...` stands for the
same dims in every operand (right-aligned), broadcasting between them is refused.
(Imported by `rules_math`.)
"""
import numpy as np

from progdesc.onnx import model as onnx_model
from progdesc.onnx.table import RULES
from progdesc.translate import Unsupported

_ELLIPSIS_LABELS = "".join(chr(0x2460 + k) for k in range(20))   # not letters of ONNX's


def _parse(equation, ranks):
    """(labels of each operand, labels of the output) with `...` spelled out."""
    if not isinstance(equation, str):
        raise Unsupported(f"equation {equation!r} is not a string")
    equation = equation.replace(" ", "")
    lhs, arrow, out = equation.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise Unsupported(f"equation {equation!r} names {len(terms)} operands, not "
                          f"{len(ranks)}")
    spans = []
    for term, rank in zip(terms, ranks):
        letters = term.replace("...", "")
        if (letters and not letters.isalpha()) or term.count("...") > 1 or (
                "..." not in term and len(letters) != rank):
            raise Unsupported(f"equation {equation!r} does not fit operands of ranks {ranks}")
        spans.append(rank - len(letters) if "..." in term else 0)
    if min(spans, default=0) < 0:
        raise Unsupported(f"equation {equation!r} does not fit operands of ranks {ranks}")
    widest = max(spans, default=0)
    ellipsis = _ELLIPSIS_LABELS[:widest]
    labels = [term.replace("...", ellipsis[widest - span:]) for term, span in zip(terms, spans)]
    if not arrow:   # implicit output: the ellipsis, then the letters written once, sorted
        counts = "".join(labels)
        out = ellipsis + "".join(sorted(c for c in set(counts) if c.isalpha()
                                        and counts.count(c) == 1))
    else:
        out = out.replace("...", ellipsis)
    if len(set(out)) != len(out) or set(out) - set("".join(labels)) or "." in out:
        raise Unsupported(f"equation {equation!r} has an output it cannot read")
    return labels, out


def _diagonal(t, x, labels):
    """`x` with each label written twice reduced to its diagonal."""
    while True:
        repeated = next((c for c in labels if labels.count(c) > 1), None)
        if repeated is None:
            return x, labels
        p = labels.index(repeated)
        q = labels.index(repeated, p + 1)
        dims, dtype = t.var(x)
        if dims[p] < 0 or dims[p] != dims[q]:
            raise Unsupported("a repeated index over symbolic or unequal dims")
        shape = [1] * len(dims)
        shape[p] = shape[q] = dims[p]
        mask = np.eye(dims[p], dtype=onnx_model.as_numpy_dtype(dtype)).reshape(shape)
        x = t.call("reduce_sum", t.call("mul", x, t.constant(mask)), axis=[q])
        labels = labels[:q] + labels[q + 1:]


def _sum_out(t, x, labels, keep):
    """`x` summed over the labels not in `keep`."""
    axes = [k for k, c in enumerate(labels) if c not in keep]
    if not axes:
        return x, labels
    return (t.call("reduce_sum", x, axis=axes),
            "".join(c for c in labels if c in keep))


@RULES.rule("Einsum", since=13)
def einsum(t, *xs, equation):
    labels, out = _parse(equation, [len(t.var(x)[0]) for x in xs])
    acc, acc_labels = None, ""
    for k, (x, lab) in enumerate(zip(xs, labels)):
        later = out + "".join(labels[k + 1:])
        x, lab = _diagonal(t, x, lab)
        x, lab = _sum_out(t, x, lab, later + acc_labels)
        if acc is None:
            acc, acc_labels = x, lab
            continue
        shared = [c for c in acc_labels if c in lab]
        batch = [c for c in shared if c in later]
        contract = [c for c in shared if c not in later]
        acc = t.call("dot_general", acc, x,
                     lhs_contracting=[acc_labels.index(c) for c in contract],
                     rhs_contracting=[lab.index(c) for c in contract],
                     lhs_batch=[acc_labels.index(c) for c in batch],
                     rhs_batch=[lab.index(c) for c in batch])
        acc_labels = ("".join(batch) + "".join(c for c in acc_labels if c not in shared)
                      + "".join(c for c in lab if c not in shared))
    acc, acc_labels = _sum_out(t, acc, acc_labels, out)
    if acc_labels == out:
        return acc
    return t.call("transpose", acc, perm=[acc_labels.index(c) for c in out])


@RULES.rule("Det", since=13)
def det(t, x):
    return t.call("det", x)
