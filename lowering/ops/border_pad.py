"""border_pad: padding that repeats X's own elements, as PaddlePaddle's pad3d / pad2d do
in their reflect, replicate and circular modes (constant padding is the `pad` op).

Along each dim, output index j (from -low to n + high - 1 in X's indices) reads X at
- reflect:   -j below 0, 2 (n - 1) - j above n - 1 (the edge element is not repeated;
  each padding at most n - 1);
- replicate: the nearest edge element;
- circular:  j modulo n (paddings of any size).
Reflect and circular padding need the padded dim's size (replicate does not).

The op is a gather with indices fixed by the shapes, so linear in X. It differentiates
through `border_pad_grad` (`jax.vjp` of the rule: every output element's gradient is
added to the element it copies), whose gradient is border_pad again.
"""
import jax.numpy as jnp

from lowering import checks
from lowering.constraints import non_negative, one_of
from lowering.errors import ShapeError
from lowering.ops.collective import local_vjp
from lowering.registry import REQUIRED, Attr, In, Out, op

_ATTRS = {
    "paddings": Attr("paddings", "ints", REQUIRED,
                     "(low, high) for each dim of X, flattened", where=non_negative),
    "mode": Attr("mode", "string", "reflect", "reflect, replicate or circular",
                 where=one_of("reflect", "replicate", "circular")),
}
_NUMPY_MODE = {"reflect": "reflect", "replicate": "edge", "circular": "wrap"}


def _pairs(X, paddings, mode):
    """[(low, high)] per dim of X, checked against its sizes for `mode`."""
    if len(paddings) != 2 * X.ndim:
        raise ShapeError(f"attribute paddings={list(paddings)} must hold (low, high) for each "
                         f"of the {X.ndim} dims of X {checks.typed(X)}", slot="X")
    pairs = list(zip(paddings[::2], paddings[1::2]))
    for axis, (n, (lo, hi)) in enumerate(zip(X.shape, pairs)):
        if lo == hi == 0:
            continue
        if not isinstance(n, int):
            if mode == "replicate":
                continue
            raise ShapeError(f"dim {axis} of X {checks.typed(X)} must be known to pad it "
                             f"({mode})", slot="X")
        if n == 0:
            raise ShapeError(f"dim {axis} of X {checks.typed(X)} is empty: no elements to "
                             f"pad it with ({mode})", slot="X")
        if mode == "reflect" and max(lo, hi) > n - 1:
            raise ShapeError(f"reflect padding ({lo}, {hi}) of dim {axis} of X "
                             f"{checks.typed(X)} must be at most its size - 1", slot="X")
    return pairs


@op("border_pad", inputs=[In("X", "number")], outputs=[Out("Out")], attrs=_ATTRS)
def border_pad(X, *, paddings, mode):
    """X padded with copies of its own elements: reflected, replicated or circular."""
    return jnp.pad(X, _pairs(X, paddings, mode), mode=_NUMPY_MODE[mode])


@border_pad.gradient
def _(g):
    g.call("border_pad_grad", g.input("X"), g.out_grad("Out"), out=g.in_grad("X"), **g.attrs)


@op("border_pad_grad", inputs=[In("X", "float"), In("OutGrad", "float")], outputs=[Out("Out")],
    attrs=_ATTRS, same_dtype=("X", "OutGrad"))
def border_pad_grad(X, OutGrad, **attrs):
    """Gradient of border_pad's X from that of its Out (X gives only the shape)."""
    return local_vjp(lambda x: border_pad.lower(x, **attrs), (X,), OutGrad)[0]


@border_pad_grad.gradient
def _(g):
    if g.wants("OutGrad"):
        g.call("border_pad", g.out_grad("Out"), out=g.in_grad("OutGrad"), **g.attrs)
    if g.wants("X"):
        g.call("fill_zeros_like", g.input("X"), out=g.in_grad("X"))
