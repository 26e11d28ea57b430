"""pd.Model (issue 28): a training step written as eager code, recorded on its first call
and replayed compiled; graph mode switched off and on over the same Scope.

References: the same network built as a static program by hand (main + startup, trained by
an Executor from a fresh Scope), NumPy for forward values, and counts of how often the
Python body ran. The demo CNN and the transformer (Adam) train 50 steps under `slow`; in CI the transformer
switches between graph and eager steps with dropout on.
"""
import inspect
import os

import numpy as np
import pytest

import progdesc as pd
from progdesc import demo, layers, ops

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RNG = np.random.default_rng(0)
X = RNG.normal(size=(32, 4)).astype("float32")
Y = X.sum(1, keepdims=True)
SEED = 5


def mlp_forward(x):
    return layers.fc(layers.fc(x, 16, act="tanh"), 1)


class MLP(pd.Model):
    """The README's MLP; `seen` collects what the body appends (a Python side effect)."""

    def __init__(self, seed=SEED):
        super().__init__(seed=seed)
        self.optimizer = pd.optimizer.Adam(0.01)
        self.seen = []

    def forward(self, x):
        return mlp_forward(x)

    def train_one_batch(self, x, y):
        loss = layers.mse_loss(self.forward(x), y)
        self.optimizer.minimize(loss)
        self.seen.append(loss)
        return loss


def static_training(build, feeds, steps, seed=SEED):
    """{parameter: value} and the last loss of the static program `build(data vars) ->
    loss` (Adam 0.01) after `steps` Executor runs from a fresh Scope."""
    main, startup = pd.Program(random_seed=seed), pd.Program(random_seed=seed)
    with pd.program_guard(main, startup):
        inputs = [pd.data(name, [None, *v.shape[1:]], str(v.dtype)) for name, v in feeds.items()]
        loss = build(*inputs)
        pd.optimizer.Adam(0.01).minimize(loss)
    exe, scope = pd.Executor(), pd.Scope()
    exe.run(startup, scope=scope)
    for _ in range(steps):
        value, = exe.run(main, feed=feeds, fetch_list=[loss], scope=scope)
    return {p.name: np.asarray(scope.get(p.name)) for p in main.all_parameters()}, value


def assert_same_parameters(model, expected, atol):
    got = model.parameters()
    assert sorted(got) == sorted(expected)
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], atol=atol, rtol=0, err_msg=name)


@pytest.fixture(scope="module")
def mlp_reference():
    return static_training(lambda x, y: layers.mse_loss(mlp_forward(x), y),
                           {"x": X, "y": Y}, 50)


def test_mlp_trains_as_the_static_program_and_runs_its_body_once(mlp_reference):
    model = MLP().compile([X, Y], is_train=True, use_graph=True)
    first = model.train_one_batch(X, Y)
    # The first loss against NumPy on the initial parameters the step started from is
    # not available any more (the step updated them); the returned value is an array.
    assert isinstance(first, np.ndarray) and first.shape == ()
    for _ in range(49):
        loss = model.train_one_batch(X, Y)
    assert model.calls["train_one_batch"] == 1 and len(model.seen) == 1   # body ran once
    params, last = mlp_reference
    assert_same_parameters(model, params, atol=1e-6)
    np.testing.assert_allclose(loss, last, atol=1e-6)
    assert len(model.recordings) == 1


def test_first_loss_is_numpys_on_the_initial_parameters():
    model = MLP().compile([X, Y])
    assert model.train_program is not None   # recorded from the examples, initialised
    initial = model.parameters()
    assert model.calls["train_one_batch"] == 1
    h = np.tanh(X @ initial["fc_0.w_0"] + initial["fc_0.b_0"])
    expected = np.mean((h @ initial["fc_1.w_0"] + initial["fc_1.b_0"] - Y) ** 2)
    np.testing.assert_allclose(model.train_one_batch(X, Y), expected, rtol=1e-5)
    assert model.calls["train_one_batch"] == 1


def test_graph_off_then_on_keeps_training_the_same_parameters():
    model = MLP().compile([X, Y])
    for _ in range(3):
        model.train_one_batch(X, Y)
    model.graph(False)
    for _ in range(3):
        loss = model.train_one_batch(X, Y)      # eager: a Variable holding its value
        assert isinstance(loss, pd.Variable) and loss.numpy().shape == ()
    assert model.calls["train_one_batch"] == 4 and len(model.seen) == 4
    model.graph(True)
    for _ in range(3):
        model.train_one_batch(X, Y)
    assert model.calls["train_one_batch"] == 4    # the recorded program again
    params, _ = static_training(lambda x, y: layers.mse_loss(mlp_forward(x), y),
                                {"x": X, "y": Y}, 9)
    assert_same_parameters(model, params, atol=1e-6)
    # the moments and the step counter the eager steps advanced are the Scope's
    assert int(model.state_dict()["@LR_STEP@"].reshape(-1)[0]) == 9


def test_eager_from_the_start_initialises_as_the_startup_program():
    model = MLP().compile([X, Y], use_graph=False)
    for _ in range(2):
        loss = model.train_one_batch(X, Y)
    assert np.isfinite(float(loss))
    params, _ = static_training(lambda x, y: layers.mse_loss(mlp_forward(x), y),
                                {"x": X, "y": Y}, 2)
    assert_same_parameters(model, params, atol=1e-6)


class Counted(pd.Model):
    """A model whose input dtype matters: `forward` casts it."""

    batch_polymorphic = False

    def forward(self, x):
        return ops.reduce_sum(ops.cast(x, dtype="float32") * 2.0)


def test_a_new_signature_records_again():
    model = Counted().eval()
    np.testing.assert_allclose(model(np.ones((2, 3), "float32")), 12.0)
    np.testing.assert_allclose(model(np.ones((2, 3), "float32")), 12.0)
    assert model.calls["forward"] == 1
    np.testing.assert_allclose(model(np.ones((4, 3), "float32")), 24.0)   # a new batch size
    assert model.calls["forward"] == 2
    np.testing.assert_allclose(model(np.ones((4, 3), "int32")), 24.0)     # a new dtype
    assert model.calls["forward"] == 3
    model(np.ones((2, 3), "float32"))
    np.testing.assert_allclose(model(np.ones((2, 3), "float64")), 12.0)   # fed as float32
    assert model.calls["forward"] == 3 and len(model.recordings) == 3


def test_a_python_decision_on_a_value_is_a_recording_error_naming_the_line():
    class Branchy(MLP):
        def train_one_batch(self, x, y):
            loss = layers.mse_loss(self.forward(x), y)
            if loss > 0:
                self.optimizer.minimize(loss)
            return loss

    line = inspect.getsourcelines(Branchy.train_one_batch.__wrapped__)[1] + 2
    model = Branchy().compile([X, Y])
    with pytest.raises(pd.RecordingError, match="pd.Model records train_one_batch.*control_flow") \
            as err:
        model.train_one_batch(X, Y)
    assert f"test_model.py:{line}" in str(err.value)
    assert model.recordings == {} and len(model.scope.local_var_names()) == 0   # nothing kept
    model.graph(False)   # eager mode decides on the value (with a warning), as eager does
    with pytest.warns(pd.RecordingWarning):
        model.train_one_batch(X, Y)


def test_eval_program_turns_dropout_off_and_matches_numpy():
    class Dropped(MLP):
        def forward(self, x):
            h = layers.fc(x, 16, act="tanh")
            return layers.fc(layers.dropout(h, 0.5, is_test=not self.training), 1)

    model = Dropped().compile([X, Y])
    model.train_one_batch(X, Y)
    model.eval()
    out = model(X)
    p = model.parameters()
    expected = np.tanh(X @ p["fc_0.w_0"] + p["fc_0.b_0"]) @ p["fc_1.w_0"] + p["fc_1.b_0"]
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
    types = [op.type for op in model.eval_program.global_block().ops]
    assert "adam" not in types and all(op.attr("is_test") for op in
                                       model.eval_program.global_block().ops
                                       if op.type == "dropout")
    model.graph(False)                                   # eager eval: the same values
    np.testing.assert_allclose(model(X).numpy(), expected, rtol=1e-5, atol=1e-6)
    assert model.training is False
    model.train()
    assert model.training is True


def test_programs_are_ordinary_and_state_saves_and_loads(tmp_path):
    model = MLP().compile([X, Y])
    assert model.calls["train_one_batch"] == 0
    program = model.train_program                        # recorded from compile's examples
    assert [op.type for op in program.global_block().ops].count("adam") == 4
    assert "fc_0.w_0" in str(model.startup_program)
    model.train_one_batch(X, Y)
    path = str(tmp_path / "mlp.safetensors")
    model.save(path)
    saved = model.state_dict()
    for _ in range(3):
        model.train_one_batch(X, Y)
    assert not np.allclose(model.parameters()["fc_0.w_0"], saved["fc_0.w_0"])
    assert "fc_0.w_0" in model.load(path)
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(value, saved[name], err_msg=name)
    assert "graph on" in repr(model) and "4 parameters (97 values)" in repr(model)
    again = pd.Program.from_bytes(program.to_bytes())     # serializable
    assert len(again.global_block().ops) == len(program.global_block().ops)


def test_a_model_without_a_step_recording_says_how_to_get_one():
    with pytest.raises(pd.ProgramError, match="model.eval"):
        MLP().eval_program
    model = MLP().compile([X], is_train=False)           # an inference model
    assert model.training is False
    assert [op.type for op in model.eval_program.global_block().ops].count("matmul") == 2
    assert sorted(model.parameters()) == ["fc_0.b_0", "fc_0.w_0", "fc_1.b_0", "fc_1.w_0"]


def cnn_forward(image):
    h = layers.pool2d(layers.conv2d(image, 32, 3, padding=1, act="relu"), 2)
    h = layers.pool2d(layers.conv2d(h, 64, 3, padding=1, act="relu"), 2)
    return layers.fc(layers.fc(h, 128, act="relu"), 10)


class CNN(pd.Model):
    def __init__(self):
        super().__init__(seed=SEED)
        self.optimizer = pd.optimizer.Adam(0.01)

    def train_one_batch(self, image, label):
        loss = ops.mean(layers.softmax_with_cross_entropy(cnn_forward(image), label))
        self.optimizer.minimize(loss)
        return loss


IMAGES = RNG.uniform(size=(16, 1, 8, 8)).astype("float32")
LABELS = RNG.integers(0, 10, size=(16, 1)).astype("int64")


@pytest.mark.slow   # the CI suite proves the parity on the MLP and the transformer layer
@pytest.mark.parametrize("steps", [50])
def test_demo_cnn_trains_as_the_demo_program(steps):
    main, startup, _, image, label, loss, _ = demo.build(learning_rate=0.01, seed=SEED)
    exe, scope = pd.Executor(), pd.Scope()
    exe.run(startup, scope=scope)
    for _ in range(steps):
        exe.run(main, feed={"image": IMAGES, "label": LABELS}, fetch_list=[loss], scope=scope)
    model = CNN().compile([IMAGES, LABELS])
    for _ in range(steps):
        model.train_one_batch(IMAGES, LABELS)
    assert model.calls["train_one_batch"] == 1
    assert_same_parameters(model, {p.name: np.asarray(scope.get(p.name))
                                   for p in main.all_parameters()}, atol=1e-6)


def transformer_loss(x, y):
    h = layers.transformer_encoder_layer(x, num_heads=2, dim_feedforward=16, dropout_rate=0.1)
    return layers.mse_loss(layers.fc(h, 1, num_flatten_dims=2), y)


class Transformer(pd.Model):
    def __init__(self):
        super().__init__(seed=SEED)
        self.optimizer = pd.optimizer.Adam(0.01)

    def train_one_batch(self, x, y):
        loss = transformer_loss(x, y)
        self.optimizer.minimize(loss)
        return loss


SEQ = RNG.normal(size=(4, 5, 8)).astype("float32")
SEQ_Y = SEQ.sum(2, keepdims=True)


@pytest.mark.slow
@pytest.mark.parametrize("steps", [50])
def test_transformer_layer_with_dropout_trains_as_the_static_program(steps):
    params, _ = static_training(transformer_loss, {"x": SEQ, "y": SEQ_Y}, steps)
    model = Transformer().compile([SEQ, SEQ_Y])
    for _ in range(steps):
        model.train_one_batch(SEQ, SEQ_Y)
    assert model.calls["train_one_batch"] == 1
    assert_same_parameters(model, params, atol=1e-6)


class SGDTransformer(pd.Model):
    def __init__(self):
        super().__init__(seed=SEED)
        self.optimizer = pd.optimizer.SGD(0.01)

    def train_one_batch(self, x, y):
        loss = transformer_loss(x, y)
        self.optimizer.minimize(loss)
        return loss


def test_transformer_with_dropout_switching_graph_and_eager_follows_the_static_program():
    # SGD: Adam turns the float noise of a gradient that is zero in exact arithmetic (the
    # attention's key bias) into full +-lr steps, which op-by-op and fused runs round
    # differently; with SGD, eager steps and compiled ones agree to float rounding.
    main, startup = pd.Program(random_seed=SEED), pd.Program(random_seed=SEED)
    with pd.program_guard(main, startup):
        loss = transformer_loss(pd.data("x", [None, 5, 8]), pd.data("y", [None, 5, 1]))
        pd.optimizer.SGD(0.01).minimize(loss)
    exe, scope = pd.Executor(), pd.Scope()
    exe.run(startup, scope=scope)
    model = SGDTransformer().compile([SEQ, SEQ_Y])
    for step in range(4):   # graph, eager, graph, eager: dropout draws from the one RNG
        expected, = exe.run(main, feed={"x": SEQ, "y": SEQ_Y}, fetch_list=[loss], scope=scope)
        model.graph(step % 2 == 0)
        value = model.train_one_batch(SEQ, SEQ_Y)
        np.testing.assert_allclose(np.asarray(value if step % 2 == 0 else value.numpy()),
                                   expected, rtol=1e-6)
    assert model.calls["train_one_batch"] == 3
    assert_same_parameters(model, {p.name: np.asarray(scope.get(p.name))
                                   for p in main.all_parameters()}, atol=1e-6)


def test_readme_model_block_runs():
    readme = open(os.path.join(ROOT, "README.md")).read()
    section = readme[readme.index("### A training step written once: `pd.Model`"):]
    code = section[section.index("```python") + len("```python"):section.index("```\n", 10)]
    code = code.replace("range(200)", "range(30)")
    namespace = {}
    exec(compile(code, "README.md", "exec"), namespace)   # noqa: S102
    model = namespace["model"]
    assert model.calls["train_one_batch"] == 2         # recorded once, one eager step
    assert float(namespace["loss_var"]) < float(namespace["first"])
    assert namespace["prediction"].shape == (4, 1)
