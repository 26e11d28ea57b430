"""Models imported from Flax (issue 24 item 6): a training step of the imported program
against the original's `jax.jit` step, interleaved in one process.

The models are written here in the shape of google/flax's examples (not copied): the
mnist CNN with BatchNorm in training mode, and a small causal transformer language model
(lm1b's shape: embedding, self-attention blocks, layer norms, a vocabulary projection).
The training step's loss (optax's softmax cross-entropy of the model's logits) is imported
with the model (`from_flax(..., method=loss_fn, eval_mode=...)`) and Adam minimizes it;
the reference is the same model and loss stepped by optax's Adam under `jax.jit` with
donated state. Ratio = progdesc /
original; the target is x1.05.
"""
import numpy as np

from bench.common import interleaved


def _models():
    import jax.numpy as jnp
    from flax import linen as nn

    class CNN(nn.Module):
        @nn.compact
        def __call__(self, x, train: bool):
            x = nn.Conv(32, (3, 3))(x)
            x = nn.BatchNorm(use_running_average=not train, momentum=0.9)(x)
            x = nn.avg_pool(nn.relu(x), (2, 2), strides=(2, 2))
            x = nn.relu(nn.Conv(64, (3, 3))(x))
            x = nn.avg_pool(x, (2, 2), strides=(2, 2)).reshape((x.shape[0], -1))
            return nn.Dense(10)(nn.relu(nn.Dense(256)(x)))

    class Block(nn.Module):
        heads: int
        @nn.compact
        def __call__(self, x, train: bool):
            mask = nn.make_causal_mask(jnp.ones(x.shape[:2]))
            x = x + nn.SelfAttention(self.heads, deterministic=True)(nn.LayerNorm()(x), mask)
            h = nn.Dense(4 * x.shape[-1])(nn.LayerNorm()(x))
            return x + nn.Dense(x.shape[-1])(nn.gelu(h))

    class LM(nn.Module):
        vocab: int = 1000
        dim: int = 128
        @nn.compact
        def __call__(self, tokens, train: bool):
            x = nn.Embed(self.vocab, self.dim)(tokens)
            for _ in range(2):
                x = Block(4)(x, train)
            return nn.Dense(self.vocab)(nn.LayerNorm()(x))

    rng = np.random.default_rng(0)
    cnn = (CNN(), rng.normal(size=(64, 28, 28, 1)).astype(np.float32),
           rng.integers(0, 10, size=(64,)).astype(np.int32))
    lm = (LM(), rng.integers(0, 1000, size=(16, 64)).astype(np.int32),
          rng.integers(0, 1000, size=(16, 64)).astype(np.int32))
    return {"mnist_cnn": cnn, "lm_transformer": lm}


def _loss_fn(module, x, y, train):
    """The training step's loss, as the examples write it; the imported program computes
    it too (`from_flax(..., method=_loss_fn)`), so both sides run the same computation."""
    import optax
    logits = module(x, train)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def _original_step(model, variables, x, y, lr):
    """step() of the jitted Flax + optax step over donated state."""
    import jax
    import optax

    tx = optax.adam(lr)
    params, rest = variables["params"], {k: v for k, v in variables.items() if k != "params"}
    state = [params, rest, tx.init(params)]

    def loss_fn(params, rest, x, y):
        return model.apply({"params": params, **rest}, x, y, method=_loss_fn, train=True,
                           mutable=list(rest))

    @jax.jit
    def raw(params, rest, opt_state, x, y):
        (loss, updates), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, rest, x, y)
        changes, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, changes), {**rest, **updates}, opt_state, loss

    step_fn = jax.jit(raw, donate_argnums=(0, 1, 2))
    x, y = jax.device_put(x), jax.device_put(y)

    def step():
        state[0], state[1], state[2], loss = step_fn(*state, x, y)
        return float(loss)
    return step


def _progdesc_step(model, variables, x, y, lr):
    """step() of the imported loss trained by progdesc's Adam."""
    import jax
    import progdesc as pd
    from progdesc.optimizer import Adam

    scope = pd.Scope()
    main, feeds, (loss,) = pd.from_flax(model, variables, x, y, scope=scope, method=_loss_fn,
                                        train=True, eval_mode={"train": False})
    startup = pd.Program()
    with pd.program_guard(main, startup):
        Adam(lr).minimize(loss)
    exe = pd.Executor()
    exe.run(startup, scope=scope)   # the optimizer's state
    feed = dict(zip(feeds, (jax.device_put(x), jax.device_put(y))))

    def step():
        return float(exe.run(main, feed=feed, fetch_list=[loss], scope=scope,
                             return_numpy=False)[0])
    return step


def run(steps=20, log=print):
    """{model: {"progdesc_s", "original_s", "ratio"}} of one training step each."""
    import jax
    results = {}
    for name, (model, x, y) in _models().items():
        variables = model.init(jax.random.key(0), x, train=False)
        with jax.enable_x64(False):
            original = _original_step(model, variables, x, y, 1e-3)
        imported = _progdesc_step(model, variables, x, y, 1e-3)
        res = interleaved({"progdesc": imported, "original": original}, steps=steps,
                          warmup=3, block=5)
        p, o = res["progdesc"]["median_s"], res["original"]["median_s"]
        results[name] = {"progdesc_s": p, "original_s": o, "ratio": p / o}
        log(f"  {name}: imported {p * 1e3:.2f} ms vs original jax.jit {o * 1e3:.2f} ms "
            f"(x{p / o:.3f})")
    return results
