"""Where progdesc loses: `python -m bench.profile [section ...]`.

Sections:
  grads      per workload, forward + backward only (no optimizer, no Executor): progdesc's
             composed gradient ops (append_backward, lowered and jitted) against jax.grad
             of progdesc's own lowered forward. Same forward HLO, so the difference is the
             gradient compositions alone.
  layers     the same comparison for single transformer pieces (fc on [B, T, D], layer_norm,
             gelu, softmax, attention scores), to find the op whose composition is slow.
  executor   cProfile of Executor.run on the trivial program (per-call Python overhead).
  build      cProfile of build + append_backward + lower at 10k ops (top functions).
"""
import cProfile
import io
import pstats
import sys
import time

import numpy as np

from bench import workloads as W
from bench.common import hlo_summary, interleaved


def _state_avals(program, names):
    import jax
    from lowering import dtypes
    block = program.global_block()
    return {n: jax.ShapeDtypeStruct(tuple(block.var(n).shape),
                                    dtypes.to_numpy(block.var(n).desc.dtype)) for n in names}


def grad_pair(build_forward, feeds, log=print, label="", steps=20):
    """Time progdesc's backward program against jax.grad of its forward lowering.

    `build_forward()` returns (main, startup, loss, feed names) for a program with
    parameters and a scalar loss, built inside its own program_guard.
    """
    import jax
    import progdesc as pd
    from lowering.lower import lower_block
    from progdesc.feeding import with_feed_fetch

    main, startup, loss, feed_names = build_forward()
    exe, scope = pd.Executor(), pd.Scope()
    exe.run(startup, scope=scope)
    fwd = lower_block(with_feed_fetch(main, feed_names, (loss.name,)), 0)
    params = [p.name for p in main.all_parameters()]
    with pd.program_guard(main, startup):
        pairs = pd.append_backward(loss)
    grad_names = tuple(g.name for _, g in pairs)
    bwd = lower_block(with_feed_fetch(main, feed_names, (loss.name,) + grad_names), 0)
    state = {n: scope.find_var(n).value for n in set(fwd.reads) | set(bwd.reads)}
    feed_vals = tuple(feeds[n] for n in feed_names)

    def f_fwd(p, feeds):
        ro = {n: (p[n] if n in p else state[n]) for n in fwd.reads}
        (l,), _ = fwd.fn(feeds, {}, ro)
        return l.reshape(())

    ref = jax.jit(lambda p, feeds: jax.value_and_grad(f_fwd)(p, feeds))
    comp = jax.jit(lambda ro, feeds: bwd.fn(feeds, {}, ro)[0])
    p0 = {n: state[n] for n in params}
    ro = {n: state[n] for n in bwd.reads}
    with jax.enable_x64(True):
        out_ref = ref(p0, feed_vals)
        out_comp = comp(ro, feed_vals)
        jax.block_until_ready((out_ref, out_comp))
        err = max(float(np.max(np.abs(np.asarray(out_comp[1 + i]) - np.asarray(
            out_ref[1][p.name])))) for i, (p, _) in enumerate(pairs))
        res = interleaved({"composed": lambda: jax.block_until_ready(comp(ro, feed_vals)),
                           "jax.grad": lambda: jax.block_until_ready(ref(p0, feed_vals))},
                          steps=steps, warmup=2, block=5)
        hc = hlo_summary(comp.lower(ro, feed_vals).compile())
        hr = hlo_summary(ref.lower(p0, feed_vals).compile())
    ratio = res["composed"]["median_s"] / res["jax.grad"]["median_s"]
    log(f"  {label}: composed {res['composed']['median_s'] * 1e3:.2f} ms vs jax.grad "
        f"{res['jax.grad']['median_s'] * 1e3:.2f} ms (x{ratio:.2f}); flops "
        f"{hc.get('flops', 0) / 1e9:.3f} vs {hr.get('flops', 0) / 1e9:.3f} G, bytes "
        f"{hc.get('bytes_accessed', 0) / 2**20:.0f} vs {hr.get('bytes_accessed', 0) / 2**20:.0f}"
        f" MB, temp {hc.get('temp_mb', 0):.1f} vs {hr.get('temp_mb', 0):.1f} MB; "
        f"max |grad diff| {err:.1e}")
    return {"composed_s": res["composed"]["median_s"], "jax_grad_s": res["jax.grad"]["median_s"],
            "ratio": ratio, "composed_hlo": hc, "jax_grad_hlo": hr, "max_abs_diff": err}


def _workload_forward(name):
    def build():
        import progdesc as pd
        from progdesc import layers, ops
        spec = W.SPECS[name]
        main, startup = pd.Program(), pd.Program()
        with pd.program_guard(main, startup):
            x = pd.data("x", [None, *spec.x_shape])
            label = pd.data("label", [None, 1], "int64")
            if name == "mlp":
                h = layers.fc(layers.fc(x, 512, act="relu"), 512, act="relu")
                logits = layers.fc(h, 10)
            elif name == "cnn":
                h = layers.pool2d(layers.conv2d(x, 32, 5, padding=2, act="relu"), 2)
                h = layers.pool2d(layers.conv2d(h, 64, 5, padding=2, act="relu"), 2)
                logits = layers.fc(layers.fc(h, 1024, act="relu"), 10)
            else:
                h = x
                for _ in range(2):
                    h = layers.transformer_encoder_layer(h, 4, 1024, dropout_rate=0.0,
                                                         is_test=True)
                logits = layers.fc(ops.reduce_mean(h, axis=[1]), 10)
            loss = ops.mean(layers.softmax_with_cross_entropy(logits, label))
        return main, startup, loss, ("x", "label")
    return build


def _piece(kind):
    def build():
        import progdesc as pd
        from progdesc import layers, ops
        main, startup = pd.Program(), pd.Program()
        with pd.program_guard(main, startup):
            x = pd.data("x", [16, 128, 256])
            r = pd.data("r", [16, 128, 256 if kind != "fc3d_ffn" else 1024])
            x.stop_gradient = False
            if kind == "fc3d":
                y = layers.fc(x, 256, num_flatten_dims=2)
            elif kind == "fc3d_ffn":
                y = layers.fc(x, 1024, num_flatten_dims=2)
            elif kind == "fc2d":
                y = ops.reshape(layers.fc(ops.reshape(x, shape=[-1, 256]), 256), shape=[16, 128, 256])
            elif kind == "layer_norm":
                y = layers.layer_norm(x, begin_norm_axis=2)
            elif kind == "gelu":
                y = ops.gelu(layers.fc(x, 256, num_flatten_dims=2))
            elif kind == "attention":
                y = layers.multi_head_attention(x, num_heads=4)
            elif kind == "softmax":
                y = ops.softmax(layers.fc(x, 256, num_flatten_dims=2))
            elif kind == "gelu_only":
                y = ops.gelu(ops.mul(x, pd.create_parameter([256], attr=pd.ParamAttr("p.w_0", pd.initializer.Constant(1.0)))))
            elif kind == "softmax_only":
                y = ops.softmax(ops.mul(x, pd.create_parameter([256], attr=pd.ParamAttr("p.w_0", pd.initializer.Constant(1.0)))))
            loss = ops.mean(ops.mul(y, r))
        return main, startup, loss, ("x", "r")
    return build


def section_grads(log=print, steps=20):
    out = {}
    for name in W.STANDARD:
        spec = W.SPECS[name]
        x, y = W.make_batches(spec, 1)[0]
        out[name] = grad_pair(_workload_forward(name), {"x": x, "label": y}, log,
                              label=f"{name} fwd+bwd", steps=steps)
    return out


LAYER_KINDS = ("fc3d", "fc2d", "fc3d_ffn", "layer_norm", "gelu_only", "softmax_only", "gelu",
               "softmax", "attention")


def section_layers(log=print, steps=20, kinds=LAYER_KINDS):
    rng = np.random.default_rng(0)
    out = {}
    for kind in kinds:
        feeds = {"x": rng.standard_normal((16, 128, 256)).astype(np.float32),
                 "r": rng.standard_normal((16, 128, 1024 if kind == "fc3d_ffn" else 256)
                                          ).astype(np.float32)}
        out[kind] = grad_pair(_piece(kind), feeds, log, label=kind, steps=steps)
    return out


def _profile(fn, top=25, sort="cumulative"):
    pr = cProfile.Profile()
    pr.enable()
    fn()
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats(sort).print_stats(top)
    return s.getvalue()


def section_executor(log=print, calls=3000):
    import jax
    from bench.overhead import trivial_program
    main, exe, scope, y = trivial_program()
    xs = np.ones((1, 4), np.float32)
    for _ in range(50):
        exe.run(main, feed={"x": xs}, fetch_list=[y], scope=scope)
    jitted = jax.jit(lambda v: v * 2.0)

    def loop():
        for _ in range(calls):
            exe.run(main, feed={"x": xs}, fetch_list=[y], scope=scope)
    text = _profile(loop, top=30, sort="tottime")
    log(text)
    # wall-clock pieces
    t0 = time.perf_counter()
    for _ in range(calls):
        with jax.enable_x64(True):
            pass
    t_x64 = (time.perf_counter() - t0) / calls
    t0 = time.perf_counter()
    for _ in range(calls):
        np.asarray(jitted(xs))
    t_raw = (time.perf_counter() - t0) / calls
    t0 = time.perf_counter()
    with jax.enable_x64(True):
        for _ in range(calls):
            np.asarray(jitted(xs))
    t_raw64 = (time.perf_counter() - t0) / calls
    log(f"  enter+exit jax.enable_x64(True): {t_x64 * 1e6:.1f} us; raw jitted call "
        f"{t_raw * 1e6:.1f} us, inside enable_x64 {t_raw64 * 1e6:.1f} us")
    return text


def section_build(log=print, n=10000):
    from bench import build_scaling
    build_scaling.measure(200)
    import progdesc as pd
    from lowering.lower import lower_block
    from progdesc.feeding import with_feed_fetch
    holder = {}

    def b():
        holder["p"] = build_scaling.build_chain(n)

    def bw():
        pd.append_backward(holder["p"][2])

    def lo():
        lower_block(with_feed_fetch(holder["p"][0], ("x",), (holder["p"][2].name,)), 0)

    for what, fn in (("build", b), ("backward", bw), ("lower", lo)):
        log(f"--- {what} ({n} forward ops), by own time ---")
        log(_profile(fn, top=15, sort="tottime"))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    sections = argv or ["grads", "layers", "executor", "build"]
    for s in sections:
        print(f"== {s} ==", flush=True)
        {"grads": section_grads, "layers": section_layers, "executor": section_executor,
         "build": section_build}[s]()


if __name__ == "__main__":
    main()
