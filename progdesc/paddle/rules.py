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
  `t.constant(array)`, `t.rank(name)`, `t.for_training` (the model is imported for
  training: batch norm and dropout run in training mode, `clone(for_test=True)` gives
  eval), and for control flow `t.program` (ours), `t.paddle` (the PaddleProgram),
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
from progdesc.paddle.table import PaddleRuleTable
from progdesc.translate import Unsupported

RULES = PaddleRuleTable("Paddle op")


def _axes(axis, rank):
    """Paddle's possibly negative axis (or list of them) made non-negative."""
    if isinstance(axis, (list, tuple)):
        return [a + rank if a < 0 else a for a in axis]
    return axis + rank if axis < 0 else axis


# --- elementwise ---
def _aligned(t, x, y, axis):
    """y made broadcastable against x the Paddle way: with axis != -1 and a lower rank,
    y's dims line up with x's from `axis` on (trailing ones appended)."""
    rx, ry = t.rank(x), t.rank(y)
    if axis == -1 or ry >= rx:
        return x, y
    if axis < 0:
        axis += rx
    trailing = rx - axis - ry
    if trailing > 0:
        y = t.call("unsqueeze", y, axes=list(range(ry, ry + trailing)))
    return x, y


def _elementwise(ours):
    def rule(t, x, y, *, axis=-1):
        if t.rank(x) < t.rank(y) and axis != -1:
            y, x = _aligned(t, y, x, axis)
        else:
            x, y = _aligned(t, x, y, axis)
        return t.call(ours, x, y)
    rule.__name__ = rule.__qualname__ = ours
    return rule


for _paddle, _ours in {"elementwise_add": "add", "elementwise_sub": "sub",
                       "elementwise_mul": "mul", "elementwise_div": "div",
                       "elementwise_pow": "pow", "elementwise_max": "maximum",
                       "elementwise_min": "minimum"}.items():
    RULES.rule(_paddle, inputs=("X", "Y"))(_elementwise(_ours))


# --- activations ---
for _name in ("relu", "sigmoid", "tanh", "exp", "log", "sqrt", "rsqrt", "abs", "square",
              "silu", "sin", "cos", "floor", "ceil", "erf"):
    RULES.rename(_name, _name)


@RULES.rule("gelu")
def gelu(t, x, *, approximate=False):
    return t.call("gelu", x, approximate=bool(approximate))


@RULES.rule("softmax")
def softmax(t, x, *, axis=-1):
    return t.call("softmax", x, axis=axis)


# --- linear algebra ---
@RULES.rule("matmul_v2", inputs=("X", "Y"))
def matmul_v2(t, x, y, *, trans_x=False, trans_y=False):
    return t.call("matmul", x, y, transpose_x=trans_x, transpose_y=trans_y)


# --- convolution ---
@RULES.rule("conv2d", "depthwise_conv2d", inputs=("Input", "Filter"), outputs=("Output",))
def conv2d(t, x, w, *, strides=(1, 1), paddings=(0, 0), dilations=(1, 1), groups=1,
           padding_algorithm="EXPLICIT", data_format="NCHW"):
    if data_format not in ("NCHW", "AnyLayout"):
        raise Unsupported(f"data_format={data_format!r}")
    return t.call("conv2d", x, w, strides=list(strides), paddings=list(paddings),
                  dilations=list(dilations), groups=groups,
                  padding_algorithm=padding_algorithm)


# --- shapes ---
@RULES.rule("reshape2", outputs=("Out", "XShape"))
def reshape2(t, x, *, shape=()):
    return t.call("reshape", x, shape=list(shape)), None


@RULES.rule("transpose2", outputs=("Out", "XShape"))
def transpose2(t, x, *, axis=()):
    return t.call("transpose", x, perm=list(axis)), None


@RULES.rule("concat", inputs=("X*",))
def concat(t, xs, *, axis=0):
    return t.call("concat", xs, axis=_axes(axis, t.rank(xs[0])))


@RULES.rule("scale")
def scale(t, x, *, scale=1.0, bias=0.0, bias_after_scale=True):
    return t.call("scale", x, scale=float(scale), bias=float(bias),
                  bias_after_scale=bool(bias_after_scale))

