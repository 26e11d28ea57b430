"""The Executor: feed values in, run a compiled program, fetch results out (seed 004).

`run` inserts feed and fetch ops into a cached clone of the program, lowers
that clone to one function and compiles it ahead of time with `jax.jit`,
once per (program, program version, feed shapes and dtypes, fetch list, precision
policy). Persistable values come from the Scope and go back to it; the ones the
program overwrites are donated, so on an accelerator the update is in place.
Nothing is written to the Scope unless the whole run succeeds.
"""
import operator
from collections import OrderedDict
from dataclasses import dataclass

import jax
import numpy as np

from lowering import registry
from lowering.errors import DistributedError, FeedError, FetchError, ProgramError
from lowering.lower import check_precision, lower_block, precision_of
from progdesc import compile_cache, jax_compat
from progdesc.callsites import user_call
from progdesc.feeding import (convert_feeds, disagreeing_feeds, in_run, names_of, on_device,
                              read_state, with_feed_fetch)
from progdesc.framework import Program, default_main_program
from progdesc.scope import ABSENT, Scope, global_scope, held_value

_CACHE_SIZE = 64


@dataclass
class _Compiled:
    """One compiled (program version, feed signature, fetch list, steps).

    The step takes `*feeds, *mutable, *readonly` (the mutable ones donated) and
    returns `(*fetched, *written)`: flat, so each call flattens no pytree.
    """
    jitted: object
    fetch_names: tuple
    reads: tuple           # persistables passed in: mutable (donated) ones first
    n_mutable: int
    writes: tuple          # persistables coming back
    n_fetched: int
    call: object = None        # the executable's call, made on the first run
    needs_x64: bool = True     # whether calls need 64-bit types enabled (a 64-bit feed)
    bound: tuple = (None, -1, -1, (), ())
    """(scope, Scope.generation, Scope.changes, read holders, write holders) of the last run:
    the holders found in that scope and checked, valid until the counters move."""
    feeds: tuple = ()          # (name, shape of one step's value) per feed, for error messages
    place: object = None       # on a mesh: puts the flat args where the executable wants them
    compiled: object = None    # the jax Compiled, after the first call (memory_analysis, ...)

    def __call__(self, args, device, compiler_options=None):
        """Run the executable on flat `args`, compiling it on the first call."""
        if self.call is None:
            with jax.enable_x64(True), on_device(device), compile_cache.compiling():
                if self.place is not None:
                    args = self.place(args)
                compiled = self.jitted.lower(*args).compile(compiler_options or None)
                outs = compiled(*args)
            # Only 64-bit feeds need the context (without it NumPy ones become 32-bit);
            # the persistables are jax arrays, which keep their dtype anyway.
            self.needs_x64 = any(np.dtype(x.dtype).itemsize == 8 for x in args[:len(self.feeds)])
            # After its first call a Compiled holds the C++ call its __call__ forwards to;
            # calling that directly saves a Python frame per run.
            self.call = jax_compat.compiled_call(compiled)
            self.compiled = compiled
            if self.place is not None:
                from progdesc.distributed.run import placing
                self.call = placing(self.call, self.place)
            return outs
        if self.needs_x64:
            with jax.enable_x64(True):
                return self.call(*args)
        return self.call(*args)


_SHAPE_DTYPE = operator.attrgetter("shape", "dtype")
_REGISTRY_GENERATION = registry.GENERATION




def _device(device):
    if device is None or isinstance(device, jax.Device):
        return device
    kind = {"gpu": "gpu", "cuda": "gpu", "cpu": "cpu", "tpu": "tpu"}.get(str(device).lower())
    try:
        return jax.devices(kind or str(device))[0]
    except RuntimeError as e:
        raise ValueError(f"no '{device}' device available: {e}") from None


class Executor:
    """Runs programs; see the module docstring.

    `device` is None (JAX's default device), a `jax.Device`, or a platform
    name such as 'cpu' or 'gpu'. `compiler_options` are XLA debug options
    applied to every program this Executor compiles (see bench/RESULTS.md
    for what the CPU ones gave). `precision` ("default" or "highest")
    overrides the precision policy of every program it runs; None keeps
    each program's own (`Program.precision`). `mesh`, a `progdesc.distributed.Mesh`,
    runs every program on the mesh's devices, data parallel or sharded
    (see progdesc/distributed/run.py). With `check_numerics=True` it
    compiles nothing: `run` runs programs op by op and raises
    `NumericsError` at the first op that produces a NaN or Inf
    (progdesc.debug).
    """

    def __init__(self, device=None, compiler_options=None, precision=None, mesh=None,
                 check_numerics=False):
        if mesh is not None and (device is not None or check_numerics):
            raise DistributedError(
                "give an Executor a device or a mesh, not both" if device is not None else
                "check_numerics runs op by op on one device: give it no mesh",
                during=user_call() or None)
        self.mesh = mesh
        self.device = _device(device)
        self.check_numerics = bool(check_numerics)
        """Whether `run` runs op by op, checking every result for NaN and Inf."""
        self._precision = None if precision is None else check_precision(precision)
        self.compiler_options = dict(compiler_options or {})
        """XLA options for every compilation, e.g. {"xla_cpu_use_onednn": True}."""
        self._cache = OrderedDict()     # raw feed signature -> (entry, feed casts)
        self._entries = OrderedDict()   # converted feed signature -> entry
        self.trace_count = 0
        """How many times a program was traced (each trace is a compilation)."""

    @property
    def precision(self):
        """The precision policy this Executor imposes, or None for each program's own."""
        return self._precision

    def run(self, program=None, feed=None, fetch_list=None, scope=None, return_numpy=True,
            steps=None):
        """Run `program`; returns the fetched values, in `fetch_list` order.

        `feed` maps data variables (or their names) to arrays; `fetch_list`
        holds Variables or names. With `return_numpy` the results are NumPy
        arrays, else jax arrays left on the device.

        With `steps=K`, every fed array has a leading axis of K mini-batches
        and the program runs K times inside one compiled call (a `lax.scan`
        carrying the persistable state); each fetched value comes back
        stacked, with that leading axis of K.
        """
        if program is None:
            program = default_main_program()
        scope = scope or global_scope()
        feed = feed or {}
        fetch_list = fetch_list or ()
        if self.check_numerics:
            from progdesc.debug import run_checked
            return run_checked(self, program, feed, fetch_list, scope, return_numpy, steps)
        try:   # feed and fetch Variables stand for themselves in the key: no name lookups
            key = (program.serial, program.version, _REGISTRY_GENERATION[0], steps,
                   *fetch_list, None, *feed, *map(_SHAPE_DTYPE, feed.values()))
            cached = self._cache.get(key)
        except (AttributeError, TypeError):   # lists or scalars fed: converted every run
            key = cached = None
        if cached is None:
            if not isinstance(program, Program):
                raise TypeError(f"Executor.run expects a Program, got {type(program).__name__}")
            try:
                entry, values, casts = self._prepare(program, feed, names_of(fetch_list),
                                                     steps)
            except (FeedError, FetchError) as e:
                raise in_run(e) from None
            if key is not None:
                _remember(self._cache, key, (entry, casts))
        else:
            entry, casts = cached
            if casts is None:
                values = feed.values()
            else:
                values = [v if cast is None else cast(v)
                          for v, cast in zip(feed.values(), casts)]
        lock = scope.lock   # runs on one scope tree take turns: from reading state to writing
        lock.acquire()
        try:
            bound = entry.bound
            if bound[0] is scope and bound[1] == Scope.generation:
                reads, writes = bound[3], bound[4]
                if entry.needs_x64:
                    with jax.enable_x64(True):
                        outs = entry.call(*values, *map(held_value, reads))
                elif reads:
                    outs = entry.call(*values, *map(held_value, reads))
                else:
                    outs = entry.call(*values)
            else:
                outs, writes = self._run_cold(program, entry, tuple(values), scope)
            if writes:
                scope.store(writes, outs[entry.n_fetched:])
                outs = outs[:entry.n_fetched]
        finally:
            lock.release()
        if return_numpy:
            if self.mesh is not None:   # gathered where other processes hold parts
                from progdesc.distributed.multihost import to_host
                return [to_host(v) for v in outs]
            if len(outs) == 1:   # the common case, without a comprehension's frame
                return [np.asarray(outs[0])]
            return [np.asarray(v) for v in outs]
        return list(outs)

    def _run_cold(self, program, entry, values, scope):
        """(outputs, write holders) of a call of `entry`, first finding and checking the
        persistables it reads where the Scope changed, and copying the ones it donates that
        may be held outside the Scope. Called with the scope's lock held."""
        generation, changes = Scope.generation, Scope.changes
        bound = entry.bound
        if bound[0] is scope and bound[2] == changes:   # only values were handed out
            reads, writes = bound[3], bound[4]
            state = tuple(h.own_value() for h in reads[:entry.n_mutable]) + tuple(
                map(held_value, reads[entry.n_mutable:]))
            if any(v is None for v in state):   # the RNG state, absent: seeded afresh
                state = read_state(program, entry.reads, reads, entry.n_mutable)
        else:
            found_reads, writes = scope.holders(entry.reads, entry.writes)
            reads = tuple(h or ABSENT for h in found_reads)
            writes = tuple(writes)
            state = read_state(program, entry.reads, reads, entry.n_mutable)
        try:
            outs = entry(values + state, self.device, self.compiler_options)
        except ProgramError as e:   # tracing with the fed sizes failed: feeds that disagree?
            mismatch = disagreeing_feeds(program, entry.feeds, e)
            if mismatch is None:
                raise
            raise in_run(mismatch) from None
        n_mutable = entry.n_mutable
        for holder, value in zip(reads[n_mutable:], state[n_mutable:]):
            if holder is not ABSENT and held_value(holder) is not value:   # a copy of a
                scope.store((holder,), (value,))                           # donated one
        entry.bound = (scope, generation, changes, reads, writes)
        return outs, writes

    def _prepare(self, program, feed, fetch_names, steps):
        """Validate and convert the feeds; find or compile their entry.

        Returns (entry, converted feeds, per-feed casts or None when every
        feed already has its variable's dtype).
        """
        names, values, casts = convert_feeds(program, feed, steps)
        key = (program.serial, program.version, registry.GENERATION[0],
               tuple((n, v.shape, v.dtype) for n, v in zip(names, values)), fetch_names, steps,
               self._precision or program.precision)
        entry = self._entries.get(key)
        if entry is None:
            entry = _remember(self._entries, key,
                              self._compile(program, tuple(names), fetch_names, steps,
                                            tuple(v.shape for v in values)))
            entry.feeds = tuple((n, v.shape if steps is None else v.shape[1:])
                                for n, v in zip(names, values))
        casts = None if all(c is None for c in casts) else tuple(casts)
        return entry, tuple(values), casts

    def _compile(self, program, feed_names, fetch_names, steps, feed_shapes):
        desc = with_feed_fetch(program, feed_names, fetch_names)
        lowered = lower_block(desc, 0, self._precision)
        written, read = set(lowered.writes), set(lowered.reads)
        mutable = tuple(n for n in lowered.reads if n in written)
        readonly = tuple(n for n in lowered.reads if n not in written)
        only_written = tuple(n for n in lowered.writes if n not in read)

        def step(feeds, mutable_state, readonly_state):
            self.trace_count += 1
            fetched, written = lowered.fn(feeds, dict(zip(mutable, mutable_state)),
                                          dict(zip(readonly, readonly_state)))
            return fetched, tuple(written[n] for n in mutable + only_written)

        def many_steps(feeds, mutable_state, readonly_state):
            def body(carry, step_feeds):
                fetched, written = step(step_feeds, carry, readonly_state)
                return written[:len(mutable)], (fetched, written[len(mutable):])
            carry, (fetched, last) = jax.lax.scan(body, mutable_state, feeds)
            return fetched, carry + tuple(v[-1] for v in last)

        n_feeds, n_mutable = len(feed_names), len(mutable)

        def flat(fn):
            def call(*args):
                fetched, written = fn(args[:n_feeds], args[n_feeds:n_feeds + n_mutable],
                                      args[n_feeds + n_mutable:])
                return (*fetched, *written)
            return call

        if self.mesh is not None:
            from progdesc.distributed.run import compile_pipeline
            call = compile_pipeline(self.mesh, desc, lowered, feed_names, mutable + readonly,
                                    mutable + only_written, steps,
                                    self._precision or precision_of(desc))
            if call is not None:
                return _Compiled(None, lowered.fetch_names, mutable + readonly, n_mutable,
                                 mutable + only_written, len(lowered.fetch_names), call=call)
        fn, place = flat(step if steps is None else many_steps), None
        donate = tuple(range(n_feeds, n_feeds + n_mutable))
        if self.mesh is None:
            jitted = jax.jit(fn, donate_argnums=donate)
        else:
            from progdesc.distributed.run import compile_on_mesh
            jitted, place = compile_on_mesh(self.mesh, desc, fn, zip(feed_names, feed_shapes),
                                            lowered.fetch_names, mutable + readonly,
                                            mutable + only_written, steps, donate)
        return _Compiled(jitted, lowered.fetch_names, mutable + readonly, n_mutable,
                         mutable + only_written, len(lowered.fetch_names), place=place)


def _remember(cache, key, value):
    """Store `value` in a bounded LRU dict; returns it."""
    cache[key] = value
    if len(cache) > _CACHE_SIZE:
        cache.popitem(last=False)
    return value
