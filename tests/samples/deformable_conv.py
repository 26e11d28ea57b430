"""Samples of lowering/ops/deformable_conv.py. The reference reads every tap of every output
pixel by bilinear interpolation at its moved point, as PaddlePaddle defines the deformable
convolution, and convolves the reads; the gradient op's reference takes central
differences of that forward reference in float64."""
import math

import numpy as np

from op_table import Invalid, Sample, rand, spec


def _read(image, y, x):
    """image [H, W] at (y, x): 0 at or beyond one pixel outside, neighbours outside 0."""
    H, W = image.shape
    if not (-1 < y < H and -1 < x < W):
        return 0.0
    y0, x0 = math.floor(y), math.floor(x)
    total = 0.0
    for r, c in ((y0, x0), (y0, x0 + 1), (y0 + 1, x0), (y0 + 1, x0 + 1)):
        if 0 <= r < H and 0 <= c < W:
            total += (1 - abs(y - r)) * (1 - abs(x - c)) * image[r, c]
    return total


def deformable_conv_ref(Input, Offset, Filter, Mask=None, strides=(1, 1), paddings=(0, 0),
                        dilations=(1, 1), groups=1, deformable_groups=1, im2col_step=1):
    x = Input.astype(np.float64)
    N, C, _, _ = x.shape
    O, Cg, kh, kw = Filter.shape
    Ho, Wo = Offset.shape[2:]
    per_dg, per_group = C // deformable_groups, O // groups
    out = np.zeros((N, O, Ho, Wo))
    for n, c, i, j, p, q in np.ndindex(N, C, kh, kw, Ho, Wo):
        g, tap = c // per_dg, i * kw + j
        dy, dx = Offset[n, 2 * (g * kh * kw + tap):2 * (g * kh * kw + tap) + 2, p, q]
        value = _read(x[n, c], p * strides[0] - paddings[0] + i * dilations[0] + dy,
                      q * strides[1] - paddings[1] + j * dilations[1] + dx)
        if Mask is not None:
            value *= Mask[n, g * kh * kw + tap, p, q]
        group = c // Cg
        for o in range(group * per_group, (group + 1) * per_group):
            out[n, o, p, q] += value * Filter[o, c - group * Cg, i, j]
    return out.astype(Input.dtype)


def deformable_conv_grad_ref(Input, Offset, Filter, OutputGrad, Mask=None, **attrs):
    given = {"Input": Input, "Offset": Offset, "Filter": Filter, "Mask": Mask}
    given = {k: None if v is None else v.astype(np.float64) for k, v in given.items()}
    grads, eps = {}, 1e-6
    for slot in ("Input", "Offset", "Mask", "Filter"):
        if given[slot] is None:
            grads[slot] = None
            continue
        d = np.zeros(given[slot].shape)
        for index in np.ndindex(*d.shape):
            sides = []
            for step in (eps, -eps):
                moved = dict(given, **{slot: given[slot].copy()})
                moved[slot][index] += step
                sides.append(np.sum(deformable_conv_ref(**moved, **attrs) * OutputGrad))
            d[index] = (sides[0] - sides[1]) / (2 * eps)
        grads[slot] = d.astype(Input.dtype)
    return grads["Input"], grads["Offset"], grads["Mask"], grads["Filter"]


def _dcn(name, x, offset, w, mask=None, **attrs):
    """A deformable_conv sample and a deformable_conv_grad sample, same geometry."""
    inputs = {"Input": x, "Offset": offset, "Filter": w}
    if mask is not None:
        inputs["Mask"] = mask
    dy = rand(*deformable_conv_ref(**inputs, **attrs).shape, seed=5)
    return [Sample("deformable_conv", inputs, deformable_conv_ref, attrs, name=name,
                   atol=1e-5),
            # no gradient maker: deformable_conv differentiates once. The unknown-batch
            # check would make Filter's O the batch dim too, and OutputGrad's clash
            Sample("deformable_conv_grad", dict(inputs, OutputGrad=dy), deformable_conv_grad_ref,
                   attrs, name=f"{name}_differentiates_once", atol=1e-4, rtol=1e-4,
                   grad=False, symbolic=False)]


SAMPLES = [
    # offsets up to 2 pixels: taps move out of Input and across pixel lines
    *_dcn("v2", rand(1, 2, 4, 4), rand(1, 18, 2, 2, low=-2, high=2, seed=1),
          rand(2, 2, 3, 3, seed=2), rand(1, 9, 2, 2, low=0, high=1, seed=3)),
    *_dcn("v1_stride_pad", rand(2, 2, 4, 3), rand(2, 8, 3, 2, low=-1.5, high=1.5, seed=1),
          rand(3, 2, 2, 2, seed=2), strides=[2, 2], paddings=[1, 1]),
    *_dcn("groups_deformable_groups_dilation", rand(1, 4, 4, 4),
          rand(1, 16, 2, 3, low=-1, high=1, seed=1), rand(2, 2, 2, 2, seed=2),
          rand(1, 8, 2, 3, low=0, high=1, seed=3), dilations=[2, 1], groups=2,
          deformable_groups=2),
]

INVALID = [
    Invalid("deformable_conv", {"Input": spec(1, 2, 4, 4), "Offset": spec(1, 16, 2, 2),
                                "Filter": spec(2, 2, 3, 3)},
            name="offset_channels", expect=("Offset", "[1, 18, 2, 2]", "float32[1, 16, 2, 2]")),
    Invalid("deformable_conv", {"Input": spec(1, 3, 4, 4), "Offset": spec(1, 18, 2, 2),
                                "Filter": spec(2, 3, 3, 3)}, attrs={"deformable_groups": 2},
            name="deformable_groups", expect=("Input", "3 channels", "deformable_groups=2")),
]
