"""deformable_conv: PaddlePaddle's deformable convolution (v2 with Mask, v1 without), as
the DCN backbones of PaddleDetection use it.

Each filter tap (i, j) of output pixel (p, q) reads Input at the point
(p * stride_h - pad_h + i * dilation_h + dy, q * stride_w - pad_w + j * dilation_w + dx),
(dy, dx) being that tap's entry of Offset for the pixel's deformable group of input
channels, by bilinear interpolation: a point at or beyond one pixel outside Input reads 0,
and so does each of its 4 neighbours outside Input. With Mask the read is scaled by the
tap's mask value. The reads are then convolved with Filter as an ordinary (grouped)
convolution would. Offset holds (dy, dx) pairs ordered by deformable group, then tap
(row-major); Mask one value per deformable group and tap.

It differentiates once, through `deformable_conv_grad` (`jax.vjp` of the same rule).
"""
import jax.numpy as jnp
import numpy as np

from lowering import checks
from lowering.constraints import non_negative, positive
from lowering.errors import ShapeError
from lowering.ops.collective import local_vjp
from lowering.registry import Attr, In, Out, op

_ATTRS = {
    "strides": Attr("strides", "ints", (1, 1), where=positive),
    "paddings": Attr("paddings", "ints", (0, 0), "(pad_h, pad_w), on both sides",
                     where=non_negative),
    "dilations": Attr("dilations", "ints", (1, 1), where=positive),
    "groups": Attr("groups", "int", 1, "channel groups of the convolution", where=positive),
    "deformable_groups": Attr("deformable_groups", "int", 1,
                              "input channel groups that share one set of offsets",
                              where=positive),
    "im2col_step": Attr("im2col_step", "int", 1, "PaddlePaddle's batching of its kernel; "
                                                 "no effect on the result", where=positive),
}
_INPUTS = [In("Input", "float", doc="[N, C, H, W]"),
           In("Offset", "float", doc="[N, 2 * deformable_groups * kh * kw, H', W']"),
           In("Filter", "float", doc="[O, C / groups, kh, kw]")]
# optional slots come last (the Python function of the op takes them as keywords)
_MASK = In("Mask", "float", optional=True, doc="[N, deformable_groups * kh * kw, H', W']")


def _geometry(Input, Offset, Mask, Filter, strides, paddings, dilations, groups,
              deformable_groups):
    """Checked output size (H', W')."""
    for slot, x in (("Input", Input), ("Offset", Offset), ("Filter", Filter)):
        checks.rank(slot, x, 4, {"Input": "N, C, H, W", "Offset": "N, 2 * taps, H', W'",
                                 "Filter": "O, C / groups, kh, kw"}[slot])
    if len(strides) != 2 or len(paddings) != 2 or len(dilations) != 2:
        raise ShapeError(f"strides {list(strides)}, paddings {list(paddings)} and dilations "
                         f"{list(dilations)} must hold (h, w) each", slot="Input")
    C, (H, W) = Input.shape[1], Input.shape[2:]
    if not all(isinstance(n, int) for n in (C, H, W)):
        raise ShapeError(f"the channels, H and W of Input {checks.typed(Input)} must be known",
                         slot="Input")
    O, kh, kw = Filter.shape[0], Filter.shape[2], Filter.shape[3]
    for what, n in (("groups", groups), ("deformable_groups", deformable_groups)):
        if C % n:
            raise ShapeError(f"Input {checks.typed(Input)}'s {C} channels must split into "
                             f"{what}={n}", slot="Input")
    if isinstance(O, int) and O % groups:
        raise ShapeError(f"Filter {checks.typed(Filter)}'s {O} filters must split into "
                         f"groups={groups}", slot="Filter")
    checks.dim("Filter", Filter, 1, C // groups, f"Input's {C} channels / groups={groups}")
    out = [(n + 2 * p - (d * (k - 1) + 1)) // s + 1
           for n, p, d, k, s in zip((H, W), paddings, dilations, (kh, kw), strides)]
    if min(out) < 1:
        raise ShapeError(f"the {kh}x{kw} window (dilations {list(dilations)}) is larger than "
                         f"Input {checks.typed(Input)} padded by {list(paddings)}", slot="Input")
    taps = deformable_groups * kh * kw
    checks.shape("Offset", Offset, [Input.shape[0], 2 * taps] + out,
                 f"N, 2 * deformable_groups * kh * kw, H', W' of Input and Filter")
    if Mask is not None:
        checks.shape("Mask", Mask, [Input.shape[0], taps] + out,
                     "N, deformable_groups * kh * kw, H', W' of Input and Filter")
    return out


def _bilinear(image, y, x):
    """image [N, G, Cg, H, W] read at points y, x [N, G, K, H', W'] -> [N, G, Cg, K, H', W']
    (0 for a point at or beyond one pixel outside, and for neighbours outside)."""
    n, g, cg, height, width = image.shape
    flat = image.reshape(n, g, cg, height * width)
    y0, x0 = jnp.floor(y), jnp.floor(x)
    dy, dx = y - y0, x - x0
    near = (y > -1) & (x > -1) & (y < height) & (x < width)
    total = 0
    for row, col, weight in ((y0, x0, (1 - dy) * (1 - dx)), (y0, x0 + 1, (1 - dy) * dx),
                             (y0 + 1, x0, dy * (1 - dx)), (y0 + 1, x0 + 1, dy * dx)):
        inside = near & (row >= 0) & (row <= height - 1) & (col >= 0) & (col <= width - 1)
        index = (jnp.clip(row, 0, height - 1) * width + jnp.clip(col, 0, width - 1))
        index = index.astype(jnp.int32).reshape(n, g, 1, -1)
        picked = jnp.take_along_axis(flat, jnp.broadcast_to(index, (n, g, cg, index.shape[-1])),
                                     axis=3).reshape((n, g, cg) + y.shape[2:])
        total = total + jnp.where(inside[:, :, None], weight[:, :, None], 0) * picked
    return total


@op("deformable_conv", inputs=_INPUTS + [_MASK], outputs=[Out("Output", doc="[N, O, H', W']")],
    attrs=_ATTRS, same_dtype=("Input", "Offset", "Mask", "Filter"))
def deformable_conv(Input, Offset, Filter, Mask=None, *, strides, paddings, dilations,
                    groups, deformable_groups, im2col_step):
    """Deformable convolution of `Input` with `Filter` at the taps moved by `Offset` (and
    scaled by `Mask`), as PaddlePaddle's deformable_conv / deformable_conv_v1 compute it."""
    Ho, Wo = _geometry(Input, Offset, Mask, Filter, strides, paddings, dilations, groups,
                       deformable_groups)
    N, C, H, W = Input.shape
    O, _, kh, kw = Filter.shape
    dg, K = deformable_groups, kh * kw
    rows = np.repeat(np.arange(kh), kw) * dilations[0]            # per tap, row-major
    cols = np.tile(np.arange(kw), kh) * dilations[1]
    base_y = (np.arange(Ho) * strides[0] - paddings[0])[None, :, None] + rows[:, None, None]
    base_x = (np.arange(Wo) * strides[1] - paddings[1])[None, None, :] + cols[:, None, None]
    pairs = Offset.reshape(N, dg, K, 2, Ho, Wo)
    y = base_y.astype(Input.dtype) + pairs[:, :, :, 0]
    x = base_x.astype(Input.dtype) + pairs[:, :, :, 1]
    read = _bilinear(Input.reshape(N, dg, C // dg, H, W), y, x)   # [N, dg, C/dg, K, H', W']
    if Mask is not None:
        read = read * Mask.reshape(N, dg, 1, K, Ho, Wo)
    read = read.reshape(N, groups, C // groups, K, Ho, Wo)
    weights = Filter.reshape(groups, O // groups, C // groups, K)
    out = jnp.einsum("ngckhw,gock->ngohw", read, weights, preferred_element_type=Input.dtype)
    return out.reshape(N, O, Ho, Wo)


@deformable_conv.gradient
def _(g):
    mask = g.input("Mask")
    g.op("deformable_conv_grad",
         {"Input": g.input("Input"), "Offset": g.input("Offset"), "Mask": mask,
          "Filter": g.input("Filter"), "OutputGrad": g.out_grad("Output")},
         {"InputGrad": g.in_grad("Input"), "OffsetGrad": g.in_grad("Offset"),
          "MaskGrad": g.in_grad("Mask") if mask else None, "FilterGrad": g.in_grad("Filter")},
         **g.attrs)


@op("deformable_conv_grad",
    inputs=_INPUTS + [In("OutputGrad", "float", doc="[N, O, H', W']"), _MASK],
    outputs=[Out("InputGrad", optional=True), Out("OffsetGrad", optional=True),
             Out("MaskGrad", optional=True), Out("FilterGrad", optional=True)],
    attrs=_ATTRS, same_dtype=("Input", "Offset", "Mask", "Filter", "OutputGrad"))
def deformable_conv_grad(Input, Offset, Filter, OutputGrad, Mask=None, **attrs):
    """Gradients of deformable_conv's inputs from that of its Output.

    No gradient maker: deformable_conv differentiates once (append_backward names this
    op when asked for a second order)."""
    def forward(x, offset, mask, w):
        return deformable_conv.lower(x, offset, w, mask, **attrs)

    dx, doffset, dmask, dw = local_vjp(forward, (Input, Offset, Mask, Filter), OutputGrad)
    return dx, doffset, dmask, dw
