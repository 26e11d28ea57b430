"""The Executor: feed values in, run a compiled program, fetch results out (seed 004).

`run` inserts feed and fetch ops into a cached clone of the program, lowers
that clone to one function and compiles it ahead of time with `jax.jit`,
once per (program, program version, feed shapes and dtypes, fetch list). Persistable
values come from the Scope and go back to it; the ones the program
overwrites are donated, so on an accelerator the update is in place.
Nothing is written to the Scope unless the whole run succeeds.
"""
import contextlib
import itertools
import weakref
from collections import OrderedDict
from dataclasses import dataclass

import jax
import numpy as np

from lowering import dtypes, registry
from lowering import progdesc_pb2 as pb
from lowering.errors import FeedError, FetchError, ScopeError
from lowering.lower import FEED_VAR, FETCH_VAR, RNG_VAR, lower_block
from progdesc.framework import Program, Variable, default_main_program, dims_compatible
from progdesc.scope import Scope, global_scope

_CACHE_SIZE = 64


@dataclass
class _Compiled:
    """One compiled (program version, feed signature, fetch list, steps)."""
    call: object
    fetch_names: tuple
    reads: tuple           # persistables passed in: mutable (donated) ones first
    n_mutable: int
    writes: tuple          # persistables coming back
    ready: bool = False        # persistables found and checked in the last resolved scope
    _scope_ref: object = None
    _generation: int = -1
    _holders: tuple = ((), ())
    compiled: object = None    # the AOT executable, made on the first call
    needs_x64: bool = True     # whether calls need 64-bit types enabled (a 64-bit argument)

    def __call__(self, feeds, mutable, readonly, device):
        """Run the executable (compiling it on the first call)."""
        if self.compiled is None:
            with jax.enable_x64(True), _default_device(device):
                self.compiled = self.call.lower(feeds, mutable, readonly).compile()
            self.needs_x64 = any(np.dtype(x.dtype).itemsize == 8
                                 for x in jax.tree_util.tree_leaves((feeds, mutable, readonly)))
        if self.needs_x64:
            with jax.enable_x64(True):
                return self.compiled(feeds, mutable, readonly)
        return self.compiled(feeds, mutable, readonly)

    def resolve(self, scope):
        """(read holders, write holders) in `scope`, cached until Scope.generation moves."""
        if self._generation != Scope.generation or self._scope_ref is None \
                or self._scope_ref() is not scope:
            read, write = scope._holders(self.reads, self.writes)
            self._holders = ([h or _ABSENT for h in read], write)
            self._scope_ref, self._generation = weakref.ref(scope), Scope.generation
            self.ready = False
        return self._holders


class _Absent:
    value = None


_ABSENT = _Absent()


def _device(device):
    if device is None or isinstance(device, jax.Device):
        return device
    kind = {"gpu": "gpu", "cuda": "gpu", "cpu": "cpu", "tpu": "tpu"}.get(str(device).lower())
    try:
        return jax.devices(kind or str(device))[0]
    except RuntimeError as e:
        raise ValueError(f"no '{device}' device available: {e}") from None


def _name_of(target):
    return target.name if isinstance(target, Variable) else target


def convert_feed(var, value):
    """`value` as an array of `var`'s dtype, or FeedError if it cannot be one."""
    name, want = var.name, dtypes.to_numpy(var.desc.dtype)
    if isinstance(value, jax.Array):
        arr = value
    else:
        try:
            arr = np.asarray(value)
        except (ValueError, TypeError) as e:
            raise FeedError(f"feed cannot be made an array: {e}", var=name) from None
    if np.dtype(arr.dtype).kind not in "biuf":
        raise FeedError(f"feed of dtype {arr.dtype} is not a rectangular numeric array",
                        var=name)
    if arr.dtype != want:
        got_kind, want_kind = dtypes.kind_of(arr.dtype), dtypes.kind_of(want)
        if not (got_kind == want_kind or (want_kind == "float" and got_kind == "int")):
            raise FeedError(f"feed has dtype {arr.dtype}, the variable is {dtypes.name_of(want)} "
                            f"(a {got_kind} value cannot be fed as {want_kind})", var=name)
        arr = arr.astype(want)
    if var.desc.need_check_feed and not dims_compatible(tuple(var.desc.dims), arr.shape):
        raise FeedError(f"feed has shape {list(arr.shape)}, the variable expects "
                        f"{list(var.desc.dims)} (-1: any size)", var=name)
    return arr


class Executor:
    """Runs programs; see the module docstring.

    `device` is None (JAX's default device), a `jax.Device`, or a platform
    name such as 'cpu' or 'gpu'.
    """

    def __init__(self, device=None):
        self.device = _device(device)
        self._cache = OrderedDict()     # raw feed signature -> (entry, feed casts)
        self._entries = OrderedDict()   # converted feed signature -> entry
        self.trace_count = 0
        """How many times a program was traced (each trace is a compilation)."""

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
        elif not isinstance(program, Program):
            raise TypeError(f"Executor.run expects a Program, got {type(program).__name__}")
        scope = scope or global_scope()
        feed = feed or {}
        fetch_names = tuple([f if f.__class__ is str else _name_of(f) for f in fetch_list or ()])
        try:
            signature = tuple([(k if k.__class__ is str else k.name, v.shape, v.dtype)
                               for k, v in feed.items()])
        except AttributeError:   # lists or scalars: convert first
            signature = None
        key = (_serial(program), program._version, registry.GENERATION[0], signature, fetch_names,
               steps)
        cached = self._cache.get(key) if signature is not None else None
        if cached is None:
            entry, values, casts = self._prepare(program, feed, fetch_names, steps)
            if signature is not None:
                _remember(self._cache, key, (entry, casts))
        else:
            entry, casts = cached
            if casts is None:
                values = tuple(feed.values())
            else:
                values = tuple([v if cast is None else v.astype(cast)
                                for v, cast in zip(feed.values(), casts)])
        read, write = entry.resolve(scope)
        state = [h.value for h in read]
        if not entry.ready:
            state = self._check_state(program, entry, state)
        n = entry.n_mutable
        fetched, written = entry(values, tuple(state[:n]), tuple(state[n:]), self.device)
        scope._store(write, written)
        entry.ready = True
        if return_numpy:
            return [np.asarray(v) for v in fetched]
        return list(fetched)

    def _prepare(self, program, feed, fetch_names, steps):
        """Validate and convert the feeds; find or compile their entry.

        Returns (entry, converted feeds, per-feed casts or None when every
        feed already has its variable's dtype).
        """
        if steps is not None and (not isinstance(steps, int) or steps < 1):
            raise ValueError(f"steps must be a positive int, got {steps!r}")
        block = program.global_block()
        names, values, casts = [], [], []
        for target, value in feed.items():
            name = _name_of(target)
            var = block.find_var(name)
            if var is None:
                raise FeedError("is fed but is not a variable of the program", var=name)
            raw_dtype = getattr(value, "dtype", None)
            if steps is not None:
                if np.ndim(value) == 0 or np.shape(value)[0] != steps:
                    raise FeedError(f"with steps={steps} every feed needs a leading axis of "
                                    f"{steps}, got shape {list(np.shape(value))}", var=name)
                arr = value if isinstance(value, jax.Array) else np.stack(
                    [convert_feed(var, v) for v in value])
                first = convert_feed(var, arr[0])      # one step's shape and dtype
                arr = arr if arr.dtype == first.dtype else arr.astype(first.dtype)
            else:
                arr = convert_feed(var, value)
            names.append(name)
            values.append(arr)
            casts.append(None if raw_dtype == arr.dtype else arr.dtype)
        key = (_serial(program), program.version, registry.GENERATION[0],
               tuple((n, v.shape, v.dtype) for n, v in zip(names, values)), fetch_names, steps)
        entry = self._entries.get(key)
        if entry is None:
            entry = _remember(self._entries, key,
                              self._compile(program, tuple(names), fetch_names, steps))
        casts = None if all(c is None for c in casts) else tuple(casts)
        return entry, tuple(values), casts

    def _check_state(self, program, entry, state):
        """Fill the RNG state if absent, refuse missing or ill-fitting persistables."""
        for i, name in enumerate(entry.reads):
            if state[i] is None:
                if name != RNG_VAR:
                    raise ScopeError("has no value in the scope: run the startup program first "
                                     "(or load a checkpoint)", var=name)
                state[i] = jax.random.PRNGKey(program.random_seed)
        seen = set()
        for i, value in enumerate(state):   # one buffer in two donated places: donate a copy
            if id(value) in seen:
                state[i] = jax.numpy.array(value, copy=True)
            seen.add(id(state[i]))
        for name, value in zip(entry.reads, state):
            var = program.global_block().find_var(name)
            if var is not None and (
                    not dims_compatible(tuple(var.desc.dims), value.shape)
                    or np.dtype(value.dtype) != dtypes.to_numpy(var.desc.dtype)):
                raise ScopeError(
                    f"scope holds {value.dtype}{list(value.shape)}, the program declares "
                    f"{dtypes.name_of(var.desc.dtype)}{list(var.desc.dims)}", var=name)
        return state

    def _compile(self, program, feed_names, fetch_names, steps):
        desc = with_feed_fetch(program, feed_names, fetch_names)
        lowered = lower_block(desc, 0)
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

        call = jax.jit(step if steps is None else many_steps, donate_argnums=(1,))
        return _Compiled(call, lowered.fetch_names, mutable + readonly, len(mutable),
                         mutable + only_written)


def _remember(cache, key, value):
    """Store `value` in a bounded LRU dict; returns it."""
    cache[key] = value
    if len(cache) > _CACHE_SIZE:
        cache.popitem(last=False)
    return value


def with_feed_fetch(program, feed_names, fetch_names):
    """A copy of `program.desc` with feed ops for `feed_names` and fetch ops for `fetch_names`."""
    block = program.global_block()
    for name in fetch_names:
        if block.find_var(name) is None:
            raise FetchError("is fetched but is not a variable of the program", var=name)
    desc = pb.ProgramDesc()
    desc.CopyFrom(program.desc)
    root = desc.blocks[0]
    root.vars.add(name=FEED_VAR, kind=pb.FEED_LIST)
    root.vars.add(name=FETCH_VAR, kind=pb.FETCH_LIST)
    ops = list(root.ops)
    del root.ops[:]
    for col, name in enumerate(feed_names):
        op = root.ops.add(type="feed")
        op.inputs.add(parameter="X", arguments=[FEED_VAR])
        op.outputs.add(parameter="Out", arguments=[name])
        op.attrs["col"].i = col
    root.ops.extend(ops)
    for col, name in enumerate(fetch_names):
        op = root.ops.add(type="fetch")
        op.inputs.add(parameter="X", arguments=[name])
        op.outputs.add(parameter="Out", arguments=[FETCH_VAR])
        op.attrs["col"].i = col
    return desc


_program_serials = itertools.count()


def _serial(program):
    serial = getattr(program, "_executor_serial", None)
    if serial is None:
        serial = program._executor_serial = next(_program_serials)
    return serial


def _default_device(device):
    return jax.default_device(device) if device is not None else contextlib.nullcontext()
