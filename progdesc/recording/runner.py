"""Running one appended op at once, on the values of its inputs (eager mode).

The op runs through `lowering.lower.run_step`, the very function the compiled block
traces, so eager and compiled values come from the same lowering rule. Each distinct
(op type, attributes, input shapes and dtypes) is compiled once with `jax.jit` and its
executable called directly afterwards: a call costs what a jitted call costs, and no
`jax.enable_x64` context is needed around it (the program's 64-bit types are fixed when
it compiles). Ops with sub-blocks (cond, scan, while) run unjitted, op by op inside.

Where values live: those of a program's ordinary variables in `values_of(program)` (by
name), those of persistables (parameters, optimizer state, the RNG state) in the current
Scope, where a compiled run of the same program finds them.

Random numbers: a random op draws what it would draw in its program's next compiled run
in this Scope (`Executor.run(startup)`, then the main program's first run): the Scope's
RNG state when the program's first random op runs (else the program's seed), folded with
the op's position; that first op also advances the Scope's state as the run would.

Ops run in the order they are appended (FIFO); JAX dispatches each asynchronously, so
independent ops overlap on the device and nothing here waits for a result (Python waits
only when it reads a value). `python -m bench.eager_schedule` measured it on a wide graph:
waiting for each op costs up to 1.3x, and dispatching in `program.schedule()`'s level
order instead of FIFO did not pay (bench/RESULTS.md), so ops are not held back to reorder.
"""
import dataclasses
import operator
import weakref

import jax

from lowering import registry
from lowering.errors import FeedError, ProgramError, ScopeError
from lowering.lower import RNG_VAR, precision_of, precision_scope, run_step, steps_of
from progdesc import compile_cache, jax_compat
from progdesc.feeding import convert_feed
from progdesc.scope import global_scope

_KERNELS = {}
_MAX_KERNELS = 4096
_AVAL = operator.attrgetter("aval")
_run_states = weakref.WeakKeyDictionary()   # scope -> {program: RNG state its ops draw from}


_values = {}   # program serial -> {variable name: its eager value}, while the program lives


def values_of(program):
    """{variable name: value} of `program`'s ordinary variables that eager mode computed
    (as long as the program lives)."""
    values = _values.get(program.serial)
    if values is None:
        values = _values[program.serial] = {}
        weakref.finalize(program, _values.pop, program.serial, None)
    return values


def rename_values(program, renames):
    """Move the values of renamed variables ({old: new}) to their new names."""
    values = _values.get(program.serial)
    for old, new in renames.items() if values else ():
        if old in values:
            values[new] = values.pop(old)


def drop_values(program, names):
    """Forget the values of variables taken out of `program`."""
    values = _values.get(program.serial)
    for name in names if values else ():
        values.pop(name, None)


def set_data_value(var, value):
    """Give data variable `var` its value (checked like a feed) for eager mode."""
    with jax.enable_x64(True):   # an int64 or float64 value stays 64-bit on the device
        values_of(var.block.program)[var.name] = jax.device_put(convert_feed(var, value))


def run_op(block, index, opdef, in_map, out_map, encoded_attrs):
    """Run the op just appended at `index` of `block` (root blocks only) and store its
    outputs: in `values_of(program)`, persistables in the current Scope."""
    if block.idx:   # an op of a sub-block runs when its control-flow op does
        return
    program = block.program
    scope = global_scope()
    with scope.lock:   # as a run: no other run on this scope donates what the op reads
        values = _values.get(program.serial)
        if values is None:
            values = values_of(program)
        args = []
        for slot in in_map if len(in_map) == 1 else opdef.input_index:   # declared order
            for name in in_map.get(slot, ()):
                value = values.get(name)
                args.append(_stored_value(block, scope, name, opdef, index)
                            if value is None else value)
        if not (opdef.random or opdef.has_blocks):   # most ops: `_run_kernel`'s steps
            kernel = _KERNELS.get((opdef.type, registry.GENERATION[0], encoded_attrs,
                                   *in_map, *map(len, in_map.values()),
                                   program.precision_enum, None,
                                   *map(_AVAL, args)))   # _kernel_key(..., None, ...), inlined
            if kernel is not None and kernel[2] is not None:   # one output value
                name = out_map.get(kernel[2], ())
                if len(name) == 1:
                    name = name[0]
                    var = block.find_var(name)
                    if var is None or not var.persistable:
                        values[name] = kernel[0](*args)
                        return
        rng = _rng_state(program, scope) if opdef.random else None
        if opdef.has_blocks:
            names, produced = _run_unjitted(program, index, in_map, args, rng)
        else:
            names, produced = _run_kernel(program, index, opdef, in_map, out_map,
                                          encoded_attrs, args, rng)
        _store(block, scope, opdef, values, names, produced)


def _store(block, scope, opdef, values, names, produced):
    """Keep an op's outputs: persistables in `scope`, the others in `values`."""
    if len(names) == 1:   # most ops: one output, not persistable
        var = block.find_var(names[0])
        if var is None or not var.persistable:
            values[names[0]] = produced[0]
            return
    persistable = None
    for name, value in zip(names, produced):
        var = block.find_var(name)
        if var is not None and var.persistable:
            if persistable is None:
                persistable = {}
            persistable[name] = value
        else:
            values[name] = value
    if persistable:   # a kernel's outputs are new arrays; an unjitted op may pass inputs on
        scope.write_many(persistable, private=not opdef.has_blocks)


def snapshot_eager_state(programs):
    """A function that puts back what eager mode keeps outside `programs` for them as it is
    now: the current Scope's variables and values, and which of `programs` have fixed their
    RNG state in it (`framework.appended_whole` takes a failed layer back with it)."""
    scope = global_scope()
    held = scope.snapshot()
    states = _run_states.get(scope)
    fixed = {id(p) for p in programs if states is not None and p in states}

    def undo():
        scope.restore(held)
        states_now = _run_states.get(scope)
        for program in programs:
            if id(program) not in fixed and states_now is not None:
                states_now.pop(program, None)
    return undo


def _stored_value(block, scope, name, opdef, index):
    """The value of input `name` that is not among the program's values: a persistable's
    from the Scope; otherwise an error naming what is missing."""
    var = block.find_var(name)
    where = dict(op_type=opdef.type, op_index=index, var=name,
                 callsite=block.desc.ops[index].callsite)
    if var is not None and var.desc.persistable:
        holder = scope.find_var(name)
        value = None if holder is None else (
            holder.value if opdef.has_blocks else holder.current())   # an unjitted op may
        if value is None:                                           # keep it in its outputs
            raise ScopeError("has no value in the current scope: run the startup program "
                             "first, or create the parameter in eager mode", **where)
        return value
    if var is not None and var.desc.need_check_feed:
        raise FeedError("has no value to run ops on in eager mode: declare it with "
                        "pd.data(..., value=array)", **where)
    raise ProgramError("has no value: the op that computes it ran outside eager mode",
                       **where)


def _rng_state(program, scope):
    """The RNG state the random ops of `program` draw from in eager mode: the one its
    first compiled run in `scope` would read (the Scope's, else the program's seed), fixed
    by its first random op, which also leaves in the Scope what that run would leave."""
    states = _run_states.setdefault(scope, weakref.WeakKeyDictionary())
    state = states.get(program)
    if state is None:
        holder = scope.find_var(RNG_VAR)
        current = None if holder is None else holder.value   # kept for later ops
        state = states[program] = (current if current is not None
                                   else jax.random.PRNGKey(program.random_seed))
        scope.write_many({RNG_VAR: jax.random.fold_in(state, 0)}, private=True)
    return state


def _run_kernel(program, index, opdef, in_map, out_map, encoded_attrs, args, rng):
    """(output names, values) of an op without sub-blocks, through its cached executable."""
    key = _kernel_key(program, index if rng is not None else None, opdef, in_map,
                      encoded_attrs, args)
    kernel = _KERNELS.get(key)
    if kernel is None:
        flat = (*args, rng) if rng is not None else args
        compiled, produced_slots = _compile(program, index, opdef, args, rng)
        outs = compiled(*flat)
        # After its first call a Compiled holds the C++ call its __call__ forwards to
        # (as the Executor uses it): calling that saves a Python frame per op.
        if len(_KERNELS) >= _MAX_KERNELS:
            _KERNELS.clear()
        single = produced_slots[0][0] if [k for _, k in produced_slots] == [1] else None
        _KERNELS[key] = (jax_compat.compiled_call(compiled), produced_slots, single)
    else:
        call, produced_slots, single = kernel
        outs = call(*args, rng) if rng is not None else call(*args)
    if single is not None:   # the executable returns its one value as it is
        outs = (outs,)
    if len(produced_slots) == 1:
        slot, k = produced_slots[0]
        names = out_map.get(slot, ())
        return (names if len(names) == k else names[:k]), outs
    names = [n for slot, k in produced_slots for n in out_map.get(slot, ())[:k]]
    return names, outs


def _kernel_key(program, rng_index, opdef, in_map, encoded_attrs, args):
    """What names an op's executable in `_KERNELS`: op type and attributes, the binding,
    the precision, the op's index for a random op, the inputs' shapes and dtypes."""
    return (opdef.type, registry.GENERATION[0], encoded_attrs,   # (run_op has it inlined)
            *in_map, *map(len, in_map.values()),   # the binding
            program.precision_enum, rng_index,
            *map(_AVAL, args))   # shapes, dtypes and weak types


def _canonical_step(program, index, opdef, args):
    """The step of op `index` (from `steps_of`) with its variables renamed by position
    (in0, in1, ...; Out.0, ...), so one executable serves every op of its kind."""
    step = steps_of(program.desc, 0, start=index)[0]
    counter = iter(range(len(args)))
    inputs = {s.name: [f"in{next(counter)}" for _ in step.inputs.get(s.name, ())]
              for s in opdef.inputs if step.inputs.get(s.name)}
    outputs = {slot: [f"{slot}.{k}" for k in range(len(names))]
               for slot, names in step.outputs.items()}
    return dataclasses.replace(step, inputs=inputs, outputs=outputs, stopped=frozenset())


def _compile(program, index, opdef, args, rng):
    """(compiled executable, [(output slot, how many values)]) for one op; the executable
    returns a tuple of the values, or the value itself where there is one."""
    step = _canonical_step(program, index, opdef, args)
    in_names = [n for names in step.inputs.values() for n in names]
    produced = []

    def kernel(*flat):
        env = dict(zip(in_names, flat))
        run_step(step, env, flat[-1] if rng is not None else None, None)
        produced[:] = [(slot, sum(n in env for n in names))
                       for slot, names in step.outputs.items()]
        outs = tuple(env[n] for names in step.outputs.values() for n in names if n in env)
        return outs[0] if len(outs) == 1 else outs   # one value: no tuple to unpack

    flat = (*args, rng) if rng is not None else tuple(args)
    with jax.enable_x64(True), _precision(program), compile_cache.compiling():
        return jax.jit(kernel).lower(*flat).compile(), produced


def _run_unjitted(program, index, in_map, args, rng):
    """(output names, values) of an op with sub-blocks, run by `run_step` op by op."""
    step = steps_of(program.desc, 0, start=index)[0]
    env = dict(zip([n for s in step.opdef.inputs for n in in_map.get(s.name, ())], args))
    with jax.enable_x64(True), _precision(program), compile_cache.compiling():
        run_step(step, env, rng, program.desc)
    names = [n for names in step.outputs.values() for n in names if n in env]
    return names, [env[n] for n in names]


def _precision(program):
    """The program's precision policy as a context, as the compiled block applies it."""
    return precision_scope(precision_of(program.desc))
