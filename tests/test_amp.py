"""Mixed precision (progdesc.amp): the rewrite, bf16 training, fp16 loss scaling, and
clone / checkpoint / inference model / export of rewritten programs.

Loss-curve tolerance (also in the README): training the same model from the
same initial weights on the same batches, every per-step bfloat16 loss is
within 0.02 + 3% of the float32 loss.
"""
import numpy as np
import pytest

import progdesc as pd
from lowering import progdesc_pb2 as pb
from progdesc import amp, custom_op, export, io, layers, ops
from progdesc.demo import load_digits

CURVE_ATOL, CURVE_RTOL = 0.02, 0.03
BATCH = 128
LOSS_SCALING_STATE = ("loss_scaling_0", "num_good_steps_0", "num_bad_steps_0")
EXE = pd.Executor()   # one compile cache for the whole module


@pytest.fixture(scope="module")
def digits():
    return load_digits()


def batches(digits, steps, flat):
    tx, ty = digits[:2]
    for i in range(steps):
        j = (i * BATCH) % (len(tx) - BATCH)
        x = tx[j:j + BATCH]
        yield {"x": x.reshape(BATCH, 64) if flat else x, "y": ty[j:j + BATCH]}


def build(kind, dtype=None, **amp_options):
    """An MLP or CNN for the 8x8 digits trained by Adam, in float32 or mixed precision.

    Returns (main, startup, test program, loss, logits, optimizer).
    """
    main, startup = pd.Program(random_seed=1), pd.Program(random_seed=1)
    with pd.program_guard(main, startup):
        if kind == "mlp":
            x = pd.data("x", [None, 64])
            h = layers.fc(x, 64, act="relu")
        else:
            x = pd.data("x", [None, 1, 8, 8])
            h = layers.pool2d(layers.conv2d(x, 8, 3, padding=1, act="relu"), 2)
            h = layers.pool2d(layers.conv2d(h, 16, 3, padding=1, act="relu"), 2)
        logits = layers.fc(h, 10)
        y = pd.data("y", [None, 1], "int64")
        loss = ops.mean(layers.softmax_with_cross_entropy(logits, y))
        opt = pd.optimizer.Adam(1e-2)
        if dtype is not None:
            opt = amp.decorate(opt, dtype, **amp_options)
        opt.minimize(loss)
    return main, startup, main.clone(for_test=True), loss, logits, opt


def train(program, startup, loss, feeds):
    """Run `startup` in a new Scope, then `program` on each feed; returns (scope, losses)."""
    scope = pd.Scope()
    EXE.run(startup, scope=scope)
    return scope, np.array([EXE.run(program, feed=f, fetch_list=[loss], scope=scope)[0]
                            for f in feeds])


def op_types(program):
    return [d.type for d in program.global_block().desc.ops]


def reader_dtypes(program, op_type, slot):
    """Dtypes of what each `op_type` op reads in `slot`."""
    block = program.global_block()
    return [block.var(op.input(slot)[0]).dtype for op in block.ops if op.type == op_type]


@pytest.fixture(scope="module")
def bf16_mlp(digits):
    model = build("mlp", "bfloat16")
    main, startup, _, loss, _, _ = model
    scope, losses = train(main, startup, loss, batches(digits, 60, flat=True))
    return model, scope, losses


# --- the rewrite ---

def test_printed_program_shows_the_casts(bf16_mlp):
    (main, *_), _, _ = bf16_mlp
    text = str(main)
    assert "fc_0.w_0.cast_bf16: bfloat16[64, 64] = cast(X=fc_0.w_0) {dtype='bfloat16'}" in text
    assert "x.cast_bf16: bfloat16[-1, 64] = cast(X=x) {dtype='bfloat16'}" in text
    assert "fc_0.matmul_0.out: bfloat16[-1, 64] = matmul(X=x.cast_bf16, Y=fc_0.w_0.cast_bf16)" in text
    # the logits go back to float32 for the loss
    assert "fc_1.out.cast_fp32: float32[-1, 10] = cast(X=fc_1.out) {dtype='float32'}" in text
    assert reader_dtypes(main, "softmax_with_cross_entropy", "Logits") == ["float32"]
    assert main.global_block().var("fc_0.out").dtype == "bfloat16"   # relu follows its input


def test_master_weights_and_optimizer_state_stay_float32(bf16_mlp):
    (main, *_), scope, _ = bf16_mlp
    block = main.global_block()
    persistables = [v for v in block.vars.values() if v.persistable and v.dtype != "uint32"]
    assert {v.name for v in persistables} >= {"fc_0.w_0", "fc_0.w_0.moment1", "fc_1.b_0.moment2"}
    for var in persistables:
        value = np.asarray(scope.get(var.name))
        want = "int64" if var.name == "@LR_STEP@" else "float32"
        assert var.dtype == want and value.dtype == want, var.name
    for param in ("fc_0.w_0", "fc_0.b_0", "fc_1.w_0", "fc_1.b_0"):
        assert block.var(param + "@GRAD").dtype == "float32"
    # the low-precision gradients are cast back to float32 by the cast op's gradient maker
    assert "fc_0.w_0@GRAD: float32[64, 64] = cast(X=fc_0.w_0.cast_bf16@GRAD)" in str(main)


def _program_with_every_kind():
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 3, 8, 8])
        target = pd.data("target", [None, 4])
        h = layers.conv2d(x, 4, 3, padding=1)
        h = layers.batch_norm(h)
        h = ops.reshape(h, shape=[0, 256])
        h = layers.layer_norm(layers.fc(h, 4))
        probs = ops.softmax(layers.fc(h, 4, act="tanh"))
        doubled = ops.scale(probs, scale=2.0)
        diff = ops.sub(layers.fc(h, 4), target)      # an activation minus fed float32 data
        loss = ops.add(ops.reduce_sum(doubled), ops.mean(ops.square(diff)))
    return main, loss


def test_lists_decide_each_ops_precision():
    main, loss = _program_with_every_kind()
    amp.rewrite_program(main, "float16")
    assert reader_dtypes(main, "conv2d", "Input") == ["float16"]
    assert reader_dtypes(main, "conv2d", "Filter") == ["float16"]
    assert reader_dtypes(main, "matmul", "X") == ["float16"] * 3
    for deny in ("batch_norm", "layer_norm", "softmax", "reduce_sum", "mean", "square"):
        assert set(reader_dtypes(main, deny, "X")) == {"float32"}, deny
    # following the inputs: bias adds and tanh after a matmul stay low, scale after softmax
    # stays float32, and an activation minus float32 data runs in float32
    assert set(reader_dtypes(main, "add", "X")[:3]) == {"float16"}
    assert reader_dtypes(main, "tanh", "X") == ["float16"]
    assert reader_dtypes(main, "scale", "X") == ["float32"]
    assert reader_dtypes(main, "sub", "X") == reader_dtypes(main, "sub", "Y") == ["float32"]
    assert loss.dtype == "float32"


def test_custom_lists_move_ops_between_lists():
    main, _ = _program_with_every_kind()
    lists = amp.AmpLists(custom_allow=["softmax"], custom_deny=["conv2d"])
    amp.rewrite_program(main, "bfloat16", lists)
    assert reader_dtypes(main, "conv2d", "Input") == ["float32"]
    assert reader_dtypes(main, "softmax", "X") == ["bfloat16"]
    with pytest.raises(pd.ProgramError, match="both custom_allow and custom_deny"):
        amp.AmpLists(custom_allow=["softmax"], custom_deny=["softmax"])
    with pytest.raises(pd.ProgramError, match="'no_such_op'"):
        amp.AmpLists(custom_deny=["no_such_op"])


def test_rewriting_twice_changes_nothing():
    main, _ = _program_with_every_kind()
    amp.rewrite_program(main, "bfloat16")
    once = main.to_bytes()
    amp.rewrite_program(main, "bfloat16")
    assert main.to_bytes() == once


def test_rewrite_refuses_a_program_with_backward_ops_and_leaves_it_unchanged():
    main, loss = _program_with_every_kind()
    with pd.program_guard(main):
        pd.append_backward(loss)
    before = main.to_bytes()
    with pytest.raises(pd.ProgramError, match="before append_backward") as err:
        amp.rewrite_program(main, "bfloat16")
    assert err.value.op_index is not None and err.value.op_type
    assert main.to_bytes() == before
    with pytest.raises(pd.ProgramError, match="bfloat16 or float16, got float32"):
        amp.decorate(pd.optimizer.SGD(0.1), "float32")
    with pytest.raises(pd.ProgramError, match="decr_ratio must be between 0 and 1"):
        amp.decorate(pd.optimizer.SGD(0.1), "float16", decr_ratio=2.0)


@pytest.mark.parametrize("first", ["bfloat16", "float16", "float32"])
def test_minimize_after_a_minimize_on_the_same_parameters_raises_and_changes_nothing(first):
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x, y = pd.data("x", [None, 4]), pd.data("y", [None, 1])
        loss = layers.mse_loss(layers.fc(x, 1), y)
        sgd = pd.optimizer.SGD(0.1)
        (sgd if first == "float32" else amp.decorate(sgd, first)).minimize(loss)
        before, startup_before = main.to_bytes(), startup.to_bytes()
        for second in (amp.decorate(pd.optimizer.Adam(0.1), "bfloat16"),
                       amp.decorate(pd.optimizer.Adam(0.1), "float16"), pd.optimizer.Adam(0.1)):
            with pytest.raises(pd.ProgramError,
                               match=r"parameters fc_0.w_0, fc_0.b_0 are already updated"):
                second.minimize(loss)
            with pytest.raises(pd.ProgramError, match=r"parameters fc_0.b_0 are already updated"):
                second.minimize(loss, parameter_list=["fc_0.b_0"])
            assert main.to_bytes() == before and startup.to_bytes() == startup_before
    scope = pd.Scope()
    EXE.run(startup, scope=scope)
    w = np.array(scope.get("fc_0.w_0"))
    feed = {"x": np.ones((2, 4), "float32"), "y": np.zeros((2, 1), "float32")}
    for _ in range(3):   # float16: the first steps may overflow at the initial loss scale
        EXE.run(main, feed=feed, fetch_list=[loss], scope=scope)
    assert not np.array_equal(scope.get("fc_0.w_0"), w)   # the first optimizer still trains


def test_a_failed_rewrite_leaves_the_program_unchanged():
    @custom_op.op("amp_test_float32_only", inputs=[custom_op.In("X", "float")],
                  outputs=[custom_op.Out("Out")])
    def float32_only(X):
        """X, for float32 X only."""
        if X.dtype != np.float32:
            raise TypeError(f"float32 only, got {X.dtype}")
        return X

    try:
        main, loss = _program_with_every_kind()
        with pd.program_guard(main):
            getattr(ops, "amp_test_float32_only")(loss)
        before = main.to_bytes()
        lists = amp.AmpLists(custom_allow=["amp_test_float32_only"])
        with pytest.raises(pd.ProgdescError, match="float32 only") as err:
            amp.rewrite_program(main, "bfloat16", lists)
        assert err.value.op_type == "amp_test_float32_only"
        assert main.to_bytes() == before and loss.dtype == "float32"
    finally:
        custom_op.unregister("amp_test_float32_only")


def test_transformer_layer_runs_attention_and_matmuls_low_and_norms_in_float32():
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 6, 16])
        h = layers.transformer_encoder_layer(x, 2, 32, dropout_rate=0.0, is_test=True)
        loss = ops.mean(h)
        amp.decorate(pd.optimizer.Adam(1e-3)).minimize(loss)
    assert set(reader_dtypes(main, "matmul", "X")) == {"bfloat16"}
    assert set(reader_dtypes(main, "layer_norm", "X")) == {"float32"}
    # attention: a fused op reading bfloat16, or matmuls around a float32 softmax
    fused = reader_dtypes(main, "scaled_dot_product_attention", "Q")
    softmax = reader_dtypes(main, "softmax", "X")
    assert (fused or softmax) and set(fused) <= {"bfloat16"} and set(softmax) <= {"float32"}
    feed = {"x": np.random.default_rng(0).normal(size=(2, 6, 16)).astype(np.float32)}
    assert np.isfinite(train(main, startup, loss, [feed] * 2)[1]).all()


# --- bf16 training tracks float32 ---

@pytest.mark.parametrize("kind, steps", [("mlp", 60),
                                         pytest.param("cnn", 40, marks=pytest.mark.slow)])
def test_bfloat16_training_tracks_the_float32_loss_curve(digits, bf16_mlp, kind, steps):
    flat = kind == "mlp"
    f32 = build(kind)
    want = train(f32[0], f32[1], f32[3], batches(digits, steps, flat))[1]
    if kind == "mlp":
        got = bf16_mlp[2]
    else:
        bf16 = build(kind, "bfloat16")
        got = train(bf16[0], bf16[1], bf16[3], batches(digits, steps, flat))[1]
    assert want[-5:].mean() < 0.5 * want[0]   # it trains
    np.testing.assert_allclose(got, want, rtol=CURVE_RTOL, atol=CURVE_ATOL)


# --- fp16 loss scaling ---

def simulate_loss_scaling(found, scale, incr_every, decr_every, incr_ratio, decr_ratio):
    """The scale and good/bad counts after each step, from the per-step inf/nan flags."""
    good = bad = 0
    out = []
    for bad_step in found:
        if bad_step:
            good, bad = 0, bad + 1
            if bad == decr_every:
                scale, bad = scale * decr_ratio, 0
        else:
            good, bad = good + 1, 0
            if good == incr_every:
                scale, good = scale * incr_ratio, 0
        out.append((scale, good, bad))
    return out


FP16 = dict(init_loss_scaling=2.0 ** 10, incr_every_n_steps=3, decr_every_n_nan_or_inf=2,
            incr_ratio=4.0, decr_ratio=0.25)
POISON = {4: np.inf, 7: np.nan, 8: -np.inf, 9: np.nan, 13: np.inf}   # step -> injected value


@pytest.fixture(scope="module")
def fp16_mlp():
    return build("mlp", "float16", **FP16)


def poisoned(digits, steps):
    for i, feed in enumerate(batches(digits, steps, flat=True)):
        if i in POISON:
            feed["x"] = feed["x"].copy()
            feed["x"][3, 5] = POISON[i]
        yield feed


def snapshot(scope, program):
    return {v.name: np.array(scope.get(v.name)) for v in program.list_vars()
            if v.persistable and v.name in scope}


def run_fp16(model, scope, feeds):
    """Run the float16 program on each feed, checking what each step changed in `scope`.

    A bad step (found_inf) must change the loss-scaling state only; a good
    one updates the parameters, Adam's moments and its step count. Returns
    [(loss, found_inf, scale, good steps, bad steps)] per step.
    """
    main, _, _, loss, _, opt = model
    s = opt.loss_scaler
    out = []
    for step, feed in enumerate(feeds):
        before = snapshot(scope, main)
        value, bad, scale, good, bad_count = EXE.run(
            main, feed=feed, fetch_list=[loss, s.found_inf, s.scale, s.good_steps, s.bad_steps],
            scope=scope)
        after = snapshot(scope, main)
        changed = {n for n in before if not np.array_equal(before[n], after[n], equal_nan=True)}
        if bad:
            assert changed <= set(LOSS_SCALING_STATE), (step, changed)
        else:
            assert {"fc_0.w_0", "fc_0.w_0.moment1", "@LR_STEP@"} <= changed, step
        out.append((float(value), bool(bad), float(scale[0]), int(good[0]), int(bad_count[0])))
    return out


def started(model, scale=None):
    scope = pd.Scope()
    EXE.run(model[1], scope=scope)
    if scale is not None:
        scope.set("loss_scaling_0", np.array([scale], np.float32))
    return scope


def test_float16_skips_bad_steps_and_moves_the_scale_as_simulated(digits, fp16_mlp):
    scope = started(fp16_mlp)
    steps = run_fp16(fp16_mlp, scope, poisoned(digits, 16))
    found = [s[1] for s in steps]
    assert found == [i in POISON for i in range(16)]
    assert [s[2:] for s in steps] == simulate_loss_scaling(
        found, FP16["init_loss_scaling"], FP16["incr_every_n_steps"],
        FP16["decr_every_n_nan_or_inf"], FP16["incr_ratio"], FP16["decr_ratio"])
    assert int(np.asarray(scope.get("@LR_STEP@"))[0]) == 16 - len(POISON)
    assert np.isfinite([s[0] for i, s in enumerate(steps) if i not in POISON]).all()


def test_float16_backs_off_from_an_overflowing_scale(digits, fp16_mlp):
    start = 2.0 ** 24   # float16 gradients overflow: steps are skipped until the scale is small
    steps = run_fp16(fp16_mlp, started(fp16_mlp, start), batches(digits, 20, flat=True))
    found = [s[1] for s in steps]
    first_good = found.index(False)
    assert first_good >= 2 and steps[first_good][2] < start
    assert sum(found[first_good:]) < len(found[first_good:]) / 2
    assert [s[2:] for s in steps] == simulate_loss_scaling(
        found, start, FP16["incr_every_n_steps"], FP16["decr_every_n_nan_or_inf"],
        FP16["incr_ratio"], FP16["decr_ratio"])


def test_float16_defaults_follow_paddle_and_gradscaler():
    main, startup, *_ = build("mlp", "float16")
    update, = [op for op in main.global_block().ops if op.type == "update_loss_scaling"]
    assert (update.attr("incr_every_n_steps"), update.attr("decr_every_n_nan_or_inf"),
            update.attr("incr_ratio"), update.attr("decr_ratio")) == (2000, 1, 2.0, 0.5)
    init, = [op for op in startup.global_block().ops if op.output("Out") == ["loss_scaling_0"]]
    assert init.attr("value") == 2.0 ** 15


def test_static_loss_scaling_keeps_its_scale():
    main = build("mlp", "float16", init_loss_scaling=128.0, use_dynamic_loss_scaling=False)[0]
    types = op_types(main)
    assert "check_finite_and_unscale" in types and "update_loss_scaling" not in types
    assert "where" in types


def test_bfloat16_uses_no_loss_scaling_unless_asked(bf16_mlp):
    (main, *_, opt), _, _ = bf16_mlp
    assert opt.loss_scaler is None
    assert not {"check_finite_and_unscale", "update_loss_scaling"} & set(op_types(main))
    asked = build("mlp", "bfloat16", use_dynamic_loss_scaling=True)
    assert "update_loss_scaling" in op_types(asked[0])


# --- clone, checkpoints, inference models, export ---

def test_test_clone_keeps_the_casts_and_drops_loss_scaling(digits, fp16_mlp, bf16_mlp):
    test_fp16 = fp16_mlp[2]
    types = op_types(test_fp16)
    assert "cast" in types and reader_dtypes(test_fp16, "matmul", "X") == ["float16"] * 2
    assert not {"check_finite_and_unscale", "update_loss_scaling", "where", "mul"} & set(types)
    assert all(d.role in (pb.FORWARD, pb.LOSS) for d in test_fp16.global_block().desc.ops)

    (_, _, test_bf16, _, logits, _), scope, _ = bf16_mlp
    vx, vy = digits[2], digits[3]
    got, = EXE.run(test_bf16, feed={"x": vx.reshape(-1, 64), "y": vy}, fetch_list=[logits],
                   scope=scope)
    assert got.dtype == np.dtype("bfloat16")
    w0, b0, w1, b1 = (np.asarray(scope.get(n), np.float64)
                      for n in ("fc_0.w_0", "fc_0.b_0", "fc_1.w_0", "fc_1.b_0"))
    want = np.maximum(vx.reshape(-1, 64) @ w0 + b0, 0) @ w1 + b1   # float64 reference
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=0.05, atol=0.1)
    assert (np.argmax(got, 1) == vy[:, 0]).mean() > 0.9


def test_rewriting_a_float32_test_clone_gives_the_mixed_precision_one(bf16_mlp):
    clone = build("mlp")[2]       # as a clone made before decorate(...).minimize would be
    amp.rewrite_program(clone, "bfloat16")
    assert str(clone) == str(bf16_mlp[0][2])


def test_checkpoint_round_trip_restores_the_loss_scaling_state(digits, fp16_mlp, tmp_path):
    main, startup = fp16_mlp[:2]
    feeds = list(poisoned(digits, 10))
    scope = started(fp16_mlp)
    run_fp16(fp16_mlp, scope, feeds[:5])        # step 4 is poisoned: the scale has moved
    io.save_checkpoint(tmp_path / "ckpt.safetensors", main, scope)
    saved = io.read_checkpoint(tmp_path / "ckpt.safetensors")
    assert float(saved["loss_scaling_0"][0]) == FP16["init_loss_scaling"] * FP16["incr_ratio"]
    assert int(saved["num_bad_steps_0"][0]) == 1
    first = run_fp16(fp16_mlp, scope, feeds[5:])

    restored = started(fp16_mlp)
    io.load_checkpoint(tmp_path / "ckpt.safetensors", main, restored)
    np.testing.assert_equal(run_fp16(fp16_mlp, restored, feeds[5:]), first)   # NaN == NaN


def test_inference_model_and_export_run_the_low_precision_program(digits, bf16_mlp, tmp_path):
    (main, _, test_program, _, logits, _), scope, _ = bf16_mlp
    images = digits[2][:20].reshape(-1, 64)
    want, = EXE.run(test_program, feed={"x": images}, fetch_list=[logits], scope=scope)

    io.save_inference_model(tmp_path / "model", [main.global_block().var("x")], [logits], EXE,
                            main, scope)
    loaded = pd.Scope()
    program, _, fetch_targets = io.load_inference_model(tmp_path / "model", EXE, loaded)
    assert "cast" in op_types(program)
    got, = EXE.run(program, feed={"x": images}, fetch_list=fetch_targets, scope=loaded)
    assert got.dtype == want.dtype
    # the same low-precision program; XLA may fuse it differently, so one bfloat16 ulp apart
    bf16 = dict(rtol=2.0 ** -7, atol=2.0 ** -7)
    np.testing.assert_allclose(np.float32(got), np.float32(want), **bf16)

    export.export_compiled(tmp_path / "model.pdx", test_program, ["x"], [logits], scope)
    model = export.load_compiled(tmp_path / "model.pdx")
    assert model.header["fetches"][0]["dtype"] == "bfloat16"
    exported, = model(images)
    assert exported.dtype == want.dtype
    np.testing.assert_allclose(np.float32(exported), np.float32(want), **bf16)
