"""Attention (opset 23: masks, causal, past key/value, grouped-query heads, softcap, the
QK output modes) and RotaryEmbedding, written with our matmul, softmax and elementwise
ops (so every variant differentiates), as ONNX's reference computes them."""
import math

import numpy as np

from progdesc.onnx.model import dtype_name
from progdesc.onnx.table import RULES
from progdesc.translate import Unsupported


def _dims(t, x):
    return list(t.var(x)[0])


def _heads_first(t, x, heads, what):
    """[B, S, heads * D] -> [B, heads, S, D]."""
    if heads is None:
        raise Unsupported(f"a 3-D {what} without its number of heads")
    x = t.call("reshape", x, shape=[0, 0, int(heads), -1])
    return t.call("transpose", x, perm=[0, 2, 1, 3])


def _repeat_heads(t, x, reps):
    """[B, H, S, D] -> [B, H * reps, S, D], each head `reps` times in a row."""
    b, h, s, d = _dims(t, x)
    if d < 0:
        raise Unsupported("grouped-query heads of a size unknown at import")
    x = t.call("tile", t.call("unsqueeze", x, axes=[2]), reps=[1, 1, reps, 1, 1])
    return t.call("reshape", x, shape=[0, h * reps, -1, d])


def _neg_inf(t, dtype):
    return t.constant(np.asarray(-np.inf, dtype))


def _mask_bias(t, mask, kv_len, dtype):
    """The additive bias of attn_mask (bool: 0 where True, -inf elsewhere), padded to the
    keys (past ones included) with masked positions."""
    dims, mask_dtype = t.var(mask)
    if mask_dtype == "bool":
        mask = t.call("where", mask, t.constant(np.zeros((), dtype)), _neg_inf(t, dtype))
    elif mask_dtype != dtype:
        mask = t.call("cast", mask, dtype=dtype)
    if dims[-1] >= 0 and kv_len >= 0 and dims[-1] < kv_len:
        config = [0, 0, 0] * (len(dims) - 1) + [0, kv_len - dims[-1], 0]
        mask = t.call("pad", mask, _neg_inf(t, dtype), padding_config=config)
    return mask


def _positions(t, x, axis):
    """0, 1, ... along `axis` (2 or 3) of [1, 1, n, 1] or [1, 1, 1, n] float32, n being
    the length of dim 2 of the [B, N, n, H] x (known at run time)."""
    first = t.call("slice", x, axes=[0, 1, 3], starts=[0, 0, 0], ends=[1, 1, 1])
    ones = t.call("scale", t.call("cast", t.call("fill_zeros_like", first), dtype="float32"),
                  bias=1.0)
    index = t.call("scale", t.call("cumsum", ones, axis=2), bias=-1.0)
    return index if axis == 2 else t.call("transpose", index, perm=[0, 1, 3, 2])


def _allowed(t, q, k, causal, left, right, past_key, nonpad):
    """Where query i may attend key j (None: everywhere), from the causal mask, the
    sliding window (`left` / `right` keys before / after the query's position, -1: no
    bound) and the keys each batch holds (`nonpad`, [B]): the query's position is i plus
    the number of past keys, or i + nonpad[b] - q_len with `nonpad`. q [B, N, T, H] and
    k [B, N, S, H] (past keys included) give the lengths, at run time."""
    if not (causal or left >= 0 or right >= 0 or nonpad is not None):
        return None
    position = _positions(t, q, 2)   # [1, 1, T, 1]
    key = _positions(t, k, 3)        # [1, 1, 1, S]
    if nonpad is not None:
        count = t.call("reshape", t.call("cast", nonpad, dtype="float32"), shape=[-1, 1, 1, 1])
        offset = t.call("sub", count, t.call("dim_size", q, axis=2, dtype="float32"))
        position = t.call("add", position, offset)
    elif past_key is not None:
        position = t.call("add", position, t.call("dim_size", past_key, axis=2,
                                                  dtype="float32"))
    diff = t.call("sub", position, key)   # query position - key position
    zero = t.constant(np.zeros((), np.float32))
    parts = []
    if nonpad is not None:
        parts.append(t.call("less_than", key, count))
    if causal:
        parts.append(t.call("greater_equal", diff, zero))
    if left >= 0:
        parts.append(t.call("less_equal", diff, t.constant(np.asarray(left, np.float32))))
    if right >= 0:
        parts.append(t.call("greater_equal", diff, t.constant(np.asarray(-right, np.float32))))
    allowed = parts[0]
    for part in parts[1:]:
        allowed = t.call("logical_and", allowed, part)
    return allowed


def _fused(t, q, k, v, causal, past_key, scale):
    """scaled_dot_product_attention of [B, N, S, H] q, k, v: [B, T, N, H]. A causal mask
    after past keys is a bias (the op's own is aligned at the first key)."""
    bias = None
    has_past = past_key is not None
    if causal and has_past:
        allowed = _allowed(t, q, k, True, -1, -1, past_key, None)
        dtype = t.var(q)[1]
        bias = t.call("where", allowed, t.constant(np.zeros((), dtype)), _neg_inf(t, dtype))
    q, k, v = (t.call("transpose", a, perm=[0, 2, 1, 3]) for a in (q, k, v))
    return t.call("scaled_dot_product_attention", q, k, v, bias, None,
                  is_causal=causal and not has_past, scale=scale)


@RULES.rule("Attention", since=23)
def attention(t, q, k, v, attn_mask=None, past_key=None, past_value=None,
              nonpad_kv_seqlen=None, *, is_causal=0, kv_num_heads=None, q_num_heads=None,
              qk_matmul_output_mode=0, scale=None, softcap=0.0, softmax_precision=None,
              left_window_size=-1, right_window_size=-1):
    if (past_key is None) != (past_value is None):
        raise Unsupported("past_key without past_value, or the reverse")
    dtype = t.var(q)[1]
    three = len(_dims(t, q)) == 3
    if three:
        q = _heads_first(t, q, q_num_heads, "Q")
        k = _heads_first(t, k, kv_num_heads, "K")
        v = _heads_first(t, v, kv_num_heads, "V")
    if past_key is not None:
        k = t.call("concat", [past_key, k], axis=2)
        v = t.call("concat", [past_value, v], axis=2)
    present_key, present_value = k, v
    _, q_heads, _, head = _dims(t, q)
    _, kv_heads, kv_len, _ = _dims(t, k)
    if scale is None:
        if head < 0:
            raise Unsupported("a head size unknown at import (and no scale)")
        scale = 1 / math.sqrt(head)
    if q_heads != kv_heads:
        if q_heads < 0 or kv_heads <= 0 or q_heads % kv_heads:
            raise Unsupported(f"{q_heads} query heads for {kv_heads} key and value heads")
        k = _repeat_heads(t, k, q_heads // kv_heads)
        v = _repeat_heads(t, v, q_heads // kv_heads)

    outputs = t.node_proto.output
    plain = ((len(outputs) < 4 or not outputs[3]) and not (softcap and softcap > 0)
             and softmax_precision is None and attn_mask is None and nonpad_kv_seqlen is None
             and left_window_size < 0 and right_window_size < 0
             and dtype in ("float32", "float64") and _dims(t, v)[3] == head >= 0)
    if plain:   # no row can be all masked: our fused attention op
        y = _fused(t, q, k, v, bool(is_causal), past_key, float(scale))
        if three:
            y = t.call("reshape", y, shape=[0, 0, -1])
        else:
            y = t.call("transpose", y, perm=[0, 2, 1, 3])
        return y, present_key, present_value, None

    bias = None
    if attn_mask is not None:
        bias = _mask_bias(t, attn_mask, kv_len, dtype)
    if nonpad_kv_seqlen is not None and past_key is not None:
        raise Unsupported("nonpad_kv_seqlen with past_key")
    allowed = _allowed(t, q, k, bool(is_causal), int(left_window_size),
                       int(right_window_size), past_key, nonpad_kv_seqlen)
    if allowed is not None:
        structure = t.call("where", allowed, t.constant(np.zeros((), dtype)), _neg_inf(t, dtype))
        bias = structure if bias is None else t.call("add", bias, structure)

    root = float(np.sqrt(scale))   # both operands scaled by its root, as the reference does
    qk = t.call("matmul", t.call("scale", q, scale=root), t.call("scale", k, scale=root),
                transpose_y=True)
    if softcap and softcap > 0:
        qk = t.call("scale", t.call("tanh", t.call("scale", qk, scale=1.0 / softcap)),
                    scale=float(softcap))
    logits = qk if bias is None else t.call("add", qk, bias)
    blocked = None
    if bias is not None:   # rows with every key masked get zero weights, not NaN
        row_max = t.call("reduce_max", bias, axis=[-1], keep_dim=True)
        blocked = t.call("equal", row_max, _neg_inf(t, dtype))
        logits = t.call("where", blocked, t.constant(np.zeros((), dtype)), logits)
    if softmax_precision is not None:
        precision = dtype_name(int(softmax_precision))
        weights = t.call("cast", t.call("softmax", t.call("cast", logits, dtype=precision),
                                        axis=-1), dtype=dtype)
    else:
        weights = t.call("softmax", logits, axis=-1)
    if blocked is not None:
        weights = t.call("where", blocked, t.constant(np.zeros((), dtype)), weights)
    y = t.call("matmul", weights, v)
    if three:
        y = t.call("reshape", t.call("transpose", y, perm=[0, 2, 1, 3]), shape=[0, 0, -1])
    mode = int(qk_matmul_output_mode)
    if mode not in (0, 1, 2, 3):
        raise Unsupported(f"qk_matmul_output_mode={mode}")
    if mode == 2 and bias is not None:
        qk = t.call("add", qk, bias)
    elif mode == 3:
        qk = weights
    return y, present_key, present_value, qk


@RULES.rule("RotaryEmbedding", since=23)
def rotary_embedding(t, x, cos_cache, sin_cache, position_ids=None, *, interleaved=0,
                     num_heads=0, rotary_embedding_dim=0):
    rank = len(_dims(t, x))
    if rank == 4:   # [B, H, S, D] -> [B, S, H, D]
        y = t.call("transpose", x, perm=[0, 2, 1, 3])
    elif rank == 3:
        if not num_heads:
            raise Unsupported("a 3-D input without num_heads")
        y = t.call("reshape", x, shape=[0, 0, int(num_heads), -1])
    else:
        raise Unsupported(f"a {rank}-D input")
    head = _dims(t, y)[3]
    if head < 0:
        raise Unsupported("a head size unknown at import")
    rot = int(rotary_embedding_dim) or head
    if rot % 2 or rot > head:
        raise Unsupported(f"rotary_embedding_dim={rot} for heads of {head}")
    if position_ids is not None:
        cos_cache = t.call("lookup_table", cos_cache, position_ids)
        sin_cache = t.call("lookup_table", sin_cache, position_ids)
    cos = t.call("unsqueeze", cos_cache, axes=[2])
    sin = t.call("unsqueeze", sin_cache, axes=[2])
    if interleaved:
        x1 = t.call("slice", y, axes=[3], starts=[0], ends=[rot], strides=[2])
        x2 = t.call("slice", y, axes=[3], starts=[1], ends=[rot], strides=[2])
    else:
        x1 = t.call("slice", y, axes=[3], starts=[0], ends=[rot // 2])
        x2 = t.call("slice", y, axes=[3], starts=[rot // 2], ends=[rot])
    real = t.call("sub", t.call("mul", cos, x1), t.call("mul", sin, x2))
    imag = t.call("add", t.call("mul", sin, x1), t.call("mul", cos, x2))
    if interleaved:
        rotated = t.call("reshape", t.call("stack", [real, imag], axis=4), shape=[0, 0, 0, rot])
    else:
        rotated = t.call("concat", [real, imag], axis=3)
    if rot < head:
        rotated = t.call("concat", [rotated, t.call("slice", y, axes=[3], starts=[rot],
                                                    ends=[head])], axis=3)
    if rank == 4:
        return t.call("transpose", rotated, perm=[0, 2, 1, 3])
    return t.call("reshape_as", rotated, x)
