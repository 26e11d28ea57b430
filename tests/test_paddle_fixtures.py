"""The PaddlePaddle fixtures are present and readable without pickle (Paddle itself not needed)."""
import json
import pathlib

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).parent / "fixtures" / "paddle"
MODELS = ("mlp", "lenet", "resnet18", "mobilenetv2", "mobilenetv3_small", "lstm", "gru", "bert",
          "dy2static", "interp")
TRAINS = ("train_adam", "train_sgd", "train_momentum", "train_adamw", "train_adam_pir")


@pytest.mark.parametrize("model", MODELS)
def test_model_fixture_complete(model):
    d = ROOT / model
    meta = json.loads((d / "meta.json").read_text())
    for fmt, files in (("legacy", ("model.pdmodel", "model.pdiparams")), ("pir", ("model.json", "model.pdiparams"))):
        for name in files:
            assert (d / fmt / name).stat().st_size > 0, f"{model}/{fmt}/{name}"
        assert meta[fmt]["written_by"].startswith("paddlepaddle ")
        assert meta[fmt]["feed_names"] and meta[fmt]["fetch_names"]
    with np.load(d / "reference.npz", allow_pickle=False) as ref:
        keys = set(ref.files)
        for b in meta["batches"]:
            inputs = [ref[p.format(B=b)] for p in meta["inputs"]]
            assert len(inputs) == len(meta["legacy"]["feed_names"]) == len(meta["pir"]["feed_names"])
            assert [list(a.shape) for a in inputs] == meta["input_shapes"][str(b)]
            assert inputs[0].shape[0] == b
            for fmt in ("legacy", "pir"):
                outs = [ref[p.format(B=b)] for p in meta[fmt]["outputs"]]
                assert len(outs) == len(meta[fmt]["fetch_names"])
                assert all(o.shape[0] == b and o.dtype == np.float32 and np.isfinite(o).all() for o in outs)
            # both formats hold the same weights, so Paddle gave (nearly) the same outputs
            for pl, pp in zip(meta["legacy"]["outputs"], meta["pir"]["outputs"]):
                np.testing.assert_allclose(ref[pl.format(B=b)], ref[pp.format(B=b)], atol=1e-6)
        assert all(not ref[k].dtype.hasobject for k in keys)


def test_mlp_legacy_separate_layout():
    d = ROOT / "mlp" / "legacy_separate"
    names = sorted(p.name for p in d.iterdir())
    assert names == ["__model__", "linear_0.b_0", "linear_0.w_0", "linear_1.b_0", "linear_1.w_0"]
    meta = json.loads((ROOT / "mlp" / "meta.json").read_text())
    assert meta["legacy_separate"]["written_by"].startswith("paddlepaddle 2.6")


@pytest.mark.parametrize("train", TRAINS)
def test_training_fixture_complete(train):
    d = ROOT / train
    meta = json.loads((d / "meta.json").read_text())
    program = "model.json" if train.endswith("_pir") else "model.pdmodel"
    for name in (program, "model.pdparams", "model.pdopt"):
        assert (d / name).stat().st_size > 0
    assert meta["learning_rate"] > 0 and meta["optimizer"] in ("Adam", "SGD", "Momentum", "AdamW")
    with np.load(d / "steps.npz", allow_pickle=False) as steps:
        for i in range(meta["steps_after"]):
            assert steps[f"x_{i}"].shape == (meta["batch"], 16)
            assert steps[f"label_{i}"].dtype == np.int64
            assert np.isfinite(steps[f"loss_{i}"]) and steps[f"loss_{i}"] > 0
