"""`pd.Model`: a training step written once as eager code, recorded on its first call and
replayed compiled afterwards (SINGA's `Model`: `compile`, `train_one_batch`, `graph`).

    class MLP(pd.Model):
        def __init__(self):
            super().__init__(seed=0)
            self.optimizer = pd.optimizer.Adam(0.01)

        def forward(self, x):
            return layers.fc(layers.fc(x, 16, act="tanh"), 1)

        def train_one_batch(self, x, y):
            loss = layers.mse_loss(self.forward(x), y)
            self.optimizer.minimize(loss)
            return loss

    model = MLP()
    model.compile([x0, y0], is_train=True, use_graph=True)
    for x, y in batches:
        loss = model.train_one_batch(x, y)       # a NumPy array

Graph on (the default): the first call of `train_one_batch` (or `forward`) with inputs of
a new signature (dtypes, and shapes past the batch dim) runs the Python body once,
recording its ops into a fresh pair of programs (main and startup) without running them;
the parameters the Scope lacks are initialised by the startup program's ops that write
them, and the main program runs through the model's Executor, exactly as `Executor.run`
runs it. Every later call with that signature runs the compiled program and not the
Python body. Python side effects of the body (appending to a list, printing, counting)
therefore happen once per recording, a Python number the body reads into an op (a counter
of its own) keeps the value it had then, and turning a value into a Python bool, int or
float in the body is a `RecordingError` naming the line (use `pd.control_flow`).

Graph off (`model.graph(False)`): every call runs the body in eager mode, op by op, in
fresh programs: values can be read (`var.numpy()`, `float(loss)`) and the call returns
the body's Variables. Both modes read and write the same Scope (`model.scope`): the
parameters, optimizer moments, the learning-rate step counter and the RNG state, so the
graph can be switched off and on at any time. Parameters are created on first use by
their (per-program, deterministic) names, `fc_0.w_0`...: every recording creates the same
names, and an initializer whose variables the Scope already holds does not run.
"""
import dataclasses
import functools
import warnings

import numpy as np

from lowering import dtypes
from lowering.errors import ProgramError
from progdesc import io
from progdesc.callsites import user_callsite
from progdesc.executor import Executor
from progdesc.framework import Program, Variable, data, program_guard
from progdesc.recording.capture import input_names
from progdesc.recording.mode import eager
from progdesc.recording.values import RecordingWarning
from progdesc.scope import Scope, scope_guard

_STEPS = ("train_one_batch", "forward")   # the methods a Model records and replays
_MAX_REPLAYS = 1024   # remembered input signatures (per batch size where it varies)


@dataclasses.dataclass
class Recording:
    """One recorded step: which method (`kind`), in which mode (`training`), for which
    input `signature`; its `program` and `startup_program`, the data variables it is fed
    by (`feed_names`) and the variables it fetches (`fetch_names`, in the order of the
    method's results); `structure` says how they come back (see `Model`)."""
    kind: str
    training: bool
    signature: tuple
    program: Program
    startup_program: Program
    feed_names: list
    fetch_names: list
    structure: str


class Model:
    """A model whose `train_one_batch(*inputs)` and `forward(*inputs)` are eager code,
    recorded on first call and replayed compiled (module docstring).

    A subclass calls layers in `forward` / `train_one_batch` (parameters are created by the
    first recording and kept in `scope`) and keeps its optimizer as an attribute, calling
    its `minimize(loss)` in `train_one_batch`. `seed` is the programs' `random_seed`
    (initial parameters, dropout); `scope` holds the model's state (a fresh Scope by
    default). In graph mode a step returns NumPy arrays, shaped as the body's return value
    (one Variable: one array; a tuple or list: a tuple; None: None); in eager mode it
    returns the body's Variables, which hold their values.
    """

    batch_polymorphic = True
    """Whether recorded programs take any batch size (the leading dim of every input is
    unknown); set it False in a subclass whose body needs a known batch size: then each
    new batch size records again."""

    def __init__(self, seed=0, scope=None):
        self.seed = int(seed)
        self.scope = Scope() if scope is None else scope
        self.executor = Executor()
        self.training = True
        self.use_graph = True
        self.sequential = False
        self.recordings = {}     # (kind, training, signature) -> Recording
        self.calls = {k: 0 for k in _STEPS}   # how often each body ran (recording or eager)
        self._examples = None
        self._inside = 0
        self._last = {}          # (kind, training) -> the latest Recording
        self._state_names = {}   # persistable name -> whether a trainable parameter
        self._replays = {}       # (kind, training, inputs' dtypes and shapes) -> Recording

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for name in _STEPS:
            fn = cls.__dict__.get(name)
            if fn is not None and callable(fn):
                setattr(cls, name, _stepped(name, fn))

    def _ready(self):
        """The model's state, set up here when a subclass's __init__ skipped Model's."""
        if "recordings" not in self.__dict__:
            kept = dict(self.__dict__)   # what the subclass set stays as it set it
            Model.__init__(self)
            self.__dict__.update(kept)

    # --- SINGA's interface ---

    def compile(self, inputs, is_train=True, use_graph=True, sequential=False):
        """Prepare the model: `inputs` are example inputs (arrays) of `train_one_batch`
        (`is_train`) or of `forward`; the train program is recorded from them when it is
        first needed (`train_program`, `save`, `load`), else at the first call. `use_graph`
        turns graph mode on or off (`graph`); `sequential` is kept for SINGA's signature:
        in graph mode XLA schedules the compiled step, and eager mode runs ops in program
        order. Returns the model."""
        self._ready()
        self._examples = (bool(is_train), [np.asarray(x) for x in inputs])
        self.training = bool(is_train)
        self.graph(use_graph, sequential)
        return self

    def graph(self, mode=True, sequential=False):
        """Turn graph mode on (record once, replay compiled) or off (run eagerly op by op);
        either way on the same parameters and optimizer state. Returns the model."""
        self._ready()
        self.use_graph, self.sequential = bool(mode), bool(sequential)
        return self

    def train(self, mode=True):
        """Training mode (True) or eval mode (False): `forward` called outside
        `train_one_batch` records its own program per mode, the eval one with `is_test` set
        on its ops (dropout off, batch_norm with running statistics). A body can read
        `self.training` too (`layers.dropout(h, 0.1, is_test=not self.training)`), which
        eager mode needs. Returns the model."""
        self._ready()
        self.training = bool(mode)
        return self

    def eval(self):
        """`train(False)`."""
        return self.train(False)

    def __call__(self, *inputs):
        """`forward(*inputs)`."""
        return self.forward(*inputs)

    def forward(self, *inputs):
        """The model's forward pass: a subclass defines it (and `train_one_batch`)."""
        raise NotImplementedError(f"{type(self).__name__} defines no forward(...)")

    def train_one_batch(self, *inputs):
        """One training step (forward, loss, `optimizer.minimize(loss)`): a subclass
        defines it."""
        raise NotImplementedError(f"{type(self).__name__} defines no train_one_batch(...)")

    # --- what was recorded ---

    @property
    def train_program(self):
        """The main program of the latest graph-mode `train_one_batch` recording (recorded
        now from `compile`'s example inputs if there is none yet)."""
        return self._recording("train_one_batch", True).program

    @property
    def startup_program(self):
        """The startup program of that recording: the initializers of its parameters and
        optimizer state."""
        return self._recording("train_one_batch", True).startup_program

    @property
    def eval_program(self):
        """The main program of the latest graph-mode `forward` recording in eval mode
        (recorded now from `compile(..., is_train=False)`'s examples if there is none)."""
        return self._recording("forward", False).program

    def _recording(self, kind, training):
        self._ready()
        found = self._last.get((kind, training))
        examples = self._examples
        if found is None and examples is not None and examples[0] == (
                kind == "train_one_batch") and training == examples[0]:
            body = getattr(getattr(type(self), kind), "__wrapped__", None)
            found = body and self._record(kind, body, training, examples[1])
        if found is None:
            what = "model.eval(); model(x)" if kind == "forward" else \
                "model.compile(example_inputs) or a train_one_batch call"
            raise ProgramError(f"the model has no graph-mode {kind} recording "
                               f"({'training' if training else 'eval'} mode) yet: {what} "
                               "records one", callsite=user_callsite())
        return found

    # --- state ---

    def parameters(self):
        """{name: NumPy array} of the trainable parameters the recordings created, read
        from `scope`."""
        self._ready()
        return {name: np.array(self.scope.get(name)) for name in self._names(True)}

    def state_dict(self):
        """{name: NumPy array} of every persistable the recordings use that the Scope holds:
        parameters, optimizer state, the step counter, the RNG state."""
        self._ready()
        return {name: np.array(self.scope.get(name)) for name in self._names(False)
                if name in self.scope}

    def _names(self, trainable):
        return [n for n, is_param in self._state_names.items() if is_param or not trainable]

    def _note_state(self, program):
        for name, var in io.persistable_vars(program).items():
            self._state_names.setdefault(name, var.is_parameter)

    def save(self, path):
        """Write the train program's persistables (parameters, optimizer state) from
        `scope` to a checkpoint file (`pd.io.save_checkpoint`)."""
        io.save_checkpoint(path, self._checkpoint_program(), self.scope)

    def load(self, path, allow_missing=False):
        """Load a checkpoint written by `save` (or `pd.io.save_checkpoint` of the same
        program) into `scope`, checked first (`pd.io.load_checkpoint`); returns the names
        loaded."""
        return io.load_checkpoint(path, self._checkpoint_program(), self.scope, allow_missing)

    def _checkpoint_program(self):
        self._ready()
        if self._last.get(("train_one_batch", True)) is None and self._examples is not None \
                and not self._examples[0]:
            return self._recording("forward", False).program
        return self.train_program

    def __repr__(self):
        if "recordings" not in self.__dict__:
            return f"<{type(self).__name__} (pd.Model, not set up)>"
        params = self._names(True)
        size = sum(int(np.prod(self.scope.get(n).shape)) for n in params if n in self.scope)
        counts = ", ".join(f"{k} x{sum(r.kind == k for r in self.recordings.values())}"
                           for k in _STEPS)
        return (f"<{type(self).__name__} (pd.Model): graph {'on' if self.use_graph else 'off'}"
                f", {'training' if self.training else 'eval'}, {len(params)} parameters "
                f"({size} values), recorded: {counts}>")

    # --- running a step ---

    def _step(self, kind, fn, inputs):
        """Run step `kind` (its undecorated body `fn`) on `inputs` where the fast path of
        `_stepped` did not: in eager mode the body; in graph mode the recording for these
        inputs' signature, made first where there is none."""
        self._ready()
        training = kind == "train_one_batch" or self.training
        if not self.use_graph:
            return self._run_eagerly(kind, fn, training, inputs)
        arrays = [x if hasattr(x, "dtype") else np.asarray(x) for x in inputs]
        rec = self.recordings.get((kind, training, self._signature(arrays)))
        if rec is None:
            rec = self._record(kind, fn, training, arrays)
        if all(hasattr(x, "dtype") for x in inputs):
            replays = self._replays
            if len(replays) >= _MAX_REPLAYS:
                replays.clear()
            replays[(kind, training, *[(x.dtype, x.shape) for x in inputs])] = rec
        return self._replay(rec, inputs)

    def _replay(self, rec, inputs):
        """Run recording `rec` on `inputs` through the Executor; its results as NumPy."""
        outs = self.executor.run(rec.program, feed=dict(zip(rec.feed_names, inputs)),
                                 fetch_list=rec.fetch_names, scope=self.scope)
        return _shaped(outs, rec.structure)

    def _signature(self, arrays):
        """The signature recordings are kept by: per input its dtype (float64 as the
        float32 it is fed as), its shape (past the batch dim where the program takes any
        batch size) and rank."""
        sig = []
        for a in arrays:
            dtype = np.dtype(a.dtype)
            dtype = np.float32 if dtype == np.float64 else dtype   # as the feed converts
            shape = tuple(a.shape)
            sig.append((np.dtype(dtype).name, shape[1:] if self.batch_polymorphic and shape
                        else shape, len(shape)))
        return tuple(sig)

    def _declare_inputs(self, fn, arrays, eager_values):
        """Data variables named after `fn`'s parameters, one per input."""
        variables = []
        for name, array in zip(input_names(functools.partial(fn, self), len(arrays)),
                               arrays):
            array = np.asarray(array)
            dtype = np.float32 if array.dtype == np.float64 else array.dtype
            shape = list(array.shape)
            if self.batch_polymorphic and shape:
                shape[0] = None
            variables.append(data(name, shape, dtypes.name_of(dtype),
                                  value=array if eager_values else None))
        return variables

    def _record(self, kind, fn, training, arrays):
        """Record `fn` into fresh programs (ops appended, none run), initialise what the
        Scope lacks, and keep the Recording."""
        main, startup = Program(random_seed=self.seed), Program(random_seed=self.seed)
        held = set(self._names(True))
        with scope_guard(self.scope), program_guard(main, startup), \
                eager.recording_only(f"pd.Model records {kind}"), self._body(kind, training):
            variables = self._declare_inputs(fn, arrays, eager_values=False)
            result = fn(self, *variables)
        structure, fetch = _flatten(result, kind)
        fetch_names = [v.name for v in fetch]
        if not training:   # eval mode: is_test on every op that has it
            main = main.clone(for_test=True)
        new = [p.name for p in main.all_parameters() if p.name not in self.scope]
        if held and new:
            warnings.warn(
                f"{kind} ({'training' if training else 'eval'} mode) created parameters "
                f"{', '.join(new)} that earlier recordings of this model do not have: a "
                "body must call the same layers in the same order each time to reuse them",
                RecordingWarning, stacklevel=3)
        self._initialise(startup)
        self._note_state(main)
        rec = Recording(kind, training, self._signature(arrays), main, startup,
                        [v.name for v in variables], fetch_names, structure)
        self.recordings[(kind, training, rec.signature)] = rec
        self._last[(kind, training)] = rec
        return rec

    def _initialise(self, startup):
        """Run the ops of `startup` that write a variable the Scope lacks."""
        block = startup.global_block()
        keep = [all(n not in self.scope for s in op.outputs for n in s.arguments)
                for op in block.desc.ops]
        if not any(keep):
            return
        if not all(keep):
            startup = startup.clone()
            block = startup.global_block()
            kept = [op for op, k in zip(block.desc.ops, keep) if k]
            del block.desc.ops[:]
            block.desc.ops.extend(kept)
            block.sync()
            startup.mark_changed()
        self.executor.run(startup, scope=self.scope)

    def _run_eagerly(self, kind, fn, training, inputs):
        """Run the body op by op in eager mode, in fresh programs, on the Scope's state."""
        main, startup = Program(random_seed=self.seed), Program(random_seed=self.seed)
        with scope_guard(self.scope), program_guard(main, startup), eager(), \
                eager.keeping_state(startup), self._body(kind, training):
            variables = self._declare_inputs(fn, inputs, eager_values=True)
            result = fn(self, *variables)
        self._note_state(main)
        _flatten(result, kind)
        return result

    def _body(self, kind, training):
        return _Body(self, kind, training)


class _Body:
    """Around a run of a step's Python body: counts it, sets `training`, and lets calls
    of the other step from inside it (`self.forward` in `train_one_batch`) run inline."""

    def __init__(self, model, kind, training):
        self.model, self.kind, self.training = model, kind, training

    def __enter__(self):
        model = self.model
        model.calls[self.kind] += 1
        self.saved = model.training
        model.training = self.training
        model._inside += 1

    def __exit__(self, *exc):
        self.model._inside -= 1
        self.model.training = self.saved


def _stepped(kind, fn):
    """`fn` (a subclass's step method), recorded and replayed by its Model. The replay of
    inputs seen before (same dtypes and shapes, same mode) is looked up here at once: it is
    all a graph-mode step costs besides `Executor.run`."""
    train = kind == "train_one_batch"

    @functools.wraps(fn)
    def step(self, *inputs):
        state = self.__dict__
        if state.get("_inside"):   # called from inside a body: part of its recording
            return fn(self, *inputs)
        replays = state.get("_replays")
        if replays and state["use_graph"]:
            try:
                rec = replays.get((kind, train or state["training"],
                                   *[(x.dtype, x.shape) for x in inputs]))
            except AttributeError:   # a Python number or list among the inputs
                rec = None
            if rec is not None:
                return self._replay(rec, inputs)
        return self._step(kind, fn, inputs)
    return step


def _flatten(result, kind):
    """(structure, [Variables]) of what a step body returned."""
    if result is None:
        return "none", []
    if isinstance(result, Variable):
        return "one", [result]
    if isinstance(result, (tuple, list)) and all(isinstance(v, Variable) for v in result):
        return "tuple", list(result)
    raise ProgramError(f"{kind} must return a Variable, a tuple or list of Variables, or "
                       f"None, got {type(result).__name__}", callsite=user_callsite())


def _shaped(outs, structure):
    """The fetched `outs` shaped as the body's return value was."""
    if structure == "one":
        return outs[0]
    return tuple(outs) if structure == "tuple" else None

