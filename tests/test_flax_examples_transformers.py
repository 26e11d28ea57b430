"""Transformers in the shape of google/flax's examples (lm1b, wmt, nlp_seq, and an nnx
Transformer scanned over its stacked layers), tiny, imported as written with dropout in
training mode and checked against Flax and optax (tests/flax_examples.py)."""
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn
from flax import nnx
from flax import struct
from flax.training import common_utils
from jax import lax

from flax_examples import Example, cases, check_example

VOCAB, LENGTH = 30, 8


def _tokens(batch, seed=0, length=LENGTH):
    """Token ids in [1, VOCAB), each row ending in padding (0) of its own length."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, VOCAB, (batch, length)).astype(np.int32)
    for row, used in zip(tokens, rng.integers(length // 2, length + 1, batch)):
        row[used:] = 0
    return tokens


@struct.dataclass
class TransformerConfig:
    """examples/lm1b, wmt: the hyperparameters every module of the model reads."""
    vocab_size: int = VOCAB
    output_vocab_size: int = VOCAB
    share_embeddings: bool = False
    logits_via_embedding: bool = False
    dtype: Any = jnp.float32
    emb_dim: int = 16
    num_heads: int = 2
    num_layers: int = 2
    qkv_dim: int = 16
    mlp_dim: int = 32
    max_len: int = 16
    dropout_rate: float = 0.1
    attention_dropout_rate: float = 0.1
    deterministic: bool = False
    kernel_init: Callable = nn.initializers.xavier_uniform()
    bias_init: Callable = nn.initializers.normal(stddev=1e-6)
    posemb_init: Callable | None = None


def _config(config, deterministic):
    """The model's config with dropout switched as an `apply` keyword asks. (The examples
    build a second model from an eval config with `deterministic=True`; from_flax takes an
    evaluation mode as `apply` keywords, so the top-level module takes this one.)"""
    return config if deterministic is None else config.replace(deterministic=deterministic)


def _partitioned(init, names, config):
    """lm1b's partitioning metadata on an initializer (wmt's modules have none)."""
    return nn.with_logical_partitioning(init, names) if config.partitioned else init


def shift_right(x, axis=1):
    """lm1b: pad one zero in front along `axis` and cut the last position off."""
    widths = [(0, 0)] * x.ndim
    widths[axis] = (1, 0)
    padded = jnp.pad(x, widths, constant_values=x.dtype.type(0))
    return lax.dynamic_slice_in_dim(padded, 0, padded.shape[axis] - 1, axis)


def shift_inputs(x, segment_ids=None, axis=1):
    """lm1b: shift_right, with a 0 (not the previous sequence's end) first in each
    sequence packed into a row."""
    shifted = shift_right(x, axis=axis)
    if segment_ids is not None:
        shifted *= segment_ids == shift_right(segment_ids, axis=axis)
    return shifted


def sinusoidal_init(max_len, min_scale=1.0, max_scale=10000.0):
    """A fixed (1, max_len, features) table of sines and cosines."""

    def init(key, shape, dtype=np.float32):
        del key, dtype
        features = shape[-1]
        position = np.arange(max_len)[:, None]
        step = -np.log(max_scale / min_scale) / (features // 2 - 1)
        freq = min_scale * np.exp(np.arange(features // 2) * step)
        table = np.zeros((max_len, features), np.float32)
        table[:, :features // 2] = np.sin(position * freq)
        table[:, features // 2:2 * (features // 2)] = np.cos(position * freq)
        return jnp.array(table[None])

    return init


@struct.dataclass
class LMConfig(TransformerConfig):
    partitioned: bool = True
    num_layers: int = 1   # each dropout site costs XLA seconds of compiling on a CPU


@struct.dataclass
class WMTConfig(TransformerConfig):
    partitioned: bool = False
    share_embeddings: bool = True
    logits_via_embedding: bool = True
    num_layers: int = 1
    posemb_init: Callable | None = nn.initializers.normal(stddev=0.02)


class AddPositionEmbs(nn.Module):
    """Adds a sinusoidal table, or a learned one where the config has `posemb_init`."""
    config: TransformerConfig

    @nn.compact
    def __call__(self, inputs, inputs_positions=None):
        config = self.config
        assert inputs.ndim == 3
        shape = (1, config.max_len, inputs.shape[-1])
        if config.posemb_init is None:
            table = sinusoidal_init(config.max_len)(None, shape)
        else:
            table = self.param("pos_embedding", config.posemb_init, shape)
        pe = table[:, :inputs.shape[1], :]
        if inputs_positions is None:
            return inputs + pe
        return inputs + jnp.take(pe[0], inputs_positions, axis=0)   # packed sequences


class MlpBlock(nn.Module):
    config: TransformerConfig

    @nn.compact
    def __call__(self, inputs):
        config = self.config
        x = nn.Dense(config.mlp_dim, dtype=config.dtype,
                     kernel_init=_partitioned(config.kernel_init, ("embed", "mlp"), config),
                     bias_init=_partitioned(config.bias_init, ("mlp",), config))(inputs)
        x = nn.Dropout(config.dropout_rate)(nn.relu(x), deterministic=config.deterministic)
        x = nn.Dense(inputs.shape[-1], dtype=config.dtype,
                     kernel_init=_partitioned(config.kernel_init, ("mlp", "embed"), config),
                     bias_init=_partitioned(config.bias_init, ("embed",), config))(x)
        return nn.Dropout(config.dropout_rate)(x, deterministic=config.deterministic)


def _layer_norm(config, **kwargs):
    return nn.LayerNorm(dtype=config.dtype,
                        bias_init=_partitioned(nn.initializers.zeros, ("embed",), config),
                        scale_init=_partitioned(nn.initializers.ones, ("embed",), config),
                        **kwargs)


def _attention(config):
    return nn.MultiHeadDotProductAttention(
        num_heads=config.num_heads, dtype=config.dtype, qkv_features=config.qkv_dim,
        kernel_init=_partitioned(config.kernel_init, ("embed", "kv"), config),
        use_bias=False, broadcast_dropout=False, dropout_rate=config.attention_dropout_rate,
        deterministic=config.deterministic)


class Encoder1DBlock(nn.Module):
    """wmt: pre-norm self-attention under the padding mask, then the MLP."""
    config: TransformerConfig

    @nn.compact
    def __call__(self, inputs, encoder_mask=None):
        config = self.config
        x = _attention(config)(_layer_norm(config)(inputs), mask=encoder_mask)
        x = nn.Dropout(config.dropout_rate)(x, deterministic=config.deterministic) + inputs
        return x + MlpBlock(config)(_layer_norm(config)(x))


class EncoderDecoder1DBlock(nn.Module):
    """Causal self-attention, attention to the encoding (wmt; lm1b has none), the MLP."""
    config: TransformerConfig

    @nn.compact
    def __call__(self, targets, encoded=None, decoder_mask=None, encoder_decoder_mask=None):
        config = self.config
        x = _attention(config)(_layer_norm(config)(targets), mask=decoder_mask)
        x = nn.Dropout(config.dropout_rate)(x, deterministic=config.deterministic) + targets
        if encoded is not None:
            y = _attention(config)(_layer_norm(config)(x), encoded, mask=encoder_decoder_mask)
            x = nn.Dropout(config.dropout_rate)(y, deterministic=config.deterministic) + x
        return x + MlpBlock(config)(_layer_norm(config)(x))


def _embed(config):
    return nn.Embed(config.vocab_size, config.emb_dim, embedding_init=_partitioned(
        nn.initializers.normal(stddev=1.0), ("vocab", "embed"), config))


class Encoder(nn.Module):
    config: TransformerConfig
    shared_embedding: Any = None

    @nn.compact
    def __call__(self, inputs, encoder_mask=None):
        config = self.config
        embed = self.shared_embedding or _embed(config)
        x = AddPositionEmbs(config, name="posembed_input")(embed(inputs.astype("int32")))
        x = nn.Dropout(config.dropout_rate)(x, deterministic=config.deterministic)
        for layer in range(config.num_layers):
            x = Encoder1DBlock(config, name=f"encoderblock_{layer}")(x, encoder_mask)
        return _layer_norm(config, name="encoder_norm")(x)


class Decoder(nn.Module):
    config: TransformerConfig
    shared_embedding: Any = None

    @nn.compact
    def __call__(self, targets, encoded=None, targets_positions=None,
                 targets_segmentation=None, decoder_mask=None, encoder_decoder_mask=None):
        config = self.config
        embed = self.shared_embedding or _embed(config)
        y = embed(shift_inputs(targets.astype("int32"), segment_ids=targets_segmentation))
        y = AddPositionEmbs(config, name="posembed_output")(y, targets_positions)
        y = nn.Dropout(config.dropout_rate)(y, deterministic=config.deterministic)
        for layer in range(config.num_layers):
            y = EncoderDecoder1DBlock(config, name=f"encoderdecoderblock_{layer}")(
                y, encoded, decoder_mask=decoder_mask,
                encoder_decoder_mask=encoder_decoder_mask)
        y = _layer_norm(config, name="encoderdecoder_norm")(y)
        if config.logits_via_embedding:
            return embed.attend(y.astype(jnp.float32)) / jnp.sqrt(y.shape[-1])
        return nn.Dense(config.output_vocab_size, dtype=config.dtype,
                        kernel_init=_partitioned(config.kernel_init, ("embed", "vocab"), config),
                        bias_init=_partitioned(config.bias_init, ("vocab",), config),
                        name="logitdense")(y)


class TransformerLM(nn.Module):
    """examples/lm1b: a decoder alone under padding and causal masks, and block-diagonal
    ones where sequences are packed into rows (`inputs_segmentation`)."""
    config: TransformerConfig

    @nn.compact
    def __call__(self, inputs, inputs_positions=None, inputs_segmentation=None,
                 deterministic=None):
        config = _config(self.config, deterministic)
        decoder_mask = nn.combine_masks(
            nn.make_attention_mask(inputs > 0, inputs > 0, dtype=config.dtype),
            nn.make_causal_mask(inputs, dtype=config.dtype))
        if inputs_segmentation is not None:
            decoder_mask = nn.combine_masks(decoder_mask, nn.make_attention_mask(
                inputs_segmentation, inputs_segmentation, jnp.equal, dtype=config.dtype))
        logits = Decoder(config, name="decoder")(
            inputs, targets_positions=inputs_positions,
            targets_segmentation=inputs_segmentation, decoder_mask=decoder_mask)
        return logits.astype(config.dtype)


class Transformer(nn.Module):
    """examples/wmt: encoder and decoder sharing one embedding."""
    config: TransformerConfig

    @nn.compact
    def __call__(self, inputs, targets, deterministic=None):
        config = _config(self.config, deterministic)
        shared = _embed(config) if config.share_embeddings else None
        encoder_mask = nn.make_attention_mask(inputs > 0, inputs > 0, dtype=config.dtype)
        encoded = Encoder(config, shared, name="encoder")(inputs, encoder_mask=encoder_mask)
        decoder_mask = nn.combine_masks(
            nn.make_attention_mask(targets > 0, targets > 0, dtype=config.dtype),
            nn.make_causal_mask(targets, dtype=config.dtype))
        encoder_decoder_mask = nn.make_attention_mask(targets > 0, inputs > 0,
                                                      dtype=config.dtype)
        logits = Decoder(config, shared, name="decoder")(
            targets, encoded, decoder_mask=decoder_mask,
            encoder_decoder_mask=encoder_decoder_mask)
        return logits.astype(config.dtype)


def compute_weighted_cross_entropy(logits, targets, weights=None, label_smoothing=0.0):
    """lm1b, wmt: (sum of the cross entropies against smoothed one-hot targets, less the
    targets' own entropy, weighted; the weights' sum)."""
    vocab = logits.shape[-1]
    confidence = 1.0 - label_smoothing
    low_confidence = (1.0 - confidence) / (vocab - 1)
    normalizing_constant = -(confidence * jnp.log(confidence) + (vocab - 1) * low_confidence
                             * jnp.log(low_confidence + 1e-20))
    soft_targets = common_utils.onehot(targets, vocab, on_value=confidence,
                                       off_value=low_confidence)
    loss = -jnp.sum(soft_targets * nn.log_softmax(logits), axis=-1) - normalizing_constant
    normalizing_factor = np.prod(targets.shape)
    if weights is not None:
        loss, normalizing_factor = loss * weights, weights.sum()
    return loss.sum(), normalizing_factor


def lm1b_loss(model, inputs, inputs_positions, inputs_segmentation):
    weights = jnp.where(inputs > 0, 1, 0).astype(jnp.float32)
    logits = model(inputs, inputs_positions=inputs_positions,
                   inputs_segmentation=inputs_segmentation)
    loss, weight_sum = compute_weighted_cross_entropy(logits, inputs, weights)
    return loss / weight_sum


def wmt_loss(model, inputs, targets):
    weights = jnp.where(targets > 0, 1, 0).astype(jnp.float32)
    loss, weight_sum = compute_weighted_cross_entropy(model(inputs, targets), targets,
                                                      weights, label_smoothing=0.1)
    return loss / weight_sum


def _linen(model, inputs, targets, loss_fn, inputs_at, **kwargs):
    init_rngs = {"params": jax.random.key(0), "dropout": jax.random.key(1)}
    variables = jax.jit(model.init)(init_rngs, *inputs)
    return Example(model, variables, inputs, targets, loss_fn, inputs_at,
                   train_kwargs={"rngs": {"dropout": jax.random.key(2)}}, **kwargs)


def _packed(batch, seed=0):
    """lm1b's packed examples: rows of two sequences each, their tokens, positions in
    their sequence and segment ids (1, 2; 0 at padding)."""
    tokens = _tokens(batch, seed)
    rng = np.random.default_rng(seed + 100)
    segmentation = np.zeros_like(tokens)
    positions = np.zeros_like(tokens)
    for row, used in enumerate((tokens > 0).sum(axis=1)):
        split = rng.integers(1, used)
        segmentation[row, :split], segmentation[row, split:used] = 1, 2
        positions[row, :split] = np.arange(split)
        positions[row, split:used] = np.arange(used - split)
    return tokens, positions, segmentation


def lm1b():
    return _linen(TransformerLM(LMConfig()), _packed(4), (), lm1b_loss,
                  lambda batch: _packed(batch, seed=batch),
                  eval_kwargs={"deterministic": True})


def wmt():
    return _linen(Transformer(WMTConfig()), (_tokens(3), _tokens(3, seed=1)), (), wmt_loss,
                  lambda batch: (_tokens(batch, seed=batch), _tokens(batch, seed=batch + 9)),
                  eval_kwargs={"deterministic": True})


@struct.dataclass
class TaggerConfig:
    """examples/nlp_seq: its own config (dropout is a call argument there)."""
    vocab_size: int = VOCAB
    output_vocab_size: int = 12
    dtype: Any = jnp.float32
    emb_dim: int = 16
    num_heads: int = 2
    num_layers: int = 1
    qkv_dim: int = 16
    mlp_dim: int = 32
    max_len: int = 16
    dropout_rate: float = 0.3
    attention_dropout_rate: float = 0.3
    kernel_init: Callable = nn.initializers.xavier_uniform()
    bias_init: Callable = nn.initializers.normal(stddev=1e-6)


def interleaved_sinusoidal_init(max_len):
    """nlp_seq: sines at the even features, cosines at the odd ones."""

    def init(key, shape, dtype=np.float32):
        del key, dtype
        features = shape[-1]
        position = np.arange(max_len)[:, None]
        freq = np.exp(np.arange(0, features, 2) * -(np.log(10000.0) / features))
        table = np.zeros((max_len, features), np.float32)
        table[:, 0::2] = np.sin(position * freq)
        table[:, 1::2] = np.cos(position * freq)
        return jnp.array(table[None])

    return init


class TaggerMlpBlock(nn.Module):
    config: TaggerConfig

    @nn.compact
    def __call__(self, inputs, deterministic=True):
        config = self.config
        x = nn.Dense(config.mlp_dim, dtype=config.dtype, kernel_init=config.kernel_init,
                     bias_init=config.bias_init)(inputs)
        x = nn.Dropout(config.dropout_rate)(nn.elu(x), deterministic=deterministic)
        x = nn.Dense(inputs.shape[-1], dtype=config.dtype, kernel_init=config.kernel_init,
                     bias_init=config.bias_init)(x)
        return nn.Dropout(config.dropout_rate)(x, deterministic=deterministic)


class TaggerBlock(nn.Module):
    config: TaggerConfig

    @nn.compact
    def __call__(self, inputs, deterministic):
        config = self.config
        x = nn.MultiHeadDotProductAttention(
            num_heads=config.num_heads, dtype=config.dtype, qkv_features=config.qkv_dim,
            kernel_init=config.kernel_init, use_bias=False, broadcast_dropout=False,
            dropout_rate=config.attention_dropout_rate, deterministic=deterministic)(
                nn.LayerNorm(dtype=config.dtype)(inputs))
        x = nn.Dropout(config.dropout_rate)(x, deterministic=deterministic) + inputs
        y = TaggerMlpBlock(config)(nn.LayerNorm(dtype=config.dtype)(x),
                                   deterministic=deterministic)
        return x + y


class Tagger(nn.Module):
    """examples/nlp_seq: a transformer encoder tagging every token. (There `inputs` is a
    keyword-only argument; from_flax passes the example inputs by position.)"""
    config: TaggerConfig

    @nn.compact
    def __call__(self, inputs, *, train):
        config = self.config
        x = nn.Embed(config.vocab_size, config.emb_dim, name="embed")(inputs.astype("int32"))
        x = nn.Dropout(config.dropout_rate)(x, deterministic=not train)
        x = x + interleaved_sinusoidal_init(config.max_len)(
            None, (1, config.max_len, config.emb_dim))[:, :x.shape[1]]
        for _ in range(config.num_layers):
            x = TaggerBlock(config)(x, deterministic=not train)
        x = nn.LayerNorm(dtype=config.dtype)(x)
        return nn.Dense(config.output_vocab_size, kernel_init=config.kernel_init,
                        bias_init=config.bias_init)(x)


def tagger_loss(model, inputs, targets, train):
    """nlp_seq: cross entropy of the tags, padding (tag 0) weighted out."""
    logits = model(inputs, train=train)
    weights = jnp.where(targets > 0, 1, 0).astype(jnp.float32)
    loss = -jnp.sum(common_utils.onehot(targets, logits.shape[-1]) * nn.log_softmax(logits),
                    axis=-1)
    return (loss * weights).sum() / weights.sum()


def _tags(tokens, seed=5):
    """A tag in [1, 12) for every token, 0 at padding."""
    tags = np.random.default_rng(seed).integers(1, 12, tokens.shape).astype(np.int32)
    return np.where(tokens > 0, tags, 0)


def nlp_seq():
    tokens = _tokens(4)
    model = Tagger(TaggerConfig())
    variables = jax.jit(functools.partial(model.init, train=False))(jax.random.key(0), tokens)
    return Example(model, variables, (tokens,), (_tags(tokens),), tagger_loss,
                   lambda batch: (_tokens(batch, seed=batch),),
                   train_kwargs={"train": True, "rngs": {"dropout": jax.random.key(2)}},
                   eval_kwargs={"train": False})


class ScannedBlock(nnx.Module):
    """A pre-norm decoder layer with dropout (nnx)."""

    def __init__(self, dim, heads, *, rngs):
        self.norm1 = nnx.LayerNorm(dim, rngs=rngs)
        self.attention = nnx.MultiHeadAttention(heads, dim, use_bias=False, decode=False,
                                                broadcast_dropout=False, dropout_rate=0.1,
                                                deterministic=False,
                                                rngs=rngs)
        self.norm2 = nnx.LayerNorm(dim, rngs=rngs)
        self.linear1 = nnx.Linear(dim, 2 * dim, rngs=rngs)
        self.linear2 = nnx.Linear(2 * dim, dim, rngs=rngs)
        self.dropout = nnx.Dropout(0.1, rngs=rngs)

    def __call__(self, x, mask):
        x = x + self.dropout(self.attention(self.norm1(x), mask=mask))
        return x + self.dropout(self.linear2(nnx.relu(self.linear1(self.norm2(x)))))


class ScanTransformer(nnx.Module):
    """A decoder-only transformer whose layers `nnx.vmap` creates stacked and `nnx.scan`
    applies, as Flax's nnx examples scan over layers."""

    def __init__(self, vocab, dim, heads, n_layers, *, rngs):
        self.embed = nnx.Embed(vocab, dim, rngs=rngs)
        self.positions = nnx.Embed(LENGTH, dim, rngs=rngs)

        @nnx.split_rngs(splits=n_layers)
        @nnx.vmap(axis_size=n_layers)
        def create_block(rngs):
            return ScannedBlock(dim, heads, rngs=rngs)

        self.layers = create_block(rngs)
        self.norm = nnx.LayerNorm(dim, rngs=rngs)
        self.head = nnx.Linear(dim, vocab, rngs=rngs)

    def __call__(self, tokens):
        mask = nnx.combine_masks(nnx.make_attention_mask(tokens > 0, tokens > 0),
                                 nnx.make_causal_mask(tokens))
        x = self.embed(tokens) + self.positions(jnp.arange(tokens.shape[1]))

        @nnx.scan
        def forward(x, block):
            return block(x, mask), None

        x, _ = forward(x, self.layers)
        return self.head(self.norm(x))


def scan_loss(model, tokens, targets):
    weights = jnp.where(targets > 0, 1.0, 0.0)
    losses = optax.softmax_cross_entropy_with_integer_labels(model(tokens), targets)
    return (losses * weights).sum() / weights.sum()


def nnx_scan():
    tokens = _tokens(4)
    model = ScanTransformer(VOCAB, 16, 2, 2, rngs=nnx.Rngs(0))
    next_tokens = np.pad(tokens[:, 1:], ((0, 0), (0, 1)))
    return Example(model, None, (tokens,), (next_tokens,), scan_loss,
                   lambda batch: (_tokens(batch, seed=batch),), eval_kwargs=True)


EXAMPLES = {"lm1b": lm1b, "wmt": wmt, "nlp_seq": nlp_seq, "nnx_scan": nnx_scan}


@pytest.mark.parametrize("name", cases(EXAMPLES, slow={"lm1b", "nlp_seq", "nnx_scan", "wmt"}))
def test_example_imports_trains_and_exports_as_flax_runs_it(name, tmp_path):
    check_example(EXAMPLES[name](), tmp_path)
