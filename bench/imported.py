"""Models imported from Flax (issue 24): a training step of the imported program against
the original's `jax.jit` step, interleaved in one process.

The models are those tests/test_flax_examples_*.py write in the shape of google/flax's
examples (mnist, imagenet's ResNet-18, lm1b, wmt), here at bench sizes. Each is imported
with its training step's loss (`from_flax(..., method=loss_fn)`, so both
sides compute the same loss, dropout in training mode included) and progdesc's Adam
minimizes it; the reference is the same model and loss stepped by optax's Adam under
`jax.jit` with donated state. Ratio = progdesc / original; the target is x1.05.
"""
import os
import sys

import numpy as np

from bench.common import interleaved

TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
LEARNING_RATE = 1e-3


def _examples():
    """{name: zero-argument builder of an `Example` (tests/flax_examples.py) at bench size}."""
    if TESTS not in sys.path:
        sys.path.insert(0, TESTS)
    import jax
    import test_flax_examples_images as images
    import test_flax_examples_transformers as transformers
    from flax_examples import Example

    rng = np.random.default_rng(0)

    def linen(model, inputs, targets, loss_fn, **kwargs):
        variables = jax.jit(model.init)({"params": jax.random.key(0),
                                         "dropout": jax.random.key(1)}, *inputs)
        return Example(model, variables, inputs, targets, loss_fn, None, **kwargs)

    def labels(batch):
        return rng.integers(0, 10, batch).astype(np.int32)

    def tokens(batch, length, vocab):
        return rng.integers(1, vocab, (batch, length)).astype(np.int32)

    def mnist():
        return linen(images.MnistCNN(), (rng.uniform(size=(64, 28, 28, 1)).astype(np.float32),),
                     (labels(64),), images.mnist_loss)

    def imagenet():
        return linen(images.ResNet18(num_classes=10, num_filters=16),
                     (rng.uniform(size=(16, 64, 64, 3)).astype(np.float32),), (labels(16),),
                     images.imagenet_loss, train_kwargs={"train": True},
                     eval_kwargs={"train": False})

    sizes = dict(vocab_size=1000, output_vocab_size=1000, emb_dim=128, qkv_dim=128,
                 mlp_dim=512, num_heads=4, num_layers=2, max_len=64)
    dropout = dict(train_kwargs={"rngs": {"dropout": jax.random.key(2)}},
                   eval_kwargs={"deterministic": True})

    def lm1b():
        inputs = tokens(16, 64, 1000)
        positions = np.broadcast_to(np.arange(64, dtype=np.int32), inputs.shape).copy()
        return linen(transformers.TransformerLM(transformers.LMConfig(**sizes)),
                     (inputs, positions, np.ones_like(inputs)), (), transformers.lm1b_loss,
                     **dropout)

    def wmt():
        return linen(transformers.Transformer(transformers.WMTConfig(**sizes)),
                     (tokens(16, 64, 1000), tokens(16, 64, 1000)), (), transformers.wmt_loss,
                     **dropout)

    return {"mnist": mnist, "imagenet": imagenet, "lm1b": lm1b, "wmt": wmt}


def _original_step(example):
    """step() of the jitted Flax + optax step over donated state."""
    import jax
    import optax
    from flax.core import unfreeze

    tx = optax.adam(LEARNING_RATE)
    variables = unfreeze(example.variables)
    params = variables.pop("params")
    mutable = list(variables)
    state = [params, variables, tx.init(params)]
    batch = [jax.device_put(v) for v in (*example.inputs, *example.targets)]

    def loss_fn(params, rest, batch):
        apply = {"method": example.loss_fn, **example.train_kwargs}
        if not mutable:
            return example.model.apply({"params": params, **rest}, *batch, **apply), rest
        loss, updates = example.model.apply({"params": params, **rest}, *batch,
                                            mutable=mutable, **apply)
        return loss, {**rest, **updates}

    def raw(params, rest, opt_state, batch):
        (loss, rest), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, rest, batch)
        changes, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, changes), rest, opt_state, loss

    step_fn = jax.jit(raw, donate_argnums=(0, 1, 2))

    def step():
        state[0], state[1], state[2], loss = step_fn(*state, batch)
        return float(loss)
    return step


def _progdesc_step(example):
    """step() of the imported loss trained by progdesc's Adam."""
    import jax
    import progdesc as pd
    from progdesc.optimizer import Adam

    scope = pd.Scope()
    main, feeds, (loss,) = pd.from_flax(
        example.model, example.variables, *example.inputs, *example.targets, scope=scope,
        method=example.loss_fn, **example.train_kwargs)
    startup = pd.Program()
    with pd.program_guard(main, startup):
        Adam(LEARNING_RATE).minimize(loss)
    exe = pd.Executor()
    exe.run(startup, scope=scope)   # the optimizer's state
    feed = {name: jax.device_put(v)
            for name, v in zip(feeds, (*example.inputs, *example.targets))}

    def step():
        return float(exe.run(main, feed=feed, fetch_list=[loss], scope=scope,
                             return_numpy=False)[0])
    return step


def run(steps=20, log=print, only=None):
    """{model: {"progdesc_s", "original_s", "ratio"}} of one training step each."""
    results = {}
    for name, build in _examples().items():
        if only and name not in only:
            continue
        example = build()
        original, imported = _original_step(example), _progdesc_step(example)
        res = interleaved({"progdesc": imported, "original": original}, steps=steps,
                          warmup=3, block=5)
        p, o = res["progdesc"]["median_s"], res["original"]["median_s"]
        results[name] = {"progdesc_s": p, "original_s": o, "ratio": p / o}
        log(f"  {name}: imported {p * 1e3:.2f} ms vs original jax.jit {o * 1e3:.2f} ms "
            f"(x{p / o:.3f})")
    return results
