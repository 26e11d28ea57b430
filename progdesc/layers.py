"""Layers: compositions of registered ops that create their own parameters (seed 003).

`fc = add(matmul(x, W), b)`: every layer appends ordinary ops to the current
block, and declares its parameters (named `<layer>_<n>.w_0`, `.b_0`, ...) in
the main and startup programs with their initializer ops in the startup one.
The layer's result is `<layer>_<n>.out` (`fc_1.out`), its intermediate
values `<layer>_<n>.<op>_<k>.out`. `param_attr` / `bias_attr` take a
ParamAttr, a name, an Initializer, or False for no bias.
"""
import contextlib
import dataclasses
import inspect
import math
import numbers

from lowering.errors import ProgramError
from progdesc import control_flow
from progdesc import initializer as init
from progdesc import ops
from progdesc.activations import activation_op
from progdesc.callsites import user_callsite
from progdesc.distributed import tensor_parallel as tp
from progdesc.framework import append_whole, default_main_program
from progdesc.param import ParamAttr, create_global_var, create_parameter


@contextlib.contextmanager
def _layer(kind, name):
    """Build one layer: yields its prefix (`name`, else 'fc_0', 'fc_1', ... for kind 'fc',
    inside another layer 'multi_head_attention_0.dropout_0'); the ops appended inside are
    named after it."""
    with default_main_program().layer_scope(kind, name) as prefix:
        yield prefix


def _output(var, prefix):
    """`var`, the result of the layer's last op, renamed '<prefix>.out'."""
    var.block.rename_output(var, prefix)
    return var


def _param(prefix, suffix, shape, attr, default_init, dtype="float32"):
    attr = ParamAttr.of(attr)
    if attr.name is None:
        attr = dataclasses.replace(attr, name=f"{prefix}.{suffix}")
    return create_parameter(shape, dtype, attr=attr, default_initializer=default_init)


def _known(dims, what, var):
    if any(d < 0 for d in dims):
        raise ProgramError(f"{what} must be known when the layer is built, got {list(dims)}",
                           var=var.name, callsite=user_callsite())
    return dims


def _positive_ints(layer, **sizes):
    """ProgramError naming the user's line unless each of `sizes` (an int, or a list of
    them) is a positive int: a size of 2.5 or 0 would build a wrong or empty layer."""
    for arg, value in sizes.items():
        for v in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v <= 0:
                raise ProgramError(f"{layer}'s {arg} must be a positive int (or ints), got "
                                   f"{value!r}", callsite=user_callsite())


def _pair(v):
    return list(v) if isinstance(v, (list, tuple)) else [v, v]


def fc(input, size, num_flatten_dims=1, param_attr=None, bias_attr=None, act=None, name=None,
       tensor_parallel=None):
    """Fully connected layer: act(flatten(input) @ W + b).

    Dims of `input` from `num_flatten_dims` on are flattened into the
    feature dim; the leading ones are kept (so a [B, T, D] input with
    num_flatten_dims=2 gives [B, T, size]). `tensor_parallel` ("column" or "row")
    splits W over the mesh axis "model" (progdesc/distributed/tensor_parallel.py): a
    "column" fc's output is split over the axis, and feeds a "row" fc, whose output is
    whole again.
    """
    tp.check_mode("fc", tensor_parallel, tp.FC_MODES)
    return _fc(input, size, num_flatten_dims, param_attr, bias_attr, act, name,
               tensor_parallel, enter=True)


def _fc(input, size, num_flatten_dims, param_attr, bias_attr, act, name, tensor_parallel,
        enter):
    """fc; a column-parallel one without its `c_identity` unless `enter` (a layer that
    projects one input several times enters it once)."""
    _positive_ints("fc", size=size, num_flatten_dims=num_flatten_dims)
    activation = activation_op(act, "fc")
    features = _known(input.shape[num_flatten_dims:], "feature dims of fc's input", input)
    in_features = math.prod(features)
    if tensor_parallel == "row" and len(input.shape) != num_flatten_dims + 1:
        raise ProgramError("a row-parallel fc takes the split features of a column-parallel "
                           "one in its last dim: give it num_flatten_dims = rank - 1",
                           var=input.name, callsite=user_callsite())
    if tensor_parallel == "column":
        tp.check_column_act(act)
        param_attr = tp.split_attr(param_attr, tp.column_spec(), "fc")
        bias_attr = tp.split_attr(bias_attr, (tp.MODEL_AXIS,), "fc")
    elif tensor_parallel == "row":
        param_attr = tp.split_attr(param_attr, tp.row_spec(), "fc")
    with _layer("fc", name) as prefix:
        x = input
        if len(input.shape) != num_flatten_dims + 1:
            x = ops.reshape(input, shape=[0] * num_flatten_dims + [in_features])
        if tensor_parallel == "column" and enter:
            x = tp.enter(x)
        w = _param(prefix, "w_0", [in_features, size], param_attr, init.XavierUniform(),
                   input.dtype)
        out = ops.matmul(x, w)
        if tensor_parallel == "row":
            out = tp.join_partial(out)
        if bias_attr is not False:
            b = _param(prefix, "b_0", [size], bias_attr, init.Constant(0.0), input.dtype)
            out = ops.add(out, b)
        return _output(activation(out), prefix)


def conv2d(input, num_filters, filter_size, stride=1, padding=0, dilation=1, groups=1,
           param_attr=None, bias_attr=None, act=None, name=None):
    """2-D convolution over NCHW input with a [num_filters, C/groups, kh, kw] filter."""
    _positive_ints("conv2d", num_filters=num_filters, filter_size=filter_size, stride=stride,
                   dilation=dilation, groups=groups)
    activation = activation_op(act, "conv2d")
    channels = _known(input.shape[1:2], "input channels of conv2d", input)[0]
    if channels % groups:
        raise ProgramError(f"{channels} input channels do not split into {groups} groups",
                           var=input.name, callsite=user_callsite())
    kh, kw = _pair(filter_size)
    with _layer("conv2d", name) as prefix:
        w = _param(prefix, "w_0", [num_filters, channels // groups, kh, kw], param_attr,
                   init.KaimingNormal(in_axis=1, out_axis=0), input.dtype)
        out = ops.conv2d(input, w, strides=_pair(stride), paddings=_pair(padding),
                         dilations=_pair(dilation), groups=groups)
        if bias_attr is not False:
            b = _param(prefix, "b_0", [num_filters], bias_attr, init.Constant(0.0), input.dtype)
            out = ops.add(out, ops.reshape(b, shape=[num_filters, 1, 1]))
        return _output(activation(out), prefix)


def pool2d(input, pool_size=2, pool_type="max", pool_stride=None, pool_padding=0,
           global_pooling=False, name=None):
    """Max or average pooling over NCHW input (stride defaults to the window size)."""
    stride = pool_size if pool_stride is None else pool_stride
    if not global_pooling:
        _positive_ints("pool2d", pool_size=pool_size, pool_stride=stride)
    with _layer("pool2d", name) as prefix:
        return _output(ops.pool2d(input, pooling_type=pool_type, ksize=_pair(pool_size),
                                  strides=_pair(stride), paddings=_pair(pool_padding),
                                  global_pooling=global_pooling), prefix)


def batch_norm(input, act=None, is_test=False, momentum=0.9, epsilon=1e-5, param_attr=None,
               bias_attr=None, name=None, sync_axis=""):
    """Batch normalization over dim 1; running mean/variance are persistable state.

    In training it normalizes with the batch statistics and updates the
    running ones; `is_test` (or `Program.clone(for_test=True)`) uses the
    running statistics. `sync_axis` (a mesh axis name, e.g. "data") makes the
    statistics those of the global batch in a data-parallel run.
    """
    activation = activation_op(act, "batch_norm")
    c = _known(input.shape[1:2], "channels of batch_norm's input", input)[0]
    with _layer("batch_norm", name) as prefix:
        scale = _param(prefix, "w_0", [c], param_attr, init.Constant(1.0), input.dtype)
        bias = _param(prefix, "b_0", [c], bias_attr, init.Constant(0.0), input.dtype)
        mean = create_global_var(f"{prefix}.w_1", [c], 0.0, input.dtype)
        variance = create_global_var(f"{prefix}.w_2", [c], 1.0, input.dtype)
        block = default_main_program().current_block()
        y = block.create_var(f"{prefix}.tmp_0", input.shape, input.dtype)
        attrs = {"momentum": momentum, "epsilon": epsilon, "is_test": is_test}
        if sync_axis:
            attrs["sync_axis"] = sync_axis
        block.append_op("batch_norm",
                        {"X": input, "Scale": scale, "Bias": bias, "Mean": mean,
                         "Variance": variance},
                        {"Y": y, "MeanOut": mean, "VarianceOut": variance}, attrs)
        return _output(activation(y), prefix)


def layer_norm(input, begin_norm_axis=1, epsilon=1e-5, param_attr=None, bias_attr=None,
               act=None, name=None):
    """Layer normalization over the dims from `begin_norm_axis` on, with scale and bias."""
    activation = activation_op(act, "layer_norm")
    size = math.prod(_known(input.shape[begin_norm_axis:], "normalized dims", input))
    with _layer("layer_norm", name) as prefix:
        inputs = {"X": input}
        if param_attr is not False:
            inputs["Scale"] = _param(prefix, "w_0", [size], param_attr, init.Constant(1.0),
                                     input.dtype)
        if bias_attr is not False:
            inputs["Bias"] = _param(prefix, "b_0", [size], bias_attr, init.Constant(0.0),
                                    input.dtype)
        block = default_main_program().current_block()
        y = block.create_var(f"{prefix}.tmp_0", input.shape, input.dtype)
        block.append_op("layer_norm", inputs, {"Y": y},
                        {"begin_norm_axis": begin_norm_axis, "epsilon": epsilon})
        return _output(activation(y), prefix)


def dropout(x, dropout_prob, is_test=False, dropout_implementation="upscale_in_train",
            name=None):
    """Zero each element with probability `dropout_prob` in training (identity in test)."""
    if dropout_prob == 0:
        return x
    with _layer("dropout", name) as prefix:
        out, _mask = ops.dropout(x, dropout_prob=float(dropout_prob), is_test=is_test,
                                 dropout_implementation=dropout_implementation)
        return _output(out, prefix)


def embedding(input, size, padding_idx=None, param_attr=None, name=None,
              tensor_parallel=None):
    """Rows of a [vocab, dim] table looked up by the integer ids in `input`.

    `tensor_parallel` splits the table over the mesh axis "model": "vocab" by rows (each
    device looks up the ids it holds, `mp_allreduce_sum` joins them; no padding_idx),
    "hidden" by columns (`c_concat` gathers the slices). The output is whole either way.
    """
    _positive_ints("embedding", size=size)
    tp.check_mode("embedding", tensor_parallel, tp.EMBEDDING_MODES)
    if tensor_parallel == "vocab" and padding_idx is not None:
        raise ProgramError("a vocab-parallel embedding takes no padding_idx",
                           var=input.name, callsite=user_callsite())
    if tensor_parallel:
        spec = (tp.MODEL_AXIS, None) if tensor_parallel == "vocab" else (None, tp.MODEL_AXIS)
        param_attr = tp.split_attr(param_attr, spec, "embedding")
    with _layer("embedding", name) as prefix:
        w = _param(prefix, "w_0", list(size), param_attr, init.Normal(0.0, 1.0))
        if tensor_parallel == "vocab":
            return _output(tp.vocab_lookup(w, input), prefix)
        out = ops.lookup_table(w, input, padding_idx=-1 if padding_idx is None else padding_idx)
        return _output(tp.gather(out) if tensor_parallel == "hidden" else out, prefix)


def _attention_with_dropout(q, k, v, causal, key_padding_mask, dropout_rate):
    """Attention over [B, T, N, H] heads, composed of ops, with dropout on its weights.

    Only training with attention dropout takes this path: the fused op never forms
    the weights that dropout would zero."""
    q, k, v = (ops.transpose(h, perm=[0, 2, 1, 3]) for h in (q, k, v))   # [B, N, T, H]
    scores = ops.matmul(q, k, transpose_y=True, alpha=1.0 / math.sqrt(q.shape[-1]))
    if causal:
        ones = ops.scale(ops.fill_zeros_like(scores), scale=1.0, bias=1.0)
        scores = ops.add(scores, ops.scale(ops.tril(ones), scale=1e9, bias=-1e9))
    if key_padding_mask is not None:
        keep = ops.cast(ops.cast(key_padding_mask, dtype="bool"), dtype=scores.dtype)
        scores = ops.add(scores, ops.reshape(ops.scale(keep, scale=1e9, bias=-1e9),
                                             shape=[0, 1, 1, -1]))
    weights = dropout(ops.softmax(scores), dropout_rate)
    return ops.transpose(ops.matmul(weights, v), perm=[0, 2, 1, 3])


def multi_head_attention(queries, keys=None, values=None, num_heads=1, d_model=None,
                         causal=False, key_padding_mask=None, dropout_rate=0.0, is_test=False,
                         param_attr=None, bias_attr=None, name=None, tensor_parallel=False):
    """Scaled dot-product attention over [B, T, D] inputs, with input and output projections.

    `causal` lets position t attend to positions <= t only;
    `key_padding_mask` [B, S] holds 1 (or True) for real keys and 0 for padding.
    Keys and values default to the queries (self-attention). The attention itself
    is one `scaled_dot_product_attention` op (`jax.nn.dot_product_attention`),
    except in training with `dropout_rate` > 0, where dropout on the attention
    weights needs them as a variable and ops compose it.
    """
    _positive_ints("multi_head_attention", num_heads=num_heads)
    tp.check_flag("multi_head_attention", tensor_parallel)
    keys = queries if keys is None else keys
    values = keys if values is None else values
    d_model = d_model or _known(queries.shape[-1:], "model dim", queries)[0]
    if d_model % num_heads:
        raise ProgramError(f"d_model {d_model} is not divisible by {num_heads} heads",
                           var=queries.name, callsite=user_callsite())
    head_dim = d_model // num_heads

    def tagged(attr, tag):   # one named ParamAttr serves four projections: suffix the name
        if attr is False or not (attr := ParamAttr.of(attr)).name:
            return attr
        return dataclasses.replace(attr, name=f"{attr.name}.{tag}")

    split = "column" if tensor_parallel else None
    local_heads = -1 if tensor_parallel else num_heads   # a device holds n / axis size heads
    with _layer("multi_head_attention", name) as prefix:
        def proj(x, tag, split=None):
            return _fc(x, d_model, 2, tagged(param_attr, tag), tagged(bias_attr, tag), None,
                       f"{prefix}.{tag}", split, enter=False)

        entered = {}   # each distinct input enters the split layer once

        def heads(x, tag):   # [B, T, D] -> [B, T, N, H]
            if tensor_parallel and x.name not in entered:
                entered[x.name] = tp.enter(x)
            x = entered.get(x.name, x)
            out = ops.reshape(proj(x, tag, split), shape=[0, 0, local_heads, head_dim])
            if tensor_parallel:
                tp.mark_heads(out, num_heads)
            return out

        q, k, v = heads(queries, "query"), heads(keys, "key"), heads(values, "value")
        if dropout_rate and not is_test:
            context = _attention_with_dropout(q, k, v, causal, key_padding_mask, dropout_rate)
        else:
            mask = None
            if key_padding_mask is not None:   # [B, S] -> [B, 1, 1, S]
                mask = ops.reshape(ops.cast(key_padding_mask, dtype="bool"),
                                   shape=[0, 1, 1, -1])
            context = ops.scaled_dot_product_attention(q, k, v, mask=mask, is_causal=causal)
        context = ops.reshape(context, shape=[0, 0, -1 if tensor_parallel else d_model])
        return _output(proj(context, "output", "row" if tensor_parallel else None), prefix)


def transformer_encoder_layer(x, num_heads, dim_feedforward, dropout_rate=0.1,
                              activation="gelu", normalize_before=False, causal=False,
                              key_padding_mask=None, is_test=False, name=None,
                              tensor_parallel=False):
    """One Transformer encoder layer: self-attention and a feed-forward net, each residual.

    Post-norm by default (x = norm(x + sublayer(x))); `normalize_before`
    gives pre-norm (x = x + sublayer(norm(x))). `tensor_parallel=True` splits the
    attention heads and the feed-forward net (a column fc, then a row one) over the
    mesh axis "model".
    """
    activation_op(activation, "transformer_encoder_layer")
    _positive_ints("transformer_encoder_layer", num_heads=num_heads,
                   dim_feedforward=dim_feedforward)
    tp.check_flag("transformer_encoder_layer", tensor_parallel)
    d_model = _known(x.shape[-1:], "model dim", x)[0]

    with _layer("transformer_encoder", name) as prefix:
        def norm(h, tag):
            return layer_norm(h, begin_norm_axis=len(h.shape) - 1, name=f"{prefix}.{tag}")

        def residual(h, sublayer, tag):
            inner = sublayer(norm(h, tag) if normalize_before else h)
            out = ops.add(h, dropout(inner, dropout_rate, is_test=is_test))
            return out if normalize_before else norm(out, tag)

        def attention(h):
            return multi_head_attention(h, num_heads=num_heads, causal=causal,
                                        key_padding_mask=key_padding_mask,
                                        dropout_rate=dropout_rate, is_test=is_test,
                                        name=f"{prefix}.attn", tensor_parallel=tensor_parallel)

        def feed_forward(h):
            hidden = fc(h, dim_feedforward, num_flatten_dims=2, act=activation,
                        name=f"{prefix}.ffn1",
                        tensor_parallel="column" if tensor_parallel else None)
            hidden = dropout(hidden, dropout_rate, is_test=is_test)
            return fc(hidden, d_model, num_flatten_dims=2, name=f"{prefix}.ffn2",
                      tensor_parallel="row" if tensor_parallel else None)

        x = residual(x, attention, "norm1")
        return _output(residual(x, feed_forward, "norm2"), prefix)


# --- recurrent layers: control_flow.scan over time ---

def _recurrent_params(prefix, input, hidden_size, gates, param_attr, bias_attr, biases):
    """(input weights `w_0` [D, gates*H], recurrent weights `w_1` [H, gates*H], [`biases`
    biases `b_k` [gates*H]], none if `bias_attr` is False), all U(-1/sqrt(H), 1/sqrt(H)) by
    default as in PyTorch; a named ParamAttr is suffixed '.w_0', '.w_1', '.b_0', ..."""
    def attr_for(attr, suffix):
        if attr is False or not (attr := ParamAttr.of(attr)).name:
            return attr
        return dataclasses.replace(attr, name=f"{attr.name}.{suffix}")

    features = _known(input.shape[2:], "feature dim of the [batch, time, features] input",
                      input)[0]
    bound = 1.0 / math.sqrt(hidden_size)
    uniform = init.Uniform(-bound, bound)
    width = gates * hidden_size
    w_x = _param(prefix, "w_0", [features, width], attr_for(param_attr, "w_0"), uniform,
                 input.dtype)
    w_h = _param(prefix, "w_1", [hidden_size, width], attr_for(param_attr, "w_1"), uniform,
                 input.dtype)
    b = [] if bias_attr is False else [
        _param(prefix, f"b_{k}", [width], attr_for(bias_attr, f"b_{k}"), uniform, input.dtype)
        for k in range(biases)]
    return w_x, w_h, b


def _check_sequence(input, layer):
    """Refuse, before `layer` appends anything, an input that is not [batch, time, features]."""
    if len(input.shape) != 3:
        raise ProgramError(f"{layer} takes a [batch, time, features] input, got shape "
                           f"{list(input.shape)}", var=input.name, callsite=user_callsite())


def _time_major_projection(input, w_x, bias):
    """input [B, T, D] -> [T, B, gates*H]: every step's input projection in one matmul."""
    xs = ops.matmul(ops.transpose(input, perm=[1, 0, 2]), w_x)
    return ops.add(xs, bias[0]) if bias else xs


def _zero_state(xs, hidden_size):
    """Zeros [B, H] for the batch of the time-major `xs` [T, B, *] (the batch may be -1)."""
    first = ops.slice(xs, axes=[0, 2], starts=[0, 0], ends=[1, hidden_size])
    return ops.squeeze(ops.fill_zeros_like(first), axes=[0])


def lstm(input, hidden_size, init_h=None, init_c=None, reverse=False, param_attr=None,
         bias_attr=None, name=None):
    """A long short-term memory layer over a batch-major [B, T, D] input, built from
    `control_flow.scan` over time; returns (outputs [B, T, H], (h_T, c_T)).

    PyTorch's `nn.LSTM` equations and gate order (the same as Flax's
    `OptimizedLSTMCell`), with one bias (PyTorch's b_ih + b_hh):
        i, f, g, o = split(x_t @ W_x + h @ W_h + b, 4)
        c' = sigmoid(f) * c + sigmoid(i) * tanh(g);  h' = sigmoid(o) * tanh(c')
    Parameters: `<name>.w_0` W_x [D, 4H], `.w_1` W_h [H, 4H], `.b_0` b [4H].
    `init_h`, `init_c` [B, H] default to zeros. `reverse` runs from the last
    step to the first (outputs stay at their input positions, h_T is then the
    state after step 0). x_t @ W_x is computed for all steps before the scan.
    """
    _positive_ints("lstm", hidden_size=hidden_size)
    _check_sequence(input, "lstm")
    with _layer("lstm", name) as prefix:
        w_x, w_h, bias = _recurrent_params(prefix, input, hidden_size, 4, param_attr,
                                           bias_attr, 1)
        xs = _time_major_projection(input, w_x, bias)
        h0 = _zero_state(xs, hidden_size) if init_h is None else init_h
        c0 = _zero_state(xs, hidden_size) if init_c is None else init_c

        def step(carry, x_t):
            h, c = carry
            i, f, g, o = ops.split(ops.add(x_t, ops.matmul(h, w_h)), num=4, axis=1)
            c = ops.add(ops.mul(ops.sigmoid(f), c), ops.mul(ops.sigmoid(i), ops.tanh(g)))
            h = ops.mul(ops.sigmoid(o), ops.tanh(c))
            return (h, c), h

        (h, c), hs = control_flow.scan(step, (h0, c0), xs, reverse=reverse)
        return _output(ops.transpose(hs, perm=[1, 0, 2]), prefix), (h, c)


def gru(input, hidden_size, init_h=None, reverse=False, param_attr=None, bias_attr=None,
        name=None):
    """A gated recurrent unit layer over a batch-major [B, T, D] input, built from
    `control_flow.scan` over time; returns (outputs [B, T, H], h_T).

    PyTorch's `nn.GRU` equations and gate order (r, z, n; Flax's `GRUCell` is
    the same), with separate input and hidden biases:
        xr, xz, xn = split(x_t @ W_x + b_x, 3);  hr, hz, hn = split(h @ W_h + b_h, 3)
        r = sigmoid(xr + hr);  z = sigmoid(xz + hz);  n = tanh(xn + r * hn)
        h' = (1 - z) * n + z * h
    Parameters: `<name>.w_0` W_x [D, 3H], `.w_1` W_h [H, 3H], `.b_0` b_x [3H],
    `.b_1` b_h [3H]. `init_h` [B, H] defaults to zeros; `reverse` as in `lstm`.
    """
    _positive_ints("gru", hidden_size=hidden_size)
    _check_sequence(input, "gru")
    with _layer("gru", name) as prefix:
        w_x, w_h, bias = _recurrent_params(prefix, input, hidden_size, 3, param_attr,
                                           bias_attr, 2)
        xs = _time_major_projection(input, w_x, bias)
        h0 = _zero_state(xs, hidden_size) if init_h is None else init_h

        def step(h, x_t):
            hh = ops.matmul(h, w_h)
            hr, hz, hn = ops.split(ops.add(hh, bias[1]) if bias else hh, num=3, axis=1)
            xr, xz, xn = ops.split(x_t, num=3, axis=1)
            r, z = ops.sigmoid(ops.add(xr, hr)), ops.sigmoid(ops.add(xz, hz))
            n = ops.tanh(ops.add(xn, ops.mul(r, hn)))
            h = ops.add(n, ops.mul(z, ops.sub(h, n)))
            return h, h

        h, hs = control_flow.scan(step, h0, xs, reverse=reverse)
        return _output(ops.transpose(hs, perm=[1, 0, 2]), prefix), h


# --- losses ---

def softmax_with_cross_entropy(logits, label, soft_label=False, ignore_index=-100,
                               return_softmax=False):
    """Per-example cross entropy of softmax(logits) (hard int labels [.., 1] or soft labels)."""
    with _layer("softmax_with_cross_entropy", None) as prefix:
        softmax, loss = ops.softmax_with_cross_entropy(logits, label, soft_label=soft_label,
                                                       ignore_index=ignore_index)
        loss = _output(loss, prefix)
    return (loss, softmax) if return_softmax else loss


def cross_entropy(input, label, soft_label=False):
    """Per-example -log(input[label]) for probabilities `input` (hard [.., 1] or soft labels)."""
    with _layer("cross_entropy", None) as prefix:
        log_p = ops.log(input)
        if soft_label:
            picked = ops.mul(label, log_p)
        else:
            depth = _known(input.shape[-1:], "number of classes", input)[0]
            ids = ops.squeeze(label, axes=[-1]) if label.shape[-1:] == (1,) else label
            picked = ops.mul(ops.one_hot(ids, depth=depth, dtype=input.dtype), log_p)
        return _output(ops.neg(ops.reduce_sum(picked, axis=[-1], keep_dim=True)), prefix)


def mse_loss(input, label):
    """Mean of the squared differences."""
    with _layer("mse_loss", None) as prefix:
        return _output(ops.mean(ops.square(ops.sub(input, label))), prefix)


def accuracy(input, label):
    """Fraction of rows whose arg-max over the last axis equals `label` ([N] or [N, 1])."""
    with _layer("accuracy", None) as prefix:
        pred = ops.argmax(input, axis=-1, dtype=label.dtype)
        ids = ops.squeeze(label, axes=[-1]) if label.shape[-1:] == (1,) else label
        return _output(ops.mean(ops.cast(ops.equal(pred, ids), dtype="float32")), prefix)


# Every layer of this module: one that fails leaves no parameter, op, name or value behind.
for _name, _layer_fn in list(globals().items()):
    if inspect.isfunction(_layer_fn) and _layer_fn.__module__ == __name__ \
            and not _name.startswith("_"):
        globals()[_name] = append_whole(_layer_fn)
del _name, _layer_fn


from progdesc.paddle_names import install as install_paddle_names  # noqa: E402 (no cycle)
install_paddle_names(globals())   # Paddle's spellings: mean, elementwise_add, ...
