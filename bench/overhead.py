"""Executor.run against a raw jitted call of the same function, per call.

Trivial program: one `scale` op (y = 2x) on a fed float32 [1, 4] array, y fetched; the
raw call is `jax.jit(lambda x: x * 2.0)`. Three pairings, on the same arrays:

- host:    NumPy feed, `exe.run(main, feed, fetch_list=[y])` (NumPy result, the default)
           against `np.asarray(jitted(x))`: what a user's loop pays per call; the target's;
- device:  NumPy feed, `return_numpy=False` then block_until_ready, against
           `jitted(x).block_until_ready()`;
- on device: a jax array fed and the result left on the device, against the jitted call
           on that jax array ("Executor.run on device arrays should cost what a jitted
           call costs").

Training steps, against `jax.jit` of the same lowered step with the state donated and
kept in dicts, as a JAX user would write it; the raw call runs inside
`jax.enable_x64(True)`, which its int64 state and labels need:

- train: a tiny MLP (4-8-3, Adam, int64 labels, batch 2: 20 persistables in, 19 out,
  next to no arithmetic), jax arrays fed, the loss left on the device and blocked on;
- mlp: the `steps` section's MLP b128 step as it runs there (NumPy feeds, the loss read
  back). Both sides run one compiled program, so on a GPU this row tells the Executor's
  per-call cost apart from the compiled step's (the `steps` section compares with Flax).
"""
import numpy as np

from bench.common import interleaved


def trivial_program():
    """(main, executor, scope, y): y = 2 * x for a [1, 4] x, startup already run."""
    import progdesc as pd
    from progdesc import ops

    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [1, 4])
        y = ops.scale(x, scale=2.0)
    exe, scope = pd.Executor(), pd.Scope()
    exe.run(startup, scope=scope)
    return main, exe, scope, y


def tiny_training_program():
    """(main, executor, scope, loss): a 4-8-3 MLP with Adam, startup already run."""
    import progdesc as pd
    from progdesc import layers, ops
    from progdesc.optimizer import Adam

    main, startup = pd.Program(random_seed=0), pd.Program(random_seed=0)
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 4])
        label = pd.data("label", [None, 1], "int64")
        logits = layers.fc(layers.fc(x, 8, act="relu"), 3)
        loss = ops.mean(layers.softmax_with_cross_entropy(logits, label))
        Adam(1e-3).minimize(loss)
    exe, scope = pd.Executor(), pd.Scope()
    exe.run(startup, scope=scope)
    return main, exe, scope, loss


def raw_training_step(main, scope, loss, feed):
    """A zero-argument raw step returning the loss on the device: jax.jit of `main`'s
    lowered step, state donated, in dicts."""
    import jax
    from lowering.lower import lower_block
    from progdesc.feeding import with_feed_fetch

    lowered = lower_block(with_feed_fetch(main, tuple(feed), (loss.name,)), 0)
    # its own copy of the state that gets donated; the read-only state is shared
    mutable = {n: scope.get(n).copy() for n in lowered.reads if n in lowered.writes}
    readonly = {n: scope.get(n) for n in lowered.reads if n not in lowered.writes}
    feeds = tuple(feed.values())
    jitted = jax.jit(lowered.fn, donate_argnums=(1,))
    state = [mutable]

    def step():
        with jax.enable_x64(True):
            fetched, written = jitted(feeds, state[0], readonly)
        state[0] = {n: written[n] for n in state[0]}
        return fetched[0]
    return step


def run(steps=2000, block=100, log=print):
    import jax

    import progdesc as pd
    from bench import workloads as W

    main, exe, scope, y = trivial_program()
    xs = np.arange(4, dtype=np.float32).reshape(1, 4)
    xd = jax.device_put(xs)
    feed, dfeed, fetch = {"x": xs}, {"x": xd}, [y]
    jitted = jax.jit(lambda v: v * 2.0)

    def step_pair(main, exe, scope, loss, feed, return_numpy):
        raw = raw_training_step(main, scope, loss, feed)
        if return_numpy:
            return (lambda: exe.run(main, feed=feed, fetch_list=[loss], scope=scope)[0],
                    lambda: np.asarray(raw()))
        return (lambda: exe.run(main, feed=feed, fetch_list=[loss], scope=scope,
                                return_numpy=False)[0].block_until_ready(),
                lambda: raw().block_until_ready())

    rng = np.random.default_rng(0)
    with jax.enable_x64(True):
        t_feed = {"x": jax.device_put(rng.standard_normal((2, 4)).astype(np.float32)),
                  "label": jax.device_put(np.array([[0], [2]], np.int64))}
    pd_train, raw_train = step_pair(*tiny_training_program(), t_feed, return_numpy=False)
    spec = W.SPECS["mlp"]
    m_main, m_startup, _, _, m_loss = W.build_progdesc(spec)
    m_exe, m_scope = pd.Executor(), pd.Scope()
    m_exe.run(m_startup, scope=m_scope)
    x_batch, y_batch = W.make_batches(spec, n=1)[0]
    pd_mlp, raw_mlp = step_pair(m_main, m_exe, m_scope, m_loss,
                                {"x": x_batch, "label": y_batch}, return_numpy=True)

    fns = {
        "progdesc_host": lambda: exe.run(main, feed=feed, fetch_list=fetch, scope=scope),
        "raw_host": lambda: np.asarray(jitted(xs)),
        "progdesc_device": lambda: exe.run(main, feed=feed, fetch_list=fetch, scope=scope,
                                           return_numpy=False)[0].block_until_ready(),
        "raw_device": lambda: jitted(xs).block_until_ready(),
        "progdesc_on_device": lambda: exe.run(main, feed=dfeed, fetch_list=fetch, scope=scope,
                                              return_numpy=False)[0].block_until_ready(),
        "raw_on_device": lambda: jitted(xd).block_until_ready(),
        "progdesc_train": pd_train,
        "raw_train": raw_train,
    }
    assert np.allclose(fns["progdesc_host"]()[0], np.asarray(jitted(xs)))
    for pd_step, raw_step in ((pd_train, raw_train), (pd_mlp, raw_mlp)):
        assert np.allclose(pd_step(), raw_step(), rtol=1e-2), "the two steps disagree"
    res = interleaved(fns, steps=steps, warmup=20, block=block)
    mlp_steps = max(steps // 20, 20)
    res.update(interleaved({"progdesc_mlp": pd_mlp, "raw_mlp": raw_mlp}, steps=mlp_steps,
                           warmup=5, block=5))
    out = {k: {"median_s": v["median_s"], "min_s": v["min_s"], "n": v["n"]}
           for k, v in res.items()}
    pairs = {"ratio": "host", "ratio_device": "device", "ratio_on_device": "on_device",
             "ratio_train": "train", "ratio_mlp": "mlp"}
    for ratio, pair in pairs.items():
        out[ratio] = res[f"progdesc_{pair}"]["median_s"] / res[f"raw_{pair}"]["median_s"]

    def us(pair):
        return (f"{res[f'progdesc_{pair}']['median_s'] * 1e6:.1f} us vs "
                f"{res[f'raw_{pair}']['median_s'] * 1e6:.1f} us")
    log(f"  trivial program: Executor.run {us('host')} jitted (x{out['ratio']:.2f}); "
        f"device results: {us('device')} (x{out['ratio_device']:.2f}); "
        f"device feeds and results: {us('on_device')} (x{out['ratio_on_device']:.2f})")
    log(f"  tiny training step, device feeds and loss: {us('train')} raw jit "
        f"(x{out['ratio_train']:.2f}); MLP b{spec.batch} step, NumPy feeds, loss read back: "
        f"{us('mlp')} (x{out['ratio_mlp']:.2f})")
    return out
