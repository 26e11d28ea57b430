"""Ops of the com.microsoft domain that exporters and onnxruntime's transformer optimizer
commonly emit: the GELU family, FusedMatMul, BiasAdd and the fused (skip, simplified)
layer normalizations, FusedConv (a Conv with its activation, from onnxruntime's
graph optimizer)."""
from progdesc.onnx.rules_nn import conv, standardize, stashed
from progdesc.onnx.table import RULES
from progdesc.translate import Unsupported

_MS = "com.microsoft."


@RULES.rule(_MS + "Gelu")
def gelu(t, x):
    return t.call("gelu", x, approximate=False)


@RULES.rule(_MS + "BiasGelu")
def bias_gelu(t, x, bias):
    return t.call("gelu", t.call("add", x, bias), approximate=False)


@RULES.rule(_MS + "FastGelu")
def fast_gelu(t, x, bias=None):
    if bias is not None:
        x = t.call("add", x, bias)
    return t.call("gelu", x, approximate=True)


@RULES.rule(_MS + "QuickGelu")
def quick_gelu(t, x, *, alpha=1.702):
    return t.call("mul", x, t.call("sigmoid", t.call("scale", x, scale=float(alpha))))


@RULES.rule(_MS + "BiasAdd")
def bias_add(t, x, bias, skip):
    return t.call("add", t.call("add", x, bias), skip)


@RULES.rule(_MS + "FusedMatMul")
def fused_matmul(t, a, b, *, alpha=1.0, transA=0, transB=0, transBatchA=0, transBatchB=0):
    if transBatchA or transBatchB:
        raise Unsupported("transBatchA / transBatchB")
    return t.call("matmul", a, b, transpose_x=bool(transA), transpose_y=bool(transB),
                  alpha=float(alpha))


def _skip_sum(t, x, skip, bias):
    total = t.call("add", x, skip)
    return total if bias is None else t.call("add", total, bias)


@RULES.rule(_MS + "SkipLayerNormalization")
def skip_layer_normalization(t, x, skip, gamma, beta=None, bias=None, *, epsilon=1e-12):
    total = _skip_sum(t, x, skip, bias)
    total32, back = stashed(t, total, 1)
    y, mean, inv_std = standardize(t, total32, [-1], epsilon)
    y = t.call("mul", back(y), gamma)
    if beta is not None:
        y = t.call("add", y, beta)
    return y, mean, inv_std, total


def _rms(t, x, scale, axis, epsilon):
    """x / sqrt(mean(x^2 over the dims from `axis` on) + eps) * scale, and the inverse
    (computed in float32 for a half-precision x)."""
    rank = len(t.var(x)[0])
    axes = list(range(int(axis) % rank, rank))
    x32, back = stashed(t, x, 1)
    ms = t.call("reduce_mean", t.call("square", x32), axis=axes, keep_dim=True)
    inv = t.call("rsqrt", t.call("scale", ms, bias=float(epsilon)))
    return t.call("mul", back(t.call("mul", x32, inv)), scale), inv


@RULES.rule(_MS + "SimplifiedLayerNormalization")
def simplified_layer_normalization(t, x, scale, *, axis=-1, epsilon=1e-5, stash_type=1):
    return _rms(t, x, scale, axis, epsilon)


@RULES.rule(_MS + "SkipSimplifiedLayerNormalization")
def skip_simplified_layer_normalization(t, x, skip, gamma, bias=None, *, epsilon=1e-12):
    total = _skip_sum(t, x, skip, bias)
    y, inv = _rms(t, total, gamma, -1, epsilon)
    return y, None, inv, total


def _activation(t, y, activation, params):
    """y through FusedConv's `activation` with its `activation_params`."""
    params = [float(p) for p in params or ()]
    if activation in ("Relu", "Tanh", "Sigmoid") and not params:
        return t.call(activation.lower(), y)
    if activation == "LeakyRelu" and len(params) <= 1:
        return t.call("leaky_relu", y, alpha=params[0] if params else 0.01)
    if activation == "Clip" and len(params) == 2:
        return t.call("clip", y, min=params[0], max=params[1])
    if activation == "HardSigmoid" and len(params) == 2:
        return t.call("hard_sigmoid", y, slope=params[0], offset=params[1])
    raise Unsupported(f"activation={activation!r} with activation_params={params}")


@RULES.rule(_MS + "FusedConv")
def fused_conv(t, x, w, b=None, z=None, *, activation=None, activation_params=None,
               auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None,
               strides=None):
    y = conv(t, x, w, b, auto_pad=auto_pad, dilations=dilations, group=group,
             kernel_shape=kernel_shape, pads=pads, strides=strides)
    if z is not None:
        y = t.call("add", y, z)
    return y if activation is None else _activation(t, y, activation, activation_params)
