"""Flax modules as programs: `from_flax` traces a linen or nnx module with `from_jax`'s
translator.

- Parameters (linen's "params" collection, nnx's `nnx.Param`s) become trainable
  parameters named by their path in the module (`Dense_0.kernel`, `layers.0.bias`),
  with the same values, placed in the Scope.
- Every other variable (linen's "batch_stats" and other collections, nnx's
  `BatchStat`s) becomes a persistable, non-trainable variable of the same name (its
  collection's name comes first if a parameter already has that name), except the keys
  of nnx's random-number streams (`nnx.RngKey`): they stay constants of the trace, so a
  module that draws random numbers (Dropout in training mode) is reported as using
  primitives progdesc does not translate; import it in eval mode.
- State the module updates when called (BatchNorm in training mode: linen traced with
  every non-"params" collection mutable, nnx by splitting the module again after the
  call) is written back by an `assign` from the new value into that variable, so each
  run of the program updates it in the Scope as Flax would return it. Call the
  module in the mode you want to import: a BatchNorm with `use_running_average=True`
  (or an nnx module after `.eval()`) reads its statistics and writes nothing.
"""
import jax

from lowering.errors import ProgramError
from progdesc.interop.from_jax import parameter_names, build, named_leaves


def from_flax(module, variables, *example_inputs, scope=None, method=None,
              batch_polymorphic=True, **apply_kwargs):
    """Trace a Flax module applied to `example_inputs` into a program.

    For a linen module, `variables` is what `module.init` returned; `method` and
    `apply_kwargs` (e.g. `train=True`) are passed to `module.apply`. For an nnx module,
    `variables` is None (the module's own variables) or an `nnx.State` of its variables
    other than random keys (`nnx.split(module, nnx.RngKey, ...)[2]`) to use instead; the module (or its method named `method`) is called with the inputs and
    `apply_kwargs`. Feeds are named after the call's parameters (`x`).

    Returns `(program, feed_names, fetch_targets)` with the parameters and statistics
    in `scope` (default: the global one); see the module's docstring for names, state
    and training mode. The program trains with `minimize` like any other. With
    `batch_polymorphic` (the default) the inputs' leading dim is the batch dim (-1), and
    the program runs at any batch size; see `from_jax`.
    """
    from flax import linen, nnx
    if isinstance(module, nnx.Module):
        return _from_nnx(module, variables, example_inputs, scope, method, apply_kwargs,
                         batch_polymorphic)
    if isinstance(module, linen.Module):
        return _from_linen(module, variables, example_inputs, scope, method, apply_kwargs,
                           batch_polymorphic)
    raise TypeError(f"from_flax expects a flax.linen or flax.nnx Module, "
                    f"got {type(module).__name__}")


def _build(call, state_tree, state_leaves, example_inputs, arg_names, scope, strip_names,
           batch_polymorphic):
    """Trace `call(state, *inputs) -> (output pytree, new state)` into a program; the
    state's leaves are [(name, value, 'param' or 'state')]."""
    input_tree = jax.tree_util.tree_structure(tuple(example_inputs))
    inputs = list(state_leaves)
    for arg_name, arg in zip(arg_names, example_inputs):
        inputs += [(n, v, "feed") for n, v in named_leaves(arg, arg_name)]
    n_state = len(state_leaves)
    is_state = [kind == "state" for _, _, kind in state_leaves]

    def flat_fn(*leaves):
        state = jax.tree_util.tree_unflatten(state_tree, leaves[:n_state])
        out, new_state = call(state, *jax.tree_util.tree_unflatten(input_tree,
                                                                   leaves[n_state:]))
        new_leaves, new_tree = jax.tree_util.tree_flatten(new_state)
        if new_tree != state_tree:
            raise ProgramError("the module's variables after the call differ in structure from "
                               f"those before it (variables made or dropped by the call?): "
                               f"{new_tree} vs {state_tree}")
        return (jax.tree_util.tree_leaves(out)
                + [v for v, s in zip(new_leaves, is_state) if s])

    writes = [name for name, _, kind in state_leaves if kind == "state"]
    return build(flat_fn, inputs, writes=writes, strip_names=strip_names, scope=scope,
                 batch_polymorphic=batch_polymorphic)


def _unique(entries):
    """Entries [(collection, name, value, kind)] as [(name, value, kind)]: a state
    variable whose name a parameter has takes its collection's name as a prefix."""
    params = {name for _, name, _, kind in entries if kind == "param"}
    return [(f"{c}.{name}" if kind == "state" and name in params else name, value, kind)
            for c, name, value, kind in entries]


def _from_linen(module, variables, example_inputs, scope, method, apply_kwargs, polymorphic):
    from flax.core import unfreeze
    variables = unfreeze(variables)
    mutable = [c for c in variables if c != "params"]
    entries = []
    for name, value in named_leaves(variables):
        collection, _, rest = name.partition(".")
        entries.append((collection, rest, value, "param" if collection == "params" else "state"))

    def call(state, *inputs):
        if not mutable:
            return module.apply(state, *inputs, method=method, **apply_kwargs), state
        out, updates = module.apply(state, *inputs, mutable=mutable, method=method,
                                    **apply_kwargs)
        updates = unfreeze(updates)
        return out, {c: updates.get(c, state[c]) for c in state}

    fn = getattr(module, method) if isinstance(method, str) else method or module.__call__
    return _build(call, jax.tree_util.tree_structure(variables), _unique(entries),
                  example_inputs, parameter_names(fn, len(example_inputs)), scope, 1,
                  polymorphic)


def _from_nnx(module, state, example_inputs, scope, method, apply_kwargs, polymorphic):
    from flax import nnx
    graphdef, rng_state, own_state = nnx.split(module, nnx.RngKey, ...)
    state = own_state if state is None else state
    types = {".".join(map(str, path)): type(v) for path, v in nnx.to_flat_state(state)}
    entries = []
    for name, value in named_leaves(state):
        if name.endswith(".value") and name.removesuffix(".value") in types:
            name = name.removesuffix(".value")   # the Variable's own field
        kind = types.get(name, nnx.Variable)
        entries.append((kind.__name__, name, value,
                        "param" if issubclass(kind, nnx.Param) else "state"))

    def call(state, *inputs):
        model = nnx.merge(graphdef, rng_state, state)
        out = getattr(model, method or "__call__")(*inputs, **apply_kwargs)
        return out, nnx.split(model, nnx.RngKey, ...)[2]

    fn = getattr(module, method or "__call__")
    return _build(call, jax.tree_util.tree_structure(state), _unique(entries), example_inputs,
                  parameter_names(fn, len(example_inputs)), scope, 0, polymorphic)
