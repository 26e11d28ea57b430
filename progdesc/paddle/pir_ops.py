"""How each PIR op of Paddle 3 reads as the legacy op the translation table knows.

PIR passes an op's operands by position and some of what legacy programs hold as
attributes (reshape's shape, slice's starts and ends, scale's factor) as operands made
by `pd_op.full_int_array` / `pd_op.full`. A row here says, for one PIR op, the legacy
op type, what each operand becomes, what each result becomes and how attributes are
renamed, so that the rows of `progdesc.paddle.rules` serve both file formats:

- an operand is a legacy input slot ('X'), a list slot ('X*': the values of a
  `builtin.combine`), `Fold(...)` (an attribute when the operand is a constant, else
  the legacy tensor slot that holds it at run time), or None (dropped);
- a result is a legacy output slot ('Out'), a list slot ('Out*': the parts of the
  vector a `builtin.split` takes apart), or None (not named);
- `attrs` renames PIR attributes to the legacy names (None drops one); `fixed` adds
  legacy attributes the PIR op implies.

The legacy names come from Paddle's legacy op definitions (op_compat.yaml maps PIR's
argument names to them); defaults are left to the table's rows.
"""
from typing import NamedTuple


class Fold(NamedTuple):
    """An operand that legacy programs hold as the attribute `name` when it is known:
    `kind` is 'ints' (a list: full_int_array, or a combine of constants), 'int',
    'float' or 'bool' (a one-element full). When it is not a constant it goes to the
    legacy tensor slot `tensor`, or to the list slot `tensors` when it is a combine
    (or a stack of one) of values; with neither, the op keeps it under `tensor` anyway."""
    name: str
    kind: str
    tensor: str = None
    tensors: str = None


class Row(NamedTuple):
    """One PIR op as a legacy op (see the module's text)."""
    type: str
    operands: tuple = ("X",)
    results: tuple = ("Out",)
    attrs: dict = {}
    fixed: dict = {}


def _unary(*names):
    return {f"pd_op.{n}": Row(n) for n in names}


def _binary(pairs, **fixed):
    return {f"pd_op.{pir}": Row(legacy, ("X", "Y"), fixed=fixed) for pir, legacy in pairs}


_REDUCE = {"axis": None, "keepdim": "keep_dim"}

ROWS = {
    # --- same name, one input X, one output Out ---
    **_unary("relu", "sigmoid", "tanh", "exp", "log", "sqrt", "rsqrt", "abs", "square",
             "silu", "sin", "cos", "floor", "ceil", "erf", "gelu", "softmax", "log_softmax",
             "relu6", "swish", "sign", "reciprocal", "softplus", "softsign", "elu", "selu",
             "celu", "tanh_shrink", "logsigmoid", "assign", "logical_not", "bitwise_not",
             "round", "log1p", "expm1", "tan", "thresholded_relu"),
    # elementwise tests: legacy programs call them isnan_v2 ... (legacy isnan answers
    # for the whole tensor)
    **{f"pd_op.{n}": Row(f"{n}_v2") for n in ("isnan", "isinf", "isfinite")},
    "pd_op.increment": Row("increment", attrs={"value": "step"}),
    "pd_op.mish": Row("mish", attrs={"lambda": "threshold"}),
    "pd_op.hardswish": Row("hard_swish"),
    "pd_op.hardsigmoid": Row("hard_sigmoid"),
    "pd_op.leaky_relu": Row("leaky_relu", attrs={"negative_slope": "alpha"}),
    "pd_op.hardtanh": Row("brelu"),
    "pd_op.prelu": Row("prelu", ("X", "Alpha")),
    # --- elementwise binary ---
    **_binary([("add", "elementwise_add"), ("subtract", "elementwise_sub"),
               ("multiply", "elementwise_mul"), ("divide", "elementwise_div"),
               ("maximum", "elementwise_max"), ("minimum", "elementwise_min"),
               ("elementwise_pow", "elementwise_pow"), ("floor_divide", "elementwise_floordiv"),
               ("remainder", "elementwise_mod")], axis=-1),
    **_binary([(n, n) for n in ("equal", "not_equal", "less_than", "less_equal",
                                 "greater_than", "greater_equal")], axis=-1),
    **_binary([(n, n) for n in ("logical_and", "logical_or", "logical_xor", "bitwise_and",
                                 "bitwise_or", "bitwise_xor")]),
    "pd_op.pow": Row("pow", attrs={"y": "factor"}),
    "pd_op.scale": Row("scale", ("X", Fold("scale", "float", tensor="ScaleTensor"))),
    "pd_op.clip": Row("clip", ("X", Fold("min", "float", tensor="Min"),
                               Fold("max", "float", tensor="Max"))),
    "pd_op.where": Row("where", ("Condition", "X", "Y")),
    "pd_op.cast": Row("cast", attrs={"dtype": "out_dtype"}),
    # --- linear algebra, convolution, normalisation, pooling ---
    "pd_op.matmul": Row("matmul_v2", ("X", "Y"),
                        attrs={"transpose_x": "trans_x", "transpose_y": "trans_y"}),
    "pd_op.bmm": Row("bmm", ("X", "Y")),
    "pd_op.conv2d": Row("conv2d", ("Input", "Filter"), ("Output",)),
    "pd_op.depthwise_conv2d": Row("depthwise_conv2d", ("Input", "Filter"), ("Output",)),
    "pd_op.conv2d_transpose": Row("conv2d_transpose", (
        "Input", "Filter", Fold("output_size", "ints")), ("Output",)),
    "pd_op.depthwise_conv2d_transpose": Row("depthwise_conv2d_transpose", (
        "Input", "Filter", Fold("output_size", "ints")), ("Output",)),
    "pd_op.sync_batch_norm": Row("sync_batch_norm", ("X", "Mean", "Variance", "Scale", "Bias"), (
        "Y", "MeanOut", "VarianceOut", "SavedMean", "SavedVariance", "ReserveSpace"),
        attrs={"data_format": "data_layout"}),
    "pd_op.batch_norm": Row("batch_norm", ("X", "Mean", "Variance", "Scale", "Bias"), (
        "Y", "MeanOut", "VarianceOut", "SavedMean", "SavedVariance", "ReserveSpace"),
        attrs={"data_format": "data_layout"}),
    "pd_op.layer_norm": Row("layer_norm", ("X", "Scale", "Bias"), ("Y", "Mean", "Variance")),
    "pd_op.group_norm": Row("group_norm", ("X", "Scale", "Bias"), ("Y", "Mean", "Variance"),
                            attrs={"data_format": "data_layout"}),
    "pd_op.instance_norm": Row("instance_norm", ("X", "Scale", "Bias"),
                               ("Y", "SavedMean", "SavedVariance")),
    "pd_op.pool2d": Row("pool2d", ("X", Fold("ksize", "ints"))),
    "pd_op.dropout": Row("dropout", ("X", "Seed", Fold("dropout_prob", "float")),
                         ("Out", "Mask"), attrs={"mode": "dropout_implementation"}),
    "pd_op.embedding": Row("lookup_table_v2", ("Ids", "W"), attrs={"sparse": "is_sparse"}),
    # --- shapes ---
    "pd_op.reshape": Row("reshape2", (
        "X", Fold("shape", "ints", tensor="Shape", tensors="ShapeTensor")), ("Out", "XShape")),
    "pd_op.transpose": Row("transpose2", results=("Out", "XShape"), attrs={"perm": "axis"}),
    "pd_op.flatten": Row("flatten_contiguous_range", results=("Out", "XShape")),
    "pd_op.squeeze": Row("squeeze2", ("X", Fold("axes", "ints")), ("Out", "XShape")),
    "pd_op.unsqueeze": Row("unsqueeze2", (
        "X", Fold("axes", "ints", tensor="AxesTensor", tensors="AxesTensorList")),
        ("Out", "XShape")),
    "pd_op.concat": Row("concat", ("X*", Fold("axis", "int", tensor="AxisTensor"))),
    "pd_op.stack": Row("stack", ("X*",), ("Y",)),
    "pd_op.split": Row("split", ("X", Fold("sections", "ints", tensors="SectionsTensorList"),
                                 Fold("axis", "int", tensor="AxisTensor")), ("Out*",)),
    "pd_op.split_with_num": Row("split", ("X", Fold("axis", "int", tensor="AxisTensor")),
                                ("Out*",)),
    "pd_op.unbind": Row("unbind", results=("Out*",)),
    "pd_op.slice": Row("slice", (
        "Input", Fold("starts", "ints", tensor="StartsTensor", tensors="StartsTensorList"),
        Fold("ends", "ints", tensor="EndsTensor", tensors="EndsTensorList"))),
    "pd_op.strided_slice": Row("strided_slice", (
        "Input", Fold("starts", "ints", tensor="StartsTensor", tensors="StartsTensorList"),
        Fold("ends", "ints", tensor="EndsTensor", tensors="EndsTensorList"),
        Fold("strides", "ints", tensor="StridesTensor", tensors="StridesTensorList"))),
    "pd_op.expand": Row("expand_v2", (
        "X", Fold("shape", "ints", tensor="Shape", tensors="expand_shapes_tensor"))),
    "pd_op.expand_as": Row("expand_as_v2", ("X", "Y"), attrs={"target_shape": "target_shape"}),
    "pd_op.tile": Row("tile", (
        "X", Fold("repeat_times", "ints", tensor="RepeatTimes", tensors="repeat_times_tensor"))),
    "pd_op.gather": Row("gather", ("X", "Index", Fold("axis", "int", tensor="Axis"))),
    "pd_op.gather_nd": Row("gather_nd", ("X", "Index")),
    "pd_op.index_select": Row("index_select", ("X", "Index"), attrs={"axis": "dim"}),
    "pd_op.take_along_axis": Row("take_along_axis", ("Input", "Index"), ("Result",),
                                 attrs={"axis": "Axis"}),
    "pd_op.shape": Row("shape", ("Input",)),
    "pd_op.shape64": Row("shape", ("Input",)),
    "pd_op.one_hot": Row("one_hot_v2", ("X", Fold("depth", "int", tensor="depth_tensor"))),
    "pd_op.pad3d": Row("pad3d", ("X", Fold("paddings", "ints", tensor="Paddings")),
                       attrs={"pad_value": "value"}),
    "pd_op.pad": Row("pad", ("X", Fold("pad_value", "float"))),
    "pd_op.tril": Row("tril_triu", fixed={"lower": True}),
    "pd_op.triu": Row("tril_triu", fixed={"lower": False}),
    "pd_op.cumsum": Row("cumsum", ("X", Fold("axis", "int"))),
    "pd_op.flip": Row("flip"),
    "pd_op.roll": Row("roll", ("X", Fold("shifts", "ints", tensor="ShiftsTensor"))),
    # --- reductions, search ---
    "pd_op.sum": Row("reduce_sum", ("X", Fold("dim", "ints")),
                     attrs={**_REDUCE, "dtype": "out_dtype"}),
    "pd_op.mean": Row("reduce_mean", ("X", Fold("dim", "ints")), attrs=_REDUCE),
    "pd_op.max": Row("reduce_max", ("X", Fold("dim", "ints")), attrs=_REDUCE),
    "pd_op.min": Row("reduce_min", ("X", Fold("dim", "ints")), attrs=_REDUCE),
    "pd_op.prod": Row("reduce_prod", ("X", Fold("dim", "ints")),
                      attrs={"keep_dim": "keep_dim", "reduce_all": "reduce_all"}),
    "pd_op.all": Row("reduce_all", attrs={"axis": "dim", "keepdim": "keep_dim"}),
    "pd_op.any": Row("reduce_any", attrs={"axis": "dim", "keepdim": "keep_dim"}),
    "pd_op.mean_all": Row("mean"),
    "pd_op.logsumexp": Row("logsumexp"),
    "pd_op.p_norm": Row("p_norm"),
    "pd_op.argmax": Row("arg_max", ("X", Fold("axis", "int"))),
    "pd_op.argmin": Row("arg_min", ("X", Fold("axis", "int"))),
    "pd_op.topk": Row("top_k_v2", ("X", Fold("k", "int", tensor="K")), ("Out", "Indices")),
    "pd_op.argsort": Row("argsort", results=("Out", "Indices")),
    "pd_op.cumprod": Row("cumprod"),
    # --- making tensors ---
    "pd_op.full_like": Row("fill_any_like", ("X", Fold("value", "float", tensor="ValueTensor"))),
    "pd_op.full_with_tensor": Row("fill_constant", (
        Fold("value", "float", tensor="ValueTensor"),
        Fold("shape", "ints", tensor="ShapeTensor", tensors="ShapeTensorList"))),
    "pd_op.arange": Row("range", ("Start", "End", "Step")),
    "pd_op.linspace": Row("linspace", ("Start", "Stop", "Num")),
    "pd_op.assign_value": Row("assign_value", ()),
    "pd_op.assign_value_": Row("assign_value", (None,)),
    "pd_op.share_data_": Row("share_data"),
    "pd_op.assign_out_": Row("assign", ("X", None)),
    "pd_op.full_batch_size_like": Row("fill_constant_batch_size_like", ("Input",)),
    # --- interpolation ---
    **{f"pd_op.{m}_interp": Row(f"{m}_interp_v2", (
        "X", "OutSize", "SizeTensor*", "Scale"), attrs={"data_format": "data_layout"})
       for m in ("nearest", "bilinear", "bicubic", "linear", "trilinear")},
    # --- losses ---
    "pd_op.cross_entropy_with_softmax": Row("softmax_with_cross_entropy", (
        "Logits", "Label"), ("Softmax", "Loss")),
    # --- sequences ---
    "pd_op.rnn": Row("rnn", ("Input", "PreState*", "WeightList*", "SequenceLength", None),
                     ("Out", "DropoutState", "State*", "Reserve")),
}
"""PIR op name -> its Row. An op named with a trailing '_' (Paddle's in-place form,
'pd_op.relu_') reads as the row of its name without it."""

INPLACE = {name: {"MeanOut": "Mean", "VarianceOut": "Variance"}
           for name in ("pd_op.batch_norm_", "pd_op.batch_norm", "pd_op.sync_batch_norm_")}
"""PIR ops whose results replace persistable operands: result slot -> the operand slot
it overwrites (the result takes the persistable's name, as in a legacy program, so the
loader sees the persistable written: running statistics, not trainable parameters).
`batch_norm` (not in place) gives its updated statistics as new values; a legacy
program writes them over the old ones, and so does the reader."""


def row(name):
    """The Row of the PIR op `name`, or None."""
    found = ROWS.get(name)
    if found is None and name.endswith("_") and not name.endswith("__"):
        found = ROWS.get(name[:-1])
    return found
