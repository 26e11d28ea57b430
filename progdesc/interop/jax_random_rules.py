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
import inspect

import jax
import numpy as np

from lowering import dtypes
from lowering.ops.prng import IMPLS, key_shape
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
        raise Unsupported(f"{bit_width}-bit random bits (translated: 8 and 32); draw "
                          "uint32 bits (jax.random.bits(key, shape, jnp.uint32)) and convert "
                          "them")
    like = None
    if any(map(is_batch_dim, shape)):   # e.g. a dropout mask of the input's shape
        refs = {t.feed_with_leading(d) for d in shape if is_batch_dim(d)}
        if None in refs or len(refs) > 1:
            raise BatchDependent(f"random bits of shape {tuple(map(str, shape))}")
        like = refs.pop()
    return t.call("random_bits", key, like, shape=[-1 if is_batch_dim(d) else d for d in shape],
                  dtype=dtype, impl=_impl(in_types[0]))


@RULES.rule("random_gamma")
def random_gamma(t, key, alpha, *, log_space, in_types):
    return t.call("random_gamma", key, alpha, log_space=log_space, impl=_impl(in_types[0]))


# --- bits ---

for _prim in ("shift_left", "shift_right_logical", "shift_right_arithmetic"):
    RULES.rename(_prim, _prim)
RULES.rename("erf_inv", "erf_inv")
RULES.rename("nextafter", "nextafter")
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


# --- shape operations on arrays of keys: the data has the key's dims after the array's ---

def _key_dims(aval):
    """The trailing dims of the data of a key aval (the impl's key shape), () if not a key."""
    if not is_key(aval):
        return ()
    return key_shape(_impl(aval))


def _for_keys(prim):
    """Decorator: `key_rule(t, *operands, key_dims, **params)` translates `prim` where an
    operand is an array of keys; other uses go to the rule registered before it."""
    original = RULES.lookup(prim)

    def register(key_rule):
        wanted = inspect.signature(key_rule).parameters

        def rule(t, *operands, in_types, **params):
            dims = next((_key_dims(a) for a in in_types if is_key(a)), ())
            if not dims:
                kwargs = dict(params)
                if "in_types" in original.keywords:
                    kwargs["in_types"] = in_types
                return original.fn(t, *operands, **kwargs)
            return key_rule(t, *operands, key_dims=dims,
                            **{k: v for k, v in params.items() if k in wanted})
        keyword = inspect.Parameter.KEYWORD_ONLY
        params = {p.name: p for p in inspect.signature(original.fn).parameters.values()
                  if p.kind is keyword}   # the original's attributes, defaults and all
        params.update((p.name, p) for p in wanted.values()
                      if p.kind is keyword and p.name not in params and p.name != "key_dims")
        params["in_types"] = inspect.Parameter("in_types", keyword)
        rule.__signature__ = inspect.Signature(
            [inspect.Parameter("t", inspect.Parameter.POSITIONAL_OR_KEYWORD),
             inspect.Parameter("operands", inspect.Parameter.VAR_POSITIONAL), *params.values()])
        RULES.rule(prim)(rule)
        return key_rule
    return register


def _trailing(dims, count):
    return list(range(count, count + len(dims)))


@_for_keys("reshape")
def _reshape_keys(t, x, *dynamic, key_dims, new_sizes, dimensions=None):
    if dimensions is not None or dynamic:
        raise Unsupported("a reshape that transposes or has dynamic sizes")
    return t.call("reshape", x, shape=[*new_sizes, *key_dims])


@_for_keys("broadcast_in_dim")
def _broadcast_keys(t, x, *dynamic, key_dims, shape, broadcast_dimensions):
    if dynamic:
        raise Unsupported("dynamic shapes")
    return t.call("broadcast_in_dim", x, shape=[*shape, *key_dims],
                  broadcast_dimensions=[*broadcast_dimensions, *_trailing(key_dims, len(shape))])


@_for_keys("transpose")
def _transpose_keys(t, x, *, key_dims, permutation):
    return t.call("transpose", x, perm=[*permutation, *_trailing(key_dims, len(permutation))])


@_for_keys("dynamic_slice")
def _dynamic_slice_keys(t, x, *starts, key_dims, slice_sizes):
    zeros = [t.constant(np.zeros((), t.var(starts[0])[1]))] * len(key_dims) if starts else []
    return t.call("dynamic_slice", x, [*starts, *zeros], sizes=[*slice_sizes, *key_dims])


@_for_keys("dynamic_update_slice")
def _dynamic_update_keys(t, x, update, *starts, key_dims):
    zeros = [t.constant(np.zeros((), t.var(starts[0])[1]))] * len(key_dims) if starts else []
    return t.call("dynamic_update_slice", x, update, [*starts, *zeros])


@_for_keys("select_n")
def _select_keys(t, which, *cases, key_dims):
    dims, _ = t.var(which)
    which = t.call("broadcast_in_dim", which, shape=[*dims, *key_dims],
                   broadcast_dimensions=list(range(len(dims))))
    if len(cases) == 2 and dtypes.kind_of(t.var(which)[1]) == "bool":
        return t.call("where", which, cases[1], cases[0])
    return t.call("select_n", which, list(cases))


@_for_keys("gather")
def _gather_keys(t, x, indices, *, key_dims):
    raise Unsupported("indexing an array of keys with an array of indices; index it with "
                      "integers or slices (keys[i], keys[1:3]), or split the key again")
