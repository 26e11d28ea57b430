"""The translation table of `from_jax`: JAX primitive name -> a rule appending our ops.

A rule is `rule(t, eqn, *ins)`: `t` is the `Translator` (`t.call(op_type, *inputs,
**attrs)` appends an op and returns its output names, `t.constant(array)` gives a
variable holding an array, `t.inline(jaxpr, ins)` translates a nested jaxpr), `eqn`
the equation (its `params`, `outvars` avals), `ins` the names of its operands. It
returns the names of the equation's results, or raises `Unsupported` for parameters
it cannot translate.
"""
from jax import export

from lowering import dtypes
from progdesc.control_flow import scan, switch, while_loop

RULES = {}


class Unsupported(Exception):
    """Raised by a rule for parameters it cannot translate; the message says which."""


class BatchDependent(Unsupported):
    """Raised for a size that depends on the symbolic batch dim in a way no op of ours
    can compute from its inputs."""


def is_batch_dim(d):
    """Whether a dim of a traced shape is symbolic (the batch dim, or an expression of it)."""
    return export.is_symbolic_dim(d)


def _same_dim(a, b):
    """Whether two dims of traced shapes are equal (symbolic ones compared as expressions)."""
    return is_batch_dim(a) == is_batch_dim(b) and a == b


def _batch_free(dims):
    """`dims` with each symbolic dim written -1 (a size the op takes from its input)."""
    return [-1 if is_batch_dim(d) else d for d in dims]


def rule(*names):
    """Decorator: register a rule under the primitive names `names`."""
    def register(fn):
        for name in names:
            RULES[name] = fn
        return fn
    return register


def _same(op_type):
    """A rule passing the operands straight to `op_type`."""
    return lambda t, eqn, *ins: t.call(op_type, *ins)


_ELEMENTWISE = {
    "add": "add", "sub": "sub", "mul": "mul", "max": "maximum", "min": "minimum",
    "pow": "pow", "neg": "neg", "abs": "abs", "exp": "exp", "log": "log", "sqrt": "sqrt",
    "rsqrt": "rsqrt", "square": "square", "tanh": "tanh", "logistic": "sigmoid",
    "erf": "erf", "erfc": "erfc", "sin": "sin", "cos": "cos", "log1p": "log1p",
    "expm1": "expm1", "sign": "sign", "floor": "floor", "is_finite": "is_finite",
    "rem": "rem", "copy": "assign", "copy_p": "assign",
    "eq": "equal", "ne": "not_equal", "lt": "less_than", "le": "less_equal",
    "gt": "greater_than", "ge": "greater_equal",
}
for _prim, _op in _ELEMENTWISE.items():
    RULES[_prim] = _same(_op)


def _kind(t, name):
    return dtypes.kind_of(t.var(name)[1])


@rule("div")
def _div(t, eqn, x, y):
    if _kind(t, x) != "float":
        raise Unsupported("integer division rounds toward zero; only float division is "
                          "translated")
    return t.call("div", x, y)


@rule("and", "or", "not")
def _logical(t, eqn, *ins):
    if any(_kind(t, x) != "bool" for x in ins):
        raise Unsupported("bitwise operations on integers")
    return t.call(f"logical_{eqn.primitive.name}", *ins)


@rule("stop_gradient")
def _stop_gradient(t, eqn, x):
    out = t.call("assign", x)
    t.block.var(out).stop_gradient = True
    return out


@rule("integer_pow")
def _integer_pow(t, eqn, x):
    return t.call("integer_pow", x, y=eqn.params["y"])


@rule("convert_element_type")
def _convert(t, eqn, x):
    dtype = dtypes.name_of(eqn.params["new_dtype"])
    return x if t.var(x)[1] == dtype else t.call("cast", x, dtype=dtype)


@rule("clamp")
def _clamp(t, eqn, low, x, high):
    return t.call("minimum", t.call("maximum", x, low), high)


# --- shapes ---

@rule("reshape")
def _reshape(t, eqn, x, *dynamic):
    if eqn.params.get("dimensions") is not None or dynamic:
        raise Unsupported("a reshape that transposes or has dynamic sizes")
    sizes = eqn.params["new_sizes"]
    if sum(map(is_batch_dim, sizes)) > 1:   # one -1 is inferred; two are not
        raise BatchDependent(f"new sizes {tuple(map(str, sizes))} hold two batch-dependent "
                             "dims")
    return t.call("reshape", x, shape=_batch_free(sizes))


@rule("broadcast_in_dim")
def _broadcast_in_dim(t, eqn, x, *dynamic):
    if dynamic:
        raise Unsupported("dynamic shapes")
    shape, mapped = eqn.params["shape"], eqn.params["broadcast_dimensions"]
    source = dict(zip(mapped, eqn.invars[0].aval.shape))
    ref, batch = t.batch_ref
    like = None
    for i, d in enumerate(shape):   # a -1 takes the operand's dim mapped there, else Like's
        if not is_batch_dim(d):
            continue
        if i not in source and _same_dim(d, batch):
            like = ref   # the batch dim of a feed
        elif i not in source or not _same_dim(source[i], d):
            raise BatchDependent(f"broadcasts to size {d}, which neither the operand "
                                 f"{eqn.invars[0].aval.str_short()} nor a feed has there")
    return t.call("broadcast_in_dim", x, like, shape=_batch_free(shape),
                  broadcast_dimensions=list(mapped))


@rule("transpose")
def _transpose(t, eqn, x):
    return t.call("transpose", x, perm=list(eqn.params["permutation"]))


@rule("squeeze")
def _squeeze(t, eqn, x):
    return t.call("squeeze", x, axes=list(eqn.params["dimensions"]))


@rule("expand_dims")
def _expand_dims(t, eqn, x):
    return t.call("unsqueeze", x, axes=list(eqn.params["dimensions"]))


@rule("concatenate")
def _concatenate(t, eqn, *xs):
    return t.call("concat", list(xs), axis=eqn.params["dimension"])


@rule("split")
def _split(t, eqn, x):
    return t.call("split", x, sections=list(eqn.params["sizes"]), axis=eqn.params["axis"])


@rule("slice")
def _slice(t, eqn, x):
    p = eqn.params
    starts, limits, dims = p["start_indices"], p["limit_indices"], eqn.invars[0].aval.shape
    strides = p["strides"] or (1,) * len(dims)
    axes = [a for a in range(len(dims))   # an axis taken whole (a batch dim) is left out
            if (starts[a], strides[a]) != (0, 1) or not _same_dim(limits[a], dims[a])]
    return t.call("slice", x, axes=axes, starts=[starts[a] for a in axes],
                  ends=[limits[a] for a in axes], strides=[strides[a] for a in axes])


@rule("dynamic_slice")
def _dynamic_slice(t, eqn, x, *starts):
    return t.call("dynamic_slice", x, list(starts), sizes=list(eqn.params["slice_sizes"]))


@rule("dynamic_update_slice")
def _dynamic_update_slice(t, eqn, x, update, *starts):
    return t.call("dynamic_update_slice", x, update, list(starts))


@rule("select_n")
def _select_n(t, eqn, which, *cases):
    if len(cases) == 2 and _kind(t, which) == "bool":
        return t.call("where", which, cases[1], cases[0])
    return t.call("select_n", which, list(cases))


@rule("dim_as_value")
def _dim_as_value(t, eqn):
    dim, dtype = eqn.params["dim"], dtypes.name_of(eqn.outvars[0].aval.dtype)
    ref, batch = t.batch_ref
    factor = dim // batch if ref is not None else None
    if factor is None or is_batch_dim(factor) or factor * batch != dim:
        raise BatchDependent(f"the size {dim} as a value")
    return t.call("dim_size", ref, axis=0, multiplier=int(factor), dtype=dtype)


@rule("iota")
def _iota(t, eqn):
    p = eqn.params
    return t.call("iota", shape=list(p["shape"]), dtype=dtypes.name_of(p["dtype"]),
                  dimension=p["dimension"])


_MODES = {"CLIP": "clip", "FILL_OR_DROP": "fill", "PROMISE_IN_BOUNDS": "promise_in_bounds"}


def _mode(eqn):
    """The out-of-bounds mode of a gather or scatter, as our ops name it."""
    mode = _MODES.get(getattr(eqn.params["mode"], "name", str(eqn.params["mode"])))
    if mode is None:
        raise Unsupported(f"mode {eqn.params['mode']}")
    return mode


@rule("gather")
def _gather(t, eqn, x, indices):
    p = eqn.params
    dn = p["dimension_numbers"]
    fill = p.get("fill_value")
    return t.call("gather_general", x, indices, offset_dims=list(dn.offset_dims),
                  collapsed_slice_dims=list(dn.collapsed_slice_dims),
                  start_index_map=list(dn.start_index_map),
                  operand_batching_dims=list(dn.operand_batching_dims),
                  start_indices_batching_dims=list(dn.start_indices_batching_dims),
                  slice_sizes=[-1 if is_batch_dim(s) and _same_dim(s, n) else s for s, n in
                               zip(p["slice_sizes"], eqn.invars[0].aval.shape)],
                  mode=_mode(eqn),
                  fill_value=float("nan") if fill is None else float(fill))


@rule("pad")
def _pad(t, eqn, x, padding_value):
    return t.call("pad", x, padding_value,
                  padding_config=[int(v) for c in eqn.params["padding_config"] for v in c])


@rule("rev")
def _rev(t, eqn, x):
    return t.call("rev", x, dimensions=list(eqn.params["dimensions"]))


@rule("scatter-add", "scatter_add")
def _scatter_add(t, eqn, x, indices, updates):
    dn = eqn.params["dimension_numbers"]
    return t.call("scatter_add_general", x, indices, updates,
                  update_window_dims=list(dn.update_window_dims),
                  inserted_window_dims=list(dn.inserted_window_dims),
                  scatter_dims_to_operand_dims=list(dn.scatter_dims_to_operand_dims),
                  operand_batching_dims=list(dn.operand_batching_dims),
                  scatter_indices_batching_dims=list(dn.scatter_indices_batching_dims),
                  mode=_mode(eqn))


# --- reductions ---

for _prim in ("reduce_sum", "reduce_max", "reduce_min", "reduce_prod"):
    RULES[_prim] = (lambda op_type: lambda t, eqn, x: t.call(
        op_type, x, axis=list(eqn.params["axes"]), keep_dim=False))(_prim)


@rule("reduce_and", "reduce_or")
def _reduce_logical(t, eqn, x):
    if _kind(t, x) != "bool":
        raise Unsupported("bitwise reductions of integers")
    op_type = "reduce_all" if eqn.primitive.name == "reduce_and" else "reduce_any"
    return t.call(op_type, x, axis=list(eqn.params["axes"]), keep_dim=False)


@rule("argmax", "argmin")
def _arg_extreme(t, eqn, x):
    (axis,) = eqn.params["axes"]
    return t.call(eqn.primitive.name, x, axis=axis, keep_dim=False,
                  dtype=dtypes.name_of(eqn.params["index_dtype"]))


@rule("top_k")
def _top_k(t, eqn, x):
    values, indices = t.call("top_k", x, k=eqn.params["k"], axis=eqn.params.get("axis", -1))
    want = dtypes.name_of(eqn.outvars[1].aval.dtype)
    return values, indices if t.var(indices)[1] == want else t.call("cast", indices, dtype=want)


@rule("cumsum")
def _cumsum(t, eqn, x):
    return t.call("cumsum", x, axis=eqn.params["axis"], reverse=eqn.params["reverse"])


@rule("reduce_window_sum", "reduce_window_max", "reduce_window_min")
def _reduce_window(t, eqn, x):
    p = eqn.params
    return t.call("reduce_window", x, computation=eqn.primitive.name.rsplit("_", 1)[1],
                  window_dimensions=list(p["window_dimensions"]),
                  window_strides=list(p["window_strides"]),
                  padding=[int(v) for pair in p["padding"] for v in pair],
                  base_dilation=list(p["base_dilation"]),
                  window_dilation=list(p["window_dilation"]))


# --- products ---

def _preferred(t, eqn, xs):
    """The operands cast to the equation's preferred element type, where it differs."""
    want = eqn.params.get("preferred_element_type")
    if want is None:
        return xs
    want = dtypes.name_of(want)
    return [x if t.var(x)[1] == want else t.call("cast", x, dtype=want) for x in xs]


@rule("dot_general")
def _dot_general(t, eqn, x, y):
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    x, y = _preferred(t, eqn, [x, y])
    return t.call("dot_general", x, y, lhs_contracting=list(lc), rhs_contracting=list(rc),
                  lhs_batch=list(lb), rhs_batch=list(rb))


@rule("conv_general_dilated")
def _conv(t, eqn, x, w):
    p = eqn.params
    dn = p["dimension_numbers"]
    x, w = _preferred(t, eqn, [x, w])
    return t.call("conv_general_dilated", x, w, window_strides=list(p["window_strides"]),
                  padding=[int(v) for pair in p["padding"] for v in pair],
                  lhs_dilation=list(p["lhs_dilation"]), rhs_dilation=list(p["rhs_dilation"]),
                  lhs_spec=list(dn.lhs_spec), rhs_spec=list(dn.rhs_spec),
                  out_spec=list(dn.out_spec), feature_group_count=p["feature_group_count"],
                  batch_group_count=p["batch_group_count"])


# --- calls, inlined ---

@rule("jit", "pjit", "closed_call", "core_call", "remat2", "checkpoint", "custom_vjp_call",
      "custom_vjp_call_jaxpr")
def _inline(t, eqn, *ins):
    body = next(eqn.params[k] for k in ("jaxpr", "call_jaxpr", "fun_jaxpr") if k in eqn.params)
    return t.inline(body, ins[len(ins) - _arity(body):])


# jax.nn functions with a custom JVP that one of our ops implements, gradient included
_CUSTOM_JVP_OPS = {"relu": "relu"}
from progdesc.jax_compat import JAX_NN_SOURCE as _JAX_NN   # noqa: E402  (a JAX internal)


@rule("custom_jvp_call")
def _custom_jvp(t, eqn, *ins):
    body = eqn.params["call_jaxpr"]
    info = body.jaxpr.debug_info
    op_type = _CUSTOM_JVP_OPS.get(info.func_name)
    if (op_type is not None and _JAX_NN in (info.func_src_info or "").replace("\\", "/")
            and len(ins) == 1 and _kind(t, ins[0]) == "float"):
        return t.call(op_type, *ins)
    return t.inline(body, ins[len(ins) - _arity(body):])


def _arity(body):
    jaxpr = getattr(body, "jaxpr", body)
    return len(jaxpr.invars)


# --- control flow, through the builders of progdesc.control_flow ---

def _vars(t, names):
    return tuple(t.block.var(n) for n in names)


@rule("cond")
def _cond(t, eqn, index, *operands):
    branches = [lambda body=body: t.sub_block(body, operands) for body in eqn.params["branches"]]
    out = switch(t.block.var(index), branches)
    t.tag_last_op()
    return [v.name for v in out]


@rule("scan")
def _scan(t, eqn, *operands):
    p = eqn.params
    consts = operands[:p["num_consts"]]
    init = operands[p["num_consts"]:p["num_consts"] + p["num_carry"]]
    xs = operands[p["num_consts"] + p["num_carry"]:]

    def step(carry, x):
        outs = t.sub_block(p["jaxpr"], [*consts, *(v.name for v in carry),
                                        *(v.name for v in x)])
        return outs[:p["num_carry"]], outs[p["num_carry"]:]
    length = None if xs and is_batch_dim(p["length"]) else p["length"]   # xs' length
    carry, ys = scan(step, _vars(t, init), _vars(t, xs), length=length,
                     reverse=p["reverse"])
    t.tag_last_op()
    return [v.name for v in (*carry, *ys)]


@rule("while")
def _while(t, eqn, *operands):
    p = eqn.params
    cond_consts = operands[:p["cond_nconsts"]]
    body_consts = operands[p["cond_nconsts"]:p["cond_nconsts"] + p["body_nconsts"]]
    init = operands[p["cond_nconsts"] + p["body_nconsts"]:]
    out = while_loop(
        lambda *carry: t.sub_block(p["cond_jaxpr"], [*cond_consts, *(v.name for v in carry)])[0],
        lambda *carry: t.sub_block(p["body_jaxpr"], [*body_consts, *(v.name for v in carry)]),
        _vars(t, init))
    t.tag_last_op()
    return [v.name for v in out]


del _prim, _op
