"""Sequence models in the shape of google/flax's examples (sst2's bidirectional LSTM
classifier, seq2seq's addition model), imported as written and checked against Flax and
optax (tests/flax_examples.py)."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from flax_examples import Example, cases, check_example


# --- sst2: embeddings with (word) dropout, a bidirectional LSTM over padded sentences,
# attention by an MLP over the valid positions, an MLP classifier ---

def sequence_mask(lengths, max_length):
    """[batch, max_length] bool: True at the positions before each sequence's length."""
    return jnp.arange(max_length)[None] < lengths[:, None]


@jax.vmap
def flip_sequences(inputs, lengths):
    """Each sequence's first `length` elements reversed, its padding left at the end."""
    max_length = inputs.shape[0]
    return jnp.flip(jnp.roll(inputs, max_length - lengths, axis=0), axis=0)


class WordDropout(nn.Module):
    """Replaces each token id by `unk_idx` with probability `dropout_rate`."""
    dropout_rate: float
    unk_idx: int
    deterministic: bool | None = None

    @nn.compact
    def __call__(self, inputs, deterministic=None):
        deterministic = nn.module.merge_param("deterministic", self.deterministic,
                                              deterministic)
        if deterministic or self.dropout_rate == 0.0:
            return inputs
        mask = jax.random.bernoulli(self.make_rng("dropout"), p=self.dropout_rate,
                                    shape=inputs.shape)
        return jnp.where(mask, jnp.array([self.unk_idx]), inputs)


class Embedder(nn.Module):
    vocab_size: int
    embedding_size: int
    dropout_rate: float = 0.0
    word_dropout_rate: float = 0.0
    unk_idx: int = 1

    def setup(self):
        self.embedding = self.param("embedding", nn.initializers.normal(stddev=0.1),
                                    (self.vocab_size, self.embedding_size))
        self.dropout_layer = nn.Dropout(rate=self.dropout_rate)
        self.word_dropout_layer = WordDropout(self.word_dropout_rate, self.unk_idx)

    def __call__(self, inputs, deterministic=None):
        inputs = self.word_dropout_layer(inputs, deterministic=deterministic)
        return self.dropout_layer(self.embedding[inputs], deterministic=deterministic)


class SimpleLSTM(nn.Module):
    """An LSTM scanned over the time axis (1) with `nn.scan`."""
    hidden_size: int

    @functools.partial(nn.transforms.scan, variable_broadcast="params", in_axes=1,
                       out_axes=1, split_rngs={"params": False})
    @nn.compact
    def __call__(self, carry, x):
        return nn.OptimizedLSTMCell(self.hidden_size)(carry, x)

    def initialize_carry(self, input_shape):
        # The carry is zeros: the key only fills the cell's signature.
        return nn.OptimizedLSTMCell(self.hidden_size, parent=None).initialize_carry(
            jax.random.key(0), input_shape)


class SimpleBiLSTM(nn.Module):
    hidden_size: int

    def setup(self):
        self.forward_lstm = SimpleLSTM(self.hidden_size)
        self.backward_lstm = SimpleLSTM(self.hidden_size)

    def __call__(self, embedded_inputs, lengths):
        carry = self.forward_lstm.initialize_carry(embedded_inputs[:, 0].shape)
        _, forward_outputs = self.forward_lstm(carry, embedded_inputs)
        reversed_inputs = flip_sequences(embedded_inputs, lengths)
        carry = self.backward_lstm.initialize_carry(reversed_inputs[:, 0].shape)
        _, backward_outputs = self.backward_lstm(carry, reversed_inputs)
        backward_outputs = flip_sequences(backward_outputs, lengths)
        return jnp.concatenate([forward_outputs, backward_outputs], -1)


class MLP(nn.Module):
    hidden_size: int
    output_size: int
    dropout_rate: float = 0.0

    def setup(self):
        self.intermediate_layer = nn.Dense(self.hidden_size)
        self.output_layer = nn.Dense(self.output_size, use_bias=False)
        self.dropout_layer = nn.Dropout(rate=self.dropout_rate)

    def __call__(self, inputs, deterministic=None):
        hidden = nn.tanh(self.intermediate_layer(inputs))
        return self.output_layer(self.dropout_layer(hidden, deterministic=deterministic))


class KeysOnlyMlpAttention(nn.Module):
    """Attention weights from an MLP of the keys alone, softmax over the valid positions."""
    hidden_size: int

    @nn.compact
    def __call__(self, keys, mask):
        energy = nn.tanh(nn.Dense(self.hidden_size, name="keys", use_bias=False)(keys))
        scores = nn.Dense(1, name="energy", use_bias=False)(energy).squeeze(-1)
        scores = jnp.where(mask, scores, -jnp.inf)
        return nn.softmax(scores, axis=-1)


class AttentionClassifier(nn.Module):
    hidden_size: int
    output_size: int
    dropout_rate: float = 0.0

    def setup(self):
        self.dropout_layer = nn.Dropout(rate=self.dropout_rate)
        self.keys_only_mlp_attention = KeysOnlyMlpAttention(self.hidden_size)
        self.mlp = MLP(self.hidden_size, self.output_size, self.dropout_rate)

    def __call__(self, encoded_inputs, lengths, deterministic=None):
        encoded_inputs = self.dropout_layer(encoded_inputs, deterministic=deterministic)
        mask = sequence_mask(lengths, encoded_inputs.shape[1])
        attention = self.keys_only_mlp_attention(encoded_inputs, mask)
        context = (jnp.expand_dims(attention, 1) @ encoded_inputs).squeeze(1)
        context = self.dropout_layer(context, deterministic=deterministic)
        return self.mlp(context, deterministic=deterministic)


class TextClassifier(nn.Module):
    """examples/sst2: embed, encode with a BiLSTM, classify with attention."""
    embedding_size: int
    hidden_size: int
    vocab_size: int
    output_size: int
    dropout_rate: float
    word_dropout_rate: float
    unk_idx: int = 1

    def setup(self):
        self.embedder = Embedder(self.vocab_size, self.embedding_size, self.dropout_rate,
                                 self.word_dropout_rate, self.unk_idx)
        self.encoder = SimpleBiLSTM(self.hidden_size)
        self.classifier = AttentionClassifier(self.hidden_size, self.output_size,
                                              self.dropout_rate)

    def __call__(self, token_ids, lengths, deterministic=None):
        embedded_inputs = self.embedder(token_ids, deterministic=deterministic)
        encoded_inputs = self.encoder(embedded_inputs, lengths)
        return self.classifier(encoded_inputs, lengths, deterministic=deterministic)


def sigmoid_cross_entropy_with_logits(*, labels, logits):
    zeros = jnp.zeros_like(logits, dtype=logits.dtype)
    condition = logits >= zeros
    relu_logits = jnp.where(condition, logits, zeros)
    neg_abs_logits = jnp.where(condition, -logits, logits)
    return relu_logits - logits * labels + jnp.log1p(jnp.exp(neg_abs_logits))


def sst2_loss(model, token_ids, lengths, labels, deterministic=None):
    logits = model(token_ids, lengths, deterministic=deterministic)
    if labels.ndim == 1:
        labels = jnp.expand_dims(labels, 1)
    return jnp.mean(sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))


SST2_VOCAB, SST2_LENGTH = 20, 6


def _sentences(batch, seed=0):
    """(token ids [batch, SST2_LENGTH] padded with 0 after each length, lengths)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, SST2_LENGTH + 1, batch).astype(np.int32)
    lengths[0] = SST2_LENGTH
    ids = rng.integers(2, SST2_VOCAB, (batch, SST2_LENGTH)).astype(np.int32)
    ids[np.arange(SST2_LENGTH)[None] >= lengths[:, None]] = 0
    return ids, lengths


def sst2():
    model = TextClassifier(embedding_size=8, hidden_size=8, vocab_size=SST2_VOCAB,
                           output_size=1, dropout_rate=0.2, word_dropout_rate=0.2)
    token_ids, lengths = _sentences(3)
    variables = jax.jit(functools.partial(model.init, deterministic=True))(
        jax.random.key(0), token_ids, lengths)
    labels = np.array([0.0, 1.0, 1.0], np.float32)
    return Example(model, variables, (token_ids, lengths), (labels,), sst2_loss,
                   lambda batch: _sentences(batch, seed=batch),
                   train_kwargs={"deterministic": False,
                                 "rngs": {"dropout": jax.random.key(1)}},
                   eval_kwargs={"deterministic": True}, learning_rate=1e-2)


# --- seq2seq: the addition task ("12+7" -> "=19"), one-hot characters, an LSTM encoder
# over the query's valid length, an LSTM decoder that samples each next character ---

class CharacterTable:
    """Characters <-> one-hot rows; 0 pads, 1 ends a sequence (EOS)."""
    pad_id, eos_id = 0, 1

    def __init__(self, chars, max_len_query_digit=1):
        self.chars = sorted(set(chars))
        self.max_len_query_digit = max_len_query_digit

    @property
    def vocab_size(self):
        return len(self.chars) + 2

    @property
    def max_input_len(self):
        return self.max_len_query_digit * 2 + 2

    @property
    def max_output_len(self):
        return self.max_len_query_digit + 3

    def encode_onehot(self, strings, max_len):
        out = np.zeros((len(strings), max_len, self.vocab_size), np.float32)
        for i, s in enumerate(strings):
            tokens = [self.chars.index(c) + 2 for c in s] + [self.eos_id]
            tokens += [self.pad_id] * (max_len - len(tokens))
            out[i, np.arange(max_len), tokens] = 1
        return out

    def get_batch(self, batch_size, seed=0):
        rng = np.random.default_rng(seed)
        top = 10 ** self.max_len_query_digit
        pairs = [sorted(rng.integers(0, top, 2)) for _ in range(batch_size)]
        return (self.encode_onehot([f"{a}+{b}" for a, b in pairs], self.max_input_len),
                self.encode_onehot([f"={a + b}" for a, b in pairs], self.max_output_len))


CTABLE = CharacterTable("0123456789+= ")


class DecoderLSTMCell(nn.RNNCellBase):
    """One decoder step: an LSTM step, logits, and a character sampled from them (fed
    to the next step unless teacher forcing feeds the expected one)."""
    features: int
    teacher_force: bool
    vocab_size: int

    @nn.compact
    def __call__(self, carry, x):
        lstm_state, last_prediction = carry
        if not self.teacher_force:
            x = last_prediction
        lstm_state, y = nn.LSTMCell(self.features)(lstm_state, x)
        logits = nn.Dense(features=self.vocab_size)(y)
        predicted_token = jax.random.categorical(self.make_rng("lstm"), logits)
        prediction = jax.nn.one_hot(predicted_token, self.vocab_size, dtype=jnp.float32)
        return (lstm_state, prediction), (logits, prediction)

    @property
    def num_feature_axes(self):
        return 1


class Seq2seq(nn.Module):
    """examples/seq2seq: encode the query, decode the answer."""
    teacher_force: bool
    hidden_size: int
    vocab_size: int
    eos_id: int = 1

    @nn.compact
    def __call__(self, encoder_inputs, decoder_inputs):
        encoder = nn.RNN(nn.LSTMCell(self.hidden_size), return_carry=True, name="encoder")
        decoder = nn.RNN(DecoderLSTMCell(decoder_inputs.shape[-1], self.teacher_force,
                                         self.vocab_size),
                         split_rngs={"params": False, "lstm": True}, name="decoder")
        seq_lengths = self.get_seq_lengths(encoder_inputs)
        encoder_state, _ = encoder(encoder_inputs, seq_lengths=seq_lengths)
        return decoder(decoder_inputs[:, :-1],
                       initial_carry=(encoder_state, decoder_inputs[:, 0]))

    def get_seq_lengths(self, inputs):
        """The position of each query's EOS (argmax of one-hot rows, then of a bool)."""
        inputs = jnp.argmax(inputs, axis=-1)
        return jnp.argmax(inputs == self.eos_id, axis=-1)


def mask_sequences(sequence_batch, lengths):
    return sequence_batch * (lengths[:, np.newaxis]
                             > np.arange(sequence_batch.shape[1])[np.newaxis])


def get_sequence_lengths(sequence_batch, eos_id):
    """Each one-hot sequence's length up to and with its EOS (all of it without one)."""
    eos_row = sequence_batch[:, :, eos_id]
    eos_idx = jnp.argmax(eos_row, axis=-1)
    return jnp.where(eos_row[jnp.arange(eos_row.shape[0]), eos_idx], eos_idx + 1,
                     sequence_batch.shape[1])


def cross_entropy_loss(logits, labels, lengths):
    xe = jnp.sum(nn.log_softmax(logits) * labels, axis=-1)
    return -jnp.mean(mask_sequences(xe, lengths))


def seq2seq_loss(model, query, answer):
    labels = jnp.asarray(answer)[:, 1:]   # the example's jitted step gets the batch as jax arrays
    logits, _ = model(query, answer)
    return cross_entropy_loss(logits, labels, get_sequence_lengths(labels, CTABLE.eos_id))


def seq2seq(teacher_force=True):
    """The addition model; with teacher forcing the decoder reads the expected answer,
    without it (the example's train.py) the characters it sampled at the step before."""
    model = Seq2seq(teacher_force=teacher_force, hidden_size=8, vocab_size=CTABLE.vocab_size,
                    eos_id=CTABLE.eos_id)
    query, answer = CTABLE.get_batch(3)
    params_key, lstm_key = jax.random.split(jax.random.key(0))
    variables = jax.jit(model.init)({"params": params_key, "lstm": lstm_key}, query, answer)
    return Example(model, variables, (query, answer), (), seq2seq_loss,
                   lambda batch: CTABLE.get_batch(batch, seed=batch),
                   train_kwargs={"rngs": {"lstm": jax.random.key(1)}}, learning_rate=3e-3)


EXAMPLES = {"sst2": sst2, "seq2seq": seq2seq,
            "seq2seq_sampling": functools.partial(seq2seq, teacher_force=False)}

# seq2seq_sampling, the example's own training mode (teacher_force=False), differs from
# seq2seq only in what the decoder reads
@pytest.mark.parametrize("name", cases(EXAMPLES, slow={"seq2seq", "seq2seq_sampling", "sst2"}))
def test_example_imports_trains_and_exports_as_flax_runs_it(name, tmp_path):
    check_example(EXAMPLES[name](), tmp_path)
