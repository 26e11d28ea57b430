"""The pipeline rows of bench/scaling.py: progdesc's pipeline against a hand-written JAX one.

The workload: x [N, 512] -> four dense 512 -> 512 relu layers -> mean softmax cross entropy
over the 512 outputs (labels < 10), Adam 1e-3; on k stages layer p runs on stage p * k // 4,
the loss on the last. Equal stages, so that the JAX version can be what JAX users write:

- progdesc: the layers under `pipeline_stage`, `progdesc.distributed.pipeline` (GPipe,
  `MICRO_BATCHES`), run on `Mesh({"pipe": k})`: one device per stage, holding its layers.
- JAX: the layers' weights stacked [k, 4 / k, 512, 512] and split over the pipe axis
  (each device holds its stage's); `shard_map` with a `lax.scan` over M + k - 1 ticks in
  which each device runs its layers on the micro-batch in hand and `lax.ppermute`s the
  result to the next; the last stage adds its loss. `jax.grad` through it is the backward
  pipeline; optax's Adam in the same jit.

Both split the batch into the same micro-batches and take the same steps.
"""
import numpy as np

NAME = "mlp4x512"
MICRO_BATCHES = 4
WIDTH = 512
LAYERS = 4


def progdesc_pipeline(k):
    """(main, startup, x, label, loss) of the workload as a k-stage GPipe pipeline."""
    import progdesc as pd
    from bench import workloads as W
    from progdesc import distributed as dist
    from progdesc import layers, ops
    from progdesc.optimizer import Adam
    main, startup = pd.Program(random_seed=0), pd.Program(random_seed=0)
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, WIDTH])
        label = pd.data("label", [None, 1], "int64")
        h = x
        for p in range(LAYERS):
            with dist.pipeline_stage(p * k // LAYERS):
                h = layers.fc(h, WIDTH, act="relu")
        loss = ops.mean(layers.softmax_with_cross_entropy(h, label))
        dist.pipeline(main, MICRO_BATCHES)
        Adam(W.ADAM_LR).minimize(loss)
    return main, startup, x, label, loss


def batch(k, seed=0):
    """(x, label) of 128 k examples, as the MLP rows' weak scaling feeds."""
    rng = np.random.default_rng(seed)
    n = 128 * k
    return (rng.standard_normal((n, WIDTH)).astype("f"),
            rng.integers(0, 10, (n, 1)).astype(np.int64))


def jax_pipeline(k, data, seed=0):
    """A zero-argument step of the hand-written shard_map pipeline (see the module
    docstring) training on `data`; it returns the loss as a NumPy value."""
    import jax
    import jax.numpy as jnp
    import optax
    from jax import lax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    from bench import workloads as W
    rng = np.random.default_rng(seed)
    per = LAYERS // k
    params = {"w": rng.normal(0, WIDTH ** -.5, (k, per, WIDTH, WIDTH)).astype("f"),
              "b": np.zeros((k, per, WIDTH), "f")}
    mesh = Mesh(np.array(jax.devices()[:k]), ("pipe",))
    x, y = data
    m = MICRO_BATCHES
    xs = x.reshape(m, -1, WIDTH)
    ys = y[:, 0].astype(np.int32).reshape(m, -1)

    def pipeline_loss(params, xs, ys):
        me = lax.axis_index("pipe")
        w, b = params["w"][0], params["b"][0]     # this stage's layers

        def tick(carry, t):
            h, total = carry
            i = jnp.clip(t - me, 0, m - 1)        # the micro-batch this stage works on
            live = (t - me >= 0) & (t - me < m)
            h = jnp.where(me == 0, xs[i], h)
            for j in range(per):
                h = jax.nn.relu(h @ w[j] + b[j])
            loss = optax.softmax_cross_entropy_with_integer_labels(h, ys[i]).mean()
            total = total + jnp.where(live & (me == k - 1), loss, 0.0)
            h = lax.ppermute(h, "pipe", [(s, s + 1) for s in range(k - 1)])
            return (h, total), None
        start = (lax.pcast(jnp.zeros(xs.shape[1:], xs.dtype), ("pipe",), to="varying"),
                 lax.pcast(jnp.zeros((), xs.dtype), ("pipe",), to="varying"))
        (_, total), _ = lax.scan(tick, start, jnp.arange(m + k - 1))
        return lax.psum(total, "pipe") / m

    split = {"w": P("pipe"), "b": P("pipe")}
    mapped = jax.shard_map(pipeline_loss, mesh=mesh, in_specs=(split, P(), P()),
                           out_specs=P())
    tx = optax.adam(W.ADAM_LR)

    @jax.jit
    def train_step(params, opt_state, xs, ys):
        loss, grads = jax.value_and_grad(mapped)(params, xs, ys)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    shardings = {n: NamedSharding(mesh, spec) for n, spec in split.items()}
    state = {"params": jax.device_put(params, shardings)}
    state["opt"] = tx.init(state["params"])
    rep = NamedSharding(mesh, P())
    xs, ys = jax.device_put(xs, rep), jax.device_put(ys, rep)

    def step():
        state["params"], state["opt"], loss = train_step(state["params"], state["opt"], xs, ys)
        return np.asarray(loss)
    return step, state


def bubble(k):
    """GPipe's idle ticks over all ticks on k stages with MICRO_BATCHES."""
    from progdesc.distributed.pipeline import bubble_fraction, ticks
    return bubble_fraction(ticks("gpipe", k, MICRO_BATCHES), k)


def most_state_on_one_device(program, scope):
    """Bytes of `program`'s persistables on the device that holds the most of them."""
    from progdesc import io
    per_device = {}
    for name in io.persistable_vars(program):
        if name in scope:
            value = scope.get(name)
            for shard in getattr(value, "addressable_shards", ()):
                per_device[shard.device] = per_device.get(shard.device, 0) + shard.data.nbytes
    return max(per_device.values(), default=0)
