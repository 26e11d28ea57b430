"""Paddle training programs continue training here (progdesc.paddle.load_training_program):
against pfix's fixtures, written by Paddle 3.3.1 (legacy mode) with paddle.static.save after
3 steps of an MLP, with the next 5 feeds and Paddle's losses of those steps."""
import json
import os
import shutil

import numpy as np
import pytest

from lowering.errors import FormatError, ScopeError, UnsupportedOpError
from paddle_pickle_asm import pickle_of_arrays
from progdesc import Executor, Scope
from progdesc import optimizer as opt
from progdesc.paddle import framework_pb2 as fpb
from progdesc.paddle import load_training_program, pickles

ROOT = os.path.join(os.path.dirname(__file__), "fixtures", "paddle")
OPTIMIZERS = ["adam", "sgd", "momentum", "adamw", "adam_pir"]   # adam_pir: model.json
VARIANTS_ROOT = os.path.join(os.path.dirname(__file__), "fixtures", "paddle_training")
VARIANTS = {   # ours: tests/fixtures/paddle_training/make_variants.py; optimizers we make
    "adam_l2decay": ["Adam"], "momentum_nesterov_l2": ["Momentum"],
    "adamw_no_decay_on_biases": ["AdamW", "AdamW"], "adam_clip_global_norm": ["Adam"],
    "sgd_clip_by_norm": ["SGD"], "sgd_clip_by_value": ["SGD"],
    "momentum_protocol2": ["Momentum"], "adam_batch_norm": ["Adam"],
    "adam_param_learning_rate": ["Adam", "Adam"],
    # the same in Paddle 3's PIR format (model.json: no op_role, the parts found by structure)
    "sgd_pir": ["SGD"], "momentum_pir": ["Momentum"], "adamw_pir": ["AdamW"],
    "adam_l2decay_pir": ["Adam"], "momentum_nesterov_l2_pir": ["Momentum"],
    "adamw_no_decay_on_biases_pir": ["AdamW", "AdamW"], "adam_clip_global_norm_pir": ["Adam"],
    "sgd_clip_by_norm_pir": ["SGD"], "adam_param_learning_rate_pir": ["Adam", "Adam"],
    "adam_batch_norm_pir": ["Adam"]}


def _fixture(name):
    d = os.path.join(VARIANTS_ROOT, name) if name in VARIANTS else os.path.join(
        ROOT, f"train_{name}")
    with open(os.path.join(d, "meta.json")) as f:
        meta = json.load(f)
    with np.load(os.path.join(d, "steps.npz"), allow_pickle=False) as steps:
        steps = dict(steps)
    return d, meta, steps


def _load(d, scope):
    exe = Executor()
    return exe, load_training_program(os.path.join(d, "model"), exe, scope)


def _losses(exe, prog, steps, scope, n=5):
    out = []
    for i in range(n):
        loss, = exe.run(prog.program, feed={"x": steps[f"x_{i}"], "label": steps[f"label_{i}"]},
                        fetch_list=[prog.loss], scope=scope)
        out.append(float(np.asarray(loss).reshape(())))
    return np.array(out)


def _paddle_losses(steps, n=5):
    return np.array([float(steps[f"loss_{i}"]) for i in range(n)])


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_five_more_steps_give_paddles_next_losses(name):
    d, meta, steps = _fixture(name)
    scope = Scope()
    exe, prog = _load(d, scope)
    assert prog.feed_names == meta["feed_names"]
    assert [type(o).__name__ for o in prog.optimizers] == [meta["optimizer"]]
    got = _losses(exe, prog, steps, scope)
    np.testing.assert_allclose(got, _paddle_losses(steps), rtol=0, atol=1e-4)
    assert got[-1] < max(meta["losses_before_save"])   # it trains: not stuck at the start


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variants_regularization_decay_exclusion_clipping_continue_as_in_paddle(name):
    d, meta, steps = _fixture(name)
    scope = Scope()
    exe, prog = _load(d, scope)
    assert [type(o).__name__ for o in prog.optimizers] == VARIANTS[name]
    got = _losses(exe, prog, steps, scope)
    np.testing.assert_allclose(got, _paddle_losses(steps), rtol=0, atol=1e-4)


@pytest.mark.parametrize("name", ["adam_clip_global_norm", "adam_clip_global_norm_pir",
                                  "adam_l2decay"])
def test_eval_clone_runs_the_forward_part_only(name):
    """clone(for_test=True) drops our backward and updates and the translated gradient
    transformations (all of optimizer role): its loss is Paddle's loss of the saved
    parameters, and it leaves them as they are."""
    d, _, steps = _fixture(name)
    scope = Scope()
    exe, prog = _load(d, scope)
    test_prog = prog.program.clone(for_test=True)
    assert {op.type for op in test_prog.global_block().ops} & {"adam", "clip", "sum"} == set()
    for _ in range(2):
        loss, = exe.run(test_prog, feed={"x": steps["x_0"], "label": steps["label_0"]},
                        fetch_list=[prog.loss.name], scope=scope)
        np.testing.assert_allclose(float(np.asarray(loss).reshape(())),
                                   float(steps["loss_0"]), rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", ["adam_batch_norm", "adam_batch_norm_pir"])
def test_batch_norm_running_statistics_move_on(name):
    """The running mean and variance (persistables of .pdparams that no update writes)
    start from Paddle's saved values and the forward part updates them each step."""
    d, _, steps = _fixture(name)
    saved = pickles.load(os.path.join(d, "model.pdparams"))
    scope = Scope()
    exe, prog = _load(d, scope)
    block = prog.program.global_block()
    stats = [n for n, v in block.vars.items() if n in saved and v.stop_gradient]
    assert len(stats) == 2
    for n in stats:
        np.testing.assert_array_equal(np.asarray(scope.find_var(n).value), saved[n])
    _losses(exe, prog, steps, scope, n=2)
    for n in stats:
        now = np.asarray(scope.find_var(n).value)
        assert np.all(np.isfinite(now)) and np.max(np.abs(now - saved[n])) > 1e-4, n


def _open_clipping(block):
    """Make Paddle's gradient clipping a no-op: bounds and norms out of reach."""
    for op in block.ops:
        kind = op.type.decode()
        names = {a.name.decode(): a for a in op.attrs}
        if kind == "clip":
            names["min"].f, names["max"].f = -1e30, 1e30
        elif kind == "clip_by_norm":
            names["max_norm"].f = 1e30
        elif kind == "fill_constant" and names["op_role"].i == 2:   # the global norm's bound
            names["value"].f, names["str_value"].s = 1e30, b"1e30"


def _open_pir_clipping(ops):
    for op in ops:
        if op["#"].endswith("clip_by_norm"):
            op["A"][0]["AT"]["D"] = 1e30


@pytest.mark.parametrize("name", ["adam_clip_global_norm", "sgd_clip_by_norm",
                                  "sgd_clip_by_value", "sgd_clip_by_norm_pir"])
def test_the_imported_clipping_matters(name, tmp_path):
    """With Paddle's clipping opened up, our losses miss Paddle's: the clip ops above run."""
    _, _, steps = _fixture(name)
    scope = Scope()
    exe = Executor()
    edit = _open_pir_clipping if name.endswith("_pir") else _open_clipping
    prog = load_training_program(_edited_copy(tmp_path, name, edit_program=edit), exe, scope)
    got = _losses(exe, prog, steps, scope)
    assert np.max(np.abs(got - _paddle_losses(steps))) > 1e-3


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_optimizer_recreated_with_paddles_settings(name):
    d, meta, _ = _fixture(name)
    scope = Scope()
    _, prog = _load(d, scope)
    ours, = prog.optimizers
    attrs = meta["optimizer_attrs"]
    f32 = lambda v: float(np.float32(v))   # noqa: E731  (Paddle's attributes are float32)
    lr = np.asarray(scope.find_var(ours.lr_var.name).value).reshape(())
    assert float(lr) == f32(attrs["learning_rate"])
    if name == "momentum":
        assert ours.momentum == f32(attrs["momentum"])
        assert ours.use_nesterov == attrs["use_nesterov"]
    if name in ("adam", "adamw"):
        assert (ours.beta1, ours.beta2, ours.epsilon) == tuple(
            f32(attrs[k]) for k in ("beta1", "beta2", "epsilon"))
        step = scope.find_var(opt.STEP_VAR).value
        assert int(np.asarray(step).reshape(-1)[0]) == meta["steps_before_save"]
    if name == "adamw":
        assert ours.decoupled_decay == f32(attrs["weight_decay"])


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_checkpoint_pickles_decode_to_paddles_names_shapes_and_values(name):
    d, meta, _ = _fixture(name)
    params = pickles.load(os.path.join(d, "model.pdparams"))
    state = pickles.load(os.path.join(d, "model.pdopt"))
    assert {k: list(v.shape) for k, v in params.items()} == meta["pdparams"]
    assert {k: list(v.shape) for k, v in state.items() if k in meta["pdopt"]} == meta["pdopt"]
    lr = [v for k, v in state.items() if k.startswith("learning_rate")]
    assert len(lr) == 1 and float(lr[0]) == float(np.float32(meta["learning_rate"]))
    n = meta["steps_before_save"]
    for k, v in state.items():
        assert v.dtype == np.float32 and np.all(np.isfinite(v)), k
        for acc, beta in (("beta1_pow_acc", "beta1"), ("beta2_pow_acc", "beta2")):
            if acc in k:   # Paddle's powers start at beta and are multiplied once per step
                b = np.float32(meta["optimizer_attrs"][beta])
                np.testing.assert_allclose(v, [b ** (n + 1)], rtol=1e-6)


@pytest.mark.parametrize("name", ["adam", "momentum"])
def test_the_loaded_accumulators_matter(name):
    """Training on from zeroed accumulators misses Paddle's losses: the test above can fail."""
    d, _, steps = _fixture(name)
    scope = Scope()
    exe, prog = _load(d, scope)
    for var in prog.program.global_block().vars.values():
        if var.persistable and var.name.endswith((".moment1", ".moment2", ".velocity")):
            scope.find_var(var.name).value = np.zeros(var.shape, "float32")
    got = _losses(exe, prog, steps, scope)
    assert np.max(np.abs(got - _paddle_losses(steps))) > 1e-3


def _edited_copy(tmp_path, name, edit_program=None, edit_state=None):
    """A copy of fixture `name` in tmp_path with its program and/or .pdopt edited."""
    d, _, _ = _fixture(name)
    for f in ("model.pdmodel", "model.pdparams", "model.pdopt"):
        if os.path.exists(os.path.join(d, f)):
            shutil.copy(os.path.join(d, f), tmp_path / f)
    if edit_program and os.path.exists(os.path.join(d, "model.json")):
        shutil.copy(os.path.join(d, "model.json"), tmp_path / "model.json")
        doc = json.loads((tmp_path / "model.json").read_text())
        edit_program(doc["program"]["regions"][0]["blocks"][0]["ops"])
        (tmp_path / "model.json").write_text(json.dumps(doc))
    elif edit_program:
        message = fpb.PdProgram()
        message.ParseFromString((tmp_path / "model.pdmodel").read_bytes())
        edit_program(message.blocks[0])
        (tmp_path / "model.pdmodel").write_bytes(message.SerializeToString())
    if edit_state:
        state = pickles.load(tmp_path / "model.pdopt")
        edit_state(state)
        (tmp_path / "model.pdopt").write_bytes(pickle_of_arrays(state))
    return str(tmp_path / "model")


def _ops(block, op_type):
    return [op for op in block.ops if op.type.decode() == op_type]


def _attr(op, name):
    return next(a for a in op.attrs if a.name.decode() == name)


def test_unknown_updates_and_extra_optimizer_ops_are_refused_all_at_once(tmp_path):
    def edit(block):
        first, second = _ops(block, "adam")[:2]
        first.type = b"lamb"
        _attr(second, "amsgrad").b = True
        clip = block.ops.add()
        clip.CopyFrom(_ops(block, "adam")[-1])
        clip.type = b"dgc_clip_by_norm"
        lr_op = block.ops.add()
        lr_op.CopyFrom(_ops(block, "relu")[0])
        _attr(lr_op, "op_role").i = 0x10
    prefix = _edited_copy(tmp_path, "adam", edit_program=edit)
    with pytest.raises(UnsupportedOpError) as e:
        load_training_program(prefix, Executor(), Scope())
    text = str(e.value)
    assert "lamb" in text and "amsgrad" in text and "dgc_clip_by_norm" in text
    assert "learning-rate schedule" in text
    assert len(e.value.places) == 4 and all(p[1] == 0 for p in e.value.places)


def test_missing_accumulator_and_inconsistent_beta_powers_are_format_errors(tmp_path):
    def drop(state):
        del state["fc_0.w_0_moment1_0"]
    prefix = _edited_copy(tmp_path, "adam", edit_state=drop)
    with pytest.raises(FormatError, match="fc_0.w_0_moment1_0"):
        load_training_program(prefix, Executor(), Scope())

    def skew(state):
        state["fc_0.w_0_beta1_pow_acc_0"] = state["fc_0.w_0_beta1_pow_acc_0"] * np.float32(0.9)
        state["fc_0.w_0_beta2_pow_acc_0"] = state["fc_0.w_0_beta2_pow_acc_0"] * np.float32(0.999)
    prefix = _edited_copy(tmp_path, "adam", edit_state=skew)
    with pytest.raises(FormatError, match="different steps"):
        load_training_program(prefix, Executor(), Scope())


def test_hostile_pdopt_is_refused_before_anything_runs(tmp_path):
    d, _, _ = _fixture("sgd")
    for f in ("model.pdmodel", "model.pdparams"):
        shutil.copy(os.path.join(d, f), tmp_path / f)
    target = tmp_path / "pwned"
    evil = (b"\x80\x02cos\nsystem\n(X" + len(f"touch {target}").to_bytes(4, "little")
            + f"touch {target}".encode() + b"tR.")
    (tmp_path / "model.pdopt").write_bytes(evil)
    with pytest.raises(FormatError, match="os.system"):
        load_training_program(str(tmp_path / "model"), Executor(), Scope())
    assert not target.exists()


def test_reloading_into_a_scope_trained_since_needs_overwrite():
    d, _, steps = _fixture("momentum")
    scope = Scope()
    exe, prog = _load(d, scope)
    _losses(exe, prog, steps, scope, n=1)
    with pytest.raises(ScopeError, match="overwrite"):
        _load(d, scope)
    prog = load_training_program(os.path.join(d, "model"), exe, scope, overwrite=True)
    np.testing.assert_allclose(_losses(exe, prog, steps, scope), _paddle_losses(steps),
                               rtol=0, atol=1e-4)


def test_a_pir_program_without_backward_is_a_format_error(tmp_path):
    def hide_gradients(ops):   # the gradient ops become ops of unknown kinds
        for op in ops:
            if op["#"].endswith("_grad"):
                op["#"] += "_of_sorts"
    prefix = _edited_copy(tmp_path, "adam_pir", edit_program=hide_gradients)
    with pytest.raises(FormatError, match="not a training program"):
        load_training_program(prefix, Executor(), Scope())


def test_a_missing_parameter_file_is_a_format_error_naming_it(tmp_path):
    d, _, _ = _fixture("sgd")
    shutil.copy(os.path.join(d, "model.pdmodel"), tmp_path / "model.pdmodel")
    with pytest.raises(FormatError, match="model.pdparams"):
        load_training_program(str(tmp_path / "model"), Executor(), Scope())
