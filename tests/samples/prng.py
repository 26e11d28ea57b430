"""Samples of lowering/ops/prng.py: JAX's own `jax.random` on typed keys as the reference
(the ops must draw JAX's numbers bit for bit from the same key data), and SciPy's
incomplete gamma function for the gradient of a gamma sample."""
import jax
import numpy as np
from scipy import special

from op_table import Invalid, Sample, rand, spec

_K = np.array([0, 42], np.uint32)                 # the data of jax.random.PRNGKey(42)
_KS = np.array([[0, 1], [7, 9], [3, 3]], np.uint32)   # a batch of three keys


def _typed(key_data):
    return jax.random.wrap_key_data(key_data)


def _bits(Key, Like=None, *, shape, dtype="uint32", **_):
    dims = tuple(Like.shape[0] if d == -1 else d for d in shape)
    keys = _typed(Key)
    if keys.ndim:
        return np.asarray(jax.vmap(lambda k: jax.random.bits(k, dims, dtype))(keys))
    return np.asarray(jax.random.bits(keys, dims, dtype))


def _gamma(Key, Alpha, *, log_space=False, **_):
    draw = jax.random.loggamma if log_space else jax.random.gamma
    keys = _typed(Key)
    if keys.ndim:
        return np.asarray(jax.vmap(lambda k, a: draw(k, a, a.shape))(keys, Alpha))
    return np.asarray(draw(keys, Alpha, Alpha.shape))


def _gamma_slope(Alpha, Sample, *, log_space=False, **_):
    """d sample / d alpha at a fixed quantile P(alpha, sample) of Gamma(alpha, 1): minus
    P's derivative in alpha (central differences) over the density (SciPy, float64)."""
    a, x = Alpha.astype(np.float64), Sample.astype(np.float64)
    x = np.exp(x) if log_space else x
    h = 1e-5 * a
    dp_da = (special.gammainc(a + h, x) - special.gammainc(a - h, x)) / (2 * h)
    density = np.exp((a - 1) * np.log(x) - x - special.gammaln(a))
    slope = -dp_da / density
    return (slope / x if log_space else slope).astype(np.float32)


_ALPHAS = np.array([[0.4, 1.0, 2.5], [5.0, 0.8, 12.0]], np.float32)


def _fresh_keys(outputs, inputs):
    (out,) = outputs["Out"]
    assert out.shape == (4, 2) and out.dtype == np.uint32, (out.shape, out.dtype)
    assert len({tuple(k) for k in out}) == 4, out   # four different keys


SAMPLES = [
    Sample("random_seed", {"Seed": np.int32(42)}, lambda Seed: _K, name="scalar"),
    Sample("random_seed", {"Seed": np.array([0, 5, -1], np.int32)},
           lambda Seed: np.asarray(jax.vmap(
               lambda s: jax.random.key_data(jax.random.PRNGKey(s)))(Seed)), name="batch"),
    Sample("random_bits", {"Key": _K}, _bits, {"shape": [3, 5]}, name="uint32",
           symbolic=False),
    Sample("random_bits", {"Key": _K}, _bits, {"shape": [40], "dtype": "uint8"},
           name="uint8", symbolic=False),
    Sample("random_bits", {"Key": _K, "Like": rand(4, 2)}, _bits, {"shape": [-1, 3]},
           name="size_of_like", symbolic=False),
    Sample("random_bits", {"Key": _KS}, _bits, {"shape": [2]}, name="per_key"),
    Sample("random_fold_in", {"Key": _K, "Data": np.uint32(3)},
           lambda Key, Data: np.asarray(jax.random.key_data(
               jax.random.fold_in(_typed(Key), Data))), name="one_key", symbolic=False),
    Sample("random_fold_in", {"Key": _KS, "Data": np.int32(7)},
           lambda Key, Data: np.asarray(jax.random.key_data(jax.vmap(
               lambda k: jax.random.fold_in(k, Data))(_typed(Key)))), name="per_key"),
    Sample("random_split", {"Key": _K},
           lambda Key, shape: np.asarray(jax.random.key_data(
               jax.random.split(_typed(Key), tuple(shape)))), {"shape": [3]},
           name="three", symbolic=False),
    Sample("random_split", {"Key": _KS},
           lambda Key, shape: np.asarray(jax.random.key_data(jax.vmap(
               lambda k: jax.random.split(k, tuple(shape)))(_typed(Key)))), {"shape": [2, 2]},
           name="per_key"),
    Sample("random_key", {}, attrs={"shape": [4]}, check=_fresh_keys),
    # gradients: finite differences of a rejection sampler are not its implicit gradient;
    # random_gamma_grad is checked against SciPy below and through jax.grad in
    # tests/test_from_jax_random.py
    Sample("random_gamma", {"Key": _K, "Alpha": _ALPHAS}, _gamma, name="one_key_no_fd",
           grad=False),
    Sample("random_gamma", {"Key": _KS[:2], "Alpha": _ALPHAS}, _gamma,
           {"log_space": True}, name="per_key_log_no_fd", grad=False),
    Sample("random_gamma_grad", {"Alpha": _ALPHAS, "Sample": np.array(
        [[0.1, 1.3, 2.0], [4.0, 0.05, 15.0]], np.float32)}, _gamma_slope, rtol=2e-3),
    Sample("random_gamma_grad", {"Alpha": _ALPHAS, "Sample": np.log(np.array(
        [[0.1, 1.3, 2.0], [4.0, 0.05, 15.0]], np.float32))}, _gamma_slope,
        {"log_space": True}, name="log", rtol=2e-3),
]

INVALID = [
    Invalid("random_bits", {"Key": spec(3, dtype="uint32")}, attrs={"shape": [2]},
            name="not_a_key", expect=["Key must be uint32 key data of shape [..., 2]",
                                      "uint32[3]"]),
    Invalid("random_fold_in", {"Key": spec(2, dtype="int32"), "Data": spec(dtype="uint32")},
            name="signed_key", expect=["Key must be uint32 key data", "int32[2]"]),
    Invalid("random_gamma", {"Key": spec(3, 2, dtype="uint32"), "Alpha": spec(2, 3)},
            name="alpha_not_per_key", expect=["Alpha float32[2, 3] must lead with the keys' "
                                              "batch dims [3]"]),
]
