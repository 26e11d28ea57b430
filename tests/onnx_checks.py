"""A check the ONNX tests share: gradients of an imported graph against central
differences."""
import numpy as np
from onnx import TensorProto, helper, numpy_helper

import progdesc
from progdesc import onnx as ponnx


def directional_gradient_check(nodes, x, params, consts=(), *, opset=23, eps=1e-3,
                               seed=1, rtol=2e-2, atol=2e-3):
    """<s, d y / d p> against central differences of <s, y> along a random direction, for
    each initializer p in `params` ({name: float32 array}) of the graph `nodes` (float input
    'x', output 'y'; `consts`: initializers not differentiated, a dict or (name, array)
    pairs)."""
    f32 = TensorProto.FLOAT
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", f32, x.shape)],
        [helper.make_tensor_value_info("y", f32, None)],
        [numpy_helper.from_array(v, k)
         for k, v in list(params.items()) + list(dict(consts).items())])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              ir_version=10)
    scope = progdesc.Scope()
    program, _, (y,) = ponnx.load(model, scope)
    exe = progdesc.Executor()
    (out,) = exe.run(program, feed={"x": x}, fetch_list=[y], scope=scope)
    rng = np.random.default_rng(seed)
    s = rng.standard_normal(np.shape(out)).astype(np.float32)
    block = program.global_block()
    with progdesc.program_guard(program):
        s_var = progdesc.data("seed", list(s.shape))
        grads = progdesc.gradients([y], [block.var(k) for k in params], target_gradients=[s_var])
    got = exe.run(program, feed={"x": x, "seed": s}, fetch_list=grads, scope=scope)
    forward = program.clone(for_test=True)
    for (name, value), grad in zip(params.items(), got):
        direction = rng.standard_normal(value.shape).astype(np.float32)
        ends = []
        for sign in (1, -1):
            scope.set(name, (value + sign * eps * direction).astype(np.float32))
            (o,) = exe.run(forward, feed={"x": x}, fetch_list=[y.name], scope=scope)
            ends.append(float(np.sum(np.asarray(o, np.float64) * s)))
        scope.set(name, value)
        np.testing.assert_allclose(float(np.sum(np.asarray(grad) * direction)),
                                   (ends[0] - ends[1]) / (2 * eps), rtol=rtol, atol=atol,
                                   err_msg=name)
