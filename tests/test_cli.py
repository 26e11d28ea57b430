"""The progdesc command: a model trained by `progdesc demo` is saved, shown, run and exported."""
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

import progdesc as pd
from progdesc import cli, io

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def progdesc(*args, cwd=None):
    """Run `python -m progdesc ARGS` as a subprocess; returns the CompletedProcess."""
    env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, "-m", "progdesc", *map(str, args)], cwd=cwd or ROOT,
                          env=env, capture_output=True, text=True, timeout=600)


def in_process(capsys, *args):
    """`cli.main(ARGS)` in this process: (exit code, stdout, stderr)."""
    try:
        code = cli.main([str(a) for a in args])
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A model directory written by `progdesc demo --save-dir`, and digit images to feed it."""
    from progdesc.demo import load_digits
    tmp = tmp_path_factory.mktemp("cli")
    done = progdesc("demo", "--epochs", "1", "--save-dir", tmp / "model")
    assert done.returncode in (0, 1), done.stderr       # 1: accuracy under the 97% bar
    assert "test accuracy" in done.stdout and "saved the inference model" in done.stdout
    (tmp / "demo.stderr").write_text(done.stderr)
    images = load_digits()[2]
    for batch in (3, 9):
        np.save(tmp / f"images{batch}.npy", images[:batch])
    return tmp


def test_demo_draws_no_progress_bar_into_a_pipe(trained):
    stderr = (trained / "demo.stderr").read_text()
    assert "\r" not in stderr and "training" not in stderr, stderr   # no "training: 5/22 ..."


def reference(model_dir, images):
    """The model's outputs computed in this process on the CPU, where the commands run."""
    exe, scope = pd.Executor(device="cpu"), pd.Scope()
    program, feeds, fetches = io.load_inference_model(model_dir, exe, scope)
    return exe.run(program, feed={feeds[0]: images}, fetch_list=fetches, scope=scope)[0]


def test_show_prints_models_programs_checkpoints_and_text(trained):
    model = trained / "model"
    done = progdesc("show", model)
    assert done.returncode == 0, done.stderr
    assert "feed  image: float32[-1, 1, 8, 8]" in done.stdout
    assert "conv2d_0.w_0: float32[32, 1, 3, 3]" in done.stdout and "= conv2d(" in done.stdout
    io.save_program(io.load_program(model / "model.pb"), trained / "model.pbtxt")
    for path, needle in ((model / "model.pb", "program (format 1"),
                         (trained / "model.pbtxt", "= matmul("),
                         (model / "params.safetensors", "fc_1.w_0: float32[128, 10]")):
        done = progdesc("show", path)
        assert done.returncode == 0 and needle in done.stdout, done.stdout + done.stderr


def test_run_prints_or_saves_results(trained):
    model = trained / "model"
    want = reference(model, np.load(trained / "images3.npy"))
    done = progdesc("run", model, "--feed", f"image={trained / 'images3.npy'}")
    assert done.returncode == 0, done.stderr
    assert "fc_1.out: float32[3, 10]" in done.stdout
    done = progdesc("run", model, "--feed", f"image={trained / 'images3.npy'}",
                    "--out", trained / "results")
    assert done.returncode == 0, done.stderr
    assert os.listdir(trained / "results") == ["fc_1.out.npy"]
    assert np.array_equal(np.load(trained / "results" / "fc_1.out.npy"), want)


def test_export_runs_in_plain_jax_with_any_batch_size(trained):
    from test_export import PLAIN_JAX, _plain_env
    artifact = trained / "digits.pdx"
    done = progdesc("export", trained / "model", "-o", artifact)
    assert done.returncode == 0, done.stderr
    assert "image: float32[batch, 1, 8, 8]" in done.stdout
    done = progdesc("show", artifact)
    assert done.returncode == 0 and "platforms: cpu, cuda, tpu" in done.stdout
    stems = []
    for batch in (3, 9):
        stems.append(str(trained / f"call{batch}"))
        np.savez(stems[-1] + ".in.npz", image=np.load(trained / f"images{batch}.npy"))
    done = subprocess.run([sys.executable, "-c", PLAIN_JAX, str(artifact), *stems], cwd=trained,
                          env=_plain_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    for batch, stem in zip((3, 9), stems):
        got = np.load(stem + ".out.npz")["fc_1.out"]
        want = reference(trained / "model", np.load(trained / f"images{batch}.npy"))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    done = progdesc("export", trained / "model", "-o", trained / "p.pdx", "--platforms", "cpu",
                    "--params-as-inputs")
    assert done.returncode == 0, done.stderr
    assert "conv2d_0.w_0" in progdesc("show", trained / "p.pdx").stdout


@pytest.mark.parametrize("command", ["demo", "show", "run", "export"])
def test_every_subcommand_has_help(command):
    done = progdesc(command, "--help")
    assert done.returncode == 0 and f"usage: progdesc {command}" in done.stdout


def test_bad_arguments_and_files_exit_2_with_one_line(trained, tmp_path, capsys):
    model = trained / "model"
    np.save(tmp_path / "pickled.npy", np.array([object()], dtype=object), allow_pickle=True)
    np.save(tmp_path / "flat.npy", np.zeros((2, 64), np.float32))
    np.savez(tmp_path / "archive.npz", image=np.zeros((2, 1, 8, 8), np.float32))
    (tmp_path / "junk.pb").write_bytes(os.urandom(300))
    image = f"image={trained / 'images3.npy'}"
    cases = [
        ("bogus",), ("show",), ("show", tmp_path / "missing.pb"), ("show", tmp_path / "junk.pb"),
        ("show", tmp_path), ("run", model), ("run", model, "--feed", "image"),
        ("run", model, "--feed", f"image={tmp_path / 'missing.npy'}"),
        ("run", model, "--feed", f"image={tmp_path / 'pickled.npy'}"),
        ("run", model, "--feed", f"image={tmp_path / 'archive.npz'}"),
        ("run", model, "--feed", f"image={tmp_path / 'flat.npy'}"),
        ("run", model, "--feed", image, "--feed", image.replace("image=", "label=")),
        ("run", model, "--feed", image, "--fetch", "no_such_var"),
        ("run", tmp_path / "nowhere", "--feed", image), ("export", model),
        ("export", model, "-o", tmp_path / "x.pdx", "--platforms", "cpu,gameboy"),
        ("demo", "--epochs", "many"),
    ]
    for args in cases:
        code, out, err = in_process(capsys, *args)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and lines[0].startswith("progdesc"), (args, err)
        assert "Traceback" not in err
    assert not (tmp_path / "x.pdx").exists()
    for args in cases[2], cases[8]:        # the real command: no traceback, one line, code 2
        done = progdesc(*args)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_run_out_cannot_write_outside_its_directory(tmp_path, capsys):
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 2])
        main.global_block().append_op("scale", {"X": x}, {"Out": "../evil"}, {"scale": 2.0})
    io.save_inference_model(tmp_path / "m", ["x"], ["../evil"], None, main, pd.Scope())
    np.save(tmp_path / "x.npy", np.ones((1, 2), np.float32))
    code, out, err = in_process(capsys, "run", tmp_path / "m", "--feed",
                                f"x={tmp_path / 'x.npy'}", "--out", tmp_path / "out")
    assert code == 0, err
    assert sorted(os.listdir(tmp_path)) == ["m", "out", "x.npy"]
    written, = os.listdir(tmp_path / "out")
    assert np.array_equal(np.load(tmp_path / "out" / written), [[2.0, 2.0]])


def test_a_paddle_model_is_shown_run_and_exported(tmp_path):
    fixture = os.path.join(ROOT, "tests", "fixtures", "paddle", "lenet")
    reference = np.load(os.path.join(fixture, "reference.npz"), allow_pickle=False)
    prefix = os.path.join(fixture, "pir", "model")
    done = progdesc("show", prefix)
    assert done.returncode == 0, done.stderr
    assert "PaddlePaddle model" in done.stdout
    assert "feed  image: float32[-1, 1, 28, 28]" in done.stdout
    assert "conv2d_0.w_0: float32[6, 1, 5, 5]" in done.stdout
    assert "= conv2d(Input=image, Filter=conv2d_0.w_0)" in done.stdout
    np.save(tmp_path / "image.npy", reference["input_b5"])
    done = progdesc("run", os.path.join(fixture, "legacy"), "--feed",
                    f"image={tmp_path / 'image.npy'}", "--out", tmp_path / "out")
    assert done.returncode == 0, done.stderr
    (saved,) = os.listdir(tmp_path / "out")
    np.testing.assert_allclose(np.load(tmp_path / "out" / saved), reference["legacy_output_b5"],
                               rtol=1e-5, atol=1e-5)
    done = progdesc("export", prefix + ".json", "-o", tmp_path / "lenet.pdx", "--platforms",
                    jax.export.default_export_platform())   # called in this process
    assert done.returncode == 0, done.stderr
    compiled = pd.export.load_compiled(tmp_path / "lenet.pdx")
    for batch in (2, 5):
        np.testing.assert_allclose(np.asarray(compiled(reference[f"input_b{batch}"])[0]),
                                   reference[f"pir_output_b{batch}"], rtol=1e-5, atol=1e-5)
    done = progdesc("show", tmp_path / "missing" / "model")
    assert done.returncode == 2 and done.stderr.count("\n") == 1


CONSOLE_SCRIPT = """\
import sys
from progdesc.cli import main
if __name__ == '__main__':
    sys.argv[0] = sys.argv[0].removesuffix('.exe')
    sys.exit(main())
"""
"""What pip writes as the `progdesc` console script (the wrapper errors once named)."""


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    """A one-layer model saved as a directory and exported as a .pdx, its weights, and feeds."""
    from progdesc import export, layers
    tmp = tmp_path_factory.mktemp("small")
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        out = layers.fc(pd.data("x", [None, 3]), 2)
    exe, scope = pd.Executor(device="cpu"), pd.Scope()
    exe.run(startup, scope=scope)
    io.save_inference_model(tmp / "m", ["x"], [out], exe, main, scope)
    export.export_compiled(tmp / "m.pdx", main, ["x"], [out], scope, platforms=("cpu",))
    export.export_compiled(tmp / "p.pdx", main, ["x"], [out], scope, platforms=("cpu",),
                           embed_params=False)
    np.save(tmp / "x.npy", np.arange(6, dtype=np.float32).reshape(2, 3))
    np.save(tmp / "wide.npy", np.ones((2, 5), np.float32))
    (tmp / "progdesc").write_text(CONSOLE_SCRIPT)
    return tmp, scope.get("fc_0.w_0"), scope.get("fc_0.b_0")


def test_run_takes_a_compiled_artifact(small_model):
    tmp, w, b = small_model
    done = progdesc("run", tmp / "m.pdx", "--feed", f"x={tmp / 'x.npy'}", "--out", tmp / "out")
    assert done.returncode == 0, done.stderr
    assert "fc_0.out: float32[2, 2]" in done.stdout
    x = np.load(tmp / "x.npy")
    np.testing.assert_allclose(np.load(tmp / "out" / "fc_0.out.npy"), x @ w + b, rtol=1e-6)


def test_run_refuses_an_artifact_that_takes_its_parameters(small_model, capsys):
    tmp, _, _ = small_model
    code, _, err = in_process(capsys, "run", tmp / "p.pdx", "--feed", f"x={tmp / 'x.npy'}")
    assert code == 2 and "takes its parameters as inputs" in err, err


def test_export_refuses_a_compiled_artifact_saying_what_it_is(small_model, capsys):
    tmp, _, _ = small_model
    code, _, err = in_process(capsys, "export", tmp / "m.pdx", "-o", tmp / "again.pdx")
    assert code == 2 and "is a compiled artifact already" in err
    assert not (tmp / "again.pdx").exists()


@pytest.mark.parametrize("launcher, model, expected", [
    ("console script", "m", "variable 'x': feed has shape [2, 5], the variable expects [-1, 3]"),
    ("python -m", "m.pdx", "variable 'x': got shape [2, 5], the artifact takes ['batch', 3]")])
def test_errors_name_the_command_and_the_argument_not_the_launcher(small_model, launcher,
                                                                    model, expected):
    tmp, _, _ = small_model
    args = ["run", tmp / model, "--feed", f"x={tmp / 'wide.npy'}"]
    if launcher == "python -m":
        done = progdesc(*args)
    else:
        env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
        done = subprocess.run([sys.executable, tmp / "progdesc", *map(str, args)], env=env,
                              capture_output=True, text=True, timeout=600)
    line, = done.stderr.strip().splitlines()
    assert done.returncode == 2
    assert line.startswith(f"progdesc run: error: {expected}"), line
    assert line.endswith(f"(--feed x={tmp / 'wide.npy'})"), line
    assert "called at" not in line and "runpy" not in line


def test_a_bad_fetch_names_its_argument(small_model, capsys):
    """In process too, the caller's frames are not searched for a user line."""
    tmp, _, _ = small_model
    _, _, err = in_process(capsys, "run", tmp / "m", "--feed", f"x={tmp / 'x.npy'}",
                           "--fetch", "nope")
    line, = err.strip().splitlines()
    assert line.startswith("progdesc run: error: variable 'nope'"), line
    assert line.endswith("(--fetch nope)"), line
    assert "called at" not in line
