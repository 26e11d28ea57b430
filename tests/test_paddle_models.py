"""Paddle's own models (tests/fixtures/paddle, saved by Paddle with its executor's
outputs) imported from their legacy files: each reproduces Paddle's outputs at both
batch sizes; ResNet-18 and the BERT encoder fine-tune with our Adam, export to a .pdx
that runs at two batch sizes, and round-trip through our own format."""
import json
import os
import time

import numpy as np
import pytest

import progdesc as pd
from progdesc import io
from progdesc.paddle import load_inference_model

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "paddle")
ATOL = 1e-5
SLOW = {"mobilenetv2", "mobilenetv3_small"}   # XLA's CPU compiles take 10 s and more


def _models():
    if not os.path.isdir(FIXTURES):
        return []
    return [pytest.param(m, marks=pytest.mark.slow) if m in SLOW else m
            for m in sorted(os.listdir(FIXTURES))
            if os.path.isdir(os.path.join(FIXTURES, m, "legacy"))]


def _reference(model):
    return np.load(os.path.join(FIXTURES, model, "reference.npz"))


def _inputs(ref, batch):
    single = f"input_b{batch}"
    if single in ref.files:
        return [ref[single]]
    return [ref[f"input{i}_b{batch}"] for i in range(len(ref.files))
            if f"input{i}_b{batch}" in ref.files]


def _outputs(ref, fmt, batch):
    single = f"{fmt}_output_b{batch}"
    if single in ref.files:
        return [ref[single]]
    return [ref[f"{fmt}_output{i}_b{batch}"] for i in range(len(ref.files))
            if f"{fmt}_output{i}_b{batch}" in ref.files]


def _load(model, fmt="legacy", **kw):
    scope = pd.Scope()
    program, feeds, fetches = load_inference_model(os.path.join(FIXTURES, model, fmt),
                                                   pd.Executor(), scope=scope, **kw)
    return program, feeds, fetches, scope


def _check(program, feeds, fetches, scope, ref, fmt):
    exe = pd.Executor()
    for batch in (2, 5):
        got = exe.run(program, feed=dict(zip(feeds, _inputs(ref, batch))), fetch_list=fetches,
                      scope=scope)
        want = _outputs(ref, fmt, batch)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            np.testing.assert_allclose(np.asarray(g), w, rtol=0, atol=ATOL)


# issue 25's list, each with a fixture in both formats (the parametrized tests take what
# the directory holds; this says what it must hold)
EXPECTED = {"mlp", "lenet", "resnet18", "mobilenetv1", "mobilenetv2", "mobilenetv3_small", "vgg",
            "lstm", "gru", "simple_rnn", "bert", "mha", "dy2static", "interp", "instance_norm",
            "more_ops"}


def test_every_expected_fixture_is_there_in_both_formats():
    for model in sorted(EXPECTED):
        for path in ("legacy/model.pdmodel", "pir/model.json", "reference.npz"):
            assert os.path.isfile(os.path.join(FIXTURES, model, path)), (model, path)


@pytest.mark.parametrize("model", _models())
def test_legacy_model_reproduces_paddle_executor(model):
    meta = json.load(open(os.path.join(FIXTURES, model, "meta.json")))
    program, feeds, fetches, scope = _load(model)
    assert feeds == meta["legacy"]["feed_names"]
    _check(program, feeds, fetches, scope, _reference(model), "legacy")


def test_one_file_per_variable_layout():
    program, feeds, fetches, scope = _load("mlp", "legacy_separate")
    _check(program, feeds, fetches, scope, _reference("mlp"), "legacy_separate")


@pytest.mark.parametrize("model", ["resnet18", pytest.param("mobilenetv2", marks=pytest.mark.slow),
                                   pytest.param("bert", marks=pytest.mark.slow)])
def test_training_import_gives_paddle_eval_after_clone_for_test(model):
    program, feeds, fetches, scope = _load(model, for_training=True)
    types = {op.type for op in program.global_block().ops}
    assert types & {"batch_norm", "dropout"}
    _check(program.clone(for_test=True), feeds, fetches, scope, _reference(model), "legacy")


def test_resnet18_import_time():
    path = os.path.join(FIXTURES, "resnet18", "legacy")
    start = time.perf_counter()
    load_inference_model(path, pd.Executor(), scope=pd.Scope())
    print(f"\nresnet18 (legacy) import: {time.perf_counter() - start:.3f} s")


def _fine_tune(model, steps=20):
    """Import for training, add a squared-error loss against random targets and take
    `steps` Adam steps; returns (losses, program, feeds, fetches, scope)."""
    program, feeds, fetches, scope = _load(model, for_training=True)
    test_program = program.clone(for_test=True)
    ref = _reference(model)
    inputs = _inputs(ref, 5)
    rng = np.random.default_rng(0)
    out = fetches[0]
    target_value = rng.standard_normal((5, *out.shape[1:])).astype(np.float32)
    startup = pd.Program()
    with pd.program_guard(program, startup):
        target = pd.data("target", [-1, *out.shape[1:]], "float32")
        loss = pd.ops.mean(pd.ops.square(pd.ops.sub(out, target)))
        pd.optimizer.Adam(1e-3).minimize(loss)
    exe = pd.Executor()
    exe.run(startup, scope=scope)
    feed = dict(zip(feeds, inputs), target=target_value)
    losses = [float(exe.run(program, feed=feed, fetch_list=[loss], scope=scope)[0])
              for _ in range(steps)]
    return losses, test_program, feeds, fetches, scope


@pytest.mark.slow
@pytest.mark.parametrize("model", ["resnet18", "bert"])
def test_fine_tune_then_export_and_save(model, tmp_path):
    losses, test_program, feeds, fetches, scope = _fine_tune(model)
    assert losses[-1] < 0.8 * losses[0], losses
    ref = _reference(model)
    exe = pd.Executor()
    want = {b: exe.run(test_program, feed=dict(zip(feeds, _inputs(ref, b))), fetch_list=fetches,
                       scope=scope) for b in (2, 5)}
    assert not np.allclose(want[2][0], _outputs(ref, "legacy", 2)[0], atol=ATOL)   # trained
    path = str(tmp_path / "model.pdx")
    # BERT's ids and mask share their unknown sequence dim (7 and 10 in the references)
    dims = {name: ("batch", "seq") for name in feeds} if model == "bert" else True
    pd.export.export_compiled(path, test_program, feeds, fetches, scope=scope,
                              batch_polymorphic=dims)
    served = pd.export.load_compiled(path)
    for batch in (2, 5):
        got = served(*_inputs(ref, batch))
        for g, w in zip(got, want[batch]):
            np.testing.assert_allclose(np.asarray(g), w, rtol=1e-5, atol=1e-5)
    saved = str(tmp_path / "saved")
    io.save_inference_model(saved, feeds, fetches, exe, program=test_program, scope=scope)
    other = pd.Scope()
    program, names, targets = io.load_inference_model(saved, exe, scope=other)
    assert names == feeds
    for batch in (2, 5):
        got = exe.run(program, feed=dict(zip(names, _inputs(ref, batch))), fetch_list=targets,
                      scope=other)
        for g, w in zip(got, want[batch]):
            np.testing.assert_allclose(np.asarray(g), w, rtol=1e-6, atol=1e-6)
