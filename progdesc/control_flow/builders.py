"""Control flow that reads like Python: `cond`, `switch`, `scan` and `while_loop` build
sub-blocks.

Each branch or step function is called once, at build time, inside a fresh
sub-block of the current block (`block_guard`): the ops it appends go there,
and it returns the Variables the sub-block hands back. Variables of enclosing
blocks it reads become the op's captured inputs; parameters it creates (an
`fc` in a scan step) live in the global block, shared by every run of it.

    y = control_flow.cond(pred, lambda: x * 2.0, lambda: -x)   # pred: a bool scalar
"""
import contextlib

from lowering.blocks import free_reads
from lowering.errors import ProgramError
from progdesc.framework import Variable, append_whole, default_main_program


@contextlib.contextmanager
def block_guard(program=None):
    """Inside, ops are appended to a new sub-block of the current block; yields the Block."""
    program = program or default_main_program()
    with program.sub_block() as block:
        yield block


def _flatten(value, what):
    """([Variable], rebuild) of a Variable or a tuple/list of them."""
    if isinstance(value, Variable):
        return [value], lambda vs: vs[0]
    if isinstance(value, (tuple, list)) and all(isinstance(v, Variable) for v in value):
        kind = type(value)
        return list(value), lambda vs: kind(vs)
    raise ProgramError(f"{what} must return a Variable or a tuple of Variables, "
                       f"got {type(value).__name__}")


def _build(fn, what):
    """(sub-block, [result names], rebuild) of calling `fn()` in a new sub-block."""
    with block_guard() as block:
        results, rebuild = _flatten(fn(), what)
    return block, [v.name for v in results], rebuild


def _captures(program, blocks):
    """The names of enclosing blocks that `blocks` ([(Block, results)]) read, in order."""
    names = []
    for block, results in blocks:
        names += [n for n in free_reads(program.desc, block.idx, results) if n not in names]
    return names


def _carry_persistables(program, block):
    """Turn each persistable of an enclosing block that `block`'s ops write (a batch-norm
    statistic, a counter) into a carried variable: its reads and writes in `block` are renamed
    to new variables of `block`, a version per write. Returns [(the persistable, the name
    bound to its value at the start of an iteration, the name of its value at the end)]; the
    loop op takes the persistable as initial carry and writes its final carry back to it."""
    local, found = block.vars, {}
    for op_desc in block.desc.ops:
        for n in (n for s in op_desc.outputs for n in s.arguments):
            v = None if n in local or n in found else block.find_var(n)
            if v is not None and v.persistable:
                found[n] = v
    carried = []
    for name, v in found.items():
        def version(hint):
            return block.create_var(program.unique_name(f"{name}.{hint}"), v.shape, v.dtype,
                                    stop_gradient=v.stop_gradient).name
        first = current = version("loop")
        for op_desc in block.desc.ops:
            for s in op_desc.inputs:
                s.arguments[:] = [current if a == name else a for a in s.arguments]
            for s in op_desc.outputs:
                if name in s.arguments:
                    current = version("next")
                    s.arguments[:] = [current if a == name else a for a in s.arguments]
        carried.append((v, first, current))
    return carried


def _write_back(block, op_desc, carried):
    """Bind the last len(carried) outputs of `op_desc`'s Carry slot to the persistables
    `carried` stands for, in place of the variables made for them."""
    if not carried:
        return
    slot = next(s for s in op_desc.outputs if s.parameter == "Carry")
    made = set(slot.arguments[-len(carried):])
    slot.arguments[-len(carried):] = [v.name for v, _, _ in carried]
    for i in reversed(range(len(block.desc.vars))):
        if block.desc.vars[i].name in made:
            del block.desc.vars[i]
    block.sync()


def _branches(fns):
    program = default_main_program()
    built = [_build(fn, f"branch {k}") for k, fn in enumerate(fns)]
    counts = [len(results) for _, results, _ in built]
    if len(set(counts)) > 1:
        raise ProgramError(f"branches return different numbers of outputs: {counts}")
    return program, built, _captures(program, [(b, r) for b, r, _ in built])


def _outputs(program, out_map, rebuild):
    block = program.current_block()
    return rebuild([block.var(n) for n in out_map["Out"]])


@append_whole   # a builder that fails leaves no sub-block behind
def cond(pred, true_fn, false_fn, name=None):
    """`true_fn()` if the bool scalar `pred` is true, else `false_fn()` (lowered to lax.cond).

    Both functions take no argument and return a Variable or a tuple of them,
    of the same shapes and dtypes; `cond` returns the same structure.
    """
    program, built, captures = _branches([true_fn, false_fn])
    (tb, touts, rebuild), (fb, fouts, _) = built
    op = program.current_block().append_op(
        "cond", {"Cond": pred, "Input": captures}, None,
        {"true_block": tb.idx, "false_block": fb.idx, "true_outputs": touts,
         "false_outputs": fouts}, name=name)
    return _outputs(program, op.outputs, rebuild)


@append_whole   # a builder that fails leaves no sub-block behind
def switch(index, branch_fns, name=None):
    """`branch_fns[index]()` for the int scalar `index` (lowered to lax.switch, which clamps an
    index out of range to the first or last branch).

    Every function takes no argument and returns a Variable or a tuple of them,
    of the same shapes and dtypes across branches; `switch` returns the same structure.
    """
    program, built, captures = _branches(list(branch_fns))
    op = program.current_block().append_op(
        "switch", {"Index": index, "Input": captures}, None,
        {"blocks": [b.idx for b, _, _ in built],
         "branch_outputs": [n for _, results, _ in built for n in results]}, name=name)
    return _outputs(program, op.outputs, built[0][2])


def _as_list(value, what):
    """([Variable], rebuild) of None, a Variable or a tuple/list of them."""
    if value is None:
        return [], lambda vs: None
    return _flatten(value, what)


@append_whole   # a builder that fails leaves no sub-block behind
def scan(step_fn, init, xs=None, *, length=None, reverse=False, name=None):
    """Apply `step_fn(carry, x) -> (carry, y)` along axis 0 of `xs` (lowered to lax.scan).

    `init` and `xs` are a Variable, a tuple of them or None (no carry, or
    `length` steps without sequences); `step_fn` sees `carry` and `x` (the
    slice of each sequence) in the same structure, and returns the new carry,
    of the same shapes and dtypes, and `y` (a Variable, a tuple of them or None).
    Returns (final carry, y stacked along a new axis 0), as `lax.scan` does.
    `reverse` scans from the last element to the first. The scan op also outputs
    every value the step computes, stacked (`Saved`), for its gradient to read
    instead of computing them again; what nothing reads, XLA does not compute.
    """
    program = default_main_program()
    init_vars, rebuild_carry = _as_list(init, "scan's init")
    seq_vars, rebuild_x = _as_list(xs, "scan's xs")
    with block_guard(program) as block:
        carry_in = [block.create_var(program.unique_name(f"{v.name}.carry"), v.shape, v.dtype)
                    for v in init_vars]
        x_in = [block.create_var(program.unique_name(f"{v.name}.step"), v.shape[1:], v.dtype)
                for v in seq_vars]
        result = step_fn(rebuild_carry(carry_in), rebuild_x(x_in))
        if not isinstance(result, tuple) or len(result) != 2:
            raise ProgramError("a scan step must return (carry, y)")
        carry_out, _ = _as_list(result[0], "a scan step's carry")
        y_out, rebuild_y = _as_list(result[1], "a scan step's y")
    if len(carry_out) != len(init_vars):
        raise ProgramError(f"the scan step returns {len(carry_out)} carried values for "
                           f"{len(init_vars)} in init")
    carry, ys = scan_op(program, block, list(zip(init_vars, carry_in, carry_out)),
                        list(zip(seq_vars, x_in)), y_out, reverse, length, name)
    return rebuild_carry(carry), rebuild_y(ys)


def scan_op(program, block, carries, sequences, y_out, reverse=False, length=None, name=None):
    """Append the scan op running the step `block` (built in `block_guard`) to the current
    block: `carries` are [(initial value, step variable bound to it, step variable handed
    on)], `sequences` [(sequence, step variable bound to its slice)], `y_out` the step's
    outputs. Persistables of enclosing blocks the step writes are carried too, and written
    back. Returns ([final carries], [stacked outputs]) as Variables of the current block."""
    state = _carry_persistables(program, block)
    carry_in = [v.name for _, v, _ in carries] + [first for _, first, _ in state]
    carry_out = [v.name for _, _, v in carries] + [last for _, _, last in state]
    results = carry_out + [v.name for v in y_out]
    saved = list(dict.fromkeys(n for op_desc in block.desc.ops for s in op_desc.outputs
                               for n in s.arguments if n in block.vars))
    outer = program.current_block()
    op = outer.append_op(
        "scan", {"Init": [v for v, _, _ in carries] + [v for v, _, _ in state],
                 "X": [v for v, _ in sequences], "Input": _captures(program, [(block, results)])},
        None, {"block": block.idx, "carry_in": carry_in, "x_in": [v.name for _, v in sequences],
               "carry_out": carry_out, "y_out": [v.name for v in y_out], "saved": saved,
               "reverse": reverse, "length": -1 if length is None else length}, name=name)
    _write_back(outer, op.desc, state)
    out_map = op.outputs
    return ([outer.var(n) for n in out_map.get("Carry", [])[:len(carries)]],
            [outer.var(n) for n in out_map.get("Y", [])])


@append_whole   # a builder that fails leaves no sub-block behind
def while_loop(cond_fn, body_fn, loop_vars, max_iters=None, name=None):
    """Run `loop_vars = body_fn(*loop_vars)` while `cond_fn(*loop_vars)` holds.

    `loop_vars` is a Variable or a tuple/list of them; `cond_fn` returns a bool
    scalar Variable and `body_fn` the next loop variables, of the same shapes
    and dtypes, in the same structure, which `while_loop` returns. Without
    `max_iters` it lowers to `lax.while_loop` and has no gradient; with it, to
    a `lax.scan` of `max_iters` steps that applies the body only while the
    condition holds (stopping after `max_iters` iterations at most), whose
    gradient is a reverse scan, as a scan's is.
    """
    program = default_main_program()
    init_vars, rebuild = _flatten(loop_vars, "while_loop's loop_vars")
    with block_guard(program) as block:
        carry_in = [block.create_var(program.unique_name(f"{v.name}.loop"), v.shape, v.dtype)
                    for v in init_vars]
        holds = cond_fn(*carry_in)
        if not isinstance(holds, Variable):
            raise ProgramError(f"a while_loop's cond_fn must return a bool scalar Variable, "
                               f"got {type(holds).__name__}")
        carry_out, _ = _flatten(body_fn(*carry_in), "a while_loop's body_fn")
    if len(carry_out) != len(init_vars):
        raise ProgramError(f"the while_loop body returns {len(carry_out)} loop variables for "
                           f"{len(init_vars)} in loop_vars")
    state = _carry_persistables(program, block)
    carry_in = [v.name for v in carry_in] + [first for _, first, _ in state]
    carry_out = [v.name for v in carry_out] + [last for _, _, last in state]
    outer = program.current_block()
    op = outer.append_op(
        "while", {"Init": init_vars + [v for v, _, _ in state],
                  "Input": _captures(program, [(block, [holds.name] + carry_out)])}, None,
        {"block": block.idx, "carry_in": carry_in, "carry_out": carry_out, "cond": holds.name,
         "max_iters": -1 if max_iters is None else max_iters}, name=name)
    _write_back(outer, op.desc, state)
    return rebuild([outer.var(n) for n in op.outputs["Carry"][:len(init_vars)]])
