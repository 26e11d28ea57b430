"""Gradient accumulation rows of the scaling table (bench/scaling.py `--accumulate K`).

One update made of K micro-batches, timed against hand-written JAX in the same process,
every implementation reading each micro-batch's loss back to the host:

- 1 device: progdesc's `accumulate_gradients(main, K)` (K runs of the program) against the
  Flax model with `optax.MultiSteps(adam, K)`, its train step under `jax.jit` called K
  times; and both without accumulation (K ordinary steps), to show what accumulation adds.
- k > 1 devices, data parallel: progdesc's `data_parallel` then `accumulate_gradients`
  (each micro-batch's gradients all-reduced) against a hand-written `shard_map` step that
  all-reduces each micro-batch's gradients too ("JAX each"), and one that accumulates on
  each device and all-reduces once per update, as DDP's `no_sync` does ("JAX once"): the
  cost of progdesc's choice.
"""
import numpy as np

ONE_DEVICE = ("progdesc accumulate", "optax.MultiSteps", "progdesc steps", "flax steps")
DATA_PARALLEL = ("progdesc dp accumulate", "JAX each", "JAX once")


def measure(k, names, steps, micro):
    """Rows timing one update of `micro` micro-batches of each workload on k devices."""
    from bench import workloads as W
    from bench.common import interleaved
    rows = []
    for name in names:
        spec = W.SPECS[name]
        batches = W.make_batches(spec, micro, batch=spec.batch * k)
        fns = _one_device(spec, batches, micro) if k == 1 else _data_parallel(
            spec, batches, micro, k)
        for fn in fns.values():
            fn()   # compile
        timed = interleaved(fns, steps=steps, warmup=1, block=3)
        rows += [{"workload": name, "mode": mode, "devices": k, "micro_batches": micro,
                  "micro_batch": spec.batch * k, "update_s": r["median_s"]}
                 for mode, r in timed.items()]
    return rows


def _progdesc_update(spec, batches, micro, k):
    import progdesc as pd
    from bench import workloads as W
    from progdesc import distributed as dist
    main, startup, _, _, loss = W.build_progdesc(spec)
    if k > 1:
        dist.data_parallel(main)
    if micro > 1:
        dist.accumulate_gradients(main, micro, startup)
    exe = pd.Executor(mesh=dist.Mesh({"data": k})) if k > 1 else pd.Executor()
    scope = pd.Scope()
    exe.run(startup, scope=scope)
    feeds = [{"x": x, "label": y} for x, y in batches]
    return lambda: [exe.run(main, feed=f, fetch_list=[loss], scope=scope)[0] for f in feeds]


def _loss_fn(spec):
    import jax.numpy as jnp
    import optax
    from bench import workloads as W
    model = W._flax_module(spec)

    def loss_fn(p, x, y):
        logits = model.apply(p, x).astype(jnp.float32)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    return model, loss_fn


def _one_device(spec, batches, micro):
    import jax
    import optax
    from bench import workloads as W
    fns = {"progdesc accumulate": _progdesc_update(spec, batches, micro, 1),
           "progdesc steps": _progdesc_update(spec, batches, 1, 1)}
    model, loss_fn = _loss_fn(spec)
    prepared = [W.flax_batch(spec, b) for b in batches]
    for mode, tx in (("optax.MultiSteps", optax.MultiSteps(optax.adam(W.ADAM_LR), micro)),
                     ("flax steps", optax.adam(W.ADAM_LR))):
        def train_step(p, s, x, y, tx=tx):
            loss, grads = jax.value_and_grad(loss_fn)(p, x, y)
            updates, s = tx.update(grads, s, p)
            return optax.apply_updates(p, updates), s, loss
        params = model.init(jax.random.PRNGKey(0), prepared[0][0])
        state = {"p": params, "s": tx.init(params)}
        step = jax.jit(train_step, donate_argnums=(0, 1))

        def update(state=state, step=step):
            out = []
            for x, y in prepared:
                state["p"], state["s"], loss = step(state["p"], state["s"], x, y)
                out.append(np.asarray(loss))
            return out
        fns[mode] = update
    return fns


def _data_parallel(spec, batches, micro, k):
    """progdesc against two hand-written shard_map steps: the all-reduce on every
    micro-batch, or once per update on the accumulated gradients."""
    import jax
    import jax.numpy as jnp
    import optax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from bench import workloads as W
    fns = {"progdesc dp accumulate": _progdesc_update(spec, batches, micro, k)}
    model, loss_fn = _loss_fn(spec)
    mesh = Mesh(np.array(jax.devices()[:k]), ("data",))
    split = NamedSharding(mesh, P("data"))
    prepared = [tuple(jax.device_put(a, split) for a in W.flax_batch(spec, b))
                for b in batches]
    tx = optax.adam(W.ADAM_LR)

    def acc_spec_of(each):
        return P() if each else P("data")

    def make_step(final, each):
        # acc: the running sum, replicated ("each"), or this device's own, which
        # "once" keeps as a leading dim of 1 of a [k, ...] array split over the devices
        def body(p, s, acc, x, y):
            loss, g = jax.value_and_grad(loss_fn)(p, x, y)
            if each:
                acc = jax.tree.map(lambda a, d: a + d, acc, jax.lax.pmean(g, "data"))
            else:
                acc = jax.tree.map(lambda a, d: a + d[None], acc, g)
            if final:
                mean = jax.tree.map(lambda a: a / micro, acc) if each else \
                    jax.lax.pmean(jax.tree.map(lambda a: a[0] / micro, acc), "data")
                updates, s = tx.update(mean, s, p)
                p = optax.apply_updates(p, updates)
                acc = jax.tree.map(jnp.zeros_like, acc)
            return p, s, acc, jax.lax.pmean(loss, "data")
        acc_spec = acc_spec_of(each)
        mapped = jax.shard_map(body, mesh=mesh, in_specs=(P(), P(), acc_spec, P("data"),
                                                          P("data")),
                               out_specs=(P(), P(), acc_spec, P()))
        return jax.jit(mapped, donate_argnums=(0, 1, 2))

    for mode, each in (("JAX each", True), ("JAX once", False)):
        params = model.init(jax.random.PRNGKey(0), prepared[0][0][:1])
        lead = () if each else (k,)
        acc = jax.tree.map(lambda a: jax.device_put(jnp.zeros(lead + a.shape, a.dtype),
                                                    NamedSharding(mesh, acc_spec_of(each))),
                           params)
        state = {"p": params, "s": tx.init(params), "acc": acc}
        mid, last = make_step(False, each), make_step(True, each)

        def update(state=state, mid=mid, last=last):
            out = []
            for i, (x, y) in enumerate(prepared):
                step = last if i == len(prepared) - 1 else mid
                state["p"], state["s"], state["acc"], loss = step(
                    state["p"], state["s"], state["acc"], x, y)
                out.append(np.asarray(loss))
            return out
        fns[mode] = update
    return fns


def table(rows):
    """The accumulation rows as text, with progdesc's ratios to hand-written JAX."""
    by = {(r["workload"], r["devices"], r["mode"]): r["update_s"] for r in rows}
    lines = []
    for (name, k) in dict.fromkeys((r["workload"], r["devices"]) for r in rows):
        r = next(r for r in rows if (r["workload"], r["devices"]) == (name, k))
        shape = f"{r['micro_batches']} x b{r['micro_batch']}"
        modes = ONE_DEVICE if k == 1 else DATA_PARALLEL
        t = [by[name, k, m] for m in modes]
        cells = " | ".join(f"{m} {s * 1e3:.1f} ms" for m, s in zip(modes, t))
        ratios = (f"x{t[0] / t[1]:.2f} vs optax.MultiSteps, accumulation adds "
                  f"{t[0] / t[2] - 1:+.0%} (optax {t[1] / t[3] - 1:+.0%})" if k == 1 else
                  f"x{t[0] / t[1]:.2f} vs JAX each, x{t[0] / t[2]:.2f} vs JAX once")
        lines.append(f"{name:<12} {k} device(s), {shape}: {cells}\n"
                     f"{'':<12} {ratios}")
    return "\n".join(lines)
