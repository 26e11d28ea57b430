"""A program as a pure JAX function: `as_jax(program, feed, fetch, scope)` -> `(fn, params)`.

`fn(params, *feeds)` runs the program's lowered block (`lowering.lower.lower_block`, the
function the Executor compiles) on the values in `params`, a flat dict {variable name:
array} of the persistables it reads, and returns the fetched values. It holds no Scope and
no Python state, so `jax.jit`, `jax.grad`, `jax.vmap`, `jax.checkpoint`, `shard_map` and
`jax.export` all apply to it. A program that draws random numbers (dropout in training)
takes its key as `fn(params, *feeds, rng=key)`; the same key gives the same numbers a run
of the Executor with that RNG state would.

`fn` computes with the types the caller's JAX allows: with `jax_enable_x64` off (JAX's
default) int64 and float64 variables are 32-bit inside, as in any JAX code, and JAX's
warnings about it are silenced. Turn x64 on (or call inside `jax.enable_x64(True)`) to
keep them 64-bit, as the Executor always does; random ops then draw exactly what an
Executor run with the same RNG state draws.

A feed declared with a batch dim first (`pd.data("x", [None, 4])`) also takes one example
without it (shape [4]), as a per-example function under `jax.vmap` gets it: when every
such feed is one example, the program runs on a batch of one and each fetch declared with
a batch dim first (of size 1 in that run) loses it again.
"""
import warnings

import jax
import numpy as np

from lowering import dtypes
from lowering.errors import FeedError, ScopeError
from lowering.lower import RNG_VAR, lower_block
from progdesc.feeding import convert_feed, names_of, with_feed_fetch
from progdesc.framework import dims_compatible
from progdesc.scope import global_scope


def as_jax(program, feed, fetch, scope=None, *, mutable=False):
    """`(fn, params)`: `program` from the `feed` variables to `fetch` as a pure JAX function.

    `feed` is a list of Variables or names, in the order `fn` takes them; `fetch` is a list
    of Variables or names (`fn` returns a tuple in that order) or one of them (`fn` returns
    that value). `params` holds the value, taken from `scope` (default: the global scope;
    later runs leave it valid), of every persistable the fetches need; `fn(params, *feeds,
    rng=None)`
    reads them from its first argument, which may be any dict with those keys.

    With `mutable=True` every op that writes a persistable runs too (batch-norm statistics
    in training, or the updates of an optimizer the program holds), `params` holds all
    they read and `fn` returns `(fetched, updates)`, `updates` being {name: new value} of
    the persistables the program writes, as Flax's `apply(..., mutable=...)` does.

    Feeds whose variable has a batch dim first (-1) may all be given as one example, without
    it: `fn` then returns the fetches that have one without it too, so that
    `jax.vmap(jax.grad(fn), in_axes=(None, 0, 0))` gives per-example gradients.

    `fn.feed_names`, `fn.fetch_names`, `fn.param_names` and `fn.needs_rng` describe it.
    """
    single = not isinstance(fetch, (list, tuple))
    fetch_names = names_of([fetch] if single else fetch, "fetch")
    feed_names = names_of(feed, "feed")
    block = program.global_block()
    feed_vars = []
    for name in feed_names:
        var = block.find_var(name)
        if var is None:
            raise FeedError("is a feed but not a variable of the program", var=name)
        feed_vars.append(var)
    desc = with_feed_fetch(program, feed_names, fetch_names)
    for var_desc in desc.blocks[0].vars:   # fn's inputs, so jax.grad may differentiate them
        if var_desc.name in feed_names:
            var_desc.stop_gradient = False
    lowered = lower_block(desc, 0, fetches_only=not mutable)
    param_names = tuple(n for n in lowered.reads if n != RNG_VAR)
    declared = {n: block.var(n).desc for n in param_names}
    needs_rng = RNG_VAR in lowered.reads
    updated = tuple(n for n in lowered.writes if n != RNG_VAR)
    batch_ranks = {i: len(v.desc.dims) for i, v in enumerate(feed_vars)
                   if len(v.desc.dims) and v.desc.dims[0] == -1}
    batch_fetches = [_has_batch_dim(desc, n) for n in fetch_names]
    params = {n: _scope_value(scope or global_scope(), n) for n in param_names}
    for name, value in params.items():
        _check_param(name, value, declared[name], "the scope")

    def fn(params, *feeds, rng=None):
        if len(feeds) != len(feed_vars):
            raise FeedError(f"fn takes {len(feed_vars)} feeds ({', '.join(feed_names)}) "
                            f"after params, got {len(feeds)}")
        state = {}
        for name in param_names:
            if name not in params:
                raise ScopeError("params holds no value for this persistable", var=name)
            state[name] = _check_param(name, params[name], declared[name], "params")
        if needs_rng:
            state[RNG_VAR] = _key_data(rng)
        example = _one_example(feeds, feed_names, batch_ranks)
        if example:
            feeds = [_batch_of_one(x) if i in batch_ranks else x for i, x in enumerate(feeds)]
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", _NO_X64, UserWarning)
            values = tuple(convert_feed(var, x) for var, x in zip(feed_vars, feeds))
            fetched, written = lowered.fn(values, {}, state)
        if example:
            fetched = [f[0] if batch and f.shape[0] == 1 else f
                       for f, batch in zip(fetched, batch_fetches)]
        out = fetched[0] if single else tuple(fetched)
        if mutable:
            return out, {n: written[n] for n in updated}
        return out

    fn.feed_names, fn.fetch_names, fn.param_names = feed_names, fetch_names, param_names
    fn.needs_rng = needs_rng
    return fn, params


_NO_X64 = r"Explicitly requested dtype (u?int64|float64|complex128) .* is not available"


def _has_batch_dim(desc, name):
    """Whether the fetch `name` is declared with a batch dim (-1) first."""
    var = next((v for v in desc.blocks[0].vars if v.name == name), None)
    return var is not None and len(var.dims) > 0 and var.dims[0] == -1


def _one_example(feeds, feed_names, batch_ranks):
    """Whether the batched feeds (index -> declared rank) are given as one example each,
    without the batch dim; FeedError if some are and some are not."""
    short = {i: np.ndim(feeds[i]) == rank - 1 for i, rank in batch_ranks.items()}
    if not any(short.values()):
        return False
    if not all(short.values()):
        examples = ", ".join(feed_names[i] for i, s in short.items() if s)
        batches = ", ".join(feed_names[i] for i, s in short.items() if not s)
        raise FeedError(f"feeds {examples} are one example (no batch dim) but {batches} "
                        "a batch: give every batched feed one way (under jax.vmap, map each "
                        "over its first axis)")
    return True


def _batch_of_one(value):
    """`value` with a leading batch dim of 1 (arrays, JAX tracers and nested lists)."""
    return value[None] if hasattr(value, "ndim") else np.asarray(value)[None]


def _scope_value(scope, name):
    """`name`'s value in `scope` (handed out: later runs copy it before donating it)."""
    if name not in scope:
        raise ScopeError("has no value in the scope: run the startup program first (or load "
                         "a checkpoint)", var=name)
    return scope.get(name)


def _check_param(name, value, desc, source):
    """`value` if it fits the VarDesc `desc` (64-bit types as 32-bit ones where x64 is off),
    else ScopeError naming `source`."""
    shape, dtype = np.shape(value), getattr(value, "dtype", None)
    canonical = jax.dtypes.canonicalize_dtype
    if dtype is None or not dims_compatible(tuple(desc.dims), shape) \
            or canonical(dtype) != canonical(dtypes.to_numpy(desc.dtype)):
        got = f"{dtype}{list(shape)}" if dtype is not None else type(value).__name__
        raise ScopeError(f"{source} holds {got}, the program declares "
                         f"{dtypes.name_of(desc.dtype)}{list(desc.dims)}", var=name)
    return value


def _key_data(rng):
    """The raw uint32 key data the program's RNG state holds, from a key of either kind."""
    if rng is None:
        raise FeedError("the program draws random numbers (dropout in training, say): "
                        "call fn(params, *feeds, rng=jax.random.key(seed))", var=RNG_VAR)
    if jax.numpy.issubdtype(rng.dtype, jax.dtypes.prng_key):
        return jax.random.key_data(rng)
    return rng
