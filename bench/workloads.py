"""The training workloads, each written twice: with progdesc and with Flax + optax.

Both versions of a workload have the same shapes, ops and dtypes (float32, Adam with
learning rate 1e-3, mean softmax cross entropy over integer labels). Differences that
remain on purpose, as each user would write it:

- CNN: progdesc is NCHW (its only layout), Flax is NHWC (its only layout for nn.Conv);
  the convolutions are 5x5 with 'SAME' padding (progdesc: explicit padding 2) in both.
- Labels: progdesc int64 [N, 1] (its hard-label convention), Flax int32 [N].
- LSTM language model (issue 15): token ids [N, T] -> embedding -> one LSTM layer ->
  per-position logits over the vocabulary, loss against the next token ([N, T, 1] int64
  in progdesc, [N, T] int32 in Flax). progdesc's `layers.lstm` is a `scan` over time
  with the input projection of all steps computed before it; Flax's is `nn.RNN` (an
  `nn.scan`) over `nn.OptimizedLSTMCell`, which projects each step's input inside the
  step. Same equations and gate order.
- Initial weights differ (same initializer families); they do not change the timings.

Each shape also has a bfloat16 mixed-precision variant, named with `_bf16` (`mlp_bf16`,
..., `transformer_large_bf16`): float32 weights and Adam state, matrix products and
convolutions in bfloat16. progdesc gets it from `progdesc.amp.decorate(Adam, "bfloat16")`;
the Flax model is the same module with `dtype=jnp.bfloat16` (computation) and
`param_dtype=jnp.float32` on its Dense and Conv layers, its softmax and loss in float32
as progdesc's AMP lists keep them (LayerNorm stays float32 there too: it reads the float32
residual sum).

`Workload.progdesc()` and `Workload.flax()` each return a `Trainer`: `define()` builds
the model and its first state (timed as part of the first step), `prepare(batch)` turns a
NumPy batch into that implementation's input (outside the timings), and `step(prepared)`
runs one training step and returns the loss read back to the host as a NumPy value (both
implementations pay the same device-to-host copy and wait).
"""
import math
from dataclasses import dataclass, field, replace
from functools import partial

import numpy as np

ADAM_LR = 1e-3


@dataclass
class Spec:
    name: str               # the model: mlp, cnn, transformer or lstm
    batch: int
    x_shape: tuple          # per-example input shape, progdesc layout (lstm: (time,))
    classes: int = 10
    extra: dict = field(default_factory=dict)
    amp: str = None         # None (float32) or the low dtype of mixed precision: 'bfloat16'

    def describe(self):
        """Shapes in words, e.g. 'transformer 2 layers d256 4 heads ffn 1024 s128 b16'."""
        amp = f" {self.amp} AMP" if self.amp else ""
        if self.name == "lstm":
            e = self.extra
            return (f"lstm LM embed {e['embed']} hidden {e['hidden']} vocab {self.classes} "
                    f"s{self.x_shape[0]} b{self.batch}")
        if self.name != "transformer":
            return f"{self.name} b{self.batch}{amp}"
        seq, d = self.x_shape
        e = self.extra
        return (f"transformer {e['layers']} layers d{d} {e['heads']} heads ffn {e['ffn']} "
                f"s{seq} b{self.batch}{amp}")


SPECS = {
    "mlp": Spec("mlp", 128, (784,)),
    "cnn": Spec("cnn", 64, (1, 28, 28)),
    "transformer": Spec("transformer", 16, (128, 256),
                        extra=dict(layers=2, heads=4, ffn=1024)),
    # the large shapes of issue 14, which `python -m bench` adds on a GPU
    "mlp_large": Spec("mlp", 8192, (784,)),
    "cnn_large": Spec("cnn", 512, (1, 28, 28)),
    "transformer_large": Spec("transformer", 64, (512, 512),
                              extra=dict(layers=6, heads=8, ffn=2048)),
    # issue 15: an LSTM language model; `python -m bench` runs it with the standard ones
    "lstm": Spec("lstm", 32, (64,), classes=1000, extra=dict(embed=128, hidden=256)),
}
STANDARD = ("mlp", "cnn", "transformer")
RECURRENT = ("lstm",)       # not in torch_reference.py
LARGE = ("mlp_large", "cnn_large", "transformer_large")
FLOAT32_OF = {n + "_bf16": n for n in STANDARD + LARGE}     # bf16 workload -> float32 one
SPECS.update({b: replace(SPECS[f], amp="bfloat16") for b, f in FLOAT32_OF.items()})


def make_batches(spec, n=4, seed=0, batch=None):
    """`n` (x, label) NumPy batches in progdesc's layout: x float32, label int64 [N, 1]
    (lstm: x int64 token ids [N, T], label the next tokens [N, T, 1])."""
    rng = np.random.default_rng(seed)
    b = batch or spec.batch
    out = []
    for _ in range(n):
        if spec.name == "lstm":
            tokens = rng.integers(0, spec.classes, size=(b, spec.x_shape[0] + 1))
            out.append((tokens[:, :-1], tokens[:, 1:, None]))
            continue
        x = rng.standard_normal((b,) + spec.x_shape).astype(np.float32)
        y = rng.integers(0, spec.classes, size=(b, 1)).astype(np.int64)
        out.append((x, y))
    return out


def flax_batch(spec, batch):
    """A progdesc-layout batch converted to what the Flax model takes (NHWC, int32 [N])."""
    x, y = batch
    if spec.name == "cnn":
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    if spec.name == "lstm":
        return x.astype(np.int32), y[..., 0].astype(np.int32)
    return x, y[:, 0].astype(np.int32)


# --- progdesc ---

def build_progdesc(spec, seed=0, tensor_parallel=False, data_parallel=False):
    """(main, startup, x var, label var, loss var) for a workload. `tensor_parallel` splits
    the transformer's layers (mlp: its first two fcs, a column-row pair) over the mesh
    axis "model"; `data_parallel` is minimize's."""
    import progdesc as pd
    from progdesc import amp, layers, ops
    from progdesc.optimizer import Adam

    main, startup = pd.Program(random_seed=seed), pd.Program(random_seed=seed)
    with pd.program_guard(main, startup):
        if spec.name == "lstm":
            x = pd.data("x", [None, *spec.x_shape], "int64")
            label = pd.data("label", [None, *spec.x_shape, 1], "int64")
        else:
            x = pd.data("x", [None, *spec.x_shape])
            label = pd.data("label", [None, 1], "int64")
        if spec.name == "mlp":
            h = layers.fc(x, 512, act="relu", tensor_parallel="column" if tensor_parallel else None)
            h = layers.fc(h, 512, act="relu", tensor_parallel="row" if tensor_parallel else None)
            logits = layers.fc(h, spec.classes)
        elif spec.name == "cnn":
            h = layers.conv2d(x, 32, 5, padding=2, act="relu")
            h = layers.pool2d(h, 2)
            h = layers.conv2d(h, 64, 5, padding=2, act="relu")
            h = layers.pool2d(h, 2)
            h = layers.fc(h, 1024, act="relu")
            logits = layers.fc(h, spec.classes)
        elif spec.name == "transformer":
            h = x
            for _ in range(spec.extra["layers"]):
                h = layers.transformer_encoder_layer(
                    h, spec.extra["heads"], spec.extra["ffn"], dropout_rate=0.0,
                    activation="gelu", is_test=True, tensor_parallel=tensor_parallel)
            pooled = ops.reduce_mean(h, axis=[1])
            logits = layers.fc(pooled, spec.classes)
        elif spec.name == "lstm":
            emb = layers.embedding(x, size=[spec.classes, spec.extra["embed"]])
            out, _ = layers.lstm(emb, spec.extra["hidden"])
            logits = layers.fc(out, spec.classes, num_flatten_dims=2)
        else:
            raise ValueError(spec.name)
        loss = ops.mean(layers.softmax_with_cross_entropy(logits, label))
        optimizer = Adam(ADAM_LR)
        if spec.amp:
            optimizer = amp.decorate(optimizer, dtype=spec.amp)
        optimizer.minimize(loss, data_parallel=data_parallel)
    return main, startup, x, label, loss


class ProgdescTrainer:
    impl = "progdesc"

    def __init__(self, spec):
        self.spec = spec

    def define(self, first_batch):
        import progdesc as pd
        self.main, self.startup, self.x, self.label, self.loss = build_progdesc(self.spec)
        self.exe, self.scope = pd.Executor(), pd.Scope()
        self.exe.run(self.startup, scope=self.scope)

    def feed(self, batch):
        return {"x": batch[0], "label": batch[1]}

    def prepare(self, batch):
        return self.feed(batch)

    def step(self, feed):
        (value,) = self.exe.run(self.main, feed=feed, fetch_list=[self.loss], scope=self.scope)
        return value

    def compiled_step(self, batch):
        """The jax `Compiled` of the training step, for XLA cost and memory analysis.

        Rebuilt the way the Executor builds it (with_feed_fetch + lower_block + jax.jit
        with the mutable state donated) rather than read from the Executor's private
        cache, so that it keeps working while the Executor changes; XLA options an
        Executor might set are not applied here.
        """
        import jax
        from lowering.lower import RNG_VAR, lower_block
        from progdesc.feeding import convert_feed, with_feed_fetch
        block = self.main.global_block()
        feed = self.prepare(batch)
        feeds = tuple(convert_feed(block.var(n), v) for n, v in feed.items())
        lowered = lower_block(with_feed_fetch(self.main, tuple(feed), (self.loss.name,)), 0)

        def value(n):
            v = self.scope.find_var(n)
            if (v is None or v.value is None) and n == RNG_VAR:
                return jax.random.PRNGKey(0)
            return v.value

        mut = {n: value(n) for n in lowered.reads if n in lowered.writes}
        ro = {n: value(n) for n in lowered.reads if n not in lowered.writes}
        with jax.enable_x64(True):
            return jax.jit(lowered.fn, donate_argnums=(1,)).lower(feeds, mut, ro).compile()


# --- Flax ---

def _flax_module(spec):
    import flax.linen as nn
    import jax.numpy as jnp

    # Mixed precision as Flax users write it: bfloat16 computation, float32 parameters.
    # float32 workloads leave dtype to Flax (float32 from the inputs and parameters).
    low = jnp.dtype(spec.amp) if spec.amp else None
    Dense = partial(nn.Dense, dtype=low, param_dtype=jnp.float32)
    Conv = partial(nn.Conv, dtype=low, param_dtype=jnp.float32)

    if spec.name == "mlp":
        class MLP(nn.Module):
            @nn.compact
            def __call__(self, x):
                x = nn.relu(Dense(512)(x))
                x = nn.relu(Dense(512)(x))
                return Dense(spec.classes)(x)
        return MLP()

    if spec.name == "cnn":
        class CNN(nn.Module):
            @nn.compact
            def __call__(self, x):          # NHWC
                x = nn.relu(Conv(32, (5, 5), padding="SAME")(x))
                x = nn.max_pool(x, (2, 2), strides=(2, 2))
                x = nn.relu(Conv(64, (5, 5), padding="SAME")(x))
                x = nn.max_pool(x, (2, 2), strides=(2, 2))
                x = x.reshape((x.shape[0], -1))
                x = nn.relu(Dense(1024)(x))
                return Dense(spec.classes)(x)
        return CNN()

    if spec.name == "transformer":
        heads, ffn = spec.extra["heads"], spec.extra["ffn"]

        class Attention(nn.Module):
            # mirrors progdesc.layers.multi_head_attention: separate q/k/v/out Dense layers
            @nn.compact
            def __call__(self, x):
                b, t, d = x.shape
                hd = d // heads

                def split(h):
                    return h.reshape(b, t, heads, hd).transpose(0, 2, 1, 3)

                q, k, v = (split(Dense(d)(x)) for _ in range(3))
                scores = jnp.matmul(q, k.transpose(0, 1, 3, 2)) * (1.0 / math.sqrt(hd))
                # softmax in float32 (a no-op for float32 workloads)
                w = nn.softmax(scores.astype(jnp.float32), axis=-1).astype(v.dtype)
                ctx = jnp.matmul(w, v).transpose(0, 2, 1, 3).reshape(b, t, d)
                return Dense(d)(ctx)

        class EncoderLayer(nn.Module):
            # post-norm, dropout 0: x = LN(x + attn(x)); x = LN(x + ffn(x)). With bf16
            # Dense layers the residual sums (float32 + bfloat16) and LayerNorm are float32.
            @nn.compact
            def __call__(self, x):
                d = x.shape[-1]
                x = nn.LayerNorm(epsilon=1e-5)(x + Attention()(x))
                h = Dense(d)(nn.gelu(Dense(ffn)(x), approximate=False))
                return nn.LayerNorm(epsilon=1e-5)(x + h)

        class Transformer(nn.Module):
            @nn.compact
            def __call__(self, x):
                for _ in range(spec.extra["layers"]):
                    x = EncoderLayer()(x)
                return Dense(spec.classes)(x.mean(axis=1))
        return Transformer()

    if spec.name == "lstm":
        class LSTMLanguageModel(nn.Module):
            @nn.compact
            def __call__(self, ids):                # [N, T] int32
                x = nn.Embed(spec.classes, spec.extra["embed"])(ids)
                x = nn.RNN(nn.OptimizedLSTMCell(spec.extra["hidden"]))(x)
                return nn.Dense(spec.classes)(x)    # [N, T, vocab]
        return LSTMLanguageModel()
    raise ValueError(spec.name)


class FlaxTrainer:
    impl = "flax"

    def __init__(self, spec):
        self.spec = spec

    def define(self, first_batch):
        import jax
        import jax.numpy as jnp
        import optax
        model = _flax_module(self.spec)
        x, _ = flax_batch(self.spec, first_batch)
        params = model.init(jax.random.PRNGKey(0), x)       # eager, as users write it
        tx = optax.adam(ADAM_LR)
        opt_state = tx.init(params)

        def loss_fn(p, x, y):
            logits = model.apply(p, x).astype(jnp.float32)   # the loss in float32
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

        def train_step(p, s, x, y):
            loss, grads = jax.value_and_grad(loss_fn)(p, x, y)
            updates, s = tx.update(grads, s, p)
            return optax.apply_updates(p, updates), s, loss

        self._raw_step = train_step
        self._step = jax.jit(train_step, donate_argnums=(0, 1))
        self.params, self.opt_state = params, opt_state

    def prepare(self, batch):
        return flax_batch(self.spec, batch)

    def step(self, prepared):
        x, y = prepared
        self.params, self.opt_state, loss = self._step(self.params, self.opt_state, x, y)
        return np.asarray(loss)   # read back to the host, as progdesc's run returns it

    def compiled_step(self, batch):
        x, y = flax_batch(self.spec, batch)
        return self._step.lower(self.params, self.opt_state, x, y).compile()


TRAINERS = {"progdesc": ProgdescTrainer, "flax": FlaxTrainer}


def trainer(impl, name):
    return TRAINERS[impl](SPECS[name])
