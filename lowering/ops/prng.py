"""PRNG keys as data: JAX's key operations on the raw key data a program variable holds.

A key is a uint32 array whose last dims are the key shape of its implementation
(`impl`, as `jax.random.key_impl` names it: (2,) for 'threefry2x32', JAX's default);
the dims before them make a batch of keys. Each op wraps the data into JAX's typed
keys (`jax.random.wrap_key_data`), calls `jax.random`, and unwraps the result, so the
numbers drawn are JAX's, bit for bit, given the same key. `random_key` makes fresh key
data from the program's RNG state (a different key at each step, reproducible from
`Program.random_seed`). Only `random_gamma` has a gradient (in its shape parameter).
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax

from lowering import checks, dtypes
from lowering.constraints import Dims, one_of
from lowering.errors import ShapeError
from lowering.registry import Attr, In, Out, op

IMPLS = ("threefry2x32", "rbg", "unsafe_rbg")
_IMPL = Attr("impl", "string", "threefry2x32", doc="the PRNG implementation: "
             + ", ".join(IMPLS), where=one_of(*IMPLS))
_KEY = In("Key", "int", doc="raw key data: uint32, its last dims the impl's key shape")


@functools.lru_cache(maxsize=None)
def key_shape(impl):
    """The trailing dims of the raw data of one key of implementation `impl`."""
    return tuple(jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0, impl=impl))).shape)


def _wrap(Key, impl, slot="Key"):
    """Key data -> typed keys (of the batch shape of the data)."""
    trail = key_shape(impl)
    n = len(trail)
    if (Key.dtype != jnp.uint32 or Key.ndim < n
            or tuple(Key.shape[Key.ndim - n:]) != trail):
        raise ShapeError(f"{slot} must be uint32 key data of shape [..., "
                         f"{', '.join(map(str, trail))}] ('{impl}' keys), got "
                         f"{checks.typed(Key)}", slot=slot)
    return jax.random.wrap_key_data(Key, impl=impl)


def _per_key(fn, keys, *others):
    """fn(one key, *others) applied to each key of a batch of keys (others broadcast to the
    batch shape), results stacked in the batch's shape."""
    if keys.ndim == 0:
        return fn(keys, *others)
    batch = keys.shape
    others = [jnp.broadcast_to(o, batch).reshape(-1) for o in others]
    out = jax.vmap(fn)(keys.reshape(-1), *others)
    return out.reshape(batch + out.shape[1:])


@op("random_seed", inputs=[In("Seed", "int", doc="one seed per key")],
    outputs=[Out("Out")], attrs={"impl": _IMPL}, differentiable=False)
def random_seed(Seed, *, impl):
    """The key data of `jax.random.key(seed, impl=impl)` for each seed: shape
    [*Seed's dims, *the impl's key shape], uint32."""
    return jax.random.key_data(_per_key(lambda s: jax.random.key(s, impl=impl), Seed))


@op("random_bits",
    inputs=[_KEY, In("Like", optional=True, differentiable=False,
                     doc="only its shape is used: the size of a -1 in shape")],
    outputs=[Out("Out")],
    attrs={"shape": Attr("shape", "ints", doc="dims drawn per key; -1 takes Like's dim "
                         "like_axis", where=Dims(least=-1)),
           "dtype": Attr("dtype", "dtype", "uint32", doc="uint32 or uint8"),
           "like_axis": Attr("like_axis", "int", 0, "the dim of Like a -1 takes"),
           "impl": _IMPL},
    differentiable=False)
def random_bits(Key, Like=None, *, shape, dtype, like_axis, impl):
    """`jax.random.bits(key, shape, dtype)` for each key: uniformly random bits of shape
    [*the keys' batch dims, *shape]."""
    want = dtypes.to_numpy(dtype)
    if dtypes.name_of(want) not in ("uint32", "uint8"):
        raise ShapeError(f"attribute dtype={dtypes.name_of(want)!r} must be uint32 or uint8")
    if -1 in shape:
        if Like is None:
            raise ShapeError(f"shape {list(shape)}: a -1 needs Like", slot="Key")
        checks.axis("Like", Like, like_axis, "like_axis")
    dims = tuple(Like.shape[like_axis] if d == -1 else d for d in shape)
    return _per_key(lambda k: jax.random.bits(k, dims, want), _wrap(Key, impl))


@op("random_fold_in", inputs=[_KEY, In("Data", "int", doc="the integers folded in; "
                                      "broadcast to the keys' batch dims")],
    outputs=[Out("Out")], attrs={"impl": _IMPL}, differentiable=False)
def random_fold_in(Key, Data, *, impl):
    """The key data of `jax.random.fold_in(key, data)` for each key."""
    keys = _wrap(Key, impl)
    checks.broadcasts_to("Data", Data, keys.shape, "the keys' batch dims")
    return jax.random.key_data(_per_key(jax.random.fold_in, keys,
                                        Data.astype(jnp.uint32)))


@op("random_split", inputs=[_KEY], outputs=[Out("Out")],
    attrs={"shape": Attr("shape", "ints", doc="dims of the new keys per key", where=Dims()),
           "impl": _IMPL},
    differentiable=False)
def random_split(Key, *, shape, impl):
    """The key data of `jax.random.split(key, shape)` for each key: shape [*the keys' batch
    dims, *shape, *the impl's key shape]."""
    return jax.random.key_data(_per_key(lambda k: jax.random.split(k, tuple(shape)),
                                        _wrap(Key, impl)))


@op("random_key", inputs=[], outputs=[Out("Out")],
    attrs={"shape": Attr("shape", "ints", (), "dims of the batch of keys", where=Dims()),
           "impl": _IMPL},
    random=True, differentiable=False)
def random_key(*, key, shape, impl):
    """Fresh key data from the program's RNG state: a different key at each step and at
    each op, reproducible from the program's seed. Shape [*shape, *the impl's key
    shape], uint32."""
    return jax.random.bits(key, (*shape, *key_shape(impl)), jnp.uint32)   # any bits are a key


@op("random_gamma", inputs=[_KEY, In("Alpha", "float", doc="the shape parameters; its "
                                      "leading dims are the keys' batch dims")],
    outputs=[Out("Out")],
    attrs={"log_space": Attr("log_space", "bool", False, "draw the samples' logarithms "
                             "(`jax.random.loggamma`)"),
           "impl": _IMPL})
def random_gamma(Key, Alpha, *, log_space, impl):
    """`jax.random.gamma(key, alpha)` (`loggamma` with log_space) for each key: one sample
    of Gamma(alpha, 1) per element of Alpha, drawn as JAX draws it. Its gradient in Alpha
    is JAX's implicit one (`random_gamma_grad`)."""
    keys = _wrap(Key, impl)
    if tuple(Alpha.shape[:keys.ndim]) != keys.shape:
        raise ShapeError(f"Alpha {checks.typed(Alpha)} must lead with the keys' batch dims "
                         f"{list(keys.shape)}", slot="Alpha")
    draw = jax.random.loggamma if log_space else jax.random.gamma

    def one(key, alpha):
        return draw(key, alpha, alpha.shape, alpha.dtype)
    for _ in range(keys.ndim):
        one = jax.vmap(one)
    return one(keys, Alpha)


@random_gamma.gradient
def _(g):
    slope = g.call("random_gamma_grad", g.input("Alpha"), g.output("Out"),
                   log_space=g.attr("log_space"))
    g.call("mul", g.out_grad("Out"), slope, out=g.in_grad("Alpha"))


@op("random_gamma_grad", inputs=[In("Alpha", "float"), In("Sample", "float")],
    outputs=[Out("Out")], same_dtype=("Alpha", "Sample"),
    attrs={"log_space": Attr("log_space", "bool", False, "Sample is a logarithm")},
    differentiable=False)
def random_gamma_grad(Alpha, Sample, *, log_space):
    """How a Gamma(Alpha, 1) sample moves with Alpha when its quantile stays put
    (`lax.random_gamma_grad`); with log_space, of the sample's logarithm."""
    checks.broadcast(Alpha=Alpha, Sample=Sample)
    if not log_space:
        return lax.random_gamma_grad(Alpha, Sample)
    sample = jnp.exp(Sample)   # d log(x) = dx / x; a sample rounded to 0 is the tiniest float
    sample = jnp.where(sample == 0, jnp.finfo(sample.dtype).tiny, sample)
    return lax.random_gamma_grad(Alpha, sample) / sample
