"""conv2d_transpose and conv3d_transpose: PaddlePaddle's transposed convolutions
("deconvolutions") over 2 (H, W) or 3 (D, H, W) spatial dims.

Each input pixel scatters a copy of its filter slice, scaled by its value, into the
output at stride `strides`; the result is then cropped by `paddings`. Filter is
[in channels, out channels / groups, k...], as PaddlePaddle lays it out. The output's
size along each spatial dim is (n - 1) * stride - pad_low - pad_high + dilation * (k - 1)
+ 1, plus `output_padding` at the high end, or `output_size` when given (at most
stride - 1 more than that). Depthwise transposed convolution is groups = in channels.
`data_format` is NCHW (channels first) or NHWC (channels last) for either rank, as
PaddlePaddle writes it.

Lowered as a convolution of the stride-dilated input with the spatially flipped filter
(`lax.conv_general_dilated` with `lhs_dilation`); each op differentiates through its
`*_grad` op (`jax.vjp` of the same rule), whose gradient maker is that of every bilinear
convolution op (`conv_grad_gradient`), so every order works.
"""
from jax import lax

from lowering import checks
from lowering.constraints import non_negative, one_of, positive
from lowering.errors import ShapeError
from lowering.ops.collective import local_vjp
from lowering.ops.nn import conv_grad_gradient
from lowering.registry import Attr, In, Out, op


def _attrs(n):
    """The attributes of the transposed convolution over `n` spatial dims."""
    dims = "DHW"[-n:]
    return {
        "strides": Attr("strides", "ints", (1,) * n, where=positive),
        "paddings": Attr("paddings", "ints", (0,) * n,
                         f"one per spatial dim, or (low, high) per spatial dim ({dims}), "
                         "cropped from the full result; EXPLICIT only", where=non_negative),
        "output_padding": Attr("output_padding", "ints", (),
                               "one per spatial dim, added at the high end, each below "
                               "max(stride, dilation); empty: none", where=non_negative),
        "output_size": Attr("output_size", "ints", (),
                            f"({', '.join(dims)}) of Output, from the inferred size to that "
                            "+ stride - 1; empty: inferred (wins over output_padding)",
                            where=positive),
        "dilations": Attr("dilations", "ints", (1,) * n, where=positive),
        "groups": Attr("groups", "int", 1, "input and output channels split into this many "
                                           "groups", where=positive),
        "padding_algorithm": Attr("padding_algorithm", "string", "EXPLICIT",
                                  "EXPLICIT, SAME (paddings as a stride-`strides` convolution "
                                  "of Input would pad, dilations ignored, as in PaddlePaddle) "
                                  "or VALID (no padding)",
                                  where=one_of("EXPLICIT", "SAME", "VALID")),
        "data_format": Attr("data_format", "string", "NCHW",
                            "NCHW: channels before the spatial dims; NHWC: after",
                            where=one_of("NCHW", "NHWC")),
    }


def _per_dim(name, values, n, x):
    if len(values) != n:
        raise ShapeError(f"attribute {name}={list(values)} must hold {n} values (one per "
                         f"spatial dim of Input {checks.typed(x)})", slot="Input")
    return tuple(values)


def _crops(spatial, kernel, strides, paddings, dilations, algorithm, x):
    """((low, high) crop per spatial dim, dilations) as PaddlePaddle resolves the algorithm."""
    n = len(spatial)
    if algorithm == "VALID":
        return ((0, 0),) * n, dilations
    if algorithm == "SAME":
        pairs = []
        for size, k, s in zip(spatial, kernel, strides):
            if not isinstance(size, int):
                raise ShapeError(f"padding_algorithm SAME needs the spatial dims of Input "
                                 f"{checks.typed(x)}", slot="Input")
            total = max((-(-size // s) - 1) * s + k - size, 0)
            pairs.append((total // 2, total - total // 2))
        return tuple(pairs), (1,) * n
    if len(paddings) == n:
        return tuple((p, p) for p in paddings), dilations
    if len(paddings) == 2 * n:
        return tuple(zip(paddings[::2], paddings[1::2])), dilations
    raise ShapeError(f"attribute paddings={list(paddings)} must hold {n} or {2 * n} values "
                     f"for Input {checks.typed(x)}", slot="Input")


def _geometry(n, Input, Filter, strides, paddings, output_padding, output_size, dilations,
              groups, padding_algorithm, data_format):
    """Checked (crop pairs, dilations, extra elements at the high end) per spatial dim."""
    dims = "DHW"[-n:]
    last = data_format == "NHWC"
    checks.rank("Input", Input, n + 2, f"N, {', '.join(dims)}, C" if last
                else f"N, C, {', '.join(dims)}")
    checks.rank("Filter", Filter, n + 2, "C, O / groups, " + ", ".join(f"k{d.lower()}"
                                                                       for d in dims))
    channels = Input.shape[-1 if last else 1]
    checks.dim("Filter", Filter, 0, channels, f"Input's channels ({data_format})")
    if isinstance(channels, int) and channels % groups:
        raise ShapeError(f"Input {checks.typed(Input)}'s {channels} channels must split into "
                         f"groups={groups}", slot="Input")
    strides = _per_dim("strides", strides, n, Input)
    dilations = _per_dim("dilations", dilations, n, Input)
    spatial = Input.shape[1:-1] if last else Input.shape[2:]
    kernel = Filter.shape[2:]
    pairs, dilations = _crops(spatial, kernel, strides, paddings, dilations, padding_algorithm,
                              Input)
    extras = []
    for i, (size, k, s, d, (lo, hi)) in enumerate(zip(spatial, kernel, strides, dilations,
                                                      pairs)):
        inferred = (size - 1) * s - lo - hi + d * (k - 1) + 1
        if output_size:
            wanted = _per_dim("output_size", output_size, n, Input)[i]
            if isinstance(size, int) and not inferred <= wanted < inferred + s:
                raise ShapeError(f"attribute output_size={list(output_size)}: dim {dims[i]} "
                                 f"must be from {inferred} to {inferred + s - 1} for Input "
                                 f"{checks.typed(Input)} and Filter {checks.typed(Filter)}",
                                 slot="Input")
            extras.append(wanted - inferred)
        elif output_padding:
            extra = _per_dim("output_padding", output_padding, n, Input)[i]
            if extra >= max(s, d):
                raise ShapeError(f"attribute output_padding={list(output_padding)} must be "
                                 f"below max(stride, dilation) = {max(s, d)} in dim {dims[i]}",
                                 slot="Input")
            extras.append(extra)
        else:
            extras.append(0)
        if isinstance(size, int) and inferred + extras[-1] < 1:
            raise ShapeError(f"paddings {[lo, hi]} crop all of the {inferred + lo + hi} "
                             f"{dims[i]} positions of the transposed convolution of Input "
                             f"{checks.typed(Input)} with Filter {checks.typed(Filter)}",
                             slot="Input")
    return pairs, dilations, tuple(extras)


def _as_conv_filter(Filter, groups):
    """[C, O / g, k...] -> the filter [O, C / g, k...] of the equivalent convolution,
    flipped in space."""
    spatial = tuple(range(2, Filter.ndim))
    if groups == 1:
        w = lax.transpose(Filter, (1, 0) + spatial)
    else:
        c, og = Filter.shape[:2]
        w = Filter.reshape((groups, c // groups, og) + Filter.shape[2:])
        w = w.transpose((0, 2, 1) + tuple(a + 1 for a in spatial))
        w = w.reshape((groups * og, c // groups) + Filter.shape[2:])
    return lax.rev(w, spatial)


def _transposed_conv(n, Input, Filter, *, strides, paddings, output_padding, output_size,
                     dilations, groups, padding_algorithm, data_format):
    """The transposed convolution over `n` spatial dims (the lowering of both ops)."""
    pairs, dilations, extras = _geometry(
        n, Input, Filter, strides, paddings, output_padding, output_size, dilations, groups,
        padding_algorithm, data_format)
    padding = [(d * (k - 1) - lo, d * (k - 1) - hi + extra)
               for k, d, (lo, hi), extra in zip(Filter.shape[2:], dilations, pairs, extras)]
    dims = "DHW"[-n:]
    layout = f"N{dims}C" if data_format == "NHWC" else f"NC{dims}"
    return lax.conv_general_dilated(
        Input, _as_conv_filter(Filter, groups), (1,) * n, padding,
        lhs_dilation=tuple(strides), rhs_dilation=tuple(dilations),
        dimension_numbers=(layout, f"OI{dims}", layout), feature_group_count=groups,
        preferred_element_type=Input.dtype)


def _gradient_maker(grad_type):
    def make(g):
        g.op(grad_type, {"Input": g.input("Input"), "Filter": g.input("Filter"),
                         "OutputGrad": g.out_grad("Output")},
             {"InputGrad": g.in_grad("Input"), "FilterGrad": g.in_grad("Filter")}, **g.attrs)
    return make


_GRAD_SLOTS = dict(
    inputs=[In("Input", "float"), In("Filter", "float"), In("OutputGrad", "float")],
    outputs=[Out("InputGrad", optional=True), Out("FilterGrad", optional=True)],
    same_dtype=("Input", "Filter", "OutputGrad"))


# --- 2-D ---

@op("conv2d_transpose",
    inputs=[In("Input", "float", doc="[N, C, H, W] (NCHW) or [N, H, W, C] (NHWC)"),
            In("Filter", "float", doc="[C, O / groups, kh, kw]")],
    outputs=[Out("Output", doc="[N, O, H', W'] (NCHW) or [N, H', W', O] (NHWC)")],
    attrs=_attrs(2), same_dtype=("Input", "Filter"))
def conv2d_transpose(Input, Filter, **attrs):
    """2-D transposed convolution of `Input` with `Filter`, PaddlePaddle's conv2d_transpose."""
    return _transposed_conv(2, Input, Filter, **attrs)


conv2d_transpose.gradient(_gradient_maker("conv2d_transpose_grad"))


@op("conv2d_transpose_grad", attrs=_attrs(2), **_GRAD_SLOTS)
def conv2d_transpose_grad(Input, Filter, OutputGrad, **attrs):
    """Gradients of conv2d_transpose's Input and Filter from the gradient of its Output."""
    return local_vjp(lambda x, w: _transposed_conv(2, x, w, **attrs), (Input, Filter),
                     OutputGrad)


conv2d_transpose_grad.gradient(conv_grad_gradient("conv2d_transpose", "conv2d_transpose_grad"))


# --- 3-D ---

@op("conv3d_transpose",
    inputs=[In("Input", "float", doc="[N, C, D, H, W] (NCHW) or [N, D, H, W, C] (NHWC)"),
            In("Filter", "float", doc="[C, O / groups, kd, kh, kw]")],
    outputs=[Out("Output", doc="[N, O, D', H', W'] (NCHW) or [N, D', H', W', O] (NHWC)")],
    attrs=_attrs(3), same_dtype=("Input", "Filter"))
def conv3d_transpose(Input, Filter, **attrs):
    """3-D transposed convolution of `Input` with `Filter`, PaddlePaddle's conv3d_transpose."""
    return _transposed_conv(3, Input, Filter, **attrs)


conv3d_transpose.gradient(_gradient_maker("conv3d_transpose_grad"))


@op("conv3d_transpose_grad", attrs=_attrs(3), **_GRAD_SLOTS)
def conv3d_transpose_grad(Input, Filter, OutputGrad, **attrs):
    """Gradients of conv3d_transpose's Input and Filter from the gradient of its Output."""
    return local_vjp(lambda x, w: _transposed_conv(3, x, w, **attrs), (Input, Filter),
                     OutputGrad)


conv3d_transpose_grad.gradient(conv_grad_gradient("conv3d_transpose", "conv3d_transpose_grad"))
