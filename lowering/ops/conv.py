"""The general convolution of `lax.conv_general_dilated`: any number of spatial dims, any
layout, strides, padding, input (transposed convolution) and kernel dilation, groups.

It differentiates through `conv_general_dilated_grad`, lowered with `jax.vjp` of the
forward rule; convolution is bilinear, so the gradient of that op is made of
convolutions and `conv_general_dilated_grad` again, and every order works.
(`conv2d` in nn.py is the NCHW layer op with PaddlePaddle's padding rules.)
"""
import jax
from jax import lax

from lowering import checks
from lowering.errors import ShapeError
from lowering.ops.collective import local_vjp
from lowering.ops.nn import conv_grad_gradient
from lowering.constraints import positive
from lowering.registry import REQUIRED, Attr, In, Out, op

_CONV_ATTRS = {
    "window_strides": Attr("window_strides", "ints", (), "one per spatial dim; empty: all 1",
                           where=positive),
    "padding": Attr("padding", "ints", (), "(low, high) per spatial dim, flattened; empty: none"),
    "lhs_dilation": Attr("lhs_dilation", "ints", (), "input dilation per spatial dim "
                                                     "(transposed convolution); empty: all 1",
                         where=positive),
    "rhs_dilation": Attr("rhs_dilation", "ints", (), "kernel dilation per spatial dim; "
                                                     "empty: all 1", where=positive),
    "lhs_spec": Attr("lhs_spec", "ints", REQUIRED, "Input's dims: batch, feature, spatial..."),
    "rhs_spec": Attr("rhs_spec", "ints", REQUIRED, "Filter's dims: out feature, in feature, "
                                                   "spatial..."),
    "out_spec": Attr("out_spec", "ints", REQUIRED, "Output's dims: batch, feature, spatial..."),
    "feature_group_count": Attr("feature_group_count", "int", 1, where=positive),
    "batch_group_count": Attr("batch_group_count", "int", 1, where=positive),
}


def _geometry(Input, Filter, window_strides, padding, lhs_dilation, rhs_dilation, lhs_spec,
              rhs_spec, out_spec, feature_group_count, batch_group_count):
    """`lax.conv_general_dilated`'s keyword arguments, checked against the operands."""
    n = Input.ndim - 2
    checks.min_rank("Input", Input, 3)
    checks.rank("Filter", Filter, Input.ndim, "as many dims as Input")
    for name, spec in (("lhs_spec", lhs_spec), ("rhs_spec", rhs_spec), ("out_spec", out_spec)):
        if sorted(spec) != list(range(n + 2)):
            raise ShapeError(f"{name} {list(spec)} must order the {n + 2} dims of Input "
                             f"{checks.typed(Input)}", slot="Input")
    ones = (1,) * n
    kw = dict(window_strides=tuple(window_strides) or ones,
              padding=tuple(zip(padding[::2], padding[1::2])) or ((0, 0),) * n,
              lhs_dilation=tuple(lhs_dilation) or ones, rhs_dilation=tuple(rhs_dilation) or ones)
    if any(len(v) != n for v in kw.values()):
        raise ShapeError(f"strides, padding pairs and dilations must have one entry per "
                         f"spatial dim ({n}), got {[list(v) for v in kw.values()]}", slot="Input")
    channels = Input.shape[lhs_spec[1]]
    groups = feature_group_count
    if isinstance(channels, int) and channels % groups == 0:
        checks.dim("Filter", Filter, rhs_spec[1], channels // groups,
                   f"Input's {channels} features / feature_group_count={groups}")
    return dict(kw, dimension_numbers=lax.ConvDimensionNumbers(
        tuple(lhs_spec), tuple(rhs_spec), tuple(out_spec)),
        feature_group_count=feature_group_count, batch_group_count=batch_group_count)


@op("conv_general_dilated", inputs=[In("Input", "float"), In("Filter", "float")],
    outputs=[Out("Output")], attrs=_CONV_ATTRS, same_dtype=("Input", "Filter"))
def conv_general_dilated(Input, Filter, **attrs):
    """N-d convolution (cross-correlation) of `Input` with `Filter`, as
    `lax.conv_general_dilated` computes it; the layouts are given by the specs."""
    return lax.conv_general_dilated(Input, Filter, **_geometry(Input, Filter, **attrs),
                                    preferred_element_type=Input.dtype)


@conv_general_dilated.gradient
def _(g):
    g.op("conv_general_dilated_grad",
         {"Input": g.input("Input"), "Filter": g.input("Filter"),
          "OutputGrad": g.out_grad("Output")},
         {"InputGrad": g.in_grad("Input"), "FilterGrad": g.in_grad("Filter")}, **g.attrs)


@op("conv_general_dilated_grad",
    inputs=[In("Input", "float"), In("Filter", "float"), In("OutputGrad", "float")],
    outputs=[Out("InputGrad", optional=True), Out("FilterGrad", optional=True)],
    attrs=_CONV_ATTRS, same_dtype=("Input", "Filter", "OutputGrad"))
def conv_general_dilated_grad(Input, Filter, OutputGrad, **attrs):
    """Gradients of conv_general_dilated's Input and Filter from that of its Output."""
    return local_vjp(lambda x, w: conv_general_dilated.lower(x, w, **attrs), (Input, Filter),
                     OutputGrad)


conv_general_dilated_grad.gradient(
    conv_grad_gradient("conv_general_dilated", "conv_general_dilated_grad"))