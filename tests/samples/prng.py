"""Samples of lowering/ops/prng.py: JAX's own `jax.random` on typed keys as the reference
(the ops must draw JAX's numbers bit for bit from the same key data)."""
import jax
import numpy as np

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
]

INVALID = [
    Invalid("random_bits", {"Key": spec(3, dtype="uint32")}, attrs={"shape": [2]},
            name="not_a_key", expect=["Key must be uint32 key data of shape [..., 2]",
                                      "uint32[3]"]),
    Invalid("random_fold_in", {"Key": spec(2, dtype="int32"), "Data": spec(dtype="uint32")},
            name="signed_key", expect=["Key must be uint32 key data", "int32[2]"]),
]
