"""Loss functions: softmax with cross entropy, and sigmoid cross entropy with logits.

Labels never receive gradients. Entries whose label equals `ignore_index`
get loss 0 and no gradient. The gradient of softmax_with_cross_entropy is a
dedicated op (it needs the one-hot of the labels along `axis`).
"""
import jax
import jax.numpy as jnp
from jax import lax

from lowering import checks
from lowering.errors import ShapeError
from lowering.ops.activation import softmax_grad
from lowering.ops.unary import full_like
from lowering.registry import In, Out, op

_SWCE_ATTRS = {"soft_label": False, "ignore_index": -100, "axis": -1}


def _check_label(Label, Logits, soft_label, axis):
    """Hard labels: integers shaped like Logits with size 1 on `axis`; soft: Logits' shape."""
    checks.axis("Logits", Logits, axis)
    if soft_label:
        checks.shape("Label", Label, Logits.shape, "soft labels have the logits' shape")
        return
    if not jnp.issubdtype(Label.dtype, jnp.integer):
        raise ShapeError(f"hard labels must be integers, got Label {checks.typed(Label)} "
                         "(set soft_label=True for label distributions)", slot="Label")
    expected = list(Logits.shape)
    expected[axis] = 1
    checks.shape("Label", Label, expected,
                 f"hard labels have the logits' shape with size 1 on axis {axis}")


@op("softmax_with_cross_entropy",
    inputs=[In("Logits", "float"), In("Label", "number", differentiable=False)],
    outputs=[Out("Softmax"), Out("Loss")], attrs=_SWCE_ATTRS)
def softmax_with_cross_entropy(Logits, Label, *, soft_label, ignore_index, axis):
    """Softmax of Logits along `axis`, and the cross entropy of Label against it.

    Hard labels (ints) have the logits' shape with size 1 on `axis`; soft labels
    (floats) have the logits' shape. Loss has the logits' shape with size 1 on `axis`.
    """
    _check_label(Label, Logits, soft_label, axis)
    logp = jax.nn.log_softmax(Logits, axis=axis)
    if soft_label:
        loss = -jnp.sum(Label.astype(logp.dtype) * logp, axis=axis, keepdims=True)
    else:
        kept = Label != ignore_index
        picked = jnp.take_along_axis(logp, jnp.where(kept, Label, 0), axis=axis)
        loss = jnp.where(kept, -picked, 0)
    return jnp.exp(logp), loss


@softmax_with_cross_entropy.gradient
def _(g):
    target = g.in_grad("Logits")
    if not target:
        return
    from_loss, from_softmax = g.has_out_grad("Loss"), g.has_out_grad("Softmax")
    softmax = g.output("Softmax")
    parts = []
    if from_loss:
        parts.append(g.call("softmax_with_cross_entropy_grad", g.input("Label"), softmax,
                            g.out_grad("Loss"), **g.attrs,
                            out=None if from_softmax else target))
    if from_softmax:
        parts.append(softmax_grad(g, softmax, g.out_grad("Softmax"), g.attr("axis"),
                                  None if from_loss else target))
    if len(parts) == 2:
        g.call("sum", parts, out=target)
    elif not parts:
        g.call("fill_zeros_like", g.input("Logits"), out=target)


@op("softmax_with_cross_entropy_grad",
    inputs=[In("Label", "number", differentiable=False), In("Softmax", "float"),
            In("DLoss", "float")],
    outputs=[Out("Out")], attrs=_SWCE_ATTRS, same_dtype=("Softmax", "DLoss"))
def softmax_with_cross_entropy_grad(Label, Softmax, DLoss, *, soft_label, ignore_index, axis):
    """(Softmax - labels) * DLoss: the gradient of softmax_with_cross_entropy's Loss w.r.t. Logits.

    Hard labels are one-hot encoded along `axis`; entries whose label is
    `ignore_index` get zero.
    """
    _check_label(Label, Softmax, soft_label, axis)
    if soft_label:
        return (Softmax - Label.astype(Softmax.dtype)) * DLoss
    onehot = lax.broadcasted_iota(Label.dtype, Softmax.shape, axis % Softmax.ndim) == Label
    return jnp.where(Label != ignore_index, (Softmax - onehot.astype(Softmax.dtype)) * DLoss, 0)


@softmax_with_cross_entropy_grad.gradient
def _(g):
    label, softmax, dloss = g.input("Label"), g.input("Softmax"), g.input("DLoss")
    ddx = g.out_grad("Out")
    if g.wants("DLoss"):  # sum over axis of ddx * (Softmax - labels), ignored entries masked
        per_unit = g.call("softmax_with_cross_entropy_grad", label, softmax,
                          full_like(g, dloss, 1.0), **g.attrs)
        g.call("reduce_sum", g.call("mul", ddx, per_unit), axis=[g.attr("axis")], keep_dim=True,
               out=g.in_grad("DLoss"))
    if g.wants("Softmax"):  # ddx * DLoss, ignored entries masked
        if not g.attr("soft_label"):
            kept = g.call("not_equal", label, full_like(g, label, g.attr("ignore_index")))
            dloss = g.call("where", kept, dloss, g.call("fill_zeros_like", dloss))
        g.call("mul", ddx, dloss, out=g.in_grad("Softmax"))


@op("sigmoid_cross_entropy_with_logits",
    inputs=[In("X", "float"), In("Label", "float", differentiable=False)],
    outputs=[Out("Out")], attrs={"ignore_index": -100, "normalize": False},
    same_dtype=("X", "Label"))
def sigmoid_cross_entropy_with_logits(X, Label, *, ignore_index, normalize):
    """Elementwise binary cross entropy of probabilities Label against sigmoid(X).

    Computed stably as max(x, 0) - x * z + log(1 + exp(-|x|)). With `normalize`
    the losses are divided by the number of entries not ignored.
    """
    checks.shape("Label", Label, X.shape, "labels have the logits' shape")
    loss = jnp.maximum(X, 0) - X * Label + jnp.log1p(jnp.exp(-jnp.abs(X)))
    kept = Label != ignore_index
    loss = jnp.where(kept, loss, 0)
    if normalize:
        loss = loss / jnp.maximum(jnp.sum(kept, dtype=X.dtype), 1)
    return loss


@sigmoid_cross_entropy_with_logits.gradient
def _(g):  # (sigmoid(x) - z) * dout, masked, divided by the count of kept entries
    target = g.in_grad("X")
    if not target:
        return
    x, z = g.input("X"), g.input("Label")
    zeros = g.call("fill_zeros_like", z)
    kept = g.call("not_equal", z, g.call("scale", zeros, bias=float(g.attr("ignore_index"))))
    dx = g.call("mul", g.out_grad("Out"), g.call("sub", g.call("sigmoid", x), z))
    if not g.attr("normalize"):
        g.call("where", kept, dx, zeros, out=target)
        return
    count = g.call("reduce_sum", g.call("cast", kept, dtype=g.var(x)[1]))
    dx = g.call("where", kept, dx, zeros)
    g.call("div", dx, g.call("clip", count, min=1.0, max=float("inf")), out=target)
