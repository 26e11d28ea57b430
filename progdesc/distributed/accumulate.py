"""The gradient-accumulation pass: k runs of the program on k micro-batches make one update.

    optimizer.minimize(loss, accumulate_steps=4)      # or, on a finished program:
    progdesc.distributed.accumulate_gradients(main, 4)

Each run adds its parameter gradients to persistable buffers ('<param>.accumulated_grad')
and counts itself in the persistable '@ACCUMULATE_STEP@'. What follows the gradients (the
optimizer ops, clipping, AMP's unscale-and-check and loss-scale update, the step counter
of Adam and the learning-rate schedules) reads the buffer's mean, `(buffer + grad) / k`,
and writes every persistable through a `where(apply, new, old)`: only on the k-th run do
parameters, optimizer state and step counters change; that run also zeroes the buffers
and the counter. For a loss that is a mean over the batch, and micro-batches of equal
size, the mean of the k micro-batch gradients is the gradient of the whole batch, so k
runs give the parameters the one step the whole batch gives.

The update is a select rather than a `cond` sub-block, as optax.MultiSteps selects its
inner state: under jax.jit the update ops (elementwise, memory-bound) run on every
micro-batch and the select is one more elementwise op beside them. A branch (lax.cond)
would skip that work on k-1 runs in k, but XLA's GPU conditional (outside CUDA graphs)
copies its predicate to the host and waits for it on every run. bench/scaling.py
measures the whole against optax.MultiSteps.

With data parallel, the gradients are all-reduced on every micro-batch (the `c_allreduce`
ops stay where the data-parallel pass put them, before the accumulation), as DDP does
without `no_sync`; averaging commutes with the sum, so the parameters are those of one
device. That is k all-reduces per update where one of the buffer would do: an all-reduce
that runs only on the k-th run needs a branch (a `cond` sub-block around it and the
update ops), which the select does not have.

With AMP loss scaling, the scaled gradients are accumulated and unscaled and checked on
the k-th run: an inf or NaN in any micro-batch stays in the buffer, so the whole update is
skipped and the loss scale moves once, as for one big step.

Counter and buffers are persistable: the startup program zeroes them and checkpoints
save them, so a run resumed from a checkpoint taken mid-accumulation continues it.
Ops that write persistables before the gradients (batch_norm's moving statistics) run
on every micro-batch, as they do under optax.MultiSteps or DDP.
"""
from lowering import progdesc_pb2 as pb
from lowering.errors import ProgramError
from lowering.gradients import grad_name
from progdesc.distributed.data_parallel import after_last_writer
from progdesc.distributed.sharding import sharding_of
from progdesc.framework import default_main_program, default_startup_program, program_guard
from progdesc.param import create_global_var

COUNTER_VAR = "@ACCUMULATE_STEP@"
_GATED_ROLES = (pb.OPTIMIZE, pb.LR_SCHED)


def check_steps(steps):
    """`steps` as an int, or ProgramError unless it is an int of at least 1 (bool refused)."""
    if isinstance(steps, bool) or not isinstance(steps, int):
        raise ProgramError(f"accumulate_steps must be an int (the number of micro-batches per "
                           f"update), got {type(steps).__name__} {steps!r}")
    if steps < 1:
        raise ProgramError(f"accumulate_steps must be at least 1, got {steps}")
    return steps


def check_can_accumulate(block, steps):
    """The checks `minimize(..., accumulate_steps=steps)` makes before it appends anything:
    `steps` is valid, the program does not accumulate already (an update appended after
    the pass would run on every micro-batch), and, when steps > 1, it holds no optimizer
    op yet (that op would read the gradient of one micro-batch)."""
    check_steps(steps)
    _check_not_accumulating(block)
    if steps == 1:
        return
    for i, op_desc in enumerate(block.desc.ops):
        if op_desc.role in _GATED_ROLES:
            raise ProgramError(
                "the program already has optimizer ops: accumulate_steps applies to every "
                "update of a program; give it to the only minimize, or apply "
                "progdesc.distributed.accumulate_gradients(program, k) to a program with one "
                "backward pass", op_type=op_desc.type, op_index=i)


def accumulate_gradients(program, steps, startup_program=None):
    """The pass on its own: make `program` update its parameters once every `steps` runs,
    with the mean of the gradients of those runs (see the module docstring).

    `program` holds a backward pass and the optimizer ops after it (minimize, with or
    without data_parallel and AMP). The buffers and the counter are initialized by
    `startup_program`, which may be left out only for the default main program (its
    startup program is then the default one). `steps == 1` changes nothing. Returns the
    names of the accumulated gradients. ProgramError, leaving both programs as they were,
    if `steps` is not an int >= 1, the startup program is missing, the program already
    accumulates, computes no parameter gradient, or has an optimizer op before its last
    gradient is computed.
    """
    check_steps(steps)
    if startup_program is None and program is not default_main_program():
        raise ProgramError(
            "accumulate_gradients needs startup_program= for a program that is not the "
            "default main program: the accumulation buffers and the step counter are "
            "initialized there, and the default startup program is not the one you run")
    block = program.global_block()
    written = {n for op_desc in block.desc.ops if op_desc.role == pb.BACKWARD
               for slot in op_desc.outputs for n in slot.arguments}
    pairs = [(p, grad_name(p.name)) for p in program.all_parameters()
             if not p.stop_gradient and grad_name(p.name) in written]
    if not pairs:
        raise ProgramError("the program computes no parameter gradient: append the backward "
                           "pass (or minimize) before accumulate_gradients")
    if steps == 1:
        return [g for _, g in pairs]
    _check_not_accumulating(block)
    accumulate(block, pairs, steps, startup_program)
    return [g for _, g in pairs]


def accumulate(block, params_grads, steps, startup_program=None):
    """Insert the accumulation of [(param, grad)] right after the last op that writes one
    of the gradients, and gate every optimizer-role op of `block` after it; see the module
    docstring. ProgramError, leaving the programs as they were, if an optimizer-role op
    comes before that point."""
    grads = [g if isinstance(g, str) else g.name for _, g in params_grads]
    at = _after_last_writer(block, grads)
    gated = [op_desc for op_desc in block.desc.ops[at:] if op_desc.role in _GATED_ROLES]
    if not gated:
        raise ProgramError("no optimizer op follows the gradients: accumulate them in a "
                           "program with its update ops (after minimize)")
    startup = startup_program or default_startup_program()
    saved = [(p, p.desc.SerializeToString()) for p in (block.program, startup)]
    try:
        with program_guard(block.program, startup):
            _rewrite(block, params_grads, grads, steps, at, gated)
    except BaseException:
        for program, desc in saved:
            program.desc.ParseFromString(desc)
            for b in program.blocks:
                b.sync()
        raise


def select_writes(block, op_descs, condition, keep_old_if=False):
    """Make `op_descs` (ops of `block`, in order) change persistables only where the bool
    `condition` is true (`keep_old_if=False`) or false (`keep_old_if=True`).

    Each persistable the ops write is written to a fresh variable instead (later ops of
    `op_descs` read that one), and one `where` per persistable, appended at the end of the
    block, writes back the new or the old value. Returns the `where` ops.
    """
    latest = {}
    for op_desc in op_descs:
        for slot in op_desc.inputs:
            for i, name in enumerate(slot.arguments):
                if name in latest:
                    slot.arguments[i] = latest[name]
        for slot in op_desc.outputs:
            for i, name in enumerate(slot.arguments):
                var = block.var(name)
                if var.persistable:
                    new = latest.get(name) or block.unused_name(f"{name}.new")
                    block.create_var(new, var.shape, var.dtype, stop_gradient=True)
                    slot.arguments[i] = latest[name] = new
    block.program.mark_changed()
    return [block.append_op("where", {"Condition": condition,
                                      "X": name if keep_old_if else new,
                                      "Y": new if keep_old_if else name},
                            {"Out": name}, role=pb.OPTIMIZE)
            for name, new in latest.items()]


def _rewrite(block, params_grads, grads, steps, at, gated):
    """The ops of `accumulate`: counter and condition at `at`, then per gradient the sum and
    mean, the gated writes, and the buffer and counter resets at the end."""
    counter = create_global_var(COUNTER_VAR, [1], 0, "int32")
    apply = block.create_var(block.unused_name("accumulate_apply"), [], "bool",
                             stop_gradient=True)
    select_writes(block, gated, apply)
    ops = []   # (op type, inputs, outputs, attrs) inserted at `at`, in order
    count = block.unused_name(f"{COUNTER_VAR}.next")
    ops.append(("increment", {"X": counter}, {"Out": count}, {"step": 1.0}))
    last = block.unused_name("accumulate_steps")
    ops.append(("fill_constant", {}, {"Out": last}, {"shape": [1], "dtype": "int32",
                                                    "value": float(steps)}))
    reached = block.unused_name("accumulate_reached")
    ops.append(("greater_equal", {"X": count, "Y": last}, {"Out": reached}, {}))
    ops.append(("reshape", {"X": reached}, {"Out": apply}, {"shape": []}))
    resets = [(counter.name, count)]
    for (param, _), grad in zip(params_grads, grads):
        gvar = block.var(grad)
        buffer = create_global_var(f"{param.name}.accumulated_grad", gvar.shape, 0.0,
                                   gvar.dtype, sharding=sharding_of(param.desc))
        total = block.unused_name(f"{grad}.accumulated")
        ops.append(("sum", {"X": [buffer, grad]}, {"Out": total}, {}))
        ops.append(("scale", {"X": total}, {"Out": grad}, {"scale": 1.0 / steps}))
        resets.append((buffer.name, total))
    for k, (op_type, inputs, outputs, attrs) in enumerate(ops):
        block.insert_op(at + k, op_type, inputs, outputs, attrs, role=pb.OPTIMIZE,
                        callsite="")
    zeros = {}
    for name, value in resets:   # name = 0 on the k-th run, else the running value
        dtype = block.var(name).dtype
        if dtype not in zeros:
            zeros[dtype] = block.unused_name(f"accumulate_zero.{dtype}")
            block.append_op("fill_constant", {}, {"Out": zeros[dtype]},
                            {"shape": [], "dtype": dtype, "value": 0.0}, role=pb.OPTIMIZE)
        block.append_op("where", {"Condition": apply, "X": zeros[dtype], "Y": value},
                        {"Out": name}, role=pb.OPTIMIZE)


def _check_not_accumulating(block):
    if block.find_var(COUNTER_VAR) is not None:
        raise ProgramError("the program already accumulates gradients (gradient "
                           "accumulation was applied before)", var=COUNTER_VAR)


def _after_last_writer(block, grads):
    """The index after the last op writing one of `grads`; ProgramError if one has no
    writer or an optimizer-role op comes before that index."""
    at = after_last_writer(block, grads)
    for i, op_desc in enumerate(block.desc.ops[:at]):
        if op_desc.role in _GATED_ROLES:
            raise ProgramError("an optimizer op comes before the last gradient is computed: "
                               "accumulation needs all updates after the one backward pass",
                               op_type=op_desc.type, op_index=i)
    return at
