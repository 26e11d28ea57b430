"""Elementwise arithmetic, comparison, logic, activations, reductions, casts."""
from progdesc.onnx.table import RULES
from progdesc.translate import Unsupported  # noqa: F401

for _onnx, _ours in (("Add", "add"), ("Sub", "sub"), ("Mul", "mul"), ("Div", "div"),
                     ("Relu", "relu"), ("Tanh", "tanh"), ("Sigmoid", "sigmoid")):
    RULES.rename(_onnx, _ours)


@RULES.rule("MatMul")
def matmul(t, a, b):
    return t.call("matmul", a, b)


@RULES.rule("Identity")
def identity(t, x):
    return x
