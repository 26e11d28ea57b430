"""Samples of lowering/ops/conv.py: an explicit-loop NumPy convolution in any layout; the
gradient op's reference is the adjoint of that linear map, built column by column."""
import itertools

import numpy as np

from op_table import Invalid, Sample, rand, spec


def _conv_ref(Input, Filter, lhs_spec, rhs_spec, out_spec, window_strides=(), padding=(),
              lhs_dilation=(), rhs_dilation=(), feature_group_count=1, batch_group_count=1):
    x = np.transpose(Input.astype(np.float64), lhs_spec)      # N, C, spatial...
    w = np.transpose(Filter.astype(np.float64), rhs_spec)     # O, C / groups, spatial...
    n = x.ndim - 2
    strides = window_strides or (1,) * n
    pads = list(zip(padding[::2], padding[1::2])) or [(0, 0)] * n
    ldil, rdil = lhs_dilation or (1,) * n, rhs_dilation or (1,) * n
    dilated = np.zeros(x.shape[:2] + tuple((d - 1) * s + 1 for d, s in zip(x.shape[2:], ldil)))
    dilated[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in ldil)] = x
    xp = np.pad(dilated, [(0, 0), (0, 0)] + pads)
    kernel = [(k - 1) * r + 1 for k, r in zip(w.shape[2:], rdil)]
    out_sp = [(p - k) // s + 1 for p, k, s in zip(xp.shape[2:], kernel, strides)]
    O, Cg = w.shape[:2]
    per_group = O // feature_group_count
    out = np.zeros((x.shape[0], O) + tuple(out_sp))
    for o, c in itertools.product(range(O), range(Cg)):
        ci = (o // per_group) * Cg + c
        for tap in np.ndindex(*w.shape[2:]):
            for pos in np.ndindex(*out_sp):
                where = tuple(p * s + t * r for p, s, t, r in zip(pos, strides, tap, rdil))
                out[(slice(None), o) + pos] += xp[(slice(None), ci) + where] * w[(o, c) + tap]
    return np.transpose(out, np.argsort(out_spec)).astype(Input.dtype)


def _adjoint(linear, shape, cotangent):
    """<linear(e_i), cotangent> for every basis array e_i of `shape`: the adjoint of
    `linear` applied to `cotangent`."""
    out = np.zeros(int(np.prod(shape)))
    for i in range(out.size):
        basis = np.zeros(out.size)
        basis[i] = 1.0
        out[i] = np.sum(linear(basis.reshape(shape)) * cotangent)
    return out.reshape(shape)


def _conv_grad_ref(Input, Filter, OutputGrad, **attrs):
    dx = _adjoint(lambda x: _conv_ref(x, Filter.astype(np.float64), **attrs), Input.shape,
                  OutputGrad)
    dw = _adjoint(lambda w: _conv_ref(Input.astype(np.float64), w, **attrs), Filter.shape,
                  OutputGrad)
    return dx.astype(Input.dtype), dw.astype(Filter.dtype)


_NHWC = {"lhs_spec": [0, 3, 1, 2], "rhs_spec": [3, 2, 0, 1], "out_spec": [0, 3, 1, 2]}
_NCHW = {"lhs_spec": [0, 1, 2, 3], "rhs_spec": [0, 1, 2, 3], "out_spec": [0, 1, 2, 3]}
_NWC = {"lhs_spec": [0, 2, 1], "rhs_spec": [2, 1, 0], "out_spec": [0, 2, 1]}


def _conv(name, x, w, symbolic=True, **attrs):
    """A conv_general_dilated sample and a conv_general_dilated_grad one, same geometry."""
    dy = rand(*_conv_ref(x, w, **attrs).shape, seed=5)
    return [Sample("conv_general_dilated", {"Input": x, "Filter": w}, _conv_ref, attrs,
                   name=name, atol=1e-5, symbolic=symbolic),
            Sample("conv_general_dilated_grad", {"Input": x, "Filter": w, "OutputGrad": dy},
                   _conv_grad_ref, attrs, name=name, atol=1e-5, symbolic=False)]


SAMPLES = [
    # Flax's nn.Conv: NHWC input, HWIO kernel, padding SAME as explicit pairs
    *_conv("nhwc_same", rand(2, 4, 4, 2), rand(3, 3, 2, 3, seed=1), padding=[1, 1, 1, 1],
           **_NHWC),
    *_conv("nchw_strided_dilated", rand(1, 2, 6, 5), rand(2, 2, 2, 2, seed=1),
           window_strides=[2, 1], rhs_dilation=[1, 2], symbolic=False, **_NCHW),
    *_conv("nwc_groups_fixed_dims", rand(1, 5, 4), rand(3, 2, 2, seed=1),
           feature_group_count=2, padding=[1, 0], symbolic=False, **_NWC),
    # a transposed convolution: the input dilated
    *_conv("lhs_dilation", rand(1, 3, 3, 1), rand(2, 2, 1, 2, seed=1), lhs_dilation=[2, 2],
           padding=[1, 1, 1, 1], **_NHWC),
]

INVALID = [
    Invalid("conv_general_dilated", {"Input": spec(1, 4, 4, 3), "Filter": spec(3, 3, 2, 5)},
            name="features_differ", attrs=_NHWC,
            expect=["dim 2 of Filter float32[3, 3, 2, 5] must be 3",
                    "Input's 3 features / feature_group_count=1"]),
]
