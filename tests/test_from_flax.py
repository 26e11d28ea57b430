"""pd.from_flax against Flax itself: outputs, gradients (jax.grad of the Flax loss), and 20
Adam steps against optax, on an MLP, a CNN with BatchNorm (training mode, statistics
updated), a transformer encoder and an embedding (linen), and on nnx modules; the imported program
saves, loads, exports and prints like any other."""
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from flax import traverse_util

import progdesc as pd
from progdesc import ops
from source_lines import line_of

RTOL = ATOL = 1e-5


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(3)(nn.relu(nn.Dense(16)(x)))


class CNN(nn.Module):
    @nn.compact
    def __call__(self, x, train=True):
        x = nn.Conv(4, (3, 3), use_bias=False)(x)   # a bias before BatchNorm has no gradient
        x = nn.BatchNorm(use_running_average=not train, momentum=0.9)(x)
        x = nn.max_pool(nn.relu(x), (2, 2), (2, 2))
        x = nn.avg_pool(nn.Conv(6, (3, 3), padding="VALID")(x), (2, 2), (1, 1))
        return nn.Dense(3)(x.reshape(x.shape[0], -1))


class Encoder(nn.Module):
    @nn.compact
    def __call__(self, x):
        # no biases: the key bias has no gradient (softmax ignores a shift along the keys),
        # and Adam would turn its rounding noise into steps
        h = nn.MultiHeadDotProductAttention(num_heads=2, use_bias=False)(nn.LayerNorm()(x))
        x = x + h
        h = nn.Dense(8)(nn.gelu(nn.Dense(16)(nn.LayerNorm()(x))))
        return (x + h).mean(axis=1)


class EmbedBag(nn.Module):
    @nn.compact
    def __call__(self, ids):
        return nn.Dense(3)(jnp.tanh(nn.Embed(10, 6)(ids).mean(axis=1)))


def _data(*shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


CASES = {
    "mlp": (MLP(), _data(6, 5), {}),
    "cnn_batchnorm": (CNN(), _data(4, 8, 8, 2), {"train": True}),
    "transformer": (Encoder(), _data(2, 5, 8), {}),
    "embedding": (EmbedBag(), np.array([[1, 4, 4, 9], [0, 2, 7, 3]], np.int32), {}),
}


def _batch_of(x, batch):
    """Inputs like the example `x` but `batch` rows (ids stay in the embedding's range)."""
    if x.dtype.kind == "i":
        return np.random.default_rng(batch).integers(0, 10, (batch, *x.shape[1:]), x.dtype)
    return _data(batch, *x.shape[1:], seed=batch)


def _flax_out(module, variables, x, kw):
    """The Flax module's output (and its updated statistics, {} without any) on `x`."""
    state = [c for c in variables if c != "params"]
    if not state:
        return jax.jit(functools.partial(module.apply, **kw))(variables, x), {}
    out, updated = jax.jit(functools.partial(module.apply, mutable=state, **kw))(variables, x)
    return out, _flat(updated.get("batch_stats", {}))


@functools.lru_cache(maxsize=None)
def _variables(case):
    """The case's module initialized (jitted: Flax's eager init compiles op by op)."""
    module, x, kw = CASES[case]
    return jax.jit(functools.partial(module.init, **kw))(jax.random.key(0), x)


def _flat(tree):
    """{'Dense_0.kernel': array} of a nested dict of arrays."""
    return {k: np.asarray(v) for k, v in traverse_util.flatten_dict(tree, sep=".").items()}


def _flax_loss(module, kw):
    def loss(params, state, x, y):
        variables = {"params": params, **state}
        if state:
            out, new_state = module.apply(variables, x, mutable=list(state), **kw)
        else:
            out, new_state = module.apply(variables, x, **kw), state
        return jnp.mean((out - y) ** 2), new_state
    return loss


def _imported(case):
    """(variables, program, feeds, fetch target, scope, loss, startup) with an MSE loss
    appended to the imported program."""
    module, x, kw = CASES[case]
    variables = _variables(case)
    scope = pd.Scope()
    program, feeds, fetches = pd.from_flax(module, variables, x, scope=scope, **kw)
    startup = pd.Program()
    with pd.program_guard(program, startup):
        y = pd.data("y", [None, *fetches[0].shape[1:]])
        loss = ops.mean(ops.square(fetches[0] - y))
    return variables, program, feeds, fetches[0], scope, loss, startup


@pytest.mark.parametrize("case", CASES)
def test_outputs_equal_flax(case):
    module, x, kw = CASES[case]
    variables = _variables(case)
    scope = pd.Scope()
    program, feeds, fetches = pd.from_flax(module, variables, x, scope=scope, **kw)
    assert feeds == ["ids" if case == "embedding" else "x"]
    got, = pd.Executor().run(program, feed={feeds[0]: x}, fetch_list=fetches, scope=scope)
    state = [c for c in variables if c != "params"]
    apply = functools.partial(module.apply, mutable=state, **kw) if state else \
        functools.partial(module.apply, **kw)
    want = jax.jit(apply)(variables, x)
    want = want[0] if state else want
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("case", CASES)
def test_parameters_keep_their_names_and_values(case):
    module, x, kw = CASES[case]
    variables = _variables(case)
    scope = pd.Scope()
    program, _, _ = pd.from_flax(module, variables, x, scope=scope, **kw)
    params = _flat(variables["params"])
    assert {p.name for p in program.all_parameters()} == set(params)
    for name, value in params.items():
        np.testing.assert_array_equal(scope.get(name), value)
    for name, value in _flat(variables.get("batch_stats", {})).items():
        var = program.global_block().var(name)
        assert var.persistable and var.stop_gradient and not var.desc.is_parameter
        np.testing.assert_array_equal(scope.get(name), value)


@pytest.mark.parametrize("case", CASES)
def test_gradients_equal_jax_grad_of_the_flax_loss(case):
    module, x, kw = CASES[case]
    variables, program, feeds, _, scope, loss, _ = _imported(case)
    y = _data(len(x), *program.global_block().var("y").shape[1:], seed=1)
    names = sorted(_flat(variables["params"]))
    block = program.global_block()
    grads = pd.gradients(loss, [block.var(n) for n in names])
    got = pd.Executor().run(program, feed={feeds[0]: x, "y": y}, fetch_list=grads, scope=scope)
    state = {c: v for c, v in variables.items() if c != "params"}
    want = _flat(jax.jit(jax.grad(lambda p: _flax_loss(module, kw)(p, state, x, y)[0]))(
        variables["params"]))
    for name, g in zip(names, got):
        np.testing.assert_allclose(g, want[name], rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("case", CASES)
def test_the_import_runs_at_other_batch_sizes_as_flax_does(case):
    module, x, kw = CASES[case]
    variables = _variables(case)
    scope = pd.Scope()
    program, feeds, fetches = pd.from_flax(module, variables, x, scope=scope, **kw)
    assert program.global_block().var(feeds[0]).shape == (-1, *x.shape[1:])
    for batch in (1, len(x) + 3):
        other = _batch_of(x, batch)
        for name, value in _flat(variables.get("batch_stats", {})).items():
            scope.set(name, value)   # the statistics Flax starts from
        got, = pd.Executor().run(program, feed={feeds[0]: other}, fetch_list=fetches,
                                 scope=scope)
        want, stats = _flax_out(module, variables, other, kw)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
        for name, value in stats.items():
            np.testing.assert_allclose(scope.get(name), value, rtol=RTOL, atol=ATOL,
                                       err_msg=name)


@pytest.mark.parametrize("case", CASES)
def test_the_import_exports_for_any_batch_size(case, tmp_path):
    module, x, kw = CASES[case]
    variables = _variables(case)
    scope = pd.Scope()
    program, feeds, fetches = pd.from_flax(module, variables, x, scope=scope, **kw)
    path = str(tmp_path / "model.pdx")
    pd.export.export_compiled(path, program, feeds, fetches, scope=scope)  # polymorphic
    served = pd.export.load_compiled(path)
    for batch in (2, 5):
        other = _batch_of(x, batch)
        got, = served(other)
        np.testing.assert_allclose(got, _flax_out(module, variables, other, kw)[0],
                                   rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("case", CASES)
def test_twenty_adam_steps_at_another_batch_size_match_optax(case):
    module, example, kw = CASES[case]
    variables, program, feeds, _, scope, loss, startup = _imported(case)
    x = _batch_of(example, len(example) + 3)   # imported at the example's batch size
    y = _data(len(x), *program.global_block().var("y").shape[1:], seed=1)
    with pd.program_guard(program, startup):
        pd.optimizer.Adam(0.01).minimize(loss)
    exe = pd.Executor()
    exe.run(startup, scope=scope)
    for _ in range(20):
        exe.run(program, feed={feeds[0]: x, "y": y}, fetch_list=[loss], scope=scope)

    opt = optax.adam(0.01)

    @jax.jit
    def step(params, state, opt_state):
        (_, state), grads = jax.value_and_grad(_flax_loss(module, kw), has_aux=True)(
            params, state, x, y)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), state, opt_state

    params = variables["params"]
    state = {c: v for c, v in variables.items() if c != "params"}
    opt_state = opt.init(params)
    for _ in range(20):
        params, state, opt_state = step(params, state, opt_state)
    for name, want in {**_flat(params), **_flat(state.get("batch_stats", {}))}.items():
        np.testing.assert_allclose(scope.get(name), want, rtol=RTOL, atol=ATOL, err_msg=name)


def test_batch_norm_in_training_mode_updates_its_statistics():
    module, x, kw = CASES["cnn_batchnorm"]
    variables = _variables("cnn_batchnorm")
    scope = pd.Scope()
    program, _, fetches = pd.from_flax(module, variables, x, scope=scope, **kw)
    pd.Executor().run(program, feed={"x": x}, fetch_list=fetches, scope=scope)
    _, updated = module.apply(variables, x, mutable=["batch_stats"], **kw)
    stats = _flat(updated["batch_stats"])
    assert not np.allclose(stats["BatchNorm_0.mean"],
                           _flat(variables["batch_stats"])["BatchNorm_0.mean"])
    for name, want in stats.items():
        np.testing.assert_allclose(scope.get(name), want, rtol=RTOL, atol=ATOL, err_msg=name)


def test_batch_norm_in_eval_mode_writes_nothing():
    module, x, _ = CASES["cnn_batchnorm"]
    variables = _variables("cnn_batchnorm")
    scope = pd.Scope()
    program, _, fetches = pd.from_flax(module, variables, x, scope=scope, train=False)
    assert "assign" not in [op.type for op in program.global_block().ops]
    got, = pd.Executor().run(program, feed={"x": x}, fetch_list=fetches, scope=scope)
    np.testing.assert_allclose(got, module.apply(variables, x, train=False), rtol=RTOL,
                               atol=ATOL)


class NnxNet(nnx.Module):
    def __init__(self, rngs):
        self.linear1 = nnx.Linear(5, 8, rngs=rngs)
        self.bn = nnx.BatchNorm(8, momentum=0.9, rngs=rngs)
        self.layers = nnx.List([nnx.Linear(8, 3, rngs=rngs)])

    def __call__(self, x):
        return self.layers[0](nnx.relu(self.bn(self.linear1(x))))


def test_nnx_module_outputs_names_and_statistics():
    model = NnxNet(nnx.Rngs(0))
    x = _data(6, 5)
    scope = pd.Scope()
    program, feeds, fetches = pd.from_flax(model, None, x, scope=scope)
    assert feeds == ["x"]
    assert {p.name for p in program.all_parameters()} == {
        "linear1.kernel", "linear1.bias", "bn.scale", "bn.bias", "layers.0.kernel",
        "layers.0.bias"}
    assert not program.global_block().var("bn.mean").desc.is_parameter
    got, = pd.Executor().run(program, feed={"x": x}, fetch_list=fetches, scope=scope)
    want = model(x)            # training mode: updates the module's statistics
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(scope.get("bn.mean"), model.bn.mean[...], rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(scope.get("bn.var"), model.bn.var[...], rtol=RTOL, atol=ATOL)


class _Penalty(nnx.Variable):
    pass


class _Penalized(nnx.Module):
    """Keeps a penalty as a variable it makes when called (nnx's VAE example's KL loss)."""

    def __init__(self, rngs):
        self.linear = nnx.Linear(5, 3, rngs=rngs)

    def __call__(self, x):
        y = self.linear(x)
        self.penalty = _Penalty(jnp.mean(y ** 2))
        return y


def _penalized_loss(model, x):
    y = model(x)
    return jnp.mean(y) + sum(jax.tree_util.tree_leaves(nnx.pop(model, _Penalty)), 0.0)


def test_a_variable_an_nnx_module_makes_when_called_is_a_value_of_that_call():
    model, x = _Penalized(nnx.Rngs(0)), _data(6, 5)
    scope = pd.Scope()
    program, _, fetches = pd.from_flax(model, None, x, scope=scope)
    assert not hasattr(model, "penalty")   # the module itself is left as it was
    assert not program.global_block().has_var("penalty")
    got, = pd.Executor().run(program, feed={"x": x}, fetch_list=fetches, scope=scope)
    np.testing.assert_allclose(got, nnx.clone(model)(x), rtol=RTOL, atol=ATOL)

    scope = pd.Scope()
    program, _, (loss,) = pd.from_flax(model, None, x, scope=scope, method=_penalized_loss)
    names = sorted(p.name for p in program.all_parameters())
    grads_of = pd.gradients(loss, [program.global_block().var(n) for n in names])
    got = pd.Executor().run(program, feed={"x": x}, fetch_list=[loss, *grads_of], scope=scope)
    want, grads = nnx.value_and_grad(_penalized_loss)(nnx.clone(model), x)
    np.testing.assert_allclose(got[0], want, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(got[names.index("linear.kernel") + 1],
                               grads["linear"]["kernel"][...], rtol=RTOL, atol=ATOL)


def test_nnx_module_trains_like_optax():
    model = NnxNet(nnx.Rngs(0))
    model.eval()
    x, y = _data(6, 5), _data(6, 3, seed=1)
    scope = pd.Scope()
    program, _, (out,) = pd.from_flax(model, None, x, scope=scope)
    startup = pd.Program()
    with pd.program_guard(program, startup):
        loss = ops.mean(ops.square(out - pd.data("y", [None, 3])))
        pd.optimizer.Adam(0.01).minimize(loss)
    exe = pd.Executor()
    exe.run(startup, scope=scope)
    for _ in range(20):
        exe.run(program, feed={"x": x, "y": y}, fetch_list=[loss], scope=scope)
    optimizer = nnx.Optimizer(model, optax.adam(0.01), wrt=nnx.Param)

    @nnx.jit
    def step(model, optimizer):
        optimizer.update(model, nnx.grad(lambda m: jnp.mean((m(x) - y) ** 2))(model))

    for _ in range(20):
        step(model, optimizer)
    np.testing.assert_allclose(scope.get("linear1.kernel"), model.linear1.kernel[...],
                               rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(scope.get("layers.0.bias"), model.layers[0].bias[...],
                               rtol=RTOL, atol=ATOL)


def test_the_imported_program_saves_loads_exports_prints_and_displays(tmp_path):
    module, x, _ = CASES["mlp"]
    variables = _variables("mlp")
    scope = pd.Scope()
    program, feeds, fetches = pd.from_flax(module, variables, x, scope=scope)
    want = module.apply(variables, x)
    text = str(program)
    assert "param Dense_0.kernel: float32[16, 3]" in text
    assert "Dense_0.dot_general_0.out: float32[-1, 3] = dot_general(" in text
    assert "relu(" in text
    assert "Dense_0.kernel" in program._repr_html_() and "Dense_0.kernel" in program.to_dot()
    line = line_of(__file__, "return nn.Dense(3)(nn.relu(nn.Dense(16)(x)))")
    assert {op.desc.callsite for op in program.global_block().ops} == {line}

    pd.io.save_inference_model(str(tmp_path / "model"), feeds, fetches, program=program,
                               scope=scope)
    fresh = pd.Scope()
    loaded, loaded_feeds, loaded_fetches = pd.io.load_inference_model(str(tmp_path / "model"),
                                                                      scope=fresh)
    got, = pd.Executor().run(loaded, feed={loaded_feeds[0]: x}, fetch_list=loaded_fetches,
                             scope=fresh)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)

    path = str(tmp_path / "model.pdx")
    pd.export.export_compiled(path, program, feeds, fetches, scope=scope)
    got, = pd.export.load_compiled(path)(x)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def test_a_module_that_is_not_flax_is_refused():
    with pytest.raises(TypeError, match="flax.linen or flax.nnx Module"):
        pd.from_flax(lambda x: x, {}, np.zeros(3))


class Dropped(nnx.Module):
    def __init__(self, rngs):
        self.linear = nnx.Linear(4, 3, rngs=rngs)
        self.drop = nnx.Dropout(0.5, rngs=rngs)

    def __call__(self, x):
        return self.drop(self.linear(x))


def test_dropout_imports_in_training_mode_and_in_eval_mode():
    model, x = Dropped(nnx.Rngs(0)), _data(2, 4)
    twin = nnx.clone(model)
    scope = pd.Scope()
    program, _, fetches = pd.from_flax(model, None, x, scope=scope)   # draws Flax's mask
    got, = pd.Executor().run(program, feed={"x": x}, fetch_list=fetches, scope=scope)
    np.testing.assert_array_equal(got, nnx.jit(lambda m, x: m(x))(twin, x))
    model.eval()
    scope = pd.Scope()
    program, _, fetches = pd.from_flax(model, None, x, scope=scope)
    got, = pd.Executor().run(program, feed={"x": x}, fetch_list=fetches, scope=scope)
    np.testing.assert_allclose(got, model(x), rtol=RTOL, atol=ATOL)


class PartitionedDecoder(nn.Module):   # lm1b's way: boxed (partitioned) initializers
    @nn.compact
    def __call__(self, ids):
        embed = nn.Embed(7, 4, embedding_init=nn.with_logical_partitioning(
            nn.initializers.normal(1.0), ("vocab", "embed")))
        x = embed(ids)
        return nn.Dense(3, kernel_init=nn.with_partitioning(
            nn.initializers.lecun_normal(), (None, "model")))(x)


def test_partitioning_metadata_leaves_parameter_names_clean():
    ids = np.array([[1, 2, 6], [0, 3, 3]], np.int32)
    module = PartitionedDecoder()
    variables = module.init(jax.random.key(0), ids)
    scope = pd.Scope()
    program, feeds, fetches = pd.from_flax(module, variables, ids, scope=scope)
    unboxed = traverse_util.flatten_dict(nn.meta.unbox(variables)["params"], sep=".")
    assert sorted(p.name for p in program.all_parameters()) == sorted(unboxed) \
        == ["Dense_0.bias", "Dense_0.kernel", "Embed_0.embedding"]
    for name, value in unboxed.items():
        np.testing.assert_array_equal(np.asarray(scope.get(name)), value)
    (got,) = pd.Executor().run(program, feed={feeds[0]: ids}, fetch_list=fetches, scope=scope)
    np.testing.assert_allclose(got, module.apply(variables, ids), rtol=1e-6)


def test_nnx_partitioning_metadata_leaves_parameter_names_clean():
    class Model(nnx.Module):
        def __init__(self, rngs):
            self.l1 = nnx.Linear(3, 4, rngs=rngs, kernel_init=nnx.with_partitioning(
                nnx.initializers.lecun_normal(), (None, "model")))

        def __call__(self, x):
            return self.l1(x)
    with jax.set_mesh(jax.make_mesh((1,), ("model",))):
        model = Model(nnx.Rngs(0))
    x = np.ones((2, 3), np.float32)
    scope = pd.Scope()
    program, feeds, fetches = pd.from_flax(model, None, x, scope=scope)
    assert sorted(p.name for p in program.all_parameters()) == [
        "l1.bias", "l1.kernel"]
    np.testing.assert_array_equal(np.asarray(scope.get("l1.kernel")), model.l1.kernel[...])
    (got,) = pd.Executor().run(program, feed={feeds[0]: x}, fetch_list=fetches, scope=scope)
    np.testing.assert_allclose(got, model(x), rtol=1e-6)


def test_importing_into_a_scope_holding_other_values_refuses_unless_asked():
    class Model(nnx.Module):
        def __init__(self, rngs):
            self.l1 = nnx.Linear(3, 4, rngs=rngs)
            self.bn = nnx.BatchNorm(4, rngs=rngs)

        def __call__(self, x):
            return self.bn(self.l1(x))
    model = Model(nnx.Rngs(0))
    x = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    scope = pd.Scope()
    pd.from_flax(model, None, x, scope=scope)
    pd.from_flax(model, None, x, scope=scope)   # the same values again: nothing overwritten
    trained = np.asarray(scope.get("l1.kernel")) + 1.0
    scope.set("l1.kernel", trained)
    model.eval()
    with pytest.raises(pd.ScopeError, match="overwrite=True") as info:
        pd.from_flax(model, None, x, scope=scope)
    assert info.value.var == "l1.kernel"
    np.testing.assert_array_equal(scope.get("l1.kernel"), trained)
    program, feeds, fetches = pd.from_flax(model, None, x, scope=scope, overwrite=True)
    np.testing.assert_array_equal(scope.get("l1.kernel"), model.l1.kernel[...])
    (got,) = pd.Executor().run(program, feed={feeds[0]: x}, fetch_list=fetches, scope=scope)
    np.testing.assert_allclose(got, model(x), rtol=1e-5, atol=1e-6)


def test_from_jax_refuses_to_overwrite_a_held_parameter_unless_asked():
    scope = pd.Scope()
    scope.set("w", np.zeros(3, np.float32))
    with pytest.raises(pd.ScopeError, match="'w'"):
        pd.from_jax(lambda p, x: x * p["w"], np.ones(3, np.float32),
                    params={"w": np.ones(3, np.float32)}, scope=scope, batch_polymorphic=False)
    np.testing.assert_array_equal(scope.get("w"), np.zeros(3))
    pd.from_jax(lambda p, x: x * p["w"], np.ones(3, np.float32),
                params={"w": np.ones(3, np.float32)}, scope=scope, overwrite=True,
                batch_polymorphic=False)
    np.testing.assert_array_equal(scope.get("w"), np.ones(3))


class Lookup(nn.Module):   # a batch of queries against a table passed in (fixed rows)
    @nn.compact
    def __call__(self, queries, table):
        scores = nn.Dense(3)(queries) @ table.T
        return jax.nn.softmax(scores) @ table


def test_per_input_leading_dims_reach_a_flax_module():
    queries, table = _rand_np(4, 3), _rand_np(7, 3, seed=1)
    module = Lookup()
    variables = module.init(jax.random.key(0), queries, table)
    with pytest.raises(pd.BatchPolymorphismError, match=r"leading dims differ"):
        pd.from_flax(module, variables, queries, table, scope=pd.Scope())
    scope = pd.Scope()
    program, feeds, fetches = pd.from_flax(module, variables, queries, table, scope=scope,
                                           batch_polymorphic={"table": False})
    assert [program.global_block().var(f).shape for f in feeds] == [(-1, 3), (7, 3)]
    for batch in (2, 5):
        q = _rand_np(batch, 3, seed=batch)
        (got,) = pd.Executor().run(program, feed={"queries": q, "table": table},
                                   fetch_list=fetches, scope=scope)
        np.testing.assert_allclose(got, module.apply(variables, q, table), rtol=1e-5,
                                   atol=1e-6)


def _rand_np(*shape, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, size=shape).astype(np.float32)
