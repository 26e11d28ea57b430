"""The translation table of PaddlePaddle's ops: one row per Paddle op, keyed by its
LEGACY type ('conv2d', 'elementwise_add', 'reshape2'), serving both file formats.

How to write a row
------------------

```python
from progdesc.paddle.rules import RULES

@RULES.rule("conv2d", "depthwise_conv2d", inputs=("Input", "Filter"), outputs=("Output",))
def conv2d(t, x, w, *, strides=(1, 1), paddings=(0, 0), dilations=(1, 1), groups=1,
           padding_algorithm="EXPLICIT", data_format="NCHW"):
    return t.call("conv2d", x, w, strides=strides, ...)

RULES.rename("relu", "relu")                        # one-to-one: X -> Out, no function
RULES.rename("elementwise_pow", "pow", inputs=("X", "Y"))
```

- `inputs` are the op's input slot names in the order the rule takes them, `outputs`
  its output slot names in the order it returns them (defaults: ('X',) and ('Out',)).
  A slot ending in '*' ('X*') is a list slot: the rule gets (returns) a list of names.
  A plain slot gets one name of ours, or None where the op leaves it empty (an optional
  slot: 'Bias' of layer_norm); a plain slot the file fills with several variables is
  refused for that op.
- The keyword-only parameters are the attributes the rule reads, under Paddle's names,
  with Paddle's defaults (a file may leave a default out). Paddle's bookkeeping
  attributes (op_role, op_namescope, use_mkldnn, ...) are simply not named.
- The rule returns our names in the declared output order: one name for one output
  slot, a tuple for several, None for an output it does not produce (batch_norm's
  SavedMean); a list for a list slot.
- `since` is the Paddle op version (the file's OpVersionMap) a row holds from; the
  table takes the newest row not above the file's version of that op.
- Two keywords are the driver's: `in_types` / `out_types`, the Paddle variables
  (`graph.Var`: shape with -1 for the batch, dtype) of the inputs / outputs in slot
  order (None where absent, a list for a list slot): for `shape` folding, a cast's
  target type, an output's declared shape.
- Raise `Unsupported("why")` for an attribute value that cannot be translated; the
  op is reported with its type, block and index and the walk goes on.
- What a rule may call on `t` (a `progdesc.paddle.translate.PaddleTranslator`):
  `t.call(our_op, *inputs, **attrs)`, `t.var(name)` -> (dims, dtype) of ours,
  `t.constant(array)`, `t.value_of(name)` (the value of a constant or folded shape,
  else None), `t.rank(name)`, `t.for_training` (the model is imported for
  training: batch norm and dropout run in training mode, `clone(for_test=True)` gives
  eval), `t.paddle_var(name, block)` (a Paddle variable's declaration as a Paddle
  block sees it), and for control flow `t.program` (ours), `t.paddle` (the PaddleProgram),
  `t.subgraph(block, inputs, outputs)` (a Paddle block, by index or `graph.Block`, as a
  graph whose arguments are bound to the Paddle names `inputs` and whose results are
  the Paddle names `outputs`), then `t.inline(graph, args)` / `t.sub_block(graph, args)`
  inside a `progdesc.control_flow` builder (see `progdesc.translate`).

Who registers what
------------------
- This module (elementwise ops, activations, linear algebra, reductions), `rules_nn`
  (convolution, pooling, normalisation, dropout, embeddings, interpolation),
  `rules_shape` (shapes, slices, lists, constants, casts) and `rules_more` (rarer
  activations, value tests, sorts and scans, gather_nd, roll, linspace, ...): the ops
  of feed-forward models (paddle.nn layers, paddle.vision models, transformer
  encoders), with the helpers they share in `rule_args` (axes, element types, tensor
  inputs that stand for attributes, sizes known only at run time). `feed` and `fetch`
  are the driver's (`progdesc.paddle.translate`): a feed op's Out becomes a data
  variable of ours with Paddle's shape (-1 batch), a fetch op's X a fetch target at
  its `col`.
- `progdesc.paddle.rules_sequence` (helper pseq) registers the `rnn` op and control
  flow into this same RULES: legacy `while`, `conditional_block` + `select_input`
  (their BLOCK attribute `sub_block` is the index of a Paddle block: take it with
  `t.subgraph`), and PIR's structured control flow, which the PIR reader names
  'pir.if' (regions: then, else) and 'pir.while' (region: body) with `Op.regions`.
- The PIR reader (`progdesc.paddle.pir`, helper ppir) normalises every `pd_op.*` op
  into the legacy type with the legacy slot and attribute names before the table sees
  it, so one row serves both formats; where PIR passes an attribute as an input value
  (`full_int_array`), the reader folds it back into the attribute when it is constant.
"""
import math

import numpy as np

from progdesc.paddle import rules_more, rules_nn, rules_shape  # noqa: F401  (register their rows)
from progdesc.paddle.rule_args import (axis_of, dims_of, dtype_name, floats_of, ints_of,
                                       numpy_dtype, parse_number, reshape_to)
from progdesc.paddle.table import RULES
from progdesc.translate import Unsupported


# --- elementwise ---
def _aligned(t, x, y, axis):
    """y made broadcastable against x the Paddle way: with axis != -1 and a lower rank,
    y's dims line up with x's from `axis` on (trailing ones appended)."""
    rx, ry = t.rank(x), t.rank(y)
    if axis == -1 or ry >= rx:
        return x, y
    axis = axis_of(axis, rx)
    trailing = rx - axis - ry
    if trailing > 0:
        y = t.call("unsqueeze", y, axes=list(range(ry, ry + trailing)))
    return x, y


def _broadcast(t, x, y, axis):
    if t.rank(x) < t.rank(y) and axis != -1:
        y, x = _aligned(t, y, x, axis)
    else:
        x, y = _aligned(t, x, y, axis)
    return x, y


def _elementwise(ours):
    def rule(t, x, y, *, axis=-1):
        return t.call(ours, *_broadcast(t, x, y, axis))
    rule.__name__ = rule.__qualname__ = ours
    return rule


for _paddle, _ours in {"elementwise_add": "add", "elementwise_sub": "sub",
                       "elementwise_mul": "mul", "elementwise_div": "div",
                       "elementwise_pow": "pow", "elementwise_max": "maximum",
                       "elementwise_min": "minimum", "elementwise_mod": "rem",
                       "equal": "equal", "not_equal": "not_equal", "less_than": "less_than",
                       "less_equal": "less_equal", "greater_than": "greater_than",
                       "greater_equal": "greater_equal", "logical_and": "logical_and",
                       "logical_or": "logical_or", "bitwise_and": "bitwise_and",
                       "bitwise_or": "bitwise_or", "bitwise_xor": "bitwise_xor"}.items():
    RULES.rule(_paddle, inputs=("X", "Y"))(_elementwise(_ours))


@RULES.rule("elementwise_floordiv", inputs=("X", "Y"))
def elementwise_floordiv(t, x, y, *, axis=-1):
    x, y = _broadcast(t, x, y, axis)
    if t.var(x)[1].startswith(("int", "uint")):
        # floor division of ints: truncated division corrected where signs differ
        q = t.call("trunc_div", x, y)
        r = t.call("rem", x, y)
        zero = t.constant(np.zeros((), t.var(x)[1]))
        fix = t.call("logical_and", t.call("not_equal", r, zero),
                     t.call("not_equal", t.call("less_than", r, zero),
                            t.call("less_than", y, zero)))
        one = t.constant(np.ones((), t.var(x)[1]))
        return t.call("where", fix, t.call("sub", q, one), q)
    return t.call("floor", t.call("div", x, y))


@RULES.rule("logical_xor", inputs=("X", "Y"))
def logical_xor(t, x, y):
    return t.call("not_equal", x, y)


RULES.rename("logical_not", "logical_not")


RULES.rename("bitwise_not", "bitwise_not")


# --- activations and other unary ops ---
for _name in ("relu", "sigmoid", "tanh", "exp", "log", "sqrt", "rsqrt", "abs", "square",
              "silu", "sin", "cos", "floor", "ceil", "erf", "sign", "log1p", "expm1", "tan",
              "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh"):
    RULES.rename(_name, _name)


@RULES.rule("gelu")
def gelu(t, x, *, approximate=False):
    return t.call("gelu", x, approximate=bool(approximate))


@RULES.rule("relu6")
def relu6(t, x, *, threshold=6.0):
    return t.call("relu6", x, threshold=float(threshold))


@RULES.rule("leaky_relu")
def leaky_relu(t, x, *, alpha=0.02):
    return t.call("leaky_relu", x, alpha=float(alpha))


@RULES.rule("hard_swish")
def hard_swish(t, x, *, threshold=6.0, scale=6.0, offset=3.0):
    return t.call("hard_swish", x, threshold=float(threshold), scale=float(scale),
                  offset=float(offset))


@RULES.rule("hard_sigmoid")
def hard_sigmoid(t, x, *, slope=0.2, offset=0.5):
    return t.call("hard_sigmoid", x, slope=float(slope), offset=float(offset))


@RULES.rule("swish")
def swish(t, x, *, beta=1.0):
    if beta == 1.0:
        return t.call("silu", x)
    return t.call("mul", x, t.call("sigmoid", t.call("scale", x, scale=float(beta))))


@RULES.rule("softplus")
def softplus(t, x, *, beta=1.0, threshold=20.0):
    return t.call("softplus", x, beta=float(beta), threshold=float(threshold))


@RULES.rule("elu")
def elu(t, x, *, alpha=1.0):
    zero = t.constant(np.zeros((), t.var(x)[1]))
    neg = t.call("scale", t.call("expm1", t.call("minimum", x, zero)), scale=float(alpha))
    return t.call("where", t.call("greater_than", x, zero), x, neg)


@RULES.rule("logsigmoid")
def logsigmoid(t, x):
    return t.call("neg", t.call("softplus", t.call("neg", x)))


@RULES.rule("mish")
def mish(t, x, *, threshold=20.0):
    return t.call("mish", x, threshold=float(threshold))


@RULES.rule("reciprocal")
def reciprocal(t, x):
    return t.call("div", t.constant(np.ones((), t.var(x)[1])), x)


@RULES.rule("pow", inputs=("X", "FactorTensor"))
def pow_(t, x, factor_tensor, *, factor=1.0):
    if factor_tensor is not None:
        return t.call("pow", x, factor_tensor)
    if float(factor).is_integer():
        return t.call("integer_pow", x, y=int(factor))
    return t.call("pow", x, t.constant(np.asarray(factor, t.var(x)[1])))


@RULES.rule("softmax")
def softmax(t, x, *, axis=-1):
    return t.call("softmax", x, axis=axis)


@RULES.rule("log_softmax")
def log_softmax(t, x, *, axis=-1):
    return t.call("log_softmax", x, axis=axis)


@RULES.rule("clip", inputs=("X", "Min", "Max"))
def clip(t, x, lo, hi, *, min=-3.4e38, max=3.4e38):  # noqa: A002  (Paddle's names)
    if lo is not None or hi is not None:
        lo = [min] if lo is None else floats_of(t, lo, "Min")
        hi = [max] if hi is None else floats_of(t, hi, "Max")
        min, max = lo[0], hi[0]
    return t.call("clip", x, min=float(min), max=float(max))


@RULES.rule("scale", inputs=("X", "ScaleTensor"))
def scale(t, x, scale_tensor, *, scale=1.0, bias=0.0, bias_after_scale=True):
    if scale_tensor is not None:
        known = t.value_of(scale_tensor)
        if known is None:   # a scale computed at run time
            if bias_after_scale:
                return t.call("scale", t.call("mul", x, scale_tensor), bias=float(bias))
            return t.call("mul", t.call("scale", x, bias=float(bias)), scale_tensor)
        scale = float(np.asarray(known).reshape(-1)[0])
    return t.call("scale", x, scale=float(scale), bias=float(bias),
                  bias_after_scale=bool(bias_after_scale))


# --- linear algebra ---
@RULES.rule("matmul_v2", inputs=("X", "Y"))
def matmul_v2(t, x, y, *, trans_x=False, trans_y=False):
    return t.call("matmul", x, y, transpose_x=bool(trans_x), transpose_y=bool(trans_y))


@RULES.rule("matmul", inputs=("X", "Y"))
def matmul(t, x, y, *, transpose_X=False, transpose_Y=False, alpha=1.0):  # noqa: N803
    return t.call("matmul", x, y, transpose_x=bool(transpose_X), transpose_y=bool(transpose_Y),
                  alpha=float(alpha))


@RULES.rule("mul", inputs=("X", "Y"))
def mul(t, x, y, *, x_num_col_dims=1, y_num_col_dims=1):
    xd, yd = dims_of(t, x), dims_of(t, y)
    k = xd[x_num_col_dims:]
    if -1 in k or -1 in yd:
        raise Unsupported("mul of operands with unknown dims past num_col_dims")
    rows, cols = math.prod(yd[:y_num_col_dims]), math.prod(yd[y_num_col_dims:])
    if math.prod(k) != rows:
        raise Unsupported(f"mul of X {xd} and Y {yd}: {math.prod(k)} != {rows}")
    if len(k) != 1:
        x = reshape_to(t, x, xd[:x_num_col_dims] + [rows])
    if len(yd) != 2:
        y = t.call("reshape", y, shape=[rows, cols])
    out = t.call("matmul", x, y)
    if len(yd) - y_num_col_dims != 1:
        out = reshape_to(t, out, xd[:x_num_col_dims] + yd[y_num_col_dims:])
    return out


# --- reductions and search ---
def _reduce(ours):
    def rule(t, x, *, dim=(), keep_dim=False, reduce_all=False, out_dtype=-1):
        axes = [] if reduce_all else [axis_of(a, t.rank(x)) for a in dim]
        if len(axes) == t.rank(x):
            axes = []
        if out_dtype not in (-1, None) and dtype_name(out_dtype) != t.var(x)[1]:
            x = t.call("cast", x, dtype=dtype_name(out_dtype))
        return t.call(ours, x, axis=axes, keep_dim=bool(keep_dim))
    rule.__name__ = rule.__qualname__ = ours
    return rule


for _name in ("reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_prod",
              "reduce_all", "reduce_any"):
    RULES.rule(_name)(_reduce(_name))


@RULES.rule("mean")
def mean(t, x):
    return t.call("mean", x)


def _arg(ours):
    def rule(t, x, *, axis=-1, keepdims=False, flatten=False, dtype=3):
        dtype = 3 if dtype == -1 else dtype
        if flatten:
            x = t.call("reshape", x, shape=[-1])
            axis = 0
        return t.call(ours, x, axis=axis_of(axis, t.rank(x)), keep_dim=bool(keepdims),
                      dtype=dtype_name(dtype))
    rule.__name__ = rule.__qualname__ = ours
    return rule


RULES.rule("arg_max")(_arg("argmax"))


RULES.rule("arg_min")(_arg("argmin"))


@RULES.rule("top_k_v2", inputs=("X", "K"), outputs=("Out", "Indices"))
def top_k_v2(t, x, k_t, *, k=1, axis=-1, largest=True, sorted=True):  # noqa: A002
    if k_t is not None:
        k = ints_of(t, k_t, "K")[0]
    out, idx = t.call("top_k", x, k=int(k), axis=axis_of(axis, t.rank(x)), largest=bool(largest))
    return out, idx


@RULES.rule("top_k", inputs=("X", "K"), outputs=("Out", "Indices"))
def top_k(t, x, k_t, *, k=1):
    return top_k_v2(t, x, k_t, k=k)


@RULES.rule("where", inputs=("Condition", "X", "Y"))
def where(t, cond, x, y):
    return t.call("where", cond, x, y)


@RULES.rule("cumsum")
def cumsum(t, x, *, axis=-1, flatten=False, exclusive=False, reverse=False):
    if flatten:
        x = t.call("reshape", x, shape=[-1])
        axis = 0
    out = t.call("cumsum", x, axis=axis_of(axis, t.rank(x)), reverse=bool(reverse))
    if exclusive:
        out = t.call("sub", out, x)
    return out


# --- more of paddle.nn ---
@RULES.rule("sum", inputs=("X*",))
def sum_(t, xs):
    return xs[0] if len(xs) == 1 else t.call("sum", xs)


@RULES.rule("bmm", inputs=("X", "Y"))
def bmm(t, x, y):
    return t.call("matmul", x, y)


@RULES.rule("p_norm")
def p_norm(t, x, *, porder=2.0, axis=-1, epsilon=1e-12, keepdim=False, asvector=False):
    if asvector:
        x = t.call("reshape", x, shape=[-1])
        axis = 0
    axes = [axis_of(axis, t.rank(x))]
    a = t.call("abs", x)
    if porder == float("inf"):
        return t.call("reduce_max", a, axis=axes, keep_dim=bool(keepdim))
    if porder == 2.0:
        return t.call("sqrt", t.call("reduce_sum", t.call("square", a), axis=axes,
                                     keep_dim=bool(keepdim)))
    if porder == 1.0:
        return t.call("reduce_sum", a, axis=axes, keep_dim=bool(keepdim))
    raise Unsupported(f"porder={porder}")


# the names three helpers had before they moved to rule_args (rules_sequence imports them)
_dtype, _np_dtype, _parse_number = dtype_name, numpy_dtype, parse_number
