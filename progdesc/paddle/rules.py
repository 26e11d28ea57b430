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
- This module: the ops of feed-forward models (paddle.nn layers, paddle.vision
  models, transformer encoders). `feed` and `fetch` are the driver's
  (`progdesc.paddle.translate`): a feed op's Out becomes a data variable of ours with
  Paddle's shape (-1 batch), a fetch op's X a fetch target at its `col`.
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

from progdesc.paddle.pdmodel import DTYPES
from progdesc.paddle.table import PaddleRuleTable
from progdesc.translate import Unsupported

RULES = PaddleRuleTable("Paddle op")

_INT32_MAX = 2**31 - 1


# --- helpers ---
def _axis(axis, rank):
    """Paddle's possibly negative axis made non-negative."""
    return axis + rank if axis < 0 else axis


def _dtype(code, what="dtype"):
    """NumPy's name of a Paddle element type number (or a name a PIR reader passed)."""
    if isinstance(code, str):
        return code
    name = DTYPES.get(code)
    if name is None:
        raise Unsupported(f"{what}={code}, an element type progdesc does not know")
    return name


def _ints(t, name, what):
    """The value of a tensor input that Paddle lets stand for an int list attribute."""
    value = t.value_of(name)
    if value is None:
        raise Unsupported(f"{what} is computed at run time (a tensor input that is not a "
                          "constant)")
    return [int(v) for v in np.asarray(value).reshape(-1)]


def _list_ints(t, names, what):
    """The values of a list of scalar tensors (ShapeTensorList, StartsTensorList)."""
    return [v for name in names for v in _ints(t, name, what)]


def _sizes(t, names, what):
    """The sizes held by a shape tensor or a list of them: ints and (variable, axis)
    pairs for sizes known only at run time (see PaddleTranslator.sizes_of)."""
    out = []
    for name in names:
        sizes = t.sizes_of(name)
        if sizes is None:
            raise Unsupported(f"{what} is computed at run time (not from a shape)")
        out += sizes
    return out


def _with_unknown(sizes, what):
    """Sizes as dims: -1 for the one size known only at run time (Unsupported if more)."""
    unknown = [s for s in sizes if not isinstance(s, int)]
    if len(unknown) > 1:
        raise Unsupported(f"{what} holds {len(unknown)} sizes known only at run time")
    return [s if isinstance(s, int) else -1 for s in sizes], (unknown[0] if unknown else None)


def _dims(t, x):
    return list(t.var(x)[0])


def _reshape(t, x, dims):
    """reshape x to `dims` (ints, -1 for unknown): an unknown dim that stays at its place
    copies x's (0), one other unknown is inferred (-1)."""
    src = _dims(t, x)
    shape = []
    for i, d in enumerate(dims):
        if d == -1 and i < len(src) and src[i] == -1 and all(
                a == b for a, b in zip(src[:i], dims[:i])):
            shape.append(0)
        else:
            shape.append(d)
    if shape.count(-1) > 1:
        raise Unsupported(f"the result's shape {dims} has more than one unknown dim")
    return t.call("reshape", x, shape=shape)


def _unsqueezed(rank, axes):
    """The positions of the new dims after Paddle's unsqueeze of `axes`, one after the
    other, into a rank-`rank` array."""
    dims = ["x"] * rank
    for a in axes:
        a = a + len(dims) + 1 if a < 0 else a
        dims.insert(min(a, len(dims)), "new")
    return [i for i, d in enumerate(dims) if d == "new"]


# --- elementwise ---
def _aligned(t, x, y, axis):
    """y made broadcastable against x the Paddle way: with axis != -1 and a lower rank,
    y's dims line up with x's from `axis` on (trailing ones appended)."""
    rx, ry = t.rank(x), t.rank(y)
    if axis == -1 or ry >= rx:
        return x, y
    axis = _axis(axis, rx)
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
    return t.call("clip", x, min=0.0, max=float(threshold))


@RULES.rule("leaky_relu")
def leaky_relu(t, x, *, alpha=0.02):
    return t.call("leaky_relu", x, alpha=float(alpha))


@RULES.rule("hard_swish")
def hard_swish(t, x, *, threshold=6.0, scale=6.0, offset=3.0):
    gate = t.call("clip", t.call("scale", x, bias=float(offset)), min=0.0, max=float(threshold))
    return t.call("scale", t.call("mul", x, gate), scale=1.0 / float(scale))


@RULES.rule("hard_sigmoid")
def hard_sigmoid(t, x, *, slope=0.2, offset=0.5):
    return t.call("clip", t.call("scale", x, scale=float(slope), bias=float(offset)),
                  min=0.0, max=1.0)


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
    return t.call("mul", x, t.call("tanh", t.call("softplus", x, threshold=float(threshold))))


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
        lo = [min] if lo is None else _floats(t, lo, "Min")
        hi = [max] if hi is None else _floats(t, hi, "Max")
        min, max = lo[0], hi[0]
    return t.call("clip", x, min=float(min), max=float(max))


def _floats(t, name, what):
    value = t.value_of(name)
    if value is None:
        raise Unsupported(f"{what} is computed at run time")
    return [float(v) for v in np.asarray(value).reshape(-1)]


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
    xd, yd = _dims(t, x), _dims(t, y)
    k = xd[x_num_col_dims:]
    if -1 in k or -1 in yd:
        raise Unsupported("mul of operands with unknown dims past num_col_dims")
    rows, cols = math.prod(yd[:y_num_col_dims]), math.prod(yd[y_num_col_dims:])
    if math.prod(k) != rows:
        raise Unsupported(f"mul of X {xd} and Y {yd}: {math.prod(k)} != {rows}")
    if len(k) != 1:
        x = _reshape(t, x, xd[:x_num_col_dims] + [rows])
    if len(yd) != 2:
        y = t.call("reshape", y, shape=[rows, cols])
    out = t.call("matmul", x, y)
    if len(yd) - y_num_col_dims != 1:
        out = _reshape(t, out, xd[:x_num_col_dims] + yd[y_num_col_dims:])
    return out


# --- convolution and pooling ---
def _conv_layout(data_format):
    if data_format not in ("NCHW", "AnyLayout"):
        raise Unsupported(f"data_format={data_format!r} (only NCHW)")


@RULES.rule("conv2d", "depthwise_conv2d", inputs=("Input", "Filter"), outputs=("Output",))
def conv2d(t, x, w, *, strides=(1, 1), paddings=(0, 0), dilations=(1, 1), groups=1,
           padding_algorithm="EXPLICIT", data_format="NCHW"):
    _conv_layout(data_format)
    return t.call("conv2d", x, w, strides=list(strides), paddings=list(paddings),
                  dilations=list(dilations), groups=max(int(groups), 1),
                  padding_algorithm=padding_algorithm)


def _same_pads(n, k, s):
    total = max((-(-n // s) - 1) * s + k - n, 0)
    return total // 2, total - total // 2


@RULES.rule("pool2d")
def pool2d(t, x, *, pooling_type="max", ksize=(1, 1), global_pooling=False, strides=(1, 1),
           paddings=(0, 0), exclusive=True, adaptive=False, ceil_mode=False,
           data_format="NCHW", padding_algorithm="EXPLICIT"):
    _conv_layout(data_format)
    if pooling_type not in ("max", "avg"):
        raise Unsupported(f"pooling_type={pooling_type!r}")
    spatial = _dims(t, x)[2:]
    if global_pooling or (adaptive and list(ksize) == [1, 1]):
        return t.call("pool2d", x, pooling_type=pooling_type, ksize=[1, 1], global_pooling=True)
    if adaptive:
        return _adaptive_pool(t, x, pooling_type, list(ksize), spatial)
    paddings = list(paddings)
    if padding_algorithm == "VALID":
        paddings = [0, 0]
    elif padding_algorithm == "SAME":
        if -1 in spatial:
            raise Unsupported("SAME padding of unknown spatial dims")
        pads = [_same_pads(n, k, s) for n, k, s in zip(spatial, ksize, strides)]
        paddings = [pads[0][0], pads[0][1], pads[1][0], pads[1][1]]
    return t.call("pool2d", x, pooling_type=pooling_type, ksize=list(ksize),
                  strides=list(strides), paddings=paddings, exclusive=bool(exclusive),
                  ceil_mode=bool(ceil_mode))


def _adaptive_pool(t, x, pooling_type, out, spatial):
    """Adaptive pooling: windows [floor(i n / o), ceil((i + 1) n / o)) along each of H, W;
    a plain pooling where o divides n."""
    if -1 in spatial:
        raise Unsupported("adaptive pooling of unknown spatial dims")
    if all(n % o == 0 for n, o in zip(spatial, out)):
        k = [n // o for n, o in zip(spatial, out)]
        return t.call("pool2d", x, pooling_type=pooling_type, ksize=k, strides=k)
    reduce = "reduce_max" if pooling_type == "max" else "reduce_mean"
    for axis, (n, o) in zip((2, 3), zip(spatial, out)):
        if n % o == 0:
            k = [1, 1]
            k[axis - 2] = n // o
            x = t.call("pool2d", x, pooling_type=pooling_type, ksize=k, strides=k)
            continue
        parts = []
        for i in range(o):
            lo, hi = (i * n) // o, -(-((i + 1) * n) // o)
            part = t.call("slice", x, axes=[axis], starts=[lo], ends=[hi])
            parts.append(t.call(reduce, part, axis=[axis], keep_dim=True))
        x = t.call("concat", parts, axis=axis)
    return x


# --- normalisation, dropout, embedding ---
@RULES.rule("batch_norm", inputs=("X", "Scale", "Bias", "Mean", "Variance"),
            outputs=("Y", "MeanOut", "VarianceOut", "SavedMean", "SavedVariance"))
def batch_norm(t, x, scale, bias, mean, variance, *, momentum=0.9, epsilon=1e-5,
               is_test=False, data_layout="NCHW", use_global_stats=False,
               trainable_statistics=False):
    if data_layout not in ("NCHW", "NHWC", "AnyLayout"):
        raise Unsupported(f"data_layout={data_layout!r}")
    if t.for_training:
        is_test = bool(use_global_stats)
    elif trainable_statistics:
        is_test = False
    op = t.block.append_op(
        "batch_norm", {"X": x, "Scale": scale, "Bias": bias, "Mean": mean,
                       "Variance": variance},
        attrs={"momentum": float(momentum), "epsilon": float(epsilon),
               "is_test": bool(is_test),
               "data_layout": "NCHW" if data_layout == "AnyLayout" else data_layout},
        callsite="")
    y = op.output("Y")[0]
    if not is_test:   # training: the running statistics are updated in place
        t.block.append_op("assign", {"X": op.output("MeanOut")[0]}, {"Out": mean}, callsite="")
        t.block.append_op("assign", {"X": op.output("VarianceOut")[0]}, {"Out": variance},
                          callsite="")
    return y, None, None, None, None


@RULES.rule("layer_norm", inputs=("X", "Scale", "Bias"), outputs=("Y", "Mean", "Variance"))
def layer_norm(t, x, scale, bias, *, begin_norm_axis=1, epsilon=1e-5):
    y = t.call("layer_norm", x, scale, bias, begin_norm_axis=_axis(begin_norm_axis, t.rank(x)),
               epsilon=float(epsilon))
    return y[0], None, None


@RULES.rule("dropout", inputs=("X", "Seed"), outputs=("Out", "Mask"))
def dropout(t, x, seed, *, dropout_prob=0.5, is_test=False,
            dropout_implementation="downgrade_in_infer"):
    if t.for_training:
        is_test = False
    out = t.call("dropout", x, dropout_prob=float(dropout_prob), is_test=bool(is_test),
                 dropout_implementation=dropout_implementation)
    return out[0], None


@RULES.rule("lookup_table_v2", "embedding", inputs=("W", "Ids"))
def lookup_table_v2(t, w, ids, *, padding_idx=-1):
    return t.call("lookup_table", w, ids, padding_idx=int(padding_idx))


@RULES.rule("lookup_table", inputs=("W", "Ids"))
def lookup_table(t, w, ids, *, padding_idx=-1):
    dims = _dims(t, ids)
    if dims and dims[-1] == 1:
        ids = t.call("squeeze", ids, axes=[len(dims) - 1])
    return t.call("lookup_table", w, ids, padding_idx=int(padding_idx))


@RULES.rule("one_hot_v2", inputs=("X", "depth_tensor"))
def one_hot_v2(t, x, depth_tensor, *, depth=-1, dtype=5, allow_out_of_range=False):
    if depth_tensor is not None:
        depth = _ints(t, depth_tensor, "depth_tensor")[0]
    return t.call("one_hot", x, depth=int(depth), dtype=_dtype(dtype))


# --- shapes ---
@RULES.rule("reshape2", inputs=("X", "Shape", "ShapeTensor*"), outputs=("Out", "XShape"))
def reshape2(t, x, shape_input, shape_list, *, shape=()):
    if shape_input is not None:
        shape = _with_unknown(_sizes(t, [shape_input], "Shape"), "Shape")[0]
    elif shape_list:
        shape = _with_unknown(_sizes(t, shape_list, "ShapeTensor"), "ShapeTensor")[0]
    return t.call("reshape", x, shape=[int(d) for d in shape]), None


@RULES.rule("reshape", inputs=("X", "Shape", "ShapeTensor*"))
def reshape(t, x, shape_input, shape_list, *, shape=()):
    return reshape2(t, x, shape_input, shape_list, shape=shape)[0]


@RULES.rule("transpose2", outputs=("Out", "XShape"))
def transpose2(t, x, *, axis=()):
    return t.call("transpose", x, perm=[_axis(a, t.rank(x)) for a in axis]), None


@RULES.rule("transpose")
def transpose(t, x, *, axis=()):
    return transpose2(t, x, axis=axis)[0]


@RULES.rule("flatten_contiguous_range", outputs=("Out", "XShape"))
def flatten_contiguous_range(t, x, *, start_axis=1, stop_axis=1):
    dims = _dims(t, x)
    if not dims:
        return t.call("reshape", x, shape=[1]), None
    start, stop = _axis(start_axis, len(dims)), _axis(stop_axis, len(dims))
    middle = dims[start:stop + 1]
    size = -1 if -1 in middle else math.prod(middle)
    return _reshape(t, x, dims[:start] + [size] + dims[stop + 1:]), None


@RULES.rule("flatten2", outputs=("Out", "XShape"))
def flatten2(t, x, *, axis=1):
    dims = _dims(t, x)
    outer, inner = dims[:axis], dims[axis:]
    return _reshape(t, x, [-1 if -1 in outer else math.prod(outer),
                           -1 if -1 in inner else math.prod(inner)]), None


@RULES.rule("squeeze2", outputs=("Out", "XShape"))
def squeeze2(t, x, *, axes=()):
    dims = _dims(t, x)
    if axes:
        keep = sorted({_axis(a, len(dims)) for a in axes if dims[_axis(a, len(dims))] == 1})
    else:
        keep = [i for i, d in enumerate(dims) if d == 1]
    return (t.call("squeeze", x, axes=keep) if keep else t.call("assign", x)), None


@RULES.rule("squeeze")
def squeeze(t, x, *, axes=()):
    return squeeze2(t, x, axes=axes)[0]


@RULES.rule("unsqueeze2", inputs=("X", "AxesTensor", "AxesTensorList*"),
            outputs=("Out", "XShape"))
def unsqueeze2(t, x, axes_tensor, axes_list, *, axes=()):
    if axes_tensor is not None:
        axes = _ints(t, axes_tensor, "AxesTensor")
    elif axes_list:
        axes = _list_ints(t, axes_list, "AxesTensorList")
    return t.call("unsqueeze", x, axes=_unsqueezed(t.rank(x), list(axes))), None


@RULES.rule("unsqueeze", inputs=("X", "AxesTensor", "AxesTensorList*"))
def unsqueeze(t, x, axes_tensor, axes_list, *, axes=()):
    return unsqueeze2(t, x, axes_tensor, axes_list, axes=axes)[0]


@RULES.rule("concat", inputs=("X*", "AxisTensor"))
def concat(t, xs, axis_tensor, *, axis=0):
    if axis_tensor is not None:
        axis = _ints(t, axis_tensor, "AxisTensor")[0]
    return t.call("concat", xs, axis=_axis(axis, t.rank(xs[0])))


@RULES.rule("split", inputs=("X", "AxisTensor", "SectionsTensorList*"), outputs=("Out*",))
def split(t, x, axis_tensor, sections_list, *, num=0, sections=(), axis=0):
    if axis_tensor is not None:
        axis = _ints(t, axis_tensor, "AxisTensor")[0]
    if sections_list:
        sections = _list_ints(t, sections_list, "SectionsTensorList")
    axis = _axis(axis, t.rank(x))
    if num:
        return list(t.call("split", x, num=int(num), axis=axis))
    return list(t.call("split", x, sections=[int(s) for s in sections], axis=axis))


@RULES.rule("stack", inputs=("X*",), outputs=("Y",))
def stack(t, xs, *, axis=0):
    return t.call("stack", xs, axis=_axis(axis, t.rank(xs[0]) + 1))


@RULES.rule("unstack", outputs=("Y*",))
def unstack(t, x, *, axis=0, num=0):
    axis = _axis(axis, t.rank(x))
    n = _dims(t, x)[axis]
    if n == -1:
        raise Unsupported("unstack along an unknown dim")
    return [t.call("squeeze", p, axes=[axis]) for p in t.call("split", x, num=n, axis=axis)]


def _slice(t, x, axes, starts, ends, strides, decrease_axis):
    dims = _dims(t, x)
    axes = [_axis(a, len(dims)) for a in axes]
    clamp = lambda v: max(min(int(v), _INT32_MAX), -_INT32_MAX)  # noqa: E731
    out = t.call("slice", x, axes=axes, starts=[clamp(s) for s in starts],
                 ends=[clamp(e) for e in ends],
                 strides=[int(s) for s in strides] if strides else [])
    if decrease_axis:
        out = t.call("squeeze", out, axes=[_axis(a, len(dims)) for a in decrease_axis])
    sizes = t.sizes_of(x)
    if sizes is not None and len(dims) == 1 and axes == [0]:
        t.set_sizes(out, sizes[slice(clamp(starts[0]), clamp(ends[0]),
                                     int(strides[0]) if strides else None)])
    return out


@RULES.rule("slice", inputs=("Input", "StartsTensor", "EndsTensor", "StartsTensorList*",
                             "EndsTensorList*"))
def slice_(t, x, starts_t, ends_t, starts_l, ends_l, *, axes=(), starts=(), ends=(),
           decrease_axis=()):
    if starts_t is not None:
        starts = _ints(t, starts_t, "StartsTensor")
    elif starts_l:
        starts = _list_ints(t, starts_l, "StartsTensorList")
    if ends_t is not None:
        ends = _ints(t, ends_t, "EndsTensor")
    elif ends_l:
        ends = _list_ints(t, ends_l, "EndsTensorList")
    return _slice(t, x, axes, starts, ends, (), decrease_axis)


@RULES.rule("strided_slice", inputs=("Input", "StartsTensor", "EndsTensor", "StridesTensor",
                                     "StartsTensorList*", "EndsTensorList*",
                                     "StridesTensorList*"))
def strided_slice(t, x, starts_t, ends_t, strides_t, starts_l, ends_l, strides_l, *, axes=(),
                  starts=(), ends=(), strides=(), decrease_axis=()):
    for name, lst, what in ((starts_t, starts_l, "starts"), (ends_t, ends_l, "ends"),
                            (strides_t, strides_l, "strides")):
        if name is not None or lst:
            value = _ints(t, name, what) if name is not None else _list_ints(t, lst, what)
            starts, ends, strides = ((value, ends, strides) if what == "starts" else
                                     (starts, value, strides) if what == "ends" else
                                     (starts, ends, value))
    return _slice(t, x, axes, starts, ends, strides, decrease_axis)


@RULES.rule("gather", inputs=("X", "Index", "Axis"))
def gather(t, x, index, axis_tensor, *, axis=0):
    if axis_tensor is not None:
        axis = _ints(t, axis_tensor, "Axis")[0]
    if t.rank(index) == 2 and _dims(t, index)[1] == 1:
        index = t.call("squeeze", index, axes=[1])
    return t.call("gather", x, index, axis=_axis(axis, t.rank(x)))


@RULES.rule("expand_v2", inputs=("X", "Shape", "expand_shapes_tensor*"))
def expand_v2(t, x, shape_t, shape_l, *, shape=()):
    if shape_t is not None:
        shape = _ints(t, shape_t, "Shape")
    elif shape_l:
        shape = _list_ints(t, shape_l, "expand_shapes_tensor")
    return t.call("expand", x, shape=[int(d) for d in shape])


@RULES.rule("expand_as_v2", inputs=("X", "Y"))
def expand_as_v2(t, x, y, *, target_shape=()):
    if y is not None:
        return t.call("expand_as", x, y)
    return t.call("expand", x, shape=[int(d) for d in target_shape])


@RULES.rule("tile", inputs=("X", "RepeatTimes", "repeat_times_tensor*"))
def tile(t, x, reps_t, reps_l, *, repeat_times=()):
    if reps_t is not None:
        repeat_times = _ints(t, reps_t, "RepeatTimes")
    elif reps_l:
        repeat_times = _list_ints(t, reps_l, "repeat_times_tensor")
    reps = [int(r) for r in repeat_times]
    rank = t.rank(x)
    if len(reps) > rank:   # Paddle lines x up with the trailing entries
        x = t.call("unsqueeze", x, axes=list(range(len(reps) - rank)))
    reps = [1] * (t.rank(x) - len(reps)) + reps
    return t.call("tile", x, reps=reps)


# --- creation ---
@RULES.rule("fill_constant", inputs=("ShapeTensor", "ShapeTensorList*", "ValueTensor"))
def fill_constant(t, shape_t, shape_l, value_t, *, shape=(), dtype=5, value=0.0, str_value=""):
    sizes = [int(d) for d in shape]
    if shape_t is not None:
        sizes = _sizes(t, [shape_t], "ShapeTensor")
    elif shape_l:
        sizes = _sizes(t, shape_l, "ShapeTensorList")
    dtype = _dtype(dtype)
    if value_t is not None:
        known = t.value_of(value_t)
        if known is None:
            raise Unsupported("ValueTensor is computed at run time")
        value = np.asarray(known).reshape(-1)[0]
    elif str_value:
        value = _parse_number(str_value)
    dims, unknown = _with_unknown(sizes, "the shape")
    if unknown is None:
        if any(d < 0 for d in dims):
            raise Unsupported(f"shape {dims} has an unknown dim")
        return t.constant(np.full(dims, value, dtype=_np_dtype(dtype)))
    like, axis = unknown
    return t.call("broadcast_in_dim", t.constant(np.asarray(value, _np_dtype(dtype))), like,
                  shape=dims, broadcast_dimensions=[], like_axis=axis)


def _parse_number(text):
    text = text.strip().lower()
    if text in ("inf", "+inf", "infinity"):
        return float("inf")
    if text in ("-inf", "-infinity"):
        return float("-inf")
    if text == "nan":
        return float("nan")
    try:
        return int(text)
    except ValueError:
        return float(text)


def _np_dtype(name):
    if name == "bfloat16":
        import ml_dtypes
        return ml_dtypes.bfloat16
    return np.dtype(name)


@RULES.rule("assign_value", inputs=())
def assign_value(t, *, shape=(), dtype=5, fp32_values=(), int32_values=(), int64_values=(),
                 bool_values=(), fp64_values=(), values=()):
    dtype = _dtype(dtype)
    data = next((v for v in (values, fp32_values, int32_values, int64_values, bool_values,
                             fp64_values) if len(v)), [])
    count = math.prod(shape)
    if len(data) != count:
        raise Unsupported(f"{len(data)} values for shape {list(shape)}")
    return t.constant(np.asarray(data).astype(_np_dtype(dtype)).reshape([int(d) for d in shape]))


@RULES.rule("assign")
def assign(t, x):
    return t.call("assign", x)


@RULES.rule("fill_any_like")
def fill_any_like(t, x, *, value=0.0, dtype=-1):
    dtype = t.var(x)[1] if dtype == -1 else _dtype(dtype)
    return t.call("expand_as", t.constant(np.asarray(value, _np_dtype(dtype))), x)


@RULES.rule("fill_zeros_like")
def fill_zeros_like(t, x):
    return t.call("fill_zeros_like", x)


@RULES.rule("fill_constant_batch_size_like", inputs=("Input",))
def fill_constant_batch_size_like(t, x, *, shape=(), dtype=5, value=0.0, str_value="",
                                  input_dim_idx=0, output_dim_idx=0):
    value = _parse_number(str_value) if str_value else value
    dims = [int(d) for d in shape]
    size = _dims(t, x)[input_dim_idx]
    fill = np.asarray(value, _np_dtype(_dtype(dtype)))
    if size != -1:
        dims[output_dim_idx] = size
        return t.constant(np.full(dims, fill))
    dims[output_dim_idx] = -1
    return t.call("broadcast_in_dim", t.constant(fill), x, shape=dims, broadcast_dimensions=[],
                  like_axis=input_dim_idx)


@RULES.rule("cast")
def cast(t, x, *, out_dtype=5, in_dtype=5):
    dtype = _dtype(out_dtype)
    known = t.value_of(x)
    if known is not None:
        return t.constant(known.astype(_np_dtype(dtype)))
    out = t.call("assign", x) if t.var(x)[1] == dtype else t.call("cast", x, dtype=dtype)
    sizes = t.sizes_of(x)
    if sizes is not None and dtype.startswith(("int", "uint")):
        t.set_sizes(out, sizes)
    return out


@RULES.rule("shape", inputs=("Input",))
def shape(t, x, *, out_types=()):
    dims = _dims(t, x)
    dtype = out_types[0].dtype if out_types and out_types[0] is not None and \
        out_types[0].dtype else "int32"
    if -1 not in dims:
        return t.constant(np.asarray(dims, _np_dtype(dtype)))
    parts = [t.call("unsqueeze", t.call("dim_size", x, axis=i, dtype=dtype), axes=[0])
             if d == -1 else t.constant(np.asarray([d], _np_dtype(dtype)))
             for i, d in enumerate(dims)]
    out = t.call("concat", parts, axis=0)
    t.set_sizes(out, [d if d != -1 else (x, i) for i, d in enumerate(dims)])
    return out


@RULES.rule("range", "arange", inputs=("Start", "End", "Step"))
def range_(t, start, end, step, *, out_types=()):
    values = [t.value_of(v) for v in (start, end, step)]
    dtype = _np_dtype(out_types[0].dtype) if out_types and out_types[0] is not None and \
        out_types[0].dtype else None
    if all(v is not None for v in values):
        s, e, d = (np.asarray(v).reshape(-1)[0] for v in values)
        return t.constant(np.arange(s, e, d).astype(dtype or values[0].dtype))
    ends = t.sizes_of(end)
    if values[0] is None or values[2] is None or ends is None or len(ends) != 1:
        raise Unsupported("start, end or step is computed at run time")
    s, d = (np.asarray(values[i]).reshape(-1)[0] for i in (0, 2))
    if s != 0 or d != 1:
        raise Unsupported("a range up to a size known only at run time from a start other "
                          "than 0 or a step other than 1")
    like, axis = ends[0]
    ones = t.call("broadcast_in_dim", t.constant(np.ones((), np.int32)), like, shape=[-1],
                  broadcast_dimensions=[], like_axis=axis)
    counted = t.call("scale", t.call("cumsum", ones, axis=0), bias=-1.0)
    dtype = np.dtype(dtype or values[0].dtype)
    return t.call("cast", counted, dtype=str(dtype)) if dtype != np.int32 else counted


# --- reductions and search ---
def _reduce(ours):
    def rule(t, x, *, dim=(), keep_dim=False, reduce_all=False, out_dtype=-1):
        axes = [] if reduce_all else [_axis(a, t.rank(x)) for a in dim]
        if len(axes) == t.rank(x):
            axes = []
        if out_dtype not in (-1, None) and _dtype(out_dtype) != t.var(x)[1]:
            x = t.call("cast", x, dtype=_dtype(out_dtype))
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
        return t.call(ours, x, axis=_axis(axis, t.rank(x)), keep_dim=bool(keepdims),
                      dtype=_dtype(dtype))
    rule.__name__ = rule.__qualname__ = ours
    return rule


RULES.rule("arg_max")(_arg("argmax"))
RULES.rule("arg_min")(_arg("argmin"))


@RULES.rule("top_k_v2", inputs=("X", "K"), outputs=("Out", "Indices"))
def top_k_v2(t, x, k_t, *, k=1, axis=-1, largest=True, sorted=True):  # noqa: A002
    if k_t is not None:
        k = _ints(t, k_t, "K")[0]
    out, idx = t.call("top_k", x, k=int(k), axis=_axis(axis, t.rank(x)), largest=bool(largest))
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
    out = t.call("cumsum", x, axis=_axis(axis, t.rank(x)), reverse=bool(reverse))
    if exclusive:
        out = t.call("sub", out, x)
    return out


# --- ops of ours added for Paddle (lowering/ops/conv_transpose.py, interpolate.py) ---
def _ours(op_type):
    """Raise Unsupported if our op library lacks `op_type` (yet)."""
    from lowering import registry
    if not registry.is_registered(op_type):
        raise Unsupported(f"progdesc has no op '{op_type}' yet")


@RULES.rule("conv2d_transpose", "depthwise_conv2d_transpose", inputs=("Input", "Filter"),
            outputs=("Output",))
def conv2d_transpose(t, x, w, *, strides=(1, 1), paddings=(0, 0), output_padding=(),
                     output_size=(), dilations=(1, 1), groups=1, padding_algorithm="EXPLICIT",
                     data_format="NCHW"):
    _ours("conv2d_transpose")
    return t.call("conv2d_transpose", x, w, strides=list(strides), paddings=list(paddings),
                  output_padding=list(output_padding), output_size=list(output_size),
                  dilations=list(dilations), groups=max(int(groups), 1),
                  padding_algorithm=padding_algorithm,
                  data_format="NCHW" if data_format == "AnyLayout" else data_format)


def _interp(method):
    def rule(t, x, out_size, size_list, scale_t, *, data_layout="NCHW", out_h=-1, out_w=-1,
             scale=(), align_corners=True, align_mode=1, out_d=-1):
        _ours("interpolate")
        if t.rank(x) != 4:
            raise Unsupported(f"{t.rank(x)}-D input (only 4-D)")
        if out_size is not None:
            out_h, out_w = _ints(t, out_size, "OutSize")
            scale = ()
        elif size_list:
            out_h, out_w = _list_ints(t, size_list, "SizeTensor")
            scale = ()
        elif scale_t is not None:
            value = t.value_of(scale_t)
            if value is None:
                raise Unsupported("Scale is computed at run time")
            scale = [float(v) for v in np.asarray(value).reshape(-1)]
        scale = list(scale)
        if len(scale) == 1:
            scale = scale * 2
        if scale and all(s <= 0 for s in scale):
            scale = []
        return t.call("interpolate", x, data_layout="NCHW" if data_layout == "AnyLayout"
                      else data_layout, out_h=int(out_h), out_w=int(out_w),
                      scale=[float(s) for s in scale], interp_method=method,
                      align_corners=bool(align_corners), align_mode=int(align_mode))
    rule.__name__ = rule.__qualname__ = f"{method}_interp"
    return rule


for _method in ("nearest", "bilinear"):
    RULES.rule(f"{_method}_interp_v2", f"{_method}_interp",
               inputs=("X", "OutSize", "SizeTensor*", "Scale"))(_interp(_method))


# --- more of paddle.nn ---
@RULES.rule("sum", inputs=("X*",))
def sum_(t, xs):
    return xs[0] if len(xs) == 1 else t.call("sum", xs)


@RULES.rule("bmm", inputs=("X", "Y"))
def bmm(t, x, y):
    return t.call("matmul", x, y)


@RULES.rule("prelu", inputs=("X", "Alpha"))
def prelu(t, x, alpha, *, mode="all", data_format="NCHW"):
    rank = t.rank(x)
    if mode == "channel":
        channel = 1 if data_format == "NCHW" else rank - 1
        alpha = t.call("reshape", alpha, shape=[-1])
        if channel != rank - 1:
            alpha = t.call("unsqueeze", alpha, axes=list(range(1, rank - channel)))
    elif mode == "element":
        alpha = t.call("unsqueeze", t.call("reshape", alpha, shape=_dims(t, alpha)[1:]),
                       axes=[0]) if t.rank(alpha) == rank else alpha
    elif mode == "all":
        alpha = t.call("reshape", alpha, shape=[])
    else:
        raise Unsupported(f"mode={mode!r}")
    zero = t.constant(np.zeros((), t.var(x)[1]))
    return t.call("where", t.call("greater_than", x, zero), x, t.call("mul", x, alpha))


@RULES.rule("flip")
def flip(t, x, *, axis=()):
    return t.call("rev", x, dimensions=[_axis(a, t.rank(x)) for a in axis])


@RULES.rule("index_select", inputs=("X", "Index"))
def index_select(t, x, index, *, dim=0):
    return t.call("gather", x, index, axis=_axis(dim, t.rank(x)))


@RULES.rule("p_norm")
def p_norm(t, x, *, porder=2.0, axis=-1, epsilon=1e-12, keepdim=False, asvector=False):
    if asvector:
        x = t.call("reshape", x, shape=[-1])
        axis = 0
    axes = [_axis(axis, t.rank(x))]
    a = t.call("abs", x)
    if porder == float("inf"):
        return t.call("reduce_max", a, axis=axes, keep_dim=bool(keepdim))
    if porder == 2.0:
        return t.call("sqrt", t.call("reduce_sum", t.call("square", a), axis=axes,
                                     keep_dim=bool(keepdim)))
    if porder == 1.0:
        return t.call("reduce_sum", a, axis=axes, keep_dim=bool(keepdim))
    raise Unsupported(f"porder={porder}")


@RULES.rule("pad3d", inputs=("X", "Paddings"))
def pad3d(t, x, paddings_t, *, paddings=(0, 0, 0, 0, 0, 0), mode="constant", value=0.0,
          data_format="NCDHW"):
    if paddings_t is not None:
        paddings = _ints(t, paddings_t, "Paddings")
    if mode != "constant" or data_format != "NCDHW":
        raise Unsupported(f"mode={mode!r}, data_format={data_format!r} (only constant, NCDHW)")
    left, right, top, bottom, front, back = [int(p) for p in paddings]
    config = [0, 0, 0, 0, 0, 0, front, back, 0, top, bottom, 0, left, right, 0]
    return t.call("pad", x, t.constant(np.asarray(value, t.var(x)[1])), padding_config=config)


@RULES.rule("pad", inputs=("X",))
def pad(t, x, *, paddings=(), pad_value=0.0):
    config = [v for i in range(0, len(paddings), 2)
              for v in (int(paddings[i]), int(paddings[i + 1]), 0)]
    return t.call("pad", x, t.constant(np.asarray(pad_value, t.var(x)[1])),
                  padding_config=config)


@RULES.rule("instance_norm", inputs=("X", "Scale", "Bias"),
            outputs=("Y", "SavedMean", "SavedVariance"))
def instance_norm(t, x, scale, bias, *, epsilon=1e-5):
    return _group_standardize(t, x, 0, scale, bias, epsilon), None, None


@RULES.rule("group_norm", inputs=("X", "Scale", "Bias"), outputs=("Y", "Mean", "Variance"))
def group_norm(t, x, scale, bias, *, epsilon=1e-5, groups=1, data_layout="NCHW"):
    if data_layout != "NCHW":
        raise Unsupported(f"data_layout={data_layout!r}")
    return _group_standardize(t, x, groups, scale, bias, epsilon), None, None


def _group_standardize(t, x, groups, scale, bias, epsilon):
    """(x - mean) / sqrt(var + eps) over each sample's groups of channels (groups=0:
    each channel alone), then the per-channel scale and bias."""
    dims = _dims(t, x)
    c = dims[1]
    if c == -1 or -1 in dims[2:]:
        raise Unsupported("normalisation over unknown dims")
    groups = groups or c
    spatial = dims[2:]
    g = t.call("reshape", x, shape=[0, groups, c // groups * math.prod(spatial)])
    mean = t.call("reduce_mean", g, axis=[2], keep_dim=True)
    centered = t.call("sub", g, mean)
    var = t.call("reduce_mean", t.call("square", centered), axis=[2], keep_dim=True)
    y = t.call("mul", centered, t.call("rsqrt", t.call("scale", var, bias=float(epsilon))))
    y = t.call("reshape", y, shape=[0, c] + spatial)
    shape = [c] + [1] * len(spatial)
    if scale is not None:
        y = t.call("mul", y, t.call("reshape", scale, shape=shape))
    if bias is not None:
        y = t.call("add", y, t.call("reshape", bias, shape=shape))
    return y
