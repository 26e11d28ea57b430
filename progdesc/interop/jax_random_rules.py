"""The rules of `from_jax` for JAX's randomness: keys, random bits, and the bit operations
that turn bits into floats. They register into `jax_rules.RULES`.

A key is held as its raw data (uint32, last dim 2 for JAX's default threefry keys): the
ops of `lowering/ops/prng.py` call `jax.random` on it, so an imported function given the
same key draws the same numbers as the original, bit for bit. `random_wrap` and
`random_unwrap` (typed key <-> raw data) are then no ops at all. The integer forms of
`and`, `or`, `not` and `xor` become our bit ops (`lowering/ops/bits.py`); their bool
forms stay logical ops (this module's rows replace jax_rules' for these primitives).
"""
import functools

import jax

from lowering import dtypes
from lowering.ops.prng import IMPLS
from progdesc.interop.jax_rules import RULES, BatchDependent, is_batch_dim
from progdesc.translate import Unsupported


def is_key(value):
    """Whether `value` (an array, or anything with a dtype) is a typed PRNG key."""
    return jax.dtypes.issubdtype(getattr(value, "dtype", None), jax.dtypes.prng_key)


@functools.lru_cache(maxsize=1)
def _impl_names():
    """{key dtype: implementation name} of the PRNG implementations our ops know."""
    return {jax.eval_shape(lambda n=name: jax.random.key(0, impl=n)).dtype: name
            for name in IMPLS}


def _impl(key_type):
    """Our `impl` attribute for a key aval, or Unsupported."""
    name = _impl_names().get(key_type.dtype)
    if name is None:
        raise Unsupported(f"keys of type {key_type.dtype} (known: {', '.join(IMPLS)})")
    return name


def _impl_of(impl):
    """Our `impl` attribute for the `impl` parameter of random_seed/random_wrap."""
    name = getattr(impl, "name", str(impl))
    if name not in IMPLS:
        raise Unsupported(f"PRNG implementation {name!r} (known: {', '.join(IMPLS)})")
    return name


# --- keys ---

@RULES.rule("random_seed")
def random_seed(t, seeds, *, impl):
    return t.call("random_seed", seeds, impl=_impl_of(impl))


@RULES.rule("random_wrap")
def random_wrap(t, data, *, impl):
    _impl_of(impl)
    return data   # a key is its data


@RULES.rule("random_unwrap", "random_clone")
def random_unwrap(t, key):
    return key


@RULES.rule("random_fold_in")
def random_fold_in(t, key, data, *, in_types):
    return t.call("random_fold_in", key, data, impl=_impl(in_types[0]))


@RULES.rule("random_split")
def random_split(t, key, *, shape, in_types):
    return t.call("random_split", key, shape=list(shape), impl=_impl(in_types[0]))


_BITS_DTYPES = {8: "uint8", 32: "uint32"}


@RULES.rule("random_bits")
def random_bits(t, key, *, bit_width, shape, in_types):
    dtype = _BITS_DTYPES.get(bit_width)
    if dtype is None:
        raise Unsupported(f"{bit_width}-bit random bits (translated: 8 and 32, the bits of "
                          "float32 draws and smaller)")
    like = None
    if any(map(is_batch_dim, shape)):   # e.g. a dropout mask of the input's shape
        ref, batch = t.batch_ref
        if ref is None or any(is_batch_dim(d) and d != batch for d in shape):
            raise BatchDependent(f"random bits of shape {tuple(map(str, shape))}")
        like = ref
    return t.call("random_bits", key, like, shape=[-1 if is_batch_dim(d) else d for d in shape],
                  dtype=dtype, impl=_impl(in_types[0]))


# --- bits ---

for _prim in ("shift_left", "shift_right_logical", "shift_right_arithmetic"):
    RULES.rename(_prim, _prim)
RULES.rename("erf_inv", "erf_inv")
del _prim


def _bitwise(logical, bitwise):
    def rule(t, *xs):
        kinds = {dtypes.kind_of(t.var(x)[1]) for x in xs}
        if kinds == {"bool"}:
            return t.call(logical, *xs) if logical else t.call("not_equal", *xs)
        if kinds == {"int"}:
            return t.call(bitwise, *xs)
        raise Unsupported(f"operands of types {sorted(t.var(x)[1] for x in xs)}")
    return rule


RULES.rule("and")(_bitwise("logical_and", "bitwise_and"))
RULES.rule("or")(_bitwise("logical_or", "bitwise_or"))
RULES.rule("not")(_bitwise("logical_not", "bitwise_not"))
RULES.rule("xor")(_bitwise(None, "bitwise_xor"))   # bools: x != y


@RULES.rule("bitcast_convert_type")
def bitcast_convert_type(t, x, *, new_dtype):
    dims, dtype = t.var(x)
    want = dtypes.name_of(new_dtype)
    if dtypes.to_numpy(want).itemsize != dtypes.to_numpy(dtype).itemsize:
        raise Unsupported(f"a bitcast from {dtype} to {want}, another width")
    return x if want == dtype else t.call("bitcast", x, dtype=want)
