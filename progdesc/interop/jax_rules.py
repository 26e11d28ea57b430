"""The translation table of `from_jax`: JAX primitive -> the ops it becomes.

Rules have the shape of `progdesc.translate`: `rule(t, *operands, **params)`, the
operands our variable names, the keyword-only parameters those of the equation's
`params` the rule reads (with their defaults), `in_types` / `out_types` the avals of
the operands and results. Primitive names of other JAX versions are aliases of the
table. A rule raises `Unsupported` for parameters it cannot translate and
`BatchDependent` for a size that depends on the symbolic batch dim.
"""
import numpy as np
from jax import export

from lowering import dtypes
from lowering.ops.shape import TO_THE_END
from progdesc.control_flow import scan, switch, while_loop
from progdesc.translate import RuleTable, Unsupported

RULES = RuleTable("JAX primitive")


class BatchDependent(Unsupported):
    """Raised for a size that depends on the symbolic batch dim in a way no op of ours
    can compute from its inputs."""


def is_batch_dim(d):
    """Whether a dim of a traced shape is symbolic (the batch dim, or an expression of it)."""
    return export.is_symbolic_dim(d)


def same_dim(a, b):
    """Whether two dims of traced shapes are equal (symbolic ones compared as expressions)."""
    return is_batch_dim(a) == is_batch_dim(b) and a == b


def _batch_free(dims):
    """`dims` with each symbolic dim written -1 (a size the op takes from its input)."""
    return [-1 if is_batch_dim(d) else d for d in dims]


def _kind(t, name):
    return dtypes.kind_of(t.var(name)[1])


# --- one-to-one ---

for _prim, _op in {
    "add": "add", "sub": "sub", "mul": "mul",
    "pow": "pow", "neg": "neg", "abs": "abs", "exp": "exp", "log": "log", "sqrt": "sqrt",
    "rsqrt": "rsqrt", "square": "square", "tanh": "tanh", "logistic": "sigmoid",
    "erf": "erf", "erfc": "erfc", "sin": "sin", "cos": "cos", "log1p": "log1p",
    "expm1": "expm1", "sign": "sign", "floor": "floor", "is_finite": "is_finite",
    "rem": "rem", "copy": "assign",
    "eq": "equal", "ne": "not_equal", "lt": "less_than", "le": "less_equal",
    "gt": "greater_than", "ge": "greater_equal",
}.items():
    RULES.rename(_prim, _op)
del _prim, _op

# names other JAX versions give these primitives
RULES.alias("copy_p", "copy")
RULES.alias("scatter_add", "scatter-add")
RULES.alias("pjit", "jit")
RULES.alias("checkpoint", "remat2")
RULES.alias("custom_vjp_call_jaxpr", "custom_vjp_call")


# --- elementwise ---

@RULES.rule("div")
def div(t, x, y):
    return t.call("div" if _kind(t, x) == "float" else "trunc_div", x, y)


def _logical(t, op_type, *xs):
    if any(_kind(t, x) != "bool" for x in xs):
        raise Unsupported("bitwise operations on integers")
    return t.call(op_type, *xs)


@RULES.rule("and")
def and_(t, x, y):
    return _logical(t, "logical_and", x, y)


@RULES.rule("or")
def or_(t, x, y):
    return _logical(t, "logical_or", x, y)


@RULES.rule("not")
def not_(t, x):
    return _logical(t, "logical_not", x)


@RULES.rule("stop_gradient")
def stop_gradient(t, x):
    out = t.call("assign", x)
    t.block.var(out).stop_gradient = True
    return out


@RULES.rule("integer_pow")
def integer_pow(t, x, *, y):
    return t.call("integer_pow", x, y=y)


@RULES.rule("convert_element_type")
def convert_element_type(t, x, *, new_dtype):
    dtype = dtypes.name_of(new_dtype)
    return x if t.var(x)[1] == dtype else t.call("cast", x, dtype=dtype)


@RULES.rule("max")
def max_(t, x, y):   # a tie sends half the gradient to each, as JAX does
    return t.call("maximum", x, y, ties="split")


@RULES.rule("min")
def min_(t, x, y):
    return t.call("minimum", x, y, ties="split")


@RULES.rule("clamp")
def clamp(t, low, x, high):
    """x takes the gradient only strictly between the bounds, as in JAX (at a tie the
    bound takes it, where JAX gives it to no one)."""
    return t.call("minimum", t.call("maximum", x, low, ties="y"), high, ties="y")


# --- shapes ---

@RULES.rule("reshape")
def reshape(t, x, *dynamic, new_sizes, dimensions=None):
    if dimensions is not None or dynamic:
        raise Unsupported("a reshape that transposes or has dynamic sizes")
    if sum(map(is_batch_dim, new_sizes)) > 1:   # one -1 is inferred; two are not
        raise BatchDependent(f"new sizes {tuple(map(str, new_sizes))} hold two "
                             "batch-dependent dims")
    return t.call("reshape", x, shape=_batch_free(new_sizes))


@RULES.rule("broadcast_in_dim")
def broadcast_in_dim(t, x, *dynamic, shape, broadcast_dimensions, in_types):
    if dynamic:
        raise Unsupported("dynamic shapes")
    source = dict(zip(broadcast_dimensions, in_types[0].shape))
    like = like_dim = None
    for i, d in enumerate(shape):   # a -1 takes the operand's dim mapped there, else Like's
        if not is_batch_dim(d):
            continue
        ref = t.feed_with_leading(d) if i not in source else None
        if ref is not None and (like is None or same_dim(d, like_dim)):
            like, like_dim = ref, d   # the leading dim of a feed
        elif i not in source or not same_dim(source[i], d):
            raise BatchDependent(f"broadcasts to size {d}, which neither the operand "
                                 f"{in_types[0].str_short()} nor a feed has there")
    return t.call("broadcast_in_dim", x, like, shape=_batch_free(shape),
                  broadcast_dimensions=list(broadcast_dimensions))


@RULES.rule("transpose")
def transpose(t, x, *, permutation):
    return t.call("transpose", x, perm=list(permutation))


@RULES.rule("squeeze")
def squeeze(t, x, *, dimensions):
    return t.call("squeeze", x, axes=list(dimensions))


@RULES.rule("expand_dims")
def expand_dims(t, x, *, dimensions):
    return t.call("unsqueeze", x, axes=list(dimensions))


@RULES.rule("concatenate")
def concatenate(t, *xs, dimension):
    return t.call("concat", list(xs), axis=dimension)


@RULES.rule("stack")
def stack(t, *xs, axis):
    return t.call("stack", list(xs), axis=axis)


@RULES.rule("unstack")
def unstack(t, x, *, axis, in_types):
    n = in_types[0].shape[axis]   # JAX cannot unstack along a symbolic dim: an int
    return [t.call("squeeze", part, axes=[axis])
            for part in t.call("split", x, num=n, axis=axis)]


@RULES.rule("split")
def split(t, x, *, sizes, axis):
    return t.call("split", x, sections=list(sizes), axis=axis)


@RULES.rule("slice")
def slice_(t, x, *, start_indices, limit_indices, strides=None, in_types):
    dims = in_types[0].shape
    strides = strides or (1,) * len(dims)
    axes = [a for a in range(len(dims))   # an axis taken whole (a batch dim) is left out
            if (start_indices[a], strides[a]) != (0, 1) or not same_dim(limit_indices[a],
                                                                        dims[a])]
    return t.call("slice", x, axes=axes,
                  starts=[_from_end(start_indices[a], dims[a]) for a in axes],
                  ends=[_from_end(limit_indices[a], dims[a]) for a in axes],
                  strides=[strides[a] for a in axes])


def _from_end(index, n):
    """A slice index into a dim `n`, as our slice op takes it (NumPy's: a negative index
    counts from the end): a symbolic `n - k` (`x[:-1]`) is -k, `n` itself past the end,
    and `mod(-1, n)` (where `jnp.roll` by one cuts) -1. Any other symbolic index is
    left as it is (the op refuses it as BatchDependent)."""
    if not is_batch_dim(index) or not is_batch_dim(n):
        return index
    offset = index - n
    if not is_batch_dim(offset):
        return TO_THE_END if offset >= 0 else int(offset)
    return -1 if index == (-1) % n else index   # n - 1 for every n >= 1


def _whole(sizes, dims):
    """`sizes` of a window into an operand of `dims`, a symbolic size the operand's whole
    dim written -1 (the op takes it from its input); another symbolic size is refused."""
    out = []
    for i, (k, n) in enumerate(zip(sizes, dims)):
        if is_batch_dim(k) and not same_dim(k, n):
            raise BatchDependent(f"size {k} of dim {i} is not the operand's whole dim {n}")
        out.append(-1 if is_batch_dim(k) else k)
    return out


@RULES.rule("dynamic_slice")
def dynamic_slice(t, x, *starts, slice_sizes, in_types):
    return t.call("dynamic_slice", x, list(starts),
                  sizes=_whole(slice_sizes, in_types[0].shape))


@RULES.rule("dynamic_update_slice")
def dynamic_update_slice(t, x, update, *starts, in_types):
    _whole(in_types[1].shape, in_types[0].shape)   # the update's gradient slices it so
    return t.call("dynamic_update_slice", x, update, list(starts))


@RULES.rule("select_n")
def select_n(t, which, *cases):
    if len(cases) == 2 and _kind(t, which) == "bool":
        return t.call("where", which, cases[1], cases[0])
    return t.call("select_n", which, list(cases))


@RULES.rule("dim_as_value")
def dim_as_value(t, *, dim, out_types):
    counted = t.counted(dim)
    if counted is None:
        raise BatchDependent(f"the size {dim} as a value")
    ref, factor, offset = counted
    dtype = dtypes.name_of(out_types[0].dtype)
    size = t.call("dim_size", ref, axis=0, multiplier=factor, dtype=dtype)
    if offset:
        size = t.call("add", size, t.constant(np.asarray(offset, dtypes.to_numpy(dtype))))
    return size


@RULES.rule("iota")
def iota(t, *, shape, dtype, dimension):
    dtype = dtypes.name_of(dtype)
    batched = [i for i, d in enumerate(shape) if is_batch_dim(d)]
    if not batched:
        return t.call("iota", shape=list(shape), dtype=dtype, dimension=dimension)
    ref = t.feed_with_leading(shape[batched[0]])
    if ref is None or any(shape[i] != shape[batched[0]] for i in batched):
        raise BatchDependent(f"an iota of shape {tuple(map(str, shape))}")
    if dimension in batched:   # counts along the batch dim: a running sum of ones, less one
        one = t.constant(np.ones((), dtypes.to_numpy(dtype)))
        ones = t.call("broadcast_in_dim", one, ref, shape=[-1], broadcast_dimensions=[])
        counts = t.call("scale", t.call("cumsum", ones, axis=0), bias=-1.0)
        kept = [dimension]
    else:   # the iota of the other dims, repeated along the batch dims (taken from the feed)
        kept = [i for i in range(len(shape)) if i not in batched]
        counts = t.call("iota", shape=[shape[i] for i in kept], dtype=dtype,
                        dimension=kept.index(dimension))
    return t.call("broadcast_in_dim", counts, ref, shape=_batch_free(shape),
                  broadcast_dimensions=kept)


_MODES = {"CLIP": "clip", "FILL_OR_DROP": "fill", "PROMISE_IN_BOUNDS": "promise_in_bounds"}


def _mode(mode):
    """The out-of-bounds mode of a gather or scatter, as our ops name it."""
    ours = _MODES.get(getattr(mode, "name", str(mode)))
    if ours is None:
        raise Unsupported(f"mode {mode}")
    return ours


@RULES.rule("gather")
def gather(t, x, indices, *, dimension_numbers, slice_sizes, mode, fill_value=None,
           in_types):
    dn = dimension_numbers
    return t.call("gather_general", x, indices, offset_dims=list(dn.offset_dims),
                  collapsed_slice_dims=list(dn.collapsed_slice_dims),
                  start_index_map=list(dn.start_index_map),
                  operand_batching_dims=list(dn.operand_batching_dims),
                  start_indices_batching_dims=list(dn.start_indices_batching_dims),
                  slice_sizes=[-1 if is_batch_dim(s) and same_dim(s, n) else s for s, n in
                               zip(slice_sizes, in_types[0].shape)],
                  mode=_mode(mode),
                  fill_value=float("nan") if fill_value is None else float(fill_value))


@RULES.rule("pad")
def pad(t, x, padding_value, *, padding_config):
    return t.call("pad", x, padding_value,
                  padding_config=[int(v) for c in padding_config for v in c])


@RULES.rule("rev")
def rev(t, x, *, dimensions):
    return t.call("rev", x, dimensions=list(dimensions))


@RULES.rule("scatter-add")
def scatter_add(t, x, indices, updates, *, dimension_numbers, mode):
    dn = dimension_numbers
    return t.call("scatter_add_general", x, indices, updates,
                  update_window_dims=list(dn.update_window_dims),
                  inserted_window_dims=list(dn.inserted_window_dims),
                  scatter_dims_to_operand_dims=list(dn.scatter_dims_to_operand_dims),
                  operand_batching_dims=list(dn.operand_batching_dims),
                  scatter_indices_batching_dims=list(dn.scatter_indices_batching_dims),
                  mode=_mode(mode))


# --- reductions ---

def _reduction(op_type):
    def reduce(t, x, *, axes):
        return t.call(op_type, x, axis=list(axes), keep_dim=False)
    return reduce


for _prim in ("reduce_sum", "reduce_max", "reduce_min", "reduce_prod"):
    RULES.rule(_prim)(_reduction(_prim))
del _prim


def _logical_reduction(op_type):
    def reduce(t, x, *, axes):
        if _kind(t, x) != "bool":
            raise Unsupported("bitwise reductions of integers")
        return t.call(op_type, x, axis=list(axes), keep_dim=False)
    return reduce


RULES.rule("reduce_and")(_logical_reduction("reduce_all"))
RULES.rule("reduce_or")(_logical_reduction("reduce_any"))


def _arg_extreme(op_type):
    def arg_extreme(t, x, *, axes, index_dtype):
        (axis,) = axes
        return t.call(op_type, x, axis=axis, keep_dim=False, dtype=dtypes.name_of(index_dtype))
    return arg_extreme


RULES.rule("argmax")(_arg_extreme("argmax"))
RULES.rule("argmin")(_arg_extreme("argmin"))


@RULES.rule("top_k")
def top_k(t, x, *, k, axis=-1, out_types):
    values, indices = t.call("top_k", x, k=k, axis=axis)
    want = dtypes.name_of(out_types[1].dtype)
    return values, indices if t.var(indices)[1] == want else t.call("cast", indices, dtype=want)


@RULES.rule("cumsum")
def cumsum(t, x, *, axis, reverse):
    return t.call("cumsum", x, axis=axis, reverse=reverse)


def _reduce_window(computation):
    def reduce_window(t, x, *, window_dimensions, window_strides, padding, base_dilation,
                      window_dilation):
        return t.call("reduce_window", x, computation=computation,
                      window_dimensions=list(window_dimensions),
                      window_strides=list(window_strides),
                      padding=[int(v) for pair in padding for v in pair],
                      base_dilation=list(base_dilation), window_dilation=list(window_dilation))
    return reduce_window


for _computation in ("sum", "max", "min"):
    RULES.rule(f"reduce_window_{_computation}")(_reduce_window(_computation))
del _computation


# --- products ---

def _preferred(t, xs, preferred_element_type):
    """The operands cast to the equation's preferred element type, where it differs."""
    if preferred_element_type is None:
        return xs
    want = dtypes.name_of(preferred_element_type)
    return [x if t.var(x)[1] == want else t.call("cast", x, dtype=want) for x in xs]


@RULES.rule("dot_general")
def dot_general(t, x, y, *, dimension_numbers, preferred_element_type=None):
    (lc, rc), (lb, rb) = dimension_numbers
    x, y = _preferred(t, [x, y], preferred_element_type)
    return t.call("dot_general", x, y, lhs_contracting=list(lc), rhs_contracting=list(rc),
                  lhs_batch=list(lb), rhs_batch=list(rb))


@RULES.rule("conv_general_dilated")
def conv_general_dilated(t, x, w, *, window_strides, padding, lhs_dilation, rhs_dilation,
                         dimension_numbers, feature_group_count, batch_group_count,
                         preferred_element_type=None):
    dn = dimension_numbers
    x, w = _preferred(t, [x, w], preferred_element_type)
    return t.call("conv_general_dilated", x, w, window_strides=list(window_strides),
                  padding=[int(v) for pair in padding for v in pair],
                  lhs_dilation=list(lhs_dilation), rhs_dilation=list(rhs_dilation),
                  lhs_spec=list(dn.lhs_spec), rhs_spec=list(dn.rhs_spec),
                  out_spec=list(dn.out_spec), feature_group_count=feature_group_count,
                  batch_group_count=batch_group_count)


# --- calls, inlined ---

def _arity(body):
    return len(getattr(body, "jaxpr", body).invars)


@RULES.rule("jit", "closed_call", "core_call", "remat2", "custom_vjp_call")
def call(t, *operands, jaxpr=None, call_jaxpr=None, fun_jaxpr=None):
    body = next(b for b in (jaxpr, call_jaxpr, fun_jaxpr) if b is not None)
    return t.inline(body, operands[len(operands) - _arity(body):])


# jax.nn functions with a custom JVP that one of our ops implements, gradient included
_CUSTOM_JVP_OPS = {"relu": "relu"}
from progdesc.jax_compat import JAX_NN_SOURCE as _JAX_NN   # noqa: E402  (a JAX internal)


@RULES.rule("custom_jvp_call")
def custom_jvp_call(t, *operands, call_jaxpr):
    info = call_jaxpr.jaxpr.debug_info
    op_type = _CUSTOM_JVP_OPS.get(info.func_name)
    if (op_type is not None and _JAX_NN in (info.func_src_info or "").replace("\\", "/")
            and len(operands) == 1 and _kind(t, operands[0]) == "float"):
        return t.call(op_type, *operands)
    return t.inline(call_jaxpr, operands[len(operands) - _arity(call_jaxpr):])


# --- control flow, through the builders of progdesc.control_flow ---

def _vars(t, names):
    return tuple(t.block.var(n) for n in names)


@RULES.rule("cond")
def cond(t, index, *operands, branches):
    out = switch(t.block.var(index),
                 [lambda body=body: t.sub_block(body, operands) for body in branches])
    t.tag_last_op()
    return [v.name for v in out]


def scan_counts(num_consts, num_carry, ft_in):
    """(consts, carried values) a `scan` equation's operands begin with: JAX up to 0.10
    gives the counts as parameters, JAX 0.11 as the flat tree `ft_in` of (consts, carry,
    xs)."""
    if num_consts is not None and num_carry is not None:
        return num_consts, num_carry
    if ft_in is None:
        raise Unsupported("a scan with neither num_consts/num_carry nor ft_in")
    consts, carry, _ = ft_in.unpack()
    return len(consts), len(carry)


@RULES.rule("scan")
def scan_(t, *operands, jaxpr, length, reverse, num_consts=None, num_carry=None, ft_in=None):
    num_consts, num_carry = scan_counts(num_consts, num_carry, ft_in)
    consts = operands[:num_consts]
    init = operands[num_consts:num_consts + num_carry]
    xs = operands[num_consts + num_carry:]

    def step(carry, x):
        outs = t.sub_block(jaxpr, [*consts, *(v.name for v in carry), *(v.name for v in x)])
        return outs[:num_carry], outs[num_carry:]
    carry, ys = scan(step, _vars(t, init), _vars(t, xs), reverse=reverse,
                     length=None if xs and is_batch_dim(length) else length)   # xs' length
    t.tag_last_op()
    return [v.name for v in (*carry, *ys)]


@RULES.rule("while")
def while_(t, *operands, cond_jaxpr, body_jaxpr, cond_nconsts, body_nconsts):
    cond_consts = operands[:cond_nconsts]
    body_consts = operands[cond_nconsts:cond_nconsts + body_nconsts]
    out = while_loop(
        lambda *carry: t.sub_block(cond_jaxpr, [*cond_consts, *(v.name for v in carry)])[0],
        lambda *carry: t.sub_block(body_jaxpr, [*body_consts, *(v.name for v in carry)]),
        _vars(t, operands[cond_nconsts + body_nconsts:]))
    t.tag_last_op()
    return [v.name for v in out]


# --- issue 24: the missing primitives (tan, exp2, atan2, integer div above, ...) ---

for _prim in ("tan", "exp2", "atan2", "asin", "acos", "atan", "sinh", "cosh", "asinh",
              "acosh", "atanh", "cbrt", "ceil", "lgamma", "digamma"):
    RULES.rename(_prim, _prim)
del _prim


def _cumulative(op_type):
    def cumulative(t, x, *, axis, reverse):
        return t.call(op_type, x, axis=axis, reverse=reverse)
    return cumulative


for _prim in ("cumprod", "cummax", "cummin"):
    RULES.rule(_prim)(_cumulative(_prim))
del _prim


@RULES.rule("sort")
def sort(t, *operands, dimension, is_stable, num_keys):
    outs, _ = t.call("sort", list(operands), axis=dimension, num_keys=num_keys,
                     is_stable=is_stable)
    return outs


def _scatter(computation):
    def scatter(t, x, indices, updates, *, dimension_numbers, mode, indices_are_sorted=False,
                unique_indices=False):
        dn = dimension_numbers
        return t.call("scatter_general", x, indices, updates, computation=computation,
                      update_window_dims=list(dn.update_window_dims),
                      inserted_window_dims=list(dn.inserted_window_dims),
                      scatter_dims_to_operand_dims=list(dn.scatter_dims_to_operand_dims),
                      operand_batching_dims=list(dn.operand_batching_dims),
                      scatter_indices_batching_dims=list(dn.scatter_indices_batching_dims),
                      mode=_mode(mode), indices_are_sorted=bool(indices_are_sorted),
                      unique_indices=bool(unique_indices))
    return scatter


for _prim, _computation in (("scatter", "set"), ("scatter-mul", "mul"),
                            ("scatter-min", "min"), ("scatter-max", "max")):
    RULES.rule(_prim)(_scatter(_computation))
del _prim, _computation
RULES.alias("scatter_mul", "scatter-mul")
RULES.alias("scatter_min", "scatter-min")
RULES.alias("scatter_max", "scatter-max")



@RULES.rule("round")
def round_(t, x, *, rounding_method):
    method = getattr(rounding_method, "name", str(rounding_method)).lower()
    return t.call("round", x, rounding_method=method)


@RULES.rule("tile")
def tile(t, x, *, reps):
    return t.call("tile", x, reps=list(reps))
