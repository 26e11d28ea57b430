"""Checkpoints while training (issue 29): what training pays for a checkpoint written in the
background, against a blocking save of the same state, in the same run.

`python -m bench.checkpoint [--hidden 4096] [--layers 3] [--saves 5] [--dir DIR]`

The workload is an MLP trained by Adam whose state (parameters and two moments) is
large: hidden 4096 and 3 layers hold about 0.45 GB. Between saves the state is trained
for a few steps (so every save writes new values). For each save:

- blocking: the save's wall time is what the training loop waits;
- background: the call's time (it takes the values), then steps run while the file is
  written; "lost" is the call plus, over the steps run until the write finished, each
  step's excess over the median step without a save (the first step after the call copies
  the state it donates: progdesc.scope), and the write's own wall time is shown beside it.

The two implementations take turns, a blocking and a background save each per round,
and the step time without a save is the median of the steps run between saves
throughout, so that a slow phase of a shared machine hits both alike.
The reference is the same MLP by hand in JAX (optax Adam, a jitted step with donated
state) saving as a JAX user would: `jax.device_get` at the call, then
`safetensors.numpy.save_file` to a temporary, fsync and `os.replace`, in a thread for the
background save (no checksums). On a CPU the writer thread competes with the step for the same
cores, so steps during a write are slower; on a GPU only the host side does.
"""
import argparse
import os
import statistics
import tempfile
import time

import numpy as np


def build(hidden, layers, features=1024, classes=10, seed=0):
    """(main, startup, loss, feed) of the MLP."""
    import progdesc as pd
    from progdesc import layers as L
    from progdesc import ops

    main, startup = pd.Program(random_seed=seed), pd.Program(random_seed=seed)
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, features])
        y = pd.data("y", [None, 1], "int64")
        h = x
        for _ in range(layers):
            h = L.fc(h, hidden, act="relu")
        loss = ops.mean(L.softmax_with_cross_entropy(L.fc(h, classes), y))
        pd.optimizer.Adam(1e-4).minimize(loss)
    return main, startup, loss, batch(features, classes, seed)


def batch(features=1024, classes=10, seed=0):
    """The one batch both implementations train on: {"x": [64, features], "y": [64, 1]}."""
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((64, features)).astype(np.float32),
            "y": rng.integers(0, classes, (64, 1)).astype(np.int64)}


class _Progdesc:
    """The MLP trained by progdesc's Executor; saves with `progdesc.io.save_checkpoint`."""

    def __init__(self, hidden, layers, path):
        import progdesc as pd
        main, startup, self.loss, self.feed = build(hidden, layers)
        self.main, self.exe, self.scope, self.path = main, pd.Executor(), pd.Scope(), path
        self.exe.run(startup, scope=self.scope)

    def step(self):
        out, = self.exe.run(self.main, feed=self.feed, fetch_list=[self.loss], scope=self.scope,
                            return_numpy=False)
        out.block_until_ready()

    def state_bytes(self):
        from progdesc import io
        return sum(np.asarray(self.scope.get(n)).nbytes for n in io.persistable_vars(self.main)
                   if n in self.scope)

    def save(self, background):
        from progdesc import io
        pending = io.save_checkpoint(self.path, self.main, self.scope, background=background)
        return pending or _Written()


class _Written:
    """A finished save, as a PendingSave."""

    def done(self):
        return True

    def wait(self):
        pass


class _Jax:
    """The same MLP by hand: a jitted optax Adam step with donated state; a checkpoint is
    `jax.device_get` at the call, then `safetensors.numpy.save_file` to a temporary, fsync
    and `os.replace` (in a thread when in the background): what a JAX user writes."""

    def __init__(self, hidden, layers, path):
        import jax
        import jax.numpy as jnp
        import optax
        self.path, feed = path, batch()
        rng = np.random.default_rng(0)
        dims = [feed["x"].shape[1]] + [hidden] * layers + [10]
        params = {}
        for i, (m, n) in enumerate(zip(dims, dims[1:])):
            params[f"w{i}"] = jnp.asarray(rng.standard_normal((m, n)).astype(np.float32)
                                          * np.float32(1 / np.sqrt(m)))
            params[f"b{i}"] = jnp.zeros((n,), jnp.float32)
        opt = optax.adam(1e-4)
        self.state = (params, opt.init(params))
        x, y = jnp.asarray(feed["x"]), jnp.asarray(feed["y"][:, 0].astype(np.int32))
        count = len(dims) - 1

        def loss(params):
            h = x
            for i in range(count):
                h = h @ params[f"w{i}"] + params[f"b{i}"]
                if i < count - 1:
                    h = jax.nn.relu(h)
            return optax.softmax_cross_entropy_with_integer_labels(h, y).mean()

        def step(state):
            params, opt_state = state
            value, grads = jax.value_and_grad(loss)(params)
            updates, opt_state = opt.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), value
        self._step = jax.jit(step, donate_argnums=0)

    def step(self):
        self.state, value = self._step(self.state)
        value.block_until_ready()

    def state_bytes(self):
        import jax
        return sum(v.nbytes for v in jax.tree_util.tree_leaves(self.state))

    def save(self, background):
        import threading

        import jax
        from safetensors.numpy import save_file
        leaves = jax.tree_util.tree_flatten_with_path(self.state)[0]
        host = jax.device_get({jax.tree_util.keystr(k): v for k, v in leaves})

        def write():
            tmp = self.path + ".tmp"
            save_file(host, tmp)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        if not background:
            write()
            return _Written()
        thread = threading.Thread(target=write)
        thread.start()
        thread.done, thread.wait = (lambda: not thread.is_alive()), thread.join
        return thread


def measure(hidden, layers, saves, directory, between=5, log=print):
    """{impl: {"state_mb", "step_s", "blocking": [...], "background": [...]}} for progdesc
    and the hand-written JAX loop: see the module docstring."""
    import jax
    trainers = {name: impl(hidden, layers, os.path.join(directory, f"bench-{name}.safetensors"))
                for name, impl in (("progdesc", _Progdesc), ("jax", _Jax))}
    plain = {name: [] for name in trainers}
    rows = {name: {"blocking": [], "background": []} for name in trainers}

    def step(trainer):
        t0 = time.perf_counter()
        trainer.step()
        return time.perf_counter() - t0

    for trainer in trainers.values():
        for _ in range(3):
            step(trainer)
    # rounds: each implementation in turn (the order alternating), a blocking then a
    # background save, each after `between` plain steps that give the step time of the round
    for i in range(saves):
        for name in (list(trainers) if i % 2 == 0 else list(trainers)[::-1]):
            trainer = trainers[name]
            for mode in ("blocking", "background"):
                plain[name].extend(step(trainer) for _ in range(between))
                t0 = time.perf_counter()
                pending = trainer.save(background=mode == "background")
                call = time.perf_counter() - t0
                during = []
                while not pending.done():
                    during.append(step(trainer))
                pending.wait()
                rows[name][mode].append({"call_s": call, "write_s": time.perf_counter() - t0,
                                         "during": during})
    results = {}
    for name, trainer in trainers.items():
        step_s = statistics.median(plain[name])
        for row in rows[name]["background"]:
            during = row.pop("during")
            row.update(steps=len(during), first_step_s=during[0] if during else None,
                       during_step_s=statistics.median(during) if during else None,
                       lost_s=row["call_s"] + sum(max(0.0, t - step_s) for t in during))
        for row in rows[name]["blocking"]:
            row.pop("during")
            row["lost_s"] = row["call_s"]
        results[name] = {"state_mb": trainer.state_bytes() / 2**20, "step_s": step_s,
                         "device": jax.devices()[0].device_kind, **rows[name]}
        log(f"{name}: state {results[name]['state_mb']:.0f} MiB, step {step_s * 1e3:.1f} ms "
            f"on {results[name]['device']}")
    return results


def report(results, log=print):
    """Print the medians of `measure`'s results."""
    for name, result in results.items():
        def med(mode, key):
            values = [r[key] for r in result[mode] if r.get(key) is not None]
            return statistics.median(values) if values else float("nan")
        blocking, lost = med("blocking", "lost_s"), med("background", "lost_s")
        log(f"{name}: step {result['step_s'] * 1e3:.1f} ms; blocking save: the loop waits "
            f"{blocking * 1e3:.0f} ms")
        log(f"  background: call {med('background', 'call_s') * 1e3:.1f} ms; write "
            f"{med('background', 'write_s') * 1e3:.0f} ms while "
            f"{med('background', 'steps'):.0f} steps ran (first "
            f"{med('background', 'first_step_s') * 1e3:.1f} ms, median "
            f"{med('background', 'during_step_s') * 1e3:.1f} ms)")
        log(f"  lost per checkpoint: {lost * 1e3:.0f} ms in the background vs "
            f"{blocking * 1e3:.0f} ms blocking (x{blocking / lost:.1f} less)")
    if {"progdesc", "jax"} <= set(results):
        def lost(name, mode):
            return statistics.median(r["lost_s"] for r in results[name][mode])
        log("progdesc / hand-written JAX, lost per checkpoint: blocking "
            f"x{lost('progdesc', 'blocking') / lost('jax', 'blocking'):.2f}, background "
            f"x{lost('progdesc', 'background') / lost('jax', 'background'):.2f}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--saves", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where to write (default: a temporary)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        results = measure(args.hidden, args.layers, args.saves, directory)
    report(results)
    return results


if __name__ == "__main__":
    main()
