"""conv2d_transpose: PaddlePaddle's 2-D transposed convolution ("deconvolution").

Each input pixel scatters a copy of its filter slice, scaled by its value, into the
output at stride `strides`; the result is then cropped by `paddings`. Filter is
[in channels, out channels / groups, kh, kw], as PaddlePaddle lays it out. The output's
spatial size is (n - 1) * stride - pad_low - pad_high + dilation * (k - 1) + 1, plus
`output_padding` rows/columns at the bottom/right, or `output_size` when given (at most
stride - 1 more than that). Depthwise transposed convolution is groups = in channels.

Lowered as a convolution of the stride-dilated input with the spatially flipped filter
(`lax.conv_general_dilated` with `lhs_dilation`); it differentiates through
`conv2d_transpose_grad` (`jax.vjp` of the same rule), whose gradient maker is that of
every bilinear convolution op (`conv_grad_gradient`), so every order works.
"""
from jax import lax

from lowering import checks
from lowering.constraints import non_negative, one_of, positive
from lowering.errors import ShapeError
from lowering.ops.collective import local_vjp
from lowering.ops.nn import conv_grad_gradient
from lowering.registry import Attr, In, Out, op

_ATTRS = {
    "strides": Attr("strides", "ints", (1, 1), where=positive),
    "paddings": Attr("paddings", "ints", (0, 0),
                     "(pad_h, pad_w) or (top, bottom, left, right), cropped from the full "
                     "result; EXPLICIT only", where=non_negative),
    "output_padding": Attr("output_padding", "ints", (),
                           "(extra_h, extra_w) rows/columns added at the bottom/right, each "
                           "below max(stride, dilation); empty: none", where=non_negative),
    "output_size": Attr("output_size", "ints", (),
                        "(H, W) of Output, from the inferred size to that + stride - 1; "
                        "empty: inferred (wins over output_padding)", where=positive),
    "dilations": Attr("dilations", "ints", (1, 1), where=positive),
    "groups": Attr("groups", "int", 1, "input and output channels split into this many groups",
                   where=positive),
    "padding_algorithm": Attr("padding_algorithm", "string", "EXPLICIT",
                              "EXPLICIT, SAME (paddings as a stride-`strides` convolution of "
                              "Input would pad, dilations ignored, as in PaddlePaddle) or "
                              "VALID (no padding)", where=one_of("EXPLICIT", "SAME", "VALID")),
    "data_format": Attr("data_format", "string", "NCHW", "layout of Input and Output",
                        where=one_of("NCHW", "NHWC")),
}


def _two(name, values, slot, x):
    if len(values) != 2:
        raise ShapeError(f"attribute {name}={list(values)} must hold 2 values (one per "
                         f"spatial dim of {slot} {checks.typed(x)})", slot=slot)
    return tuple(values)


def _pairs(spatial, kernel, strides, paddings, dilations, algorithm, x):
    """((low, high) crop per spatial dim, dilations) as PaddlePaddle resolves the algorithm."""
    if algorithm == "VALID":
        return ((0, 0), (0, 0)), dilations
    if algorithm == "SAME":
        pairs = []
        for n, k, s in zip(spatial, kernel, strides):
            if not isinstance(n, int):
                raise ShapeError(f"padding_algorithm SAME needs the spatial dims of Input "
                                 f"{checks.typed(x)}", slot="Input")
            total = max((-(-n // s) - 1) * s + k - n, 0)
            pairs.append((total // 2, total - total // 2))
        return tuple(pairs), (1, 1)
    if len(paddings) == 2:
        return ((paddings[0],) * 2, (paddings[1],) * 2), dilations
    if len(paddings) == 4:
        return (tuple(paddings[:2]), tuple(paddings[2:])), dilations
    raise ShapeError(f"attribute paddings={list(paddings)} must hold 2 or 4 values", slot="Input")


def _geometry(Input, Filter, strides, paddings, output_padding, output_size, dilations,
              groups, padding_algorithm, data_format):
    """Checked (spatial axes, crop pairs, dilations, extra rows/cols at the high end)."""
    checks.rank("Input", Input, 4, "N, C, H, W" if data_format == "NCHW" else "N, H, W, C")
    checks.rank("Filter", Filter, 4, "C, O / groups, kh, kw")
    axes = (2, 3) if data_format == "NCHW" else (1, 2)
    channels = Input.shape[1 if data_format == "NCHW" else 3]
    checks.dim("Filter", Filter, 0, channels, f"Input's channels ({data_format})")
    if isinstance(channels, int) and channels % groups:
        raise ShapeError(f"Input {checks.typed(Input)}'s {channels} channels must split into "
                         f"groups={groups}", slot="Input")
    strides = _two("strides", strides, "Input", Input)
    dilations = _two("dilations", dilations, "Input", Input)
    spatial, kernel = [Input.shape[a] for a in axes], Filter.shape[2:]
    pairs, dilations = _pairs(spatial, kernel, strides, paddings, dilations, padding_algorithm,
                              Input)
    extras = []
    for i, (n, k, s, d, (lo, hi)) in enumerate(zip(spatial, kernel, strides, dilations, pairs)):
        inferred = (n - 1) * s - lo - hi + d * (k - 1) + 1
        if output_size:
            size = _two("output_size", output_size, "Input", Input)[i]
            if isinstance(n, int) and not inferred <= size < inferred + s:
                raise ShapeError(f"attribute output_size={list(output_size)}: dim {'HW'[i]} "
                                 f"must be from {inferred} to {inferred + s - 1} for Input "
                                 f"{checks.typed(Input)} and Filter {checks.typed(Filter)}",
                                 slot="Input")
            extras.append(size - inferred)
        elif output_padding:
            extra = _two("output_padding", output_padding, "Input", Input)[i]
            if extra >= max(s, d):
                raise ShapeError(f"attribute output_padding={list(output_padding)} must be "
                                 f"below max(stride, dilation) = {max(s, d)} in dim {'HW'[i]}",
                                 slot="Input")
            extras.append(extra)
        else:
            extras.append(0)
        if isinstance(n, int) and inferred + extras[-1] < 1:
            raise ShapeError(f"paddings {[lo, hi]} crop all of the {inferred + lo + hi} "
                             f"{'HW'[i]} positions of the transposed convolution of Input "
                             f"{checks.typed(Input)} with Filter {checks.typed(Filter)}",
                             slot="Input")
    return axes, pairs, dilations, tuple(extras)


def _as_conv_filter(Filter, groups):
    """[C, O / g, kh, kw] -> the OIHW filter [O, C / g, kh, kw] of the equivalent
    convolution, flipped in space."""
    if groups == 1:
        w = lax.transpose(Filter, (1, 0, 2, 3))
    else:
        c, og, kh, kw = Filter.shape
        w = Filter.reshape(groups, c // groups, og, kh, kw).transpose(0, 2, 1, 3, 4)
        w = w.reshape(groups * og, c // groups, kh, kw)
    return lax.rev(w, (2, 3))


@op("conv2d_transpose",
    inputs=[In("Input", "float", doc="[N, C, H, W] (NCHW) or [N, H, W, C] (NHWC)"),
            In("Filter", "float", doc="[C, O / groups, kh, kw]")],
    outputs=[Out("Output", doc="[N, O, H', W'] (NCHW) or [N, H', W', O] (NHWC)")],
    attrs=_ATTRS, same_dtype=("Input", "Filter"))
def conv2d_transpose(Input, Filter, *, strides, paddings, output_padding, output_size,
                     dilations, groups, padding_algorithm, data_format):
    """2-D transposed convolution of `Input` with `Filter`, PaddlePaddle's conv2d_transpose."""
    _, pairs, dilations, extras = _geometry(
        Input, Filter, strides, paddings, output_padding, output_size, dilations, groups,
        padding_algorithm, data_format)
    padding = [(d * (k - 1) - lo, d * (k - 1) - hi + extra)
               for k, d, (lo, hi), extra in zip(Filter.shape[2:], dilations, pairs, extras)]
    return lax.conv_general_dilated(
        Input, _as_conv_filter(Filter, groups), (1, 1), padding, lhs_dilation=tuple(strides),
        rhs_dilation=tuple(dilations), dimension_numbers=(data_format, "OIHW", data_format),
        feature_group_count=groups, preferred_element_type=Input.dtype)


@conv2d_transpose.gradient
def _(g):
    g.op("conv2d_transpose_grad", {"Input": g.input("Input"), "Filter": g.input("Filter"),
                                   "OutputGrad": g.out_grad("Output")},
         {"InputGrad": g.in_grad("Input"), "FilterGrad": g.in_grad("Filter")}, **g.attrs)


@op("conv2d_transpose_grad",
    inputs=[In("Input", "float"), In("Filter", "float"), In("OutputGrad", "float")],
    outputs=[Out("InputGrad", optional=True), Out("FilterGrad", optional=True)],
    attrs=_ATTRS, same_dtype=("Input", "Filter", "OutputGrad"))
def conv2d_transpose_grad(Input, Filter, OutputGrad, **attrs):
    """Gradients of conv2d_transpose's Input and Filter from the gradient of its Output."""
    return local_vjp(lambda x, w: conv2d_transpose.lower(x, w, **attrs), (Input, Filter),
                     OutputGrad)


conv2d_transpose_grad.gradient(conv_grad_gradient("conv2d_transpose", "conv2d_transpose_grad"))
