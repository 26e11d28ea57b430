"""Control flow that reads like Python: `cond`, `switch` and `scan` build sub-blocks.

Each branch or step function is called once, at build time, inside a fresh
sub-block of the current block (`block_guard`): the ops it appends go there,
and it returns the Variables the sub-block hands back. Variables of enclosing
blocks it reads become the op's captured inputs; parameters it creates (an
`fc` in a scan step) live in the global block, shared by every run of it.

    y = control_flow.cond(x.sum() > 0, lambda: x * 2.0, lambda: -x)
"""
import contextlib

from lowering.blocks import free_reads
from lowering.errors import ProgramError
from progdesc.framework import Variable, default_main_program


@contextlib.contextmanager
def block_guard(program=None):
    """Inside, ops are appended to a new sub-block of the current block; yields the Block."""
    program = program or default_main_program()
    parent = program._current
    block = program.create_block(parent_idx=parent)
    try:
        yield block
    finally:
        program._current = parent


def _flatten(value, what):
    """([Variable], rebuild) of a Variable or a tuple/list of them."""
    if isinstance(value, Variable):
        return [value], lambda vs: vs[0]
    if isinstance(value, (tuple, list)) and all(isinstance(v, Variable) for v in value):
        kind = type(value)
        return list(value), lambda vs: kind(vs)
    raise ProgramError(f"{what} must return a Variable or a tuple of Variables, "
                       f"got {type(value).__name__}")


def _build(fn, what, args=()):
    """(sub-block, [result names], rebuild) of calling `fn(*args)` in a new sub-block."""
    with block_guard() as block:
        results, rebuild = _flatten(fn(*args), what)
    return block, [v.name for v in results], rebuild


def _captures(program, blocks):
    """The names of enclosing blocks that `blocks` ([(Block, results)]) read, in order."""
    names = []
    for block, results in blocks:
        names += [n for n in free_reads(program.desc, block.idx, results) if n not in names]
    return names


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


def cond(pred, true_fn, false_fn, name=None):
    """`true_fn()` if the bool scalar `pred` is true, else `false_fn()` (lowered to lax.cond).

    Both functions take no argument and return a Variable or a tuple of them,
    of the same shapes and dtypes; `cond` returns the same structure.
    """
    program, built, captures = _branches([true_fn, false_fn])
    (tb, touts, rebuild), (fb, fouts, _) = built
    _, out_map = program.current_block()._add_op(
        "cond", {"Cond": pred, "Input": captures}, None,
        {"true_block": tb.idx, "false_block": fb.idx, "true_outputs": touts,
         "false_outputs": fouts}, name=name)
    return _outputs(program, out_map, rebuild)


def switch(index, branch_fns, name=None):
    """`branch_fns[index]()` for the int scalar `index` (lowered to lax.switch, which clamps an
    index out of range to the first or last branch).

    Every function takes no argument and returns a Variable or a tuple of them,
    of the same shapes and dtypes across branches; `switch` returns the same structure.
    """
    program, built, captures = _branches(list(branch_fns))
    _, out_map = program.current_block()._add_op(
        "switch", {"Index": index, "Input": captures}, None,
        {"blocks": [b.idx for b, _, _ in built],
         "branch_outputs": [n for _, results, _ in built for n in results]}, name=name)
    return _outputs(program, out_map, built[0][2])
