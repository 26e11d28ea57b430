"""Flax modules as programs: `from_flax` traces a linen or nnx module with `from_jax`'s
translator.

- Parameters (linen's "params" collection, nnx's `nnx.Param`s) become trainable
  parameters named by their path in the module (`Dense_0.kernel`, `layers.0.bias`),
  with the same values, placed in the Scope. Partitioning metadata
  (`nn.with_partitioning`, `nn.with_logical_partitioning`, `nnx.with_partitioning`)
  leaves the names as they are: `Embed_0.embedding`, not `Embed_0.embedding.value`.
- Every other variable (linen's "batch_stats" and other collections, nnx's
  `BatchStat`s) becomes a persistable, non-trainable variable of the same name (its
  collection's name comes first if a parameter already has that name). The keys of
  nnx's random-number streams (`nnx.RngKey`) are such variables too, holding the keys'
  raw data (`drop.rngs.key`), and each stream's count (`nnx.RngCount`) is state
  the program updates, so Dropout in training mode draws Flax's masks, the next one at
  each run (inside `nnx.scan` over stacked layers too). A linen module's
  `rngs={'dropout': key}` keys are constants: the same mask at each run.
- State the module updates when called (BatchNorm in training mode: linen traced with
  every non-"params" collection mutable, nnx by splitting the module again after the
  call) is written back by an `assign` from the new value into that variable, so each
  run of the program updates it in the Scope as Flax would return it. A variable an nnx
  module makes during the call (`self.kl_loss = Loss(...)`, popped by its loss with
  `nnx.pop`) is a value of that call, kept by no variable. Call the
  module in the mode you want to import: a BatchNorm with `use_running_average=True`
  (or an nnx module after `.eval()`) reads its statistics and writes nothing.
"""
import functools
import inspect

import jax

from lowering.errors import ProgramError
from progdesc.interop.from_jax import parameter_names, build, named_leaves


def from_flax(module, variables, *example_inputs, scope=None, method=None,
              batch_polymorphic=True, axis_names=None, eval_mode=None, overwrite=False,
              program_rngs=False, **apply_kwargs):
    """Trace a Flax module applied to `example_inputs` into a program.

    For a linen module, `variables` is what `module.init` returned; `method` and
    `apply_kwargs` (e.g. `train=True`) are passed to `module.apply`. For an nnx module,
    `variables` is None (the module's own variables) or an `nnx.State` of its variables
    other than random keys (`nnx.split(module, nnx.RngKey, ...)[2]`) to use instead; the
    module (or its method named `method`) is called with the inputs and
    `apply_kwargs`. Either kind takes as `method` a function called with the module
    first, as a training step's loss is written (`def loss_fn(model, images, labels)`):
    the program then computes what it returns. Feeds are named after the call's
    parameters (`x`; `images`, `labels`).

    Returns `(program, feed_names, fetch_targets)` with the parameters and statistics
    in `scope` (default: the global one); see the module's docstring for names, state
    and training mode. A variable the Scope already holds with other values (a parameter
    trained since) is never replaced unless `overwrite=True`: a ScopeError naming it is
    raised instead (import into a fresh `pd.Scope()`, or pass the held values). The
    program trains with `minimize` like any other. With
    `batch_polymorphic` (the default) the inputs' leading dim is the batch dim (-1), and
    the program runs at any batch size; a dict chooses per input (a leading dim of its
    own, the batch dim, or fixed: `{"edges": "edges", "mask": False}`); see `from_jax`.
    `axis_names` maps the axis names
    of the module's collectives (`BatchNorm(axis_name="batch")`) to mesh axes, as in
    `from_jax`.

    `eval_mode` imports the module's evaluation behaviour too (BatchNorm's running
    averages, no dropout), for `clone(for_test=True)`, inference models and export: for a
    linen module, the `apply` keywords that select it (`eval_mode={"train": False}`,
    replacing those of `apply_kwargs`); for an nnx module, True (the module is traced once
    after `.train()` and once after `.eval()`). Where the two behaviours differ, the
    program holds both, chosen by a `mode_select` op's `is_test`: training runs use the
    first, a test clone the second.

    With `program_rngs`, the module's random-number streams (nnx's `RngKey`s, linen's
    `rngs={...}` keys) take a fresh key from the program's RNG state at each run
    instead: dropout masks differ from Flax's, but change at every step even in linen,
    and are reproducible from `program.random_seed`.
    """
    from flax import linen, nnx
    if eval_mode is not None and not (
            eval_mode is True if isinstance(module, nnx.Module) else isinstance(eval_mode, dict)):
        raise TypeError("eval_mode is True for an nnx module, a dict of apply keywords for a "
                        f"linen module (e.g. {{'train': False}}), got {eval_mode!r}")
    options = {"batch_polymorphic": batch_polymorphic, "axis_names": axis_names,
               "eval_mode": eval_mode, "overwrite": overwrite, "program_rngs": program_rngs}
    if isinstance(module, nnx.Module):
        return _from_nnx(module, variables, example_inputs, scope, method, apply_kwargs,
                         options)
    if isinstance(module, linen.Module):
        return _from_linen(module, variables, example_inputs, scope, method, apply_kwargs,
                           options)
    raise TypeError(f"from_flax expects a flax.linen or flax.nnx Module, "
                    f"got {type(module).__name__}")


def _build(call, state_tree, state_leaves, example_inputs, arg_names, scope, strip_names,
           options, kinds=None):
    """Trace `call(state, *inputs, eval_mode=False) -> (output pytree, new state)` into a
    program; the state's leaves are [(name, value, 'param' or 'state')], `options` the
    keywords of from_jax's `build` the user chose, and `eval_mode` (whether the module has
    an evaluation behaviour to import as well); `kinds` maps the name of an input that is
    no feed to its kind ('rng': keys from the program's RNG state; 'state': a persistable
    holding the value)."""
    options = dict(options)
    with_eval = options.pop("eval_mode") is not None
    options.pop("program_rngs")
    input_tree = jax.tree_util.tree_structure(tuple(example_inputs))
    inputs = list(state_leaves)
    for arg_name, arg in zip(arg_names, example_inputs):
        kind = (kinds or {}).get(arg_name, "feed")
        inputs += [(n, v, kind) for n, v in named_leaves(arg, arg_name)]
    n_state = len(state_leaves)
    is_state = [kind == "state" for _, _, kind in state_leaves]

    def flat_fn(*leaves, eval_mode=False):
        state = jax.tree_util.tree_unflatten(state_tree, leaves[:n_state])
        out, new_state = call(state, *jax.tree_util.tree_unflatten(input_tree,
                                                                   leaves[n_state:]),
                              eval_mode=eval_mode)
        new_leaves, new_tree = jax.tree_util.tree_flatten(new_state)
        if new_tree != state_tree:
            raise ProgramError("the module's variables after the call differ in structure from "
                               f"those before it (variables made or dropped by the call?): "
                               f"{new_tree} vs {state_tree}")
        return (jax.tree_util.tree_leaves(out)
                + [v for v, s in zip(new_leaves, is_state) if s])

    writes = [name for name, _, kind in state_leaves if kind == "state"]
    eval_fn = functools.partial(flat_fn, eval_mode=True) if with_eval else None
    return build(flat_fn, inputs, writes=writes, strip_names=strip_names, scope=scope,
                 eval_fn=eval_fn, **options)


def _unique(entries):
    """Entries [(collection, name, value, kind)] as [(name, value, kind)]: a state
    variable whose name a parameter has takes its collection's name as a prefix."""
    params = {name for _, name, _, kind in entries if kind == "param"}
    return [(f"{c}.{name}" if kind == "state" and name in params else name, value, kind)
            for c, name, value, kind in entries]


def _takes_module(method):
    """1 where `method` is a function called with the module first (a loss function
    `loss_fn(model, x, labels)`), else 0."""
    return int(callable(method) and not inspect.ismethod(method))


_RNGS = "rngs"   # the name of the keys of a module's random-number streams, drawn from the
                 # program's RNG state (from_flax(program_rngs=True))


def _from_linen(module, variables, example_inputs, scope, method, apply_kwargs, options):
    from flax.core import unfreeze
    variables = unfreeze(variables)
    mutable = [c for c in variables if c != "params"]
    entries = []
    for name, value in named_leaves(variables):
        collection, _, rest = name.partition(".")
        entries.append((collection, rest, value, "param" if collection == "params" else "state"))

    fn = getattr(module, method) if isinstance(method, str) else method or module.__call__
    arg_names = parameter_names(fn, len(example_inputs), skip=_takes_module(method))
    rngs = apply_kwargs.get("rngs") if options["program_rngs"] else None
    if rngs:   # the keys: a last input, drawn from the program's RNG state
        apply_kwargs = {k: v for k, v in apply_kwargs.items() if k != "rngs"}
        example_inputs, arg_names = (*example_inputs, rngs), [*arg_names, _RNGS]
    eval_kwargs = {**apply_kwargs, **(options["eval_mode"] or {})}

    def call(state, *inputs, eval_mode=False):
        kwargs = eval_kwargs if eval_mode else apply_kwargs
        if rngs:
            kwargs, inputs = dict(kwargs, rngs=inputs[-1]), inputs[:-1]
        if not mutable:
            return module.apply(state, *inputs, method=method, **kwargs), state
        out, updates = module.apply(state, *inputs, mutable=mutable, method=method, **kwargs)
        updates = unfreeze(updates)
        return out, {c: updates.get(c, state[c]) for c in state}

    return _build(call, jax.tree_util.tree_structure(variables), _unique(entries),
                  example_inputs, arg_names, scope, 1, options,
                  {_RNGS: "rng"} if rngs else None)


def _from_nnx(module, state, example_inputs, scope, method, apply_kwargs, options):
    from flax import nnx
    graphdef, rng_state, own_state = nnx.split(module, nnx.RngKey, ...)
    state = own_state if state is None else state
    types = {".".join(map(str, path)): type(v) for path, v in nnx.to_flat_state(state)}
    entries = []
    for name, value in named_leaves(state):   # a Variable's leaf is named after it
        kind = types.get(name, nnx.Variable)
        entries.append((kind.__name__, name, value,
                        "param" if issubclass(kind, nnx.Param) else "state"))

    fn = method if callable(method) else getattr(module, method or "__call__")
    arg_names = parameter_names(fn, len(example_inputs), skip=_takes_module(method))
    keys_in = bool(jax.tree_util.tree_leaves(rng_state))
    rng_name = _RNGS if options["program_rngs"] else ""   # as state: named by their paths
    if keys_in:   # the streams' keys: a last input, traced as the other variables are
        example_inputs, arg_names = (*example_inputs, rng_state), [*arg_names, rng_name]

    def call(state, *inputs, eval_mode=False):
        model = nnx.merge(graphdef, inputs[-1] if keys_in else rng_state, state)
        inputs = inputs[:-1] if keys_in else inputs
        if options["eval_mode"] is not None:
            if eval_mode:
                model.eval()
            else:
                model.train()
        if callable(method):
            out = method(model, *inputs, **apply_kwargs)
        else:
            out = getattr(model, method or "__call__")(*inputs, **apply_kwargs)
        return out, _kept(state, nnx.split(model, nnx.RngKey, ...)[2])

    return _build(call, jax.tree_util.tree_structure(state), _unique(entries), example_inputs,
                  arg_names, scope, 0, options,
                  {rng_name: "rng" if options["program_rngs"] else "state"} if keys_in else None)


def _kept(before, after):
    """The nnx State `after` a call, restricted to the variables `before` it: a variable
    the call made (`self.kl_loss = Loss(...)`) is a value of that call only, and one it
    dropped (`nnx.pop`) keeps its value."""
    from flax import nnx
    made = dict(nnx.to_flat_state(after))
    return nnx.from_flat_state([(path, made.get(path, value))
                                for path, value in nnx.to_flat_state(before)])
