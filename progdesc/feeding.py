"""What a run takes in and hands out, shared by everything that runs a program.

The Executor, the checking run (progdesc.debug), `export_compiled`, `as_jax`,
eager mode and the data reader use these: the program with feed and fetch ops
(`with_feed_fetch`), feeds converted to their variables' dtypes (`convert_feed`,
`convert_feeds`), the names of fetch targets (`names_of`), the persistable values
read from the Scope (`read_state`), and the errors about them (`in_run`,
`disagreeing_feeds`).
"""
import contextlib
import operator

import jax
import numpy as np

from lowering import dtypes
from lowering import progdesc_pb2 as pb
from lowering.errors import FeedError, FetchError, ScopeError, did_you_mean
from lowering.lower import FEED_VAR, FETCH_VAR, RNG_VAR
from progdesc import compile_cache
from progdesc.callsites import user_callsite
from progdesc.framework import Variable, dims_compatible
from progdesc.scope import held_value


def name_of(target):
    """The name of a Variable, or `target` itself (a name)."""
    return target.name if isinstance(target, Variable) else target


def names_of(targets, what="fetch_list"):
    """The names of `targets`, Variables or names; TypeError naming `what` for anything else."""
    names = tuple(name_of(t) for t in targets)
    for name, target in zip(names, targets):
        if not isinstance(name, str):
            raise TypeError(f"{what} holds Variables or variable names, got {target!r}")
    return names


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
    arr = raw_key_data(arr)
    kind = np.dtype(arr.dtype).kind
    if kind not in "biuf" and arr.dtype != dtypes.to_numpy("bfloat16"):   # its kind is 'V'
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


def is_typed_key(dtype):
    """Whether `dtype` is that of a typed PRNG key (`jax.random.key(0)`)."""
    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def raw_key_data(value):
    """A typed PRNG key's raw data, as a program variable holds it; any other value as it
    is."""
    return jax.random.key_data(value) if is_typed_key(getattr(value, "dtype", None)) else value


def feed_cast(raw_dtype, dtype):
    """The function that makes a fed value of `raw_dtype` one of `dtype` (a typed PRNG key
    its raw data), or None where none is needed."""
    if raw_dtype == dtype:
        return None
    if is_typed_key(raw_dtype):
        return lambda value: jax.random.key_data(value).astype(dtype)
    return operator.methodcaller("astype", dtype)


def convert_feeds(program, feed, steps=None):
    """(names, converted values, per-feed cast or None) of `feed`, a dict from data
    variables (or their names) to values (a cast: `feed_cast`'s function, for the next
    feeds of the same dtypes); FeedError for a feed that does not fit its variable.

    With `steps=K` every value has a leading axis of K mini-batches, each converted.
    """
    if steps is not None and (not isinstance(steps, int) or steps < 1):
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    if not hasattr(feed, "items"):
        raise FeedError(f"feed maps data variables (or their names) to values, got a "
                        f"{type(feed).__name__}")
    block = program.global_block()
    names, values, casts = [], [], []
    for target, value in feed.items():
        name = name_of(target)
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
        casts.append(feed_cast(raw_dtype, arr.dtype))
    return names, values, casts


def read_state(program, names, holders, n_mutable=0):
    """The values of the persistables `names` held by `holders` (Scope holders, or
    `scope.ABSENT` for a name the scope lacks), checked against the program: the first
    `n_mutable` (to be donated) made the Scope's own first, the RNG state seeded from
    `program.random_seed` if absent; ScopeError for a missing or ill-fitting one.
    Call with the scope's lock held."""
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


def on_device(device):
    """A context making `device` JAX's default device; None leaves the default as it is."""
    return jax.default_device(device) if device is not None else contextlib.nullcontext()


def in_run(error):
    """`error` again, naming the line of the user's code that called `run`."""
    site = user_callsite()
    return type(error)(error.detail, op_type=error.op_type, op_index=error.op_index,
                       block_idx=error.block_idx, var=error.var, callsite=error.callsite,
                       slot=error.slot, during=f"run called at {site}" if site else None)


def disagreeing_feeds(program, feed_shapes, error):
    """A FeedError if the op that `error` (from tracing block 0) names combines two feeds
    whose sizes differ on a dim both declare unknown (-1); else None. `feed_shapes` holds
    (name, shape of one step's value) per feed.

    Shape inference gives every -1 dim one symbolic size, so an op that combines two
    such dims passes when it is appended and fails only once fed sizes differ.
    """
    if error.block_idx or error.op_index is None:
        return None
    block, fed = program.global_block(), dict(feed_shapes)
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
