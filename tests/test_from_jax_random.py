"""pd.from_jax / pd.from_flax of functions that draw random numbers: given the same key, the
imported program draws the same numbers as the original compiled by `jax.jit`, bit for bit
(np.testing.assert_array_equal), with old-style (`PRNGKey`) and typed (`jax.random.key`)
keys; a key argument is a data variable holding the key's raw data; what is not translated
is refused saying what to do."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import progdesc as pd
from progdesc import ops
from source_lines import line_of

KEYS = {"PRNGKey": jax.random.PRNGKey(3), "typed": jax.random.key(3)}


def _data(*shape, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, size=shape).astype(np.float32)


def _raw(value):
    """A key's raw data (any other array as it is), as a program variable holds it."""
    value = jnp.asarray(value)
    if jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key):
        return np.asarray(jax.random.key_data(value))
    return np.asarray(value)


def bernoulli(k, x):
    return jax.random.bernoulli(k, 0.3, x.shape)


def uniform(k, x):
    return jax.random.uniform(k, x.shape, minval=-2.0, maxval=3.0) * x


def normal(k, x):
    return jax.random.normal(k, x.shape) + x


def split(k, x):
    return jax.random.split(k, 3)


def fold_in(k, x):
    return jax.random.fold_in(k, 7), jax.random.fold_in(k, x.shape[1])


def dropout(k, x):
    keep = jax.random.bernoulli(k, 0.8, x.shape)
    return jnp.where(keep, x / 0.8, 0.0)


def integers_and_choices(k, x):
    a, b, c = jax.random.split(k, 3)
    return (jax.random.randint(a, x.shape, 0, 10), jax.random.categorical(b, x),
            jax.random.truncated_normal(c, -1.0, 1.0, x.shape), jax.random.gumbel(c, (2,)))


def arrays_of_keys(k, x):
    a, b = jax.random.split(k)
    keys = jax.random.split(b, 4)
    picked = jnp.where(x[0, 0] > 0, keys[1], keys[2])
    per_key = jax.vmap(lambda key: jax.random.normal(key, (2,)))(keys)
    return (jax.random.normal(a, (2,)), per_key, jax.random.uniform(picked, (3,)),
            jax.random.normal(keys.reshape(2, 2).T[1, 0], (2,)))


def keys_in_control_flow(k, x):
    def body(i, carry):
        key, acc = carry
        key, sub = jax.random.split(key)
        return key, acc + jax.random.normal(sub, acc.shape)
    key, acc = jax.lax.fori_loop(0, 3, body, (k, x))
    per_step = jax.lax.scan(lambda c, kk: (c, jax.random.uniform(kk, (2,))), 0.0,
                            jax.random.split(k, 4))[1]
    branch = jax.lax.cond(x[0, 0] > 0, lambda kk: jax.random.normal(kk, (2,)),
                          lambda kk: jnp.zeros(2), k)
    return acc, key, per_step, branch


def gamma_family(k, x):
    a, b, c, d = jax.random.split(k, 4)
    shape = x * x + 0.3
    per_key = jax.vmap(lambda key, s: jax.random.gamma(key, s))(jax.random.split(d, 3), shape.T)
    return (jax.random.gamma(a, shape), jax.random.loggamma(a, shape * 0.1),
            jax.random.beta(b, shape, 2.0 - x), jax.random.dirichlet(c, shape),
            jax.random.poisson(d, shape * 4.0), per_key)


FUNCTIONS = [bernoulli, uniform, normal, split, fold_in, dropout, integers_and_choices,
             arrays_of_keys, keys_in_control_flow, gamma_family]


def _run(fn, key, x, **kwargs):
    program, feeds, fetches = pd.from_jax(fn, key, x, **kwargs)
    assert feeds == ["k", "x"]
    return pd.Executor().run(program, feed={"k": _raw(key), "x": x}, fetch_list=fetches)


@pytest.mark.parametrize("key", KEYS.values(), ids=KEYS.keys())
@pytest.mark.parametrize("fn", FUNCTIONS, ids=lambda f: f.__name__)
def test_draws_equal_the_originals_bit_for_bit(fn, key):
    if fn is arrays_of_keys and key is KEYS["PRNGKey"]:
        pytest.skip("old-style keys are plain uint32 arrays: (4, 2) reshaped is no array of keys")
    if fn is gamma_family and key is KEYS["PRNGKey"]:
        pytest.skip("the typed key's case draws the same numbers (and compiles for long)")
    x = _data(4, 3)
    got = _run(fn, key, x)   # the batch dim symbolic
    want = jax.tree_util.tree_leaves(jax.jit(fn)(key, x))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, _raw(w))


@pytest.mark.slow   # 9 s on 2 cores; the gamma draws themselves run in CI
def test_gamma_samples_differentiate_in_their_shape_as_jax_grad_does():
    """JAX's implicit gradient of a gamma sample (and of beta, dirichlet, loggamma built on
    it) in its shape parameter; the ops' reference for it is tests/samples/prng.py."""
    key, x = KEYS["typed"], _data(4, 3)

    def total(x):
        return sum(jnp.sum(o * (i + 1.0)) for i, o in enumerate(gamma_family(key, x)[:4]))
    program, feeds, fetches = pd.from_jax(lambda k, x: gamma_family(k, x)[:4], key, x)
    with pd.program_guard(program):
        weighted = [pd.ops.scale(pd.ops.reduce_sum(f), scale=i + 1.0)
                    for i, f in enumerate(fetches)]
        (grad,) = pd.gradients(pd.ops.sum(weighted), [program.global_block().var("x")])
    got, = pd.Executor().run(program, feed={"k": _raw(key), "x": x}, fetch_list=[grad])
    np.testing.assert_allclose(got, jax.jit(jax.grad(total))(x), rtol=1e-4, atol=1e-5)


def test_a_key_argument_is_a_data_variable_of_its_raw_data():
    program, feeds, _ = pd.from_jax(dropout, KEYS["typed"], _data(4, 3))
    k = program.global_block().var("k")
    assert (list(k.shape), k.dtype) == ([2], "uint32")   # not taken for a batch of 2
    assert list(program.global_block().var("x").shape) == [-1, 3]


def test_a_typed_key_is_fed_as_its_data():
    key, x = KEYS["typed"], _data(4, 3)
    program, _, fetches = pd.from_jax(normal, key, x)
    got, = pd.Executor().run(program, feed={"k": key, "x": x}, fetch_list=fetches)
    np.testing.assert_array_equal(got, jax.jit(normal)(key, x))
    with pytest.raises(pd.FeedError, match="the variable expects"):   # two keys, not one
        pd.Executor().run(program, feed={"k": jax.random.split(key), "x": x},
                          fetch_list=fetches)


def test_a_typed_key_is_fed_run_after_run_and_to_the_exported_program(tmp_path):
    x, scope = _data(4, 3), pd.Scope()
    program, feeds, fetches = pd.from_jax(normal, KEYS["typed"], x, scope=scope)
    exe = pd.Executor()
    for seed in (5, 6, 7):   # the later runs take the Executor's cached way in
        key = jax.random.key(seed)
        got, = exe.run(program, feed={"k": key, "x": x}, fetch_list=fetches, scope=scope)
        np.testing.assert_array_equal(got, jax.jit(normal)(key, x))
    path = str(tmp_path / "normal.pdx")
    pd.export.export_compiled(path, program, feeds, fetches, scope=scope)
    key = jax.random.key(8)
    np.testing.assert_array_equal(pd.export.load_compiled(path)(key, x)[0],
                                  jax.jit(normal)(key, x))


def test_a_dropout_mask_is_drawn_for_the_batch_size_run_and_exported(tmp_path):
    key, scope = KEYS["typed"], pd.Scope()
    program, feeds, fetches = pd.from_jax(dropout, key, _data(4, 3), scope=scope)
    path = str(tmp_path / "dropout.pdx")
    pd.export.export_compiled(path, program, feeds, fetches, scope=scope)
    exported = pd.export.load_compiled(path)
    for batch in (1, 7):
        x = _data(batch, 3, seed=batch)
        got, = pd.Executor().run(program, feed={"k": _raw(key), "x": x}, fetch_list=fetches,
                                 scope=scope)
        want = jax.jit(dropout)(key, x)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(exported(_raw(key), x)[0], want)


def test_a_key_made_inside_from_a_seed_draws_jaxs_numbers():
    def seeded(seed, x):
        return jax.random.normal(jax.random.key(seed), x.shape) + jax.random.uniform(
            jax.random.PRNGKey(0), x.shape)
    x = _data(2, 3)
    program, _, fetches = pd.from_jax(seeded, np.int32(11), x)
    got, = pd.Executor().run(program, feed={"seed": np.int32(11), "x": x}, fetch_list=fetches)
    np.testing.assert_array_equal(got, jax.jit(seeded)(np.int32(11), x))


class DropoutMLP(nnx.Module):
    def __init__(self, rngs):
        self.hidden = nnx.Linear(4, 8, rngs=rngs)
        self.drop = nnx.Dropout(0.5, rngs=rngs)
        self.out = nnx.Linear(8, 2, rngs=rngs)

    def __call__(self, x):
        return self.out(self.drop(nnx.relu(self.hidden(x))))


def test_nnx_dropout_in_training_mode_draws_flaxs_masks_step_after_step():
    model = DropoutMLP(nnx.Rngs(params=0, dropout=1))
    twin = nnx.clone(model)
    scope = pd.Scope()
    program, _, fetches = pd.from_flax(model, None, _data(5, 4), scope=scope)
    step = nnx.jit(lambda m, x: m(x))
    outs = []
    for i, batch in enumerate((5, 5, 3)):   # the stream's count advances as Flax's does
        x = _data(batch, 4, seed=i)
        got, = pd.Executor().run(program, feed={"x": x}, fetch_list=fetches, scope=scope)
        np.testing.assert_array_equal(got, step(twin, x))
        outs.append(got)
    assert not np.array_equal(outs[0], outs[1])   # a fresh mask at each step


def test_linen_dropout_with_an_rng_key_draws_flaxs_mask():
    class Model(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dropout(0.5, deterministic=False)(nn.Dense(3)(x))
    x = _data(4, 5)
    model = Model()
    variables = model.init(jax.random.key(0), x)
    key = jax.random.key(9)
    scope = pd.Scope()
    program, _, fetches = pd.from_flax(model, variables, x, scope=scope, rngs={"dropout": key})
    got, = pd.Executor().run(program, feed={"x": x}, fetch_list=fetches, scope=scope)
    want = jax.jit(lambda v, x: model.apply(v, x, rngs={"dropout": key}))(variables, x)
    np.testing.assert_array_equal(got, want)


def test_what_is_not_translated_says_what_to_do():
    def draws(k, x):
        return jax.random.bits(k, (3,), jnp.uint16).astype(jnp.float32) * x[0]
    with pytest.raises(pd.UnsupportedPrimitiveError) as info:
        pd.from_jax(draws, KEYS["typed"], _data(4, 3))
    line = line_of(__file__, "return jax.random.bits(k, (3,), jnp.uint16).astype")
    reasons = {name: (where, why) for name, where, why in info.value.unsupported}
    assert reasons["random_bits"][0] == line
    assert "draw uint32 bits" in reasons["random_bits"][1]

    def gathered(k, i):
        return jax.random.key_data(jax.random.split(k, 4)[i])
    with pytest.raises(pd.UnsupportedPrimitiveError, match="index it with integers or slices"):
        pd.from_jax(gathered, KEYS["typed"], np.array([0, 2]))


@pytest.mark.parametrize("key", KEYS.values(), ids=KEYS.keys())
def test_program_keys_draw_afresh_each_run_reproducibly_from_the_programs_seed(key):
    x = np.ones((6, 5), np.float32)
    program, feeds, fetches = pd.from_jax(dropout, key, x, program_keys=["k"])
    assert feeds == ["x"]

    def masks(seed, runs):
        program.random_seed = seed
        exe, scope = pd.Executor(), pd.Scope()
        return [exe.run(program, feed={"x": x}, fetch_list=fetches, scope=scope)[0] != 0
                for _ in range(runs)]
    first, second = masks(1, 2)
    assert not np.array_equal(first, second)          # a fresh key at each run
    assert 0 < first.mean() < 1
    np.testing.assert_array_equal(masks(1, 1)[0], first)   # the same seed, the same masks
    assert not np.array_equal(masks(2, 1)[0], first)


def test_program_keys_must_name_key_arguments():
    with pytest.raises(pd.ProgramError, match=r"program_keys names \['key'\]"):
        pd.from_jax(dropout, KEYS["typed"], _data(2, 3), program_keys=["key"])
    with pytest.raises(pd.ProgramError, match="'x' is no PRNG key"):
        pd.from_jax(dropout, KEYS["typed"], _data(2, 3), program_keys=["x"])


class LinenDropout(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dropout(0.5, deterministic=False)(nn.Dense(6)(x))


def _flax_cases():
    x = _data(5, 4)
    linen = LinenDropout()
    return {"nnx": ((DropoutMLP(nnx.Rngs(params=0, dropout=1)), None, x), {}),
            "linen": ((linen, linen.init(jax.random.key(0), x), x),
                      {"rngs": {"dropout": jax.random.key(2)}})}


@pytest.mark.parametrize("case", ["nnx", "linen"])
def test_program_rngs_give_a_flax_module_fresh_masks_from_the_programs_seed(case):
    args, kwargs = _flax_cases()[case]
    x = np.abs(args[-1]) + 1.0
    scope = pd.Scope()
    program, feeds, fetches = pd.from_flax(*args, scope=scope, program_rngs=True, **kwargs)
    assert feeds == ["x"]
    params = {v.name: scope.get(v.name) for v in program.list_vars()
              if v.persistable and not v.name.startswith("@")}   # not the RNG state

    def outputs(seed, runs):
        program.random_seed = seed
        run_scope = pd.Scope()
        for name, value in params.items():
            run_scope.set(name, value)
        exe = pd.Executor()
        return [exe.run(program, feed={"x": x}, fetch_list=fetches, scope=run_scope)[0]
                for _ in range(runs)]
    first, second = outputs(3, 2)
    assert not np.array_equal(first, second)
    np.testing.assert_array_equal(outputs(3, 1)[0], first)


def test_an_nnx_model_with_dropout_in_training_mode_trains_like_optax():
    model = DropoutMLP(nnx.Rngs(params=0, dropout=1))
    x, y = _data(16, 4, seed=1), _data(16, 2, seed=2)
    scope = pd.Scope()
    program, _, (out,) = pd.from_flax(model, None, x, scope=scope)
    startup = pd.Program()
    with pd.program_guard(program, startup):
        loss = ops.mean(ops.square(out - pd.data("y", [None, 2])))
        pd.optimizer.Adam(0.02).minimize(loss)
    exe = pd.Executor()
    exe.run(startup, scope=scope)
    for _ in range(20):
        exe.run(program, feed={"x": x, "y": y}, fetch_list=[loss], scope=scope)
    optimizer = nnx.Optimizer(model, optax.adam(0.02), wrt=nnx.Param)

    @nnx.jit
    def step(model, optimizer):   # each step draws the next mask, as each run does
        optimizer.update(model, nnx.grad(lambda m: jnp.mean((m(x) - y) ** 2))(model))

    for _ in range(20):
        step(model, optimizer)
    for name, want in [("hidden.kernel", model.hidden.kernel), ("out.bias", model.out.bias)]:
        np.testing.assert_allclose(scope.get(name), want[...], rtol=1e-4, atol=1e-5,
                                   err_msg=name)
    assert scope.get("drop.rngs.count") == model.drop.rngs.count[...] == 20


class ScannedBlocks(nnx.Module):
    """Layers stacked by nnx.vmap and run by nnx.scan, each with its own dropout key."""

    def __init__(self, rngs):
        @nnx.split_rngs(splits=3)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def make(rngs):
            return DropoutBlock(rngs)
        self.blocks = make(rngs)

    def __call__(self, x):
        @nnx.scan(in_axes=(0, nnx.Carry), out_axes=nnx.Carry)
        def body(block, x):
            return block(x)
        return body(self.blocks, x)


class DropoutBlock(nnx.Module):
    def __init__(self, rngs):
        self.linear = nnx.Linear(4, 4, rngs=rngs)
        self.drop = nnx.Dropout(0.3, rngs=rngs)

    def __call__(self, x):
        return self.drop(nnx.relu(self.linear(x)))


def test_nnx_scan_over_layers_with_stacked_dropout_keys_draws_flaxs_masks():
    model = ScannedBlocks(nnx.Rngs(0))
    twin = nnx.clone(model)
    scope = pd.Scope()
    program, feeds, fetches = pd.from_flax(model, None, _data(6, 4), scope=scope)
    assert feeds == ["x"]
    assert scope.get("blocks.drop.rngs.key").shape == (3, 2)   # a key per layer
    step = nnx.jit(lambda m, x: m(x))
    for i in range(2):
        x = np.abs(_data(6, 4, seed=i))
        got, = pd.Executor().run(program, feed={"x": x}, fetch_list=fetches, scope=scope)
        np.testing.assert_array_equal(got, step(twin, x))


class VAE(nn.Module):
    """The shape of flax's examples/vae: the sampling key is an argument of the call."""

    @nn.compact
    def __call__(self, x, z_rng):
        h = nn.relu(nn.Dense(8)(x))
        mean, logvar = nn.Dense(3)(h), nn.Dense(3)(h)
        z = mean + jnp.exp(0.5 * logvar) * jax.random.normal(z_rng, logvar.shape)
        return nn.sigmoid(nn.Dense(5)(z)), mean, logvar


def _vae_loss(recon, x, mean, logvar, exp, average):
    return average((recon - x) * (recon - x)) + average(exp(logvar) + mean * mean - logvar)


def test_a_vae_samples_with_its_key_argument_as_flax_does_gradients_included():
    model, key = VAE(), jax.random.key(7)
    x = np.abs(_data(4, 5))
    variables = model.init(jax.random.key(0), x, key)
    scope = pd.Scope()
    program, feeds, fetches = pd.from_flax(model, variables, x, key, scope=scope)
    assert feeds == ["x", "z_rng"]
    names = sorted(v.name for v in program.all_parameters())
    with pd.program_guard(program):
        recon, mean, logvar = fetches
        loss = _vae_loss(recon, program.global_block().var("x"), mean, logvar, ops.exp, ops.mean)
        grads = pd.gradients([loss], [program.global_block().var(n) for n in names])
    x6 = np.abs(_data(6, 5, seed=1))   # another batch size
    got = pd.Executor(precision="highest").run(
        program, feed={"x": x6, "z_rng": key}, fetch_list=[*fetches, *grads], scope=scope)
    want = jax.jit(model.apply)(variables, x6, key)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)

    def flax_loss(params):
        recon, mean, logvar = model.apply({"params": params}, x6, key)
        return _vae_loss(recon, x6, mean, logvar, jnp.exp, jnp.mean)
    with jax.default_matmul_precision("highest"):
        want_grads = jax.grad(flax_loss)(variables["params"])
    flat = {".".join(k): v for k, v in
            nnx.traversals.flatten_mapping(nn.unbox(want_grads)).items()}
    for name, g in zip(names, got[len(fetches):]):
        np.testing.assert_allclose(g, flat[name], rtol=1e-4, atol=1e-6, err_msg=name)
