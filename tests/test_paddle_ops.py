"""Ops added for PaddlePaddle's models, beyond what the op table checks: an unknown batch
where the table's unknown-batch check cannot give one (conv2d_transpose's Filter is rank 4
too, so the table would make its input channels unknown as well)."""
import numpy as np

import progdesc as pd
from progdesc import ops
from samples.conv_transpose import conv2d_transpose_ref


def test_conv2d_transpose_with_an_unknown_batch():
    x = np.random.default_rng(0).uniform(-1, 1, (3, 2, 4, 5)).astype("float32")
    w = np.random.default_rng(1).uniform(-1, 1, (2, 3, 3, 3)).astype("float32")
    attrs = dict(strides=[2, 2], paddings=[1, 0], output_padding=[1, 1])
    main = pd.Program()
    with pd.program_guard(main, pd.Program()):
        xv = pd.data("x", [None, 2, 4, 5])
        wv = pd.data("w", [2, 3, 3, 3])
        out = ops.conv2d_transpose(xv, wv, **attrs)
    assert list(out.shape) == [-1, 3, 8, 12]
    got, = pd.Executor().run(main, feed={"x": x, "w": w}, fetch_list=[out], scope=pd.Scope())
    np.testing.assert_allclose(got, conv2d_transpose_ref(x, w, **attrs), rtol=1e-5, atol=1e-5)


def test_piecewise_activations_take_paddles_derivatives_at_their_corners():
    # PaddlePaddle's kernels: relu6' = [0 < out < 6]; hard_sigmoid' = slope * [0 < out < 1];
    # hard_swish' = 0 where x + 3 <= 0, 1 where x + 3 >= 6, else (2x + 3) / 6
    x = np.array([-3.0, 0.0, 3.0, 6.0], "float32")
    expected = {"relu6": [0, 0, 1, 0], "hard_sigmoid": [0, 1 / 6, 0, 0],
                "hard_swish": [0, 0.5, 1, 1]}
    main = pd.Program()
    with pd.program_guard(main, pd.Program()):
        xv = pd.data("x", [4])
        outs = {"relu6": ops.relu6(xv), "hard_sigmoid": ops.hard_sigmoid(xv, slope=1 / 6),
                "hard_swish": ops.hard_swish(xv)}
        grads = {k: pd.gradients([v], [xv])[0] for k, v in outs.items()}
    got = pd.Executor().run(main, feed={"x": x}, fetch_list=list(grads.values()),
                            scope=pd.Scope())
    for name, value in zip(grads, got):
        np.testing.assert_allclose(value, expected[name], rtol=1e-6, atol=1e-7, err_msg=name)
