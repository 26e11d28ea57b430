"""Checks of a Flax example imported by `pd.from_flax`, against Flax, jax.grad and optax
running the original.

An `Example` is a model written in the shape of google/flax's examples/ (in the tests,
not copied from there), an example batch, and the loss its training step minimizes,
written as those examples write it: `loss_fn(model, *inputs, *targets)` (for linen,
`model` is the bound module, as `module.apply(..., method=loss_fn)` passes it).
`check_example` imports it as a user would and asserts:

1. forward: the imported model's outputs equal the original's (1e-5 relative);
2. gradients of the imported loss with respect to every parameter equal jax.grad's of
   the original loss (1e-4 relative);
3. `steps` Adam steps of the imported loss leave every parameter and statistic where as
   many `optax.adam` steps leave the original's (1e-4 relative);
4. the imported forward, exported to a `.pdx` (its evaluation mode where the model has
   one), runs at two other batch sizes as the original does (1e-5 relative).
"""
import dataclasses
from typing import Callable

import jax
import numpy as np
import optax
import pytest

import progdesc as pd
from progdesc.export import export_compiled, load_compiled

FORWARD, GRADIENT, TRAINED = 1e-5, 1e-4, 1e-4


@dataclasses.dataclass
class Example:
    """A model to import, its example batch and the loss of its training step."""
    model: object                 # a flax.linen or flax.nnx Module
    variables: object             # what linen's `init` returned; None for an nnx module
    inputs: tuple                 # the example batch's inputs, batch dim first
    targets: tuple                # what the loss compares the outputs with
    loss_fn: Callable             # loss_fn(model, *inputs, *targets, **train_kwargs) -> scalar
    inputs_at: Callable           # batch size -> inputs of that many examples
    train_kwargs: dict = dataclasses.field(default_factory=dict)   # apply keywords (train=True, rngs=)
    eval_kwargs: object = None    # linen: apply keywords of its eval mode; nnx: True; None: none
    import_kwargs: dict = dataclasses.field(default_factory=dict)  # more from_flax keywords
    learning_rate: float = 1e-3
    steps: int = 30
    export_batches: tuple = (1, 3)


def cases(examples, slow=()):
    """pytest parameters of the names of `examples`, those in `slow` marked slow: XLA's
    compiles make a model with dropout or many layers cost a minute of CPU, so CI runs
    the rest and `make test-all` every one."""
    return [pytest.param(name, marks=pytest.mark.slow) if name in slow else name
            for name in examples]


def check_example(example, tmp_path):
    """Assert the four checks of the module docstring on `example`."""
    reference = _Linen(example) if example.variables is not None else _Nnx(example)
    check_forward(example, reference)
    check_gradients(example, reference)
    check_training(example, reference)
    check_export(example, reference, tmp_path)


def assert_close(got, want, rel, what):
    """`got` equals `want` within `rel` of the larger of 1 and want's largest magnitude."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} vs {want.shape}"
    scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
    np.testing.assert_allclose(got, want, rtol=rel, atol=rel * scale, err_msg=what)


def check_forward(example, reference):
    scope = pd.Scope()
    program, feeds, fetches = pd.from_flax(example.model, example.variables, *example.inputs,
                                           scope=scope, **example.import_kwargs,
                                           **example.train_kwargs)
    got = pd.Executor().run(program, feed=dict(zip(feeds, _leaves(example.inputs))),
                            fetch_list=fetches, scope=scope)
    want = jax.tree_util.tree_leaves(reference.forward(example.inputs))
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert_close(g, w, FORWARD, f"forward output {i}")


def check_gradients(example, reference):
    scope, program, feeds, loss = _imported_loss(example)
    names = sorted(p.name for p in program.all_parameters())
    block = program.global_block()
    grads = pd.gradients(loss, [block.var(n) for n in names])
    reached = [(n, g) for n, g in zip(names, grads) if g is not None]
    got = pd.Executor().run(program, feed=_loss_feed(example, feeds),
                            fetch_list=[g for _, g in reached], scope=scope)
    want = reference.gradients()
    assert set(names) == set(want), (sorted(names), sorted(want))
    got = dict(zip([n for n, _ in reached], got))
    for name in names:   # a parameter the loss does not reach has no gradient: JAX's are 0
        assert_close(got.get(name, np.zeros_like(want[name])), want[name], GRADIENT,
                     f"gradient of {name}")


def check_training(example, reference):
    scope, program, feeds, loss = _imported_loss(example)
    startup = pd.Program()
    with pd.program_guard(program, startup):
        pd.optimizer.Adam(example.learning_rate).minimize(loss)
    exe = pd.Executor()
    exe.run(startup, scope=scope)
    feed = _loss_feed(example, feeds)
    for _ in range(example.steps):
        exe.run(program, feed=feed, fetch_list=[loss], scope=scope)
    want = reference.trained()
    assert {p.name for p in program.all_parameters()} <= set(want)
    for name, value in want.items():
        assert_close(scope.get(name), value, TRAINED, f"{name} after {example.steps} Adam steps")


def check_export(example, reference, tmp_path):
    scope = pd.Scope()
    program, feeds, fetches = pd.from_flax(example.model, example.variables, *example.inputs,
                                           scope=scope, eval_mode=example.eval_kwargs,
                                           **example.import_kwargs, **example.train_kwargs)
    path = str(tmp_path / "example.pdx")
    export_compiled(path, program, feeds, fetches, scope,   # the import's symbolic dims
                    batch_polymorphic=example.import_kwargs.get("batch_polymorphic", True))
    served = load_compiled(path)
    for batch in example.export_batches:
        inputs = example.inputs_at(batch)
        got = served(*_leaves(inputs))
        want = jax.tree_util.tree_leaves(reference.forward(inputs, evaluating=True))
        for i, (g, w) in enumerate(zip(got, want)):
            assert_close(g, w, FORWARD, f"exported output {i} at batch {batch}")


def _leaves(inputs):
    return jax.tree_util.tree_leaves(tuple(inputs))


def _imported_loss(example):
    scope = pd.Scope()
    program, feeds, fetches = pd.from_flax(
        example.model, example.variables, *example.inputs, *example.targets, scope=scope,
        method=example.loss_fn, **example.import_kwargs, **example.train_kwargs)
    assert len(fetches) == 1 and fetches[0].shape == (), fetches
    return scope, program, feeds, fetches[0]


def _loss_feed(example, feeds):
    return dict(zip(feeds, _leaves((*example.inputs, *example.targets))))


def _flat(tree, sep="."):
    """{'Dense_0.kernel': array} of a nested dict of arrays (boxed metadata unboxed)."""
    from flax import linen as nn
    from flax import traverse_util
    tree = nn.meta.unbox(tree)
    return {k: np.asarray(v) for k, v in traverse_util.flatten_dict(tree, sep=sep).items()}


class _Linen:
    """The original linen example: applied, differentiated and trained by Flax + optax."""

    def __init__(self, example):
        from flax.core import unfreeze
        self.example = example
        self.variables = unfreeze(example.variables)
        self.mutable = [c for c in self.variables if c != "params"]

    def _apply(self, variables, *args, method=None, **kwargs):
        """(output, variables after the call)."""
        model = self.example.model
        if not self.mutable:
            return model.apply(variables, *args, method=method, **kwargs), variables
        out, updates = model.apply(variables, *args, method=method, mutable=self.mutable,
                                   **kwargs)
        return out, {**variables, **updates}

    def forward(self, inputs, evaluating=False):
        kwargs = dict(self.example.train_kwargs)
        if evaluating and self.example.eval_kwargs:
            kwargs.update(self.example.eval_kwargs)
        return jax.jit(lambda v, *x: self._apply(v, *x, **kwargs)[0])(self.variables, *inputs)

    def _loss(self, params, variables, batch):
        return self._apply({**variables, "params": params}, *batch, method=self.example.loss_fn,
                           **self.example.train_kwargs)

    def gradients(self):
        batch = (*self.example.inputs, *self.example.targets)
        grads = jax.jit(jax.grad(lambda p: self._loss(p, self.variables, batch)[0]))(
            self.variables["params"])
        return _flat(grads)

    def trained(self):
        batch = (*self.example.inputs, *self.example.targets)
        opt = optax.adam(self.example.learning_rate)

        @jax.jit
        def step(variables, opt_state):
            (_, variables_after), grads = jax.value_and_grad(
                self._loss, has_aux=True)(variables["params"], variables, batch)
            updates, opt_state = opt.update(grads, opt_state, variables["params"])
            params = optax.apply_updates(variables["params"], updates)
            return {**variables_after, "params": params}, opt_state

        variables, opt_state = self.variables, opt.init(self.variables["params"])
        for _ in range(self.example.steps):
            variables, opt_state = step(variables, opt_state)
        flat = {}
        params = _flat(variables["params"])
        for collection, tree in variables.items():
            for name, value in _flat(tree).items():
                clash = collection != "params" and name in params
                flat[f"{collection}.{name}" if clash else name] = value
        return flat


class _Nnx:
    """The original nnx example: a copy of the module, called, differentiated and trained
    by Flax + optax (the example's module itself is left as it is)."""

    def __init__(self, example):
        self.example = example

    def _copy(self, evaluating=False):
        from flax import nnx
        model = nnx.clone(self.example.model)
        if self.example.eval_kwargs:
            model.eval() if evaluating else model.train()
        return model

    def forward(self, inputs, evaluating=False):
        model = self._copy(evaluating)
        return model(*inputs, **self.example.train_kwargs)

    def _loss(self, model):
        example = self.example
        return example.loss_fn(model, *example.inputs, *example.targets,
                               **example.train_kwargs)

    def gradients(self):
        from flax import nnx
        grads = nnx.grad(self._loss)(self._copy())
        return _flat_state(grads)

    def trained(self):
        from flax import nnx
        model = self._copy()
        optimizer = nnx.Optimizer(model, optax.adam(self.example.learning_rate), wrt=nnx.Param)

        @nnx.jit
        def step(model, optimizer):
            optimizer.update(model, nnx.grad(self._loss)(model))

        for _ in range(self.example.steps):
            step(model, optimizer)
        return _flat_state(nnx.split(model, nnx.RngKey, ...)[2])


def _flat_state(state):
    """{'conv1.kernel': array} of an nnx State."""
    from flax import nnx
    return {".".join(map(str, path)): np.asarray(v.get_value() if hasattr(v, "get_value") else v)
            for path, v in nnx.to_flat_state(state)}

