"""The Executor: feed values in, run a compiled program, fetch results out (seed 004).

`run` inserts feed and fetch ops into a cached clone of the program, lowers
that clone to one function and compiles it with `jax.jit`, once per
(program, program version, feed shapes and dtypes, fetch list). Persistable
values come from the Scope and go back to it; the ones the program
overwrites are donated, so on an accelerator the update is in place.
Nothing is written to the Scope unless the whole run succeeds.
"""
import contextlib
import itertools
from collections import OrderedDict
from dataclasses import dataclass

import jax
import numpy as np

from lowering import dtypes
from lowering import progdesc_pb2 as pb
from lowering.errors import FeedError, FetchError, ScopeError
from lowering.lower import FEED_VAR, FETCH_VAR, RNG_VAR, lower_block
from progdesc.framework import Program, Variable, default_main_program, dims_compatible
from progdesc.scope import global_scope

_CACHE_SIZE = 64


@dataclass
class _Compiled:
    jitted: object
    feed_names: tuple
    fetch_names: tuple
    mutable: tuple
    readonly: tuple
    checked_state: bool = False


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
        self._cache = OrderedDict()
        self.trace_count = 0
        """How many times a program was traced (each trace is a compilation)."""

    def run(self, program=None, feed=None, fetch_list=None, scope=None, return_numpy=True):
        """Run `program` once; returns the fetched values, in `fetch_list` order.

        `feed` maps data variables (or their names) to arrays; `fetch_list`
        holds Variables or names. With `return_numpy` the results are NumPy
        arrays, else jax arrays left on the device.
        """
        program = program or default_main_program()
        if not isinstance(program, Program):
            raise TypeError(f"Executor.run expects a Program, got {type(program).__name__}")
        scope = scope or global_scope()
        block = program.global_block()
        fetch_names = tuple(_name_of(f) for f in (fetch_list or ()))
        feed_names, feed_values = [], []
        for target, value in (feed or {}).items():
            name = _name_of(target)
            var = block.find_var(name)
            if var is None:
                raise FeedError("is fed but is not a variable of the program", var=name)
            feed_names.append(name)
            feed_values.append(convert_feed(var, value))
        key = (_serial(program), program.version, tuple(feed_names),
               tuple((v.shape, v.dtype) for v in feed_values), fetch_names)
        entry = self._cache.get(key)
        if entry is None:
            entry = self._compile(program, tuple(feed_names), fetch_names)
            self._cache[key] = entry
            if len(self._cache) > _CACHE_SIZE:
                self._cache.popitem(last=False)
        state = self._read_state(program, scope, entry)
        with jax.enable_x64(True), _default_device(self.device):
            fetched, written = entry.jitted(
                tuple(feed_values), {n: state[n] for n in entry.mutable},
                {n: state[n] for n in entry.readonly})
        scope._write(written)
        if return_numpy:
            return [np.asarray(v) for v in fetched]
        return list(fetched)

    def _read_state(self, program, scope, entry):
        state, missing = scope._read(entry.mutable + entry.readonly)
        for name in missing:
            if name != RNG_VAR:
                raise ScopeError("has no value in the scope: run the startup program first "
                                 "(or load a checkpoint)", var=name)
            state[name] = jax.random.PRNGKey(program.random_seed)
        if not entry.checked_state:
            for name, value in state.items():
                var = program.global_block().find_var(name)
                if var is not None and (
                        not dims_compatible(tuple(var.desc.dims), value.shape)
                        or np.dtype(value.dtype) != dtypes.to_numpy(var.desc.dtype)):
                    raise ScopeError(
                        f"scope holds {value.dtype}{list(value.shape)}, the program declares "
                        f"{dtypes.name_of(var.desc.dtype)}{list(var.desc.dims)}", var=name)
            entry.checked_state = True
        return state

    def _compile(self, program, feed_names, fetch_names):
        desc = with_feed_fetch(program, feed_names, fetch_names)
        lowered = lower_block(desc, 0)
        mutable = tuple(n for n in lowered.reads if n in lowered.writes)
        readonly = tuple(n for n in lowered.reads if n not in lowered.writes)

        def step(feeds, mutable_state, readonly_state):
            self.trace_count += 1
            return lowered.fn(feeds, mutable_state, readonly_state)

        return _Compiled(jax.jit(step, donate_argnums=(1,)), lowered.feed_names,
                         lowered.fetch_names, mutable, readonly)


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
