"""The Executor: feed values in, run a compiled program, fetch results out (seed 004).

`run` inserts feed and fetch ops into a cached clone of the program, lowers
that clone to one function and compiles it ahead of time with `jax.jit`,
once per (program, program version, feed shapes and dtypes, fetch list, precision
policy). Persistable values come from the Scope and go back to it; the ones the
program overwrites are donated, so on an accelerator the update is in place.
Nothing is written to the Scope unless the whole run succeeds.
"""
import contextlib
import operator
from collections import OrderedDict
from dataclasses import dataclass

import jax
import numpy as np

from lowering import dtypes, registry
from lowering import progdesc_pb2 as pb
from lowering.errors import (DistributedError, FeedError, FetchError, ProgramError, ScopeError,
                             did_you_mean)
from lowering.lower import FEED_VAR, FETCH_VAR, RNG_VAR, check_precision, lower_block
from progdesc import compile_cache, jax_compat
from progdesc.callsites import user_call, user_callsite
from progdesc.framework import Program, Variable, default_main_program, dims_compatible
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
            with jax.enable_x64(True), _default_device(device), compile_cache.compiling():
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


def _name_of(target):
    return target.name if isinstance(target, Variable) else target


def _fetch_names(fetch_list):
    """The names of the fetched Variables or names; TypeError for anything else."""
    names = tuple(_name_of(f) for f in fetch_list)
    for name, target in zip(names, fetch_list):
        if not isinstance(name, str):
            raise TypeError(f"fetch_list holds Variables or variable names, got {target!r}")
    return names


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
                entry, values, casts = self._prepare(program, feed, _fetch_names(fetch_list),
                                                     steps)
            except (FeedError, FetchError) as e:
                raise _in_run(e) from None
            if key is not None:
                _remember(self._cache, key, (entry, casts))
        else:
            entry, casts = cached
            if casts is None:
                values = feed.values()
            else:
                values = [v if cast is None else v.astype(cast)
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
                state = self._check_state(program, entry.reads, reads, entry.n_mutable)
        else:
            found_reads, writes = scope.holders(entry.reads, entry.writes)
            reads = tuple(h or ABSENT for h in found_reads)
            writes = tuple(writes)
            state = self._check_state(program, entry.reads, reads, entry.n_mutable)
        try:
            outs = entry(values + state, self.device, self.compiler_options)
        except ProgramError as e:   # tracing with the fed sizes failed: feeds that disagree?
            mismatch = _disagreeing_feeds(program, entry.feeds, e)
            if mismatch is None:
                raise
            raise _in_run(mismatch) from None
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
        names, values, casts = self._convert_feeds(program, feed, steps)
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

    def _convert_feeds(self, program, feed, steps):
        """(names, converted values, per-feed cast dtype or None) of `feed`; FeedError for a
        feed that does not fit its variable."""
        if steps is not None and (not isinstance(steps, int) or steps < 1):
            raise ValueError(f"steps must be a positive int, got {steps!r}")
        if not hasattr(feed, "items"):
            raise FeedError(f"feed maps data variables (or their names) to values, got a "
                            f"{type(feed).__name__}")
        block = program.global_block()
        names, values, casts = [], [], []
        for target, value in feed.items():
            name = _name_of(target)
            var = block.find_var(name)
            if var is None:
                raise FeedError("is fed but is not a variable of the program"
                                + did_you_mean(name, block.vars), var=name)
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
        return names, values, casts

    def _check_state(self, program, names, holders, n_mutable):
        """The values of the persistables `names` held by `holders` (the first `n_mutable`
        donated: made the Scope's own first), the RNG state filled in if absent; refuses
        missing or ill-fitting ones."""
        state = [h.own_value() for h in holders[:n_mutable]] + [
            held_value(h) for h in holders[n_mutable:]]
        for i, name in enumerate(names):
            if state[i] is None:
                if name != RNG_VAR:
                    raise ScopeError("has no value in the scope: run the startup program first "
                                     "(or load a checkpoint)", var=name)
                with compile_cache.compiling():      # compiles, once per process
                    state[i] = jax.random.PRNGKey(program.random_seed)
        seen = set()
        for i, value in enumerate(state):   # one buffer in two places, one donated: copy it
            # (the Scope keeps the copy of a read-only one once the run succeeded)
            if id(value) in seen:
                state[i] = jax.device_put(value, value.sharding, may_alias=False)
            seen.add(id(state[i]))
        for name, value in zip(names, state):
            var = program.global_block().find_var(name)
            if var is not None and (
                    not dims_compatible(tuple(var.desc.dims), value.shape)
                    or np.dtype(value.dtype) != dtypes.to_numpy(var.desc.dtype)):
                raise ScopeError(
                    f"scope holds {value.dtype}{list(value.shape)}, the program declares "
                    f"{dtypes.name_of(var.desc.dtype)}{list(var.desc.dims)}", var=name)
        return tuple(state)

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


def _in_run(error):
    """`error` again, naming the line of the user's code that called `run`."""
    site = user_callsite()
    return type(error)(error.detail, op_type=error.op_type, op_index=error.op_index,
                       block_idx=error.block_idx, var=error.var, callsite=error.callsite,
                       slot=error.slot, during=f"run called at {site}" if site else None)


def _disagreeing_feeds(program, feeds, error):
    """A FeedError if the op that `error` (from tracing block 0) names combines two feeds
    whose sizes differ on a dim both declare unknown (-1); else None.

    Shape inference gives every -1 dim one symbolic size, so an op that combines two
    such dims passes when it is appended and fails only once fed sizes differ.
    """
    if error.block_idx or error.op_index is None:
        return None
    block, fed = program.global_block(), dict(feeds)
    reached = _feeds_into(block.desc.ops, error.op_index, fed)
    for i, (input_a, a) in enumerate(reached):
        for input_b, b in reached[i + 1:]:
            if a == b or input_a == input_b:
                continue
            for d, (da, db) in enumerate(zip(block.var(a).shape, block.var(b).shape)):
                if da < 0 and db < 0 and fed[a][d] != fed[b][d]:
                    return FeedError(
                        f"feeds '{a}' {list(fed[a])} and '{b}' {list(fed[b])} differ on dim {d} "
                        f"({fed[a][d]} vs {fed[b][d]}): both declare it -1 and this op combines "
                        f"them ('{a}' reaches input {input_a}, '{b}' input {input_b}). Feed "
                        "equal sizes", op_type=error.op_type, op_index=error.op_index,
                        callsite=error.callsite, var=b)
    return None


def _feeds_into(ops, index, feed_names):
    """[(input label, feed name)] for each feed whose value flows into an input of op `index`."""
    writer = {}
    for i, op_desc in enumerate(ops[:index]):
        for slot in op_desc.outputs:
            writer.update(dict.fromkeys(slot.arguments, i))
    reached = []
    for slot in ops[index].inputs:
        for k, name in enumerate(slot.arguments):
            label = f"{slot.parameter}[{k}]" if len(slot.arguments) > 1 else slot.parameter
            todo, seen = [name], set()
            while todo:
                n = todo.pop()
                if n in seen:
                    continue
                seen.add(n)
                if n in feed_names:
                    reached.append((label, n))
                elif n in writer:
                    todo.extend(a for s in ops[writer[n]].inputs for a in s.arguments)
    return reached


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
            raise FetchError("is fetched but is not a variable of the program"
                             + did_you_mean(name, block.vars), var=name)
    desc = pb.ProgramDesc()
    desc.CopyFrom(program.desc)
    root = desc.blocks[0]
    root.vars.add(name=FEED_VAR, kind=pb.FEED_LIST)
    root.vars.add(name=FETCH_VAR, kind=pb.FETCH_LIST)
    for col, name in enumerate(feed_names):
        op = pb.OpDesc(type="feed")
        op.inputs.add(parameter="X", arguments=[FEED_VAR])
        op.outputs.add(parameter="Out", arguments=[name])
        op.attrs["col"].i = col
        root.ops.insert(col, op)
    for col, name in enumerate(fetch_names):
        op = root.ops.add(type="fetch")
        op.inputs.add(parameter="X", arguments=[name])
        op.outputs.add(parameter="Out", arguments=[FETCH_VAR])
        op.attrs["col"].i = col
    return desc


def _default_device(device):
    return jax.default_device(device) if device is not None else contextlib.nullcontext()
