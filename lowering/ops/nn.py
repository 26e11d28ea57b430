"""Neural-network layers: conv2d, pool2d, scaled_dot_product_attention, batch_norm,
layer_norm, dropout, lookup_table.

Convolution and pooling differentiate through dedicated ops lowered with
`jax.vjp` / `jax.jvp` of the forward rule (XLA's transposed convolutions,
select-and-scatter): `conv2d_grad`, `pool2d_grad` and `pool2d_jvp`, whose own
gradient makers close the loop, so every order of derivative works. Attention
differentiates once, through `scaled_dot_product_attention_grad` (the VJP of
the same `jax.nn.dot_product_attention` call). The
normalizations differentiate by composing reductions and elementwise ops;
`lookup_table` scatters into `lookup_table_grad`, whose gradient is a lookup.
"""
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from lowering import checks
from lowering.constraints import between, non_negative, one_of, positive
from lowering.errors import BackwardError, ShapeError
from lowering.ops.collective import all_reduce, local_vjp
from lowering.registry import REQUIRED, Attr, In, Out, op


def _pad_pairs(paddings):
    """((top, bottom), (left, right)) from (pad_h, pad_w) or (top, bottom, left, right)."""
    if len(paddings) == 2:
        return ((paddings[0],) * 2, (paddings[1],) * 2)
    if len(paddings) == 4:
        return (tuple(paddings[:2]), tuple(paddings[2:]))
    raise ValueError(f"paddings must hold 2 or 4 values, got {list(paddings)}")


def _zeros_into(g, like, slot):
    """Emit zeros shaped like `like` as the gradient of input `slot`, if wanted."""
    if g.in_grad(slot):
        g.call("fill_zeros_like", like, out=g.in_grad(slot))


# --- convolution ---

_CONV_ATTRS = {
    "strides": Attr("strides", "ints", (1, 1), where=positive),
    "paddings": Attr("paddings", "ints", (0, 0),
                     "(pad_h, pad_w) or (top, bottom, left, right); EXPLICIT only",
                     where=non_negative),
    "dilations": Attr("dilations", "ints", (1, 1), where=positive),
    "groups": Attr("groups", "int", 1, "input and output channels split into this many groups",
                   where=positive),
    "padding_algorithm": Attr("padding_algorithm", "string", "EXPLICIT",
                              "EXPLICIT, SAME (output = ceil(input / stride); dilations "
                              "are ignored, as in PaddlePaddle) or VALID (no padding)",
                              where=one_of("EXPLICIT", "SAME", "VALID")),
}
_CONV_DIMS = ("NCHW", "OIHW", "NCHW")


def _conv_geometry(spatial, kernel, strides, paddings, dilations, algorithm):
    """(padding pairs, dilations) as PaddlePaddle resolves `padding_algorithm`."""
    if algorithm == "EXPLICIT":
        return _pad_pairs(paddings), tuple(dilations)
    if algorithm == "VALID":
        return ((0, 0), (0, 0)), tuple(dilations)
    if algorithm == "SAME":
        pads = []
        for n, k, s in zip(spatial, kernel, strides):
            total = max((-(-n // s) - 1) * s + k - n, 0)
            pads.append((total // 2, total - total // 2))
        return tuple(pads), (1, 1)
    raise ValueError(f"padding_algorithm must be EXPLICIT, SAME or VALID, got {algorithm!r}")


def _check_window(slot, x, window, pads):
    """The (dilated) window fits in the padded spatial dims of NCHW input `slot`."""
    for name, n, k, (lo, hi) in zip("HW", x.shape[2:], window, pads):
        if isinstance(n, int) and k > n + lo + hi:
            raise ShapeError(f"the {window[0]}x{window[1]} window is larger than {slot} "
                             f"{checks.typed(x)}'s {name} of {n} (padded: {n + lo + hi})",
                             slot=slot)


def _check_conv(Input, Filter, groups):
    checks.rank("Input", Input, 4, "N, C, H, W")
    checks.rank("Filter", Filter, 4, "O, C / groups, kh, kw")
    channels, filters = Input.shape[1], Filter.shape[0]
    if groups < 1 or any(isinstance(n, int) and n % groups for n in (channels, filters)):
        raise ShapeError(f"Input {checks.typed(Input)}'s channels and Filter "
                         f"{checks.typed(Filter)}'s filters must split into groups={groups}",
                         slot="Filter")
    if isinstance(channels, int):
        checks.dim("Filter", Filter, 1, channels // groups,
                   f"Input {checks.typed(Input)}'s {channels} channels / groups={groups}")


@op("conv2d", inputs=[In("Input", "float", doc="[N, C, H, W]"),
                      In("Filter", "float", doc="[O, C / groups, kh, kw]")],
    outputs=[Out("Output")], attrs=_CONV_ATTRS, same_dtype=("Input", "Filter"))
def conv2d(Input, Filter, *, strides, paddings, dilations, groups, padding_algorithm):
    """2-D convolution (cross-correlation) of NCHW `Input` with OIHW `Filter`."""
    _check_conv(Input, Filter, groups)
    pads, dilation = _conv_geometry(Input.shape[2:], Filter.shape[2:], strides, paddings,
                                    dilations, padding_algorithm)
    _check_window("Input", Input, [(k - 1) * d + 1 for k, d in zip(Filter.shape[2:], dilation)],
                  pads)
    return lax.conv_general_dilated(Input, Filter, tuple(strides), pads, rhs_dilation=dilation,
                                    dimension_numbers=_CONV_DIMS, feature_group_count=groups)


@conv2d.gradient
def _(g):
    g.op("conv2d_grad", {"Input": g.input("Input"), "Filter": g.input("Filter"),
                         "OutputGrad": g.out_grad("Output")},
         {"InputGrad": g.in_grad("Input"), "FilterGrad": g.in_grad("Filter")}, **g.attrs)


@op("conv2d_grad", inputs=[In("Input", "float"), In("Filter", "float"), In("OutputGrad", "float")],
    outputs=[Out("InputGrad", optional=True), Out("FilterGrad", optional=True)],
    attrs=_CONV_ATTRS, same_dtype=("Input", "Filter", "OutputGrad"))
def conv2d_grad(Input, Filter, OutputGrad, **attrs):
    """Gradients of conv2d's Input and Filter from the gradient of its Output."""
    return local_vjp(lambda x, w: conv2d.lower(x, w, **attrs), (Input, Filter), OutputGrad)


def conv_grad_gradient(conv, conv_grad):
    """The gradient maker of a convolution's gradient op `conv_grad` (Input, Filter,
    OutputGrad -> InputGrad, FilterGrad), for the convolution op `conv` with its attributes.

    A convolution is bilinear: <ddx, InputGrad> + <ddw, FilterGrad> = <conv(ddx, w) +
    conv(x, ddw), dy>, so OutputGrad's gradient is made of convolutions and Input's and
    Filter's of `conv_grad` itself.
    """
    def make(g):
        x, w, dy = g.input("Input"), g.input("Filter"), g.input("OutputGrad")
        ddx = g.out_grad("InputGrad") if g.has_out_grad("InputGrad") else None
        ddw = g.out_grad("FilterGrad") if g.has_out_grad("FilterGrad") else None
        if g.wants("OutputGrad"):
            pairs = [p for p in ((ddx, w), (x, ddw)) if None not in p]
            target = g.in_grad("OutputGrad")
            if len(pairs) == 2:
                g.call("add", *(g.call(conv, *p, **g.attrs) for p in pairs), out=target)
            elif pairs:
                g.call(conv, *pairs[0], out=target, **g.attrs)
            else:
                g.call("fill_zeros_like", dy, out=target)
        for slot, other, operands, result in (
                ("Filter", ddx, {"Input": ddx, "Filter": w}, "FilterGrad"),
                ("Input", ddw, {"Input": x, "Filter": ddw}, "InputGrad")):
            if not g.wants(slot):
                continue
            if other is None:
                _zeros_into(g, w if slot == "Filter" else x, slot)
            else:
                g.op(conv_grad, dict(operands, OutputGrad=dy), {result: g.in_grad(slot)},
                     **g.attrs)
    return make


conv2d_grad.gradient(conv_grad_gradient("conv2d", "conv2d_grad"))


# --- pooling ---

_POOL_ATTRS = {
    "pooling_type": Attr("pooling_type", "string", "max", "max or avg", where=one_of("max", "avg")),
    "ksize": Attr("ksize", "ints", REQUIRED, "(kh, kw)", where=positive),
    "strides": Attr("strides", "ints", (1, 1), where=positive),
    "paddings": Attr("paddings", "ints", (0, 0), "(pad_h, pad_w) or (top, bottom, left, right)",
                     where=non_negative),
    "global_pooling": Attr("global_pooling", "bool", False, "pool over all of H and W"),
    "exclusive": Attr("exclusive", "bool", True,
                      "avg divides by the number of non-padding elements, else by kh * kw"),
    "ceil_mode": Attr("ceil_mode", "bool", False, "round the output size up"),
}


def _pool_geometry(spatial, ksize, strides, paddings, global_pooling, ceil_mode):
    """(window, strides, padding pairs); ceil_mode pads the high side for the last window."""
    if global_pooling:
        return tuple(spatial), (1, 1), ((0, 0), (0, 0))
    pads = []
    for n, k, s, (lo, hi) in zip(spatial, ksize, strides, _pad_pairs(paddings)):
        span = n + lo + hi - k
        out = (-(-span // s) if ceil_mode else span // s) + 1
        pads.append((lo, hi + max((out - 1) * s + k - n - lo - hi, 0)))
    return tuple(ksize), tuple(strides), tuple(pads)


@op("pool2d", inputs=[In("X", "float", doc="[N, C, H, W]")], outputs=[Out("Out")],
    attrs=_POOL_ATTRS)
def pool2d(X, *, pooling_type, ksize, strides, paddings, global_pooling, exclusive, ceil_mode):
    """Max or average pooling over the H and W dims of NCHW `X` (padding never wins a max)."""
    checks.rank("X", X, 4, "N, C, H, W")
    k, s, pads = _pool_geometry(X.shape[2:], ksize, strides, paddings, global_pooling, ceil_mode)
    _check_window("X", X, k, pads)
    window, stride, padding = (1, 1) + k, (1, 1) + s, ((0, 0), (0, 0)) + pads
    if pooling_type == "max":
        return lax.reduce_window(X, np.array(-np.inf, X.dtype), lax.max, window, stride, padding)
    zero = np.array(0, X.dtype)
    total = lax.reduce_window(X, zero, lax.add, window, stride, padding)
    if exclusive:
        return total / lax.reduce_window(jnp.ones(X.shape[2:], X.dtype), zero, lax.add, k, s, pads)
    return total / (k[0] * k[1])


@pool2d.gradient
def _(g):
    g.call("pool2d_grad", g.input("X"), g.out_grad("Out"), out=g.in_grad("X"), **g.attrs)


@op("pool2d_grad", inputs=[In("X", "float"), In("OutGrad", "float")], outputs=[Out("Out")],
    attrs=_POOL_ATTRS, same_dtype=("X", "OutGrad"))
def pool2d_grad(X, OutGrad, **attrs):
    """Gradient of pool2d's X from the gradient of its Out (linear in OutGrad; zero in X)."""
    return local_vjp(lambda x: pool2d.lower(x, **attrs), (X,), OutGrad)[0]


@pool2d_grad.gradient
def _(g):
    x = g.input("X")
    if g.wants("OutGrad"):
        g.call("pool2d_jvp", x, g.out_grad("Out"), out=g.in_grad("OutGrad"), **g.attrs)
    _zeros_into(g, x, "X")


@op("pool2d_jvp", inputs=[In("X", "float"), In("Tangent", "float")], outputs=[Out("Out")],
    attrs=_POOL_ATTRS, same_dtype=("X", "Tangent"))
def pool2d_jvp(X, Tangent, **attrs):
    """Derivative of pool2d at X along Tangent: the transpose of pool2d_grad in OutGrad."""
    return jax.jvp(lambda x: pool2d.lower(x, **attrs), (X,), (Tangent,))[1]


@pool2d_jvp.gradient
def _(g):
    x = g.input("X")
    if g.wants("Tangent"):
        g.call("pool2d_grad", x, g.out_grad("Out"), out=g.in_grad("Tangent"), **g.attrs)
    _zeros_into(g, x, "X")


# --- attention ---

_ATTENTION_ATTRS = {
    "is_causal": Attr("is_causal", "bool", False, "query t attends to keys s <= t only"),
    "scale": Attr("scale", "float", 0.0, "multiplies Q K^T; 0 means 1 / sqrt(H)"),
}
_ATTENTION_INPUTS = [
    In("Q", "float", doc="queries [B, T, N, H] (N heads of size H)"),
    In("K", "float", doc="keys [B, S, N, H]"),
    In("V", "float", doc="values [B, S, N, H]"),
    In("Bias", "float", optional=True, doc="added to the logits, broadcastable to [B, N, T, S]"),
    In("Mask", "bool", optional=True,
       doc="True where query t may attend to key s, broadcastable to [B, N, T, S]"),
]


def _check_attention(Q, K, V, Bias, Mask):
    """Q [B, T, N, H], K and V [B, S, N, H]; Bias and Mask broadcast to [B, N, T, S]."""
    for slot, x, meaning in (("Q", Q, "B, T, N, H"), ("K", K, "B, S, N, H"),
                             ("V", V, "B, S, N, H")):
        checks.rank(slot, x, 4, meaning)
    for axis, why in ((0, "the batch of Q"), (2, "the heads of Q"), (3, "the head size of Q")):
        checks.dim("K", K, axis, Q.shape[axis], why)
    checks.shape("V", V, K.shape, "the shape of K: one value per key")
    logits = (Q.shape[0], Q.shape[2], Q.shape[1], K.shape[1])
    for slot, x in (("Bias", Bias), ("Mask", Mask)):
        if x is not None:
            checks.broadcasts_to(slot, x, logits, "B, N, T, S: batch, heads, queries, keys")


@op("scaled_dot_product_attention", inputs=_ATTENTION_INPUTS, outputs=[Out("Out")],
    attrs=_ATTENTION_ATTRS, same_dtype=("Q", "K", "V", "Bias"))
def scaled_dot_product_attention(Q, K, V, Bias=None, Mask=None, *, is_causal, scale):
    """softmax(scale * Q K^T + Bias, masked) V for every head, as `jax.nn.dot_product_attention`.

    Out is [B, T, N, H]. JAX picks the implementation (`implementation=None`:
    XLA's in jax 0.10). JAX's softmax runs in float32, so float64 attention is
    written out here in float64. A query row whose keys are all masked gets
    uniform weights.
    """
    _check_attention(Q, K, V, Bias, Mask)
    if Q.dtype != jnp.float64:
        return jax.nn.dot_product_attention(Q, K, V, bias=Bias, mask=Mask, is_causal=is_causal,
                                            scale=scale or None)
    logits = jnp.einsum("btnh,bsnh->bnts", Q, K) * (scale or 1 / math.sqrt(Q.shape[-1]))
    if Bias is not None:
        logits = logits + Bias
    keep = jnp.ones(logits.shape[-2:], bool) if Mask is None else Mask
    if is_causal:
        keep = keep & jnp.tril(jnp.ones(logits.shape[-2:], bool))
    logits = jnp.where(keep, logits, jnp.finfo(logits.dtype).min)
    return jnp.einsum("bnts,bsnh->btnh", jax.nn.softmax(logits, axis=-1), V)


@scaled_dot_product_attention.gradient
def _(g):
    bias = g.input("Bias")
    g.op("scaled_dot_product_attention_grad",
         {"Q": g.input("Q"), "K": g.input("K"), "V": g.input("V"), "Bias": bias,
          "Mask": g.input("Mask"), "OutGrad": g.out_grad("Out")},
         {"QGrad": g.in_grad("Q"), "KGrad": g.in_grad("K"), "VGrad": g.in_grad("V"),
          "BiasGrad": g.in_grad("Bias") if bias else None}, **g.attrs)


@op("scaled_dot_product_attention_grad",
    inputs=_ATTENTION_INPUTS + [In("OutGrad", "float", doc="gradient of Out [B, T, N, H]")],
    outputs=[Out("QGrad", optional=True), Out("KGrad", optional=True),
             Out("VGrad", optional=True), Out("BiasGrad", optional=True)],
    attrs=_ATTENTION_ATTRS, same_dtype=("Q", "K", "V", "Bias", "OutGrad"))
def scaled_dot_product_attention_grad(Q, K, V, OutGrad, Bias=None, Mask=None, **attrs):
    """Gradients of scaled_dot_product_attention's Q, K, V (and Bias) from that of its Out.

    No gradient maker: attention differentiates once (append_backward names this op
    when asked for a second order)."""
    def forward(q, k, v, bias):
        return scaled_dot_product_attention.lower(q, k, v, bias, Mask, **attrs)

    return local_vjp(forward, (Q, K, V, Bias), OutGrad)


# --- normalization ---

def _mean(g, x, axes, sync):
    """Emit the mean of x over `axes` (kept as size 1), and over the devices of mesh axis
    `sync` when it is not ''."""
    mean = g.call("reduce_mean", x, axis=axes, keep_dim=True)
    return g.call("c_allreduce", mean, reduce_type="mean", axis_name=sync) if sync else mean


def _standardize(g, x, axes, epsilon, sync=""):
    """Emit (x - mean, rsqrt(var + eps), normalized x), statistics over `axes` kept as size 1
    (and over the devices of mesh axis `sync`, if given)."""
    centered = g.call("sub", x, _mean(g, x, axes, sync))
    var = _mean(g, g.call("mul", centered, centered), axes, sync)
    inv_std = g.call("rsqrt", g.call("scale", var, bias=epsilon))
    return centered, inv_std, g.call("mul", centered, inv_std)


def _standardize_grad(g, u, xhat, inv_std, axes, out=None, sync=""):
    """Gradient wrt x of <u, xhat>: inv_std * (u - mean(u) - xhat * mean(u * xhat))."""
    mean_u = _mean(g, u, axes, sync)
    mean_ux = _mean(g, g.call("mul", u, xhat), axes, sync)
    w = g.call("sub", g.call("sub", u, mean_u), g.call("mul", xhat, mean_ux))
    return g.call("mul", w, inv_std, out=out)


def _weighted_grads(g, pairs, shape_stat):
    """Sum of weight * gradient over the (output slot, weight) pairs that get one, or None;
    `shape_stat` reshapes a statistic's gradient to broadcast against x."""
    parts = []
    for slot, weight in pairs:
        if g.has_out_grad(slot):
            d = shape_stat(g.out_grad(slot))
            parts.append(d if weight == 1.0 else g.call("scale", d, scale=weight))
    return None if not parts else parts[0] if len(parts) == 1 else g.call("add", *parts)


def _stats_grad(g, x, centered, axes, count, dmean, dvar):
    """Gradients wrt x of <dmean, mean(x)> + <dvar, var(x)> (over `axes`), or None.

    `count` is the number of elements each statistic averages, None when it is only
    known at run time."""
    parts = []
    if dmean:
        parts.append(g.call("expand_as", dmean, x))
    if dvar:
        parts.append(g.call("mul", g.call("scale", dvar, scale=2.0), centered))
    if not parts:
        return None
    total = parts[0] if len(parts) == 1 else g.call("add", *parts)
    if count:
        return g.call("scale", total, scale=1.0 / count)
    ones = g.call("scale", g.call("fill_zeros_like", x), bias=1.0)
    return g.call("div", total, g.call("reduce_sum", ones, axis=axes, keep_dim=True))


def _channel_axis(rank, data_layout):
    return rank - 1 if data_layout == "NHWC" else 1


@op("batch_norm",
    inputs=[In("X", "float", doc="[N, C, ...] (NCHW) or [N, ..., C] (NHWC)"),
            In("Scale", "float", doc="[C]"), In("Bias", "float", doc="[C]"),
            In("Mean", "float", differentiable=False, doc="running mean [C]"),
            In("Variance", "float", differentiable=False, doc="running variance [C]")],
    outputs=[Out("Y"),
             Out("MeanOut", optional=True, doc="momentum * Mean + (1 - momentum) * batch mean"),
             Out("VarianceOut", optional=True,
                 doc="momentum * Variance + (1 - momentum) * biased batch variance"),
             Out("SavedMean", optional=True, doc="batch mean (running Mean when is_test)"),
             Out("SavedVariance", optional=True,
                 doc="biased batch variance (running Variance when is_test)")],
    attrs={"momentum": Attr("momentum", "float", 0.9, where=between(0, 1)),
           "epsilon": Attr("epsilon", "float", 1e-5, where=non_negative), "is_test": False,
           "data_layout": Attr("data_layout", "string", "NCHW", "NCHW or NHWC",
                               where=one_of("NCHW", "NHWC")),
           "sync_axis": Attr("sync_axis", "string", "",
                             "mesh axis whose devices share batch statistics ('': none)")},
    same_dtype=("X", "Scale", "Bias", "Mean", "Variance"))
def batch_norm(X, Scale, Bias, Mean, Variance, *, momentum, epsilon, is_test, data_layout,
               sync_axis):
    """Batch normalization over every axis but the channel axis.

    Training normalizes with the batch statistics and, as PaddlePaddle does, updates the
    running variance with the biased batch variance. SavedVariance is that variance itself,
    not PaddlePaddle's inverse standard deviation. With is_test the running statistics
    normalize and pass through unchanged.

    With `sync_axis` (data parallel, e.g. "data") the batch statistics are those of the
    global batch: the per-device mean and mean square deviation averaged over the devices of
    that mesh axis (every device holds an equal share of the batch). Where the axis is not
    mapped (one device) that is the local batch, as without it.
    """
    checks.min_rank("X", X, 2)
    channel = _channel_axis(X.ndim, data_layout)
    for slot, v in (("Scale", Scale), ("Bias", Bias), ("Mean", Mean), ("Variance", Variance)):
        checks.shape(slot, v, [X.shape[channel]], f"one per channel of X {checks.typed(X)}, "
                     f"{data_layout}")
    axes = tuple(a for a in range(X.ndim) if a != channel)
    shape = tuple(-1 if a == channel else 1 for a in range(X.ndim))
    if is_test:
        mean, var = Mean, Variance
    else:
        mean = all_reduce(jnp.mean(X, axis=axes), "mean", sync_axis)
        var = all_reduce(jnp.mean(jnp.square(X - mean.reshape(shape)), axis=axes), "mean",
                         sync_axis)
    inv_std = lax.rsqrt(var + epsilon)
    y = (X - mean.reshape(shape)) * (inv_std * Scale).reshape(shape) + Bias.reshape(shape)
    if is_test:
        return y, Mean, Variance, Mean, Variance
    return (y, momentum * Mean + (1 - momentum) * mean,
            momentum * Variance + (1 - momentum) * var, mean, var)


@batch_norm.gradient
def _(g):
    x, dy = g.input("X"), g.out_grad("Y")
    rank, eps = len(g.var(x)[0]), g.attr("epsilon")
    channel = _channel_axis(rank, g.attr("data_layout"))
    axes = [a for a in range(rank) if a != channel]

    def per_channel(v):  # [C] -> broadcastable against x
        return v if channel == rank - 1 else g.call("reshape", v, shape=[1, -1] + [1] * (rank - 2))

    if g.attr("is_test"):
        inv_std = g.call("rsqrt", g.call("scale", per_channel(g.input("Variance")), bias=eps))
        if g.wants("X"):
            g.call("mul", dy, g.call("mul", per_channel(g.input("Scale")), inv_std),
                   out=g.in_grad("X"))
        if g.wants("Scale"):
            xhat = g.call("mul", g.call("sub", x, per_channel(g.input("Mean"))), inv_std)
    else:
        sync = g.attr("sync_axis")
        centered, inv_std, xhat = _standardize(g, x, axes, eps, sync)
        if g.wants("X"):
            keep = 1.0 - g.attr("momentum")

            def per_channel_synced(v):   # a statistic shared by the devices: so is its gradient
                v = per_channel(v)
                return g.call("c_allreduce", v, reduce_type="mean", axis_name=sync) if sync else v

            dmean = _weighted_grads(g, [("SavedMean", 1.0), ("MeanOut", keep)],
                                    per_channel_synced)
            dvar = _weighted_grads(g, [("SavedVariance", 1.0), ("VarianceOut", keep)],
                                   per_channel_synced)
            dims = [g.var(x)[0][a] for a in axes]
            count = None if -1 in dims else math.prod(dims)
            extra = _stats_grad(g, x, centered, axes, count, dmean, dvar)
            u = g.call("mul", dy, per_channel(g.input("Scale")))
            dx = _standardize_grad(g, u, xhat, inv_std, axes,
                                   out=None if extra else g.in_grad("X"), sync=sync)
            if extra:
                g.call("add", dx, extra, out=g.in_grad("X"))
    if g.wants("Scale"):
        g.call("reduce_sum", g.call("mul", dy, xhat), axis=axes, out=g.in_grad("Scale"))
    if g.wants("Bias"):
        g.call("reduce_sum", dy, axis=axes, out=g.in_grad("Bias"))


@op("layer_norm",
    inputs=[In("X", "float"),
            In("Scale", "float", optional=True, doc="[prod(X.shape[begin_norm_axis:])]"),
            In("Bias", "float", optional=True, doc="[prod(X.shape[begin_norm_axis:])]")],
    outputs=[Out("Y"), Out("Mean", optional=True, doc="[prod(X.shape[:begin_norm_axis])]"),
             Out("Variance", optional=True, doc="biased, [prod(X.shape[:begin_norm_axis])]")],
    attrs={"begin_norm_axis": Attr("begin_norm_axis", "int", 1,
                                   "normalize over the dims from this one on"),
           "epsilon": Attr("epsilon", "float", 1e-5, where=non_negative)},
    same_dtype=("X", "Scale", "Bias"))
def layer_norm(X, Scale=None, Bias=None, *, begin_norm_axis, epsilon):
    """Layer normalization over the trailing dims of X from `begin_norm_axis` on."""
    checks.axis("X", X, begin_norm_axis, "begin_norm_axis")
    width = math.prod(X.shape[begin_norm_axis % X.ndim:])
    for slot, v in (("Scale", Scale), ("Bias", Bias)):
        if v is not None:
            checks.shape(slot, v, [width], f"one per element of X {checks.typed(X)}'s dims from "
                         f"begin_norm_axis={begin_norm_axis} on")
    x = X.reshape(-1, width)
    mean = jnp.mean(x, axis=1)
    var = jnp.mean(jnp.square(x - mean[:, None]), axis=1)
    y = (x - mean[:, None]) * lax.rsqrt(var + epsilon)[:, None]
    if Scale is not None:
        y = y * Scale
    if Bias is not None:
        y = y + Bias
    return y.reshape(X.shape), mean, var


@layer_norm.gradient
def _(g):
    x, scale = g.input("X"), g.input("Scale")
    dims = g.var(x)[0]
    width = math.prod(dims[g.attr("begin_norm_axis") % len(dims):])
    x2 = g.call("reshape", x, shape=[-1, width])
    dy = g.call("reshape", g.out_grad("Y"), shape=[-1, width])
    centered, inv_std, xhat = _standardize(g, x2, [1], g.attr("epsilon"))
    if g.wants("X"):
        def per_row(v):  # [rows] -> [rows, 1]
            return g.call("reshape", v, shape=[-1, 1])

        dmean = _weighted_grads(g, [("Mean", 1.0)], per_row)
        dvar = _weighted_grads(g, [("Variance", 1.0)], per_row)
        extra = _stats_grad(g, x2, centered, [1], width, dmean, dvar)
        u = g.call("mul", dy, scale) if scale else dy
        dx = _standardize_grad(g, u, xhat, inv_std, [1])
        if extra:
            dx = g.call("add", dx, extra)
        g.call("reshape_as", dx, x, out=g.in_grad("X"))
    if g.wants("Scale"):
        g.call("reduce_sum", g.call("mul", dy, xhat), axis=[0], out=g.in_grad("Scale"))
    if g.wants("Bias"):
        g.call("reduce_sum", dy, axis=[0], out=g.in_grad("Bias"))


# --- a value by mode: training or test ---

@op("mode_select", inputs=[In("Train", doc="the value in training"),
                           In("Eval", doc="the value when the program runs for test")],
    outputs=[Out("Out")], attrs={"is_test": False}, same_dtype=("Train", "Eval"))
def mode_select(Train, Eval, *, is_test):
    """Out = Eval when is_test, else Train: one value of a program imported with both a
    training and an evaluation behaviour (from_flax's `eval_mode`), which
    `clone(for_test=True)` switches as it switches dropout and batch_norm. The branch not
    taken is dead code, which XLA removes."""
    checks.shape("Eval", Eval, Train.shape, "the value in training has it")
    return Eval if is_test else Train


@mode_select.gradient
def _(g):
    # the value not taken gets no gradient (none flows back into the graph computing it)
    taken = "Eval" if g.attr("is_test") else "Train"
    if g.wants(taken):
        g.pass_through(taken, g.out_grad("Out"))


# --- dropout ---

def _dropout_factor(dropout_prob, dropout_implementation, is_test):
    """What X (times the mask, in training) is multiplied by."""
    if dropout_implementation == "downgrade_in_infer":
        return 1.0 - dropout_prob if is_test else 1.0
    if is_test:
        return 1.0
    return 0.0 if dropout_prob >= 1.0 else 1.0 / (1.0 - dropout_prob)


@op("dropout", inputs=[In("X", "float")],
    outputs=[Out("Out"), Out("Mask", doc="uint8, 1 where X was kept (all ones when is_test)")],
    attrs={"dropout_prob": Attr("dropout_prob", "float", 0.5, where=between(0, 1)),
           "is_test": False,
           "dropout_implementation": Attr("dropout_implementation", "string", "upscale_in_train",
                                          "upscale_in_train or downgrade_in_infer",
                                          where=one_of("upscale_in_train", "downgrade_in_infer"))},
    random=True)
def dropout(X, *, key, dropout_prob, is_test, dropout_implementation):
    """Zero each element of X with probability `dropout_prob`.

    upscale_in_train scales the kept values by 1 / (1 - p) in training and is the identity
    when is_test; downgrade_in_infer keeps them as they are and scales by (1 - p) when is_test.
    """
    factor = _dropout_factor(dropout_prob, dropout_implementation, is_test)
    if is_test:
        return X * factor, jnp.ones(X.shape, jnp.uint8)
    mask = jax.random.bernoulli(key, 1.0 - dropout_prob, X.shape)
    return X * mask.astype(X.dtype) * factor, mask.astype(jnp.uint8)


@dropout.gradient
def _(g):
    dout, x = g.out_grad("Out"), g.input("X")
    if not g.attr("is_test"):
        if g.output("Mask") is None:
            raise BackwardError("dropout needs its Mask output to compute gradients",
                                op_type="dropout")
        dout = g.call("mul", dout, g.call("cast", g.output("Mask"), dtype=g.var(x)[1]))
    factor = _dropout_factor(g.attr("dropout_prob"), g.attr("dropout_implementation"),
                             g.attr("is_test"))
    g.call("scale", dout, scale=factor, out=g.in_grad("X"))


# --- embedding lookup ---

_PADDING_IDX = Attr("padding_idx", "int64", -1,
                    "id whose rows are zero and get no gradient; -1: none; other negative "
                    "values count from the vocabulary size")


def _padding_row(vocab, padding_idx):
    return None if padding_idx == -1 else padding_idx % vocab if padding_idx < 0 else padding_idx


def _drop_padding(rows, Ids, pad):
    """`rows` (Ids.shape + [D]) with the rows of padding ids zeroed."""
    if pad is None:
        return rows
    return jnp.where((Ids == pad)[..., None], jnp.zeros((), rows.dtype), rows)


@op("lookup_table", inputs=[In("W", "float", doc="[V, D]"), In("Ids", "int", doc="in [0, V)")],
    outputs=[Out("Out")], attrs={"padding_idx": _PADDING_IDX})
def lookup_table(W, Ids, *, padding_idx):
    """Rows of W at Ids (any shape): Out has shape Ids.shape + [D]."""
    checks.rank("W", W, 2, "vocabulary size, embedding size")
    return _drop_padding(W[Ids], Ids, _padding_row(W.shape[0], padding_idx))


@lookup_table.gradient
def _(g):
    g.call("lookup_table_grad", g.input("W"), g.input("Ids"), g.out_grad("Out"),
           padding_idx=g.attr("padding_idx"), out=g.in_grad("W"))


@op("lookup_table_grad",
    inputs=[In("W", differentiable=False, doc="only its shape is used"), In("Ids", "int"),
            In("OutGrad", "float")],
    outputs=[Out("Out")], attrs={"padding_idx": _PADDING_IDX})
def lookup_table_grad(W, Ids, OutGrad, *, padding_idx):
    """Gradient of lookup_table's W: the rows of OutGrad added up at Ids (zeros shaped like W)."""
    rows = _drop_padding(OutGrad, Ids, _padding_row(W.shape[0], padding_idx))
    return jnp.zeros(W.shape, OutGrad.dtype).at[Ids].add(rows)


@lookup_table_grad.gradient
def _(g):
    g.call("lookup_table", g.out_grad("Out"), g.input("Ids"), padding_idx=g.attr("padding_idx"),
           out=g.in_grad("OutGrad"))
