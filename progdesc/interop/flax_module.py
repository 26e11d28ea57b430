"""A program as a Flax NNX module: `ProgramModule(program, feed, fetch, scope)`.

The module holds the persistables the program reads as NNX variables: trainable
parameters as `nnx.Param`, every other persistable (batch-norm running statistics,
parameters made with `trainable=False`) as `nnx.BatchStat`. Variable names hold dots
(`fc_0.w_0`), so each becomes an attribute with the dots written as `__` (`fc_0__w_0`);
`module.variable_names` maps attributes to program variables, and `module.attribute_of`
the other way.

Calling the module runs the program through `as_jax`: in training mode (`train()`, the
default) the program itself, writing the statistics it updates back into their
`BatchStat`s; in evaluation mode (`eval()`) its `clone(for_test=True)`. A program that
draws random numbers in training (dropout) takes its keys from the `rngs` given to the
constructor (stream `dropout`, else `default`).
"""
import keyword
import re

from flax import nnx

from lowering import progdesc_pb2 as pb
from lowering.errors import ProgramError
from progdesc.interop.as_jax import as_jax

_FORWARD_ROLES = (pb.FORWARD, pb.LOSS)


def attribute_name(var_name):
    """The attribute a program variable becomes: dots written as `__`, any other character
    that cannot stand in a Python name as `_`, and `v_` before a leading digit or keyword."""
    attr = re.sub(r"\W", "_", var_name.replace(".", "__"))
    if not attr or attr[0].isdigit() or keyword.iskeyword(attr):
        attr = "v_" + attr
    return attr


class ProgramModule(nnx.Module):
    """A forward program from `feed` to `fetch` as an `nnx.Module`; see the module docstring.

    `feed` lists the Variables (or names) the module is called with, in order; `fetch` is a
    list of them (the module returns a tuple) or one (it returns that value). Initial values
    come from `scope` (default: the global scope), where the startup program put them.
    """

    def __init__(self, program, feed, fetch, scope=None, *, rngs=None):
        _check_forward(program)
        self.deterministic = False
        self.rngs = rngs
        self._names = ()
        self._train_fn, train_values = as_jax(program, feed, fetch, scope, mutable=True)
        self._eval_fn, eval_values = as_jax(program.clone(for_test=True), feed, fetch, scope)
        block = program.global_block()
        names = {}
        for name, value in {**train_values, **eval_values}.items():
            attr = attribute_name(name)
            if attr in names.values() or hasattr(self, attr):
                other = next((n for n, a in names.items() if a == attr), None)
                raise ProgramError(f"becomes attribute '{attr}', which "
                                   + (f"'{other}' becomes too" if other else
                                      "ProgramModule uses itself"), var=name)
            var = block.var(name)
            trainable = var.is_parameter and not var.stop_gradient
            setattr(self, attr, (nnx.Param if trainable else nnx.BatchStat)(value))
            names[name] = attr
        self._names = tuple(names.items())     # static: hashable, in the order of the program

    @property
    def variable_names(self):
        """{attribute: program variable name} of every variable the module holds."""
        return {attr: name for name, attr in self._names}

    @property
    def attribute_of(self):
        """{program variable name: attribute}, the inverse of `variable_names`."""
        return dict(self._names)

    def set_view(self, deterministic=None):
        """Used by `nnx.view`: `deterministic=True` selects the test program."""
        if deterministic is not None:
            self.deterministic = deterministic

    def __call__(self, *feeds):
        """The fetched values of the program (training mode) or its test clone (`eval()`)."""
        fn = self._eval_fn if self.deterministic else self._train_fn
        attribute_of = self.attribute_of
        params = {name: getattr(self, attribute_of[name])[...] for name in fn.param_names}
        if self.deterministic:
            return fn(params, *feeds)
        rng = None
        if fn.needs_rng:
            if self.rngs is None:
                raise ProgramError("the program draws random numbers in training (dropout): "
                                   "give ProgramModule rngs=nnx.Rngs(...), or call eval()")
            rng = self.rngs.dropout()
        out, updates = fn(params, *feeds, rng=rng)
        for name, value in updates.items():
            if name in attribute_of:
                getattr(self, attribute_of[name])[...] = value
        return out


def _check_forward(program):
    """ProgramError naming the first backward or optimizer op of `program`."""
    for block in program.blocks:
        for i, op_desc in enumerate(block.desc.ops):
            if op_desc.role not in _FORWARD_ROLES:
                raise ProgramError(
                    "ProgramModule wraps a forward program, and this op belongs to its backward "
                    "or optimizer part (nnx.Optimizer trains the module): wrap a clone of the "
                    "program made before minimize", op_type=op_desc.type, op_index=i,
                    block_idx=block.idx, callsite=op_desc.callsite)
