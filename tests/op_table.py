"""The op sample table, in the spirit of PyTorch's OpInfo.

Every registered op type has entries in `tests/samples/<family>.py` (a list
`SAMPLES` of `Sample`). Each entry gives inputs, attributes and an
independent NumPy reference; the tests in test_op_table.py run all entries (CI runs the
costly checks, gradients and unknown-batch shapes, on each op's first entry only).
A module's `INVALID` list of `Invalid` gives inputs its ops must refuse.
"""
import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from lowering.errors import ShapeError


@dataclass
class Sample:
    """One sample of one op.

    `inputs` maps input slot names to arrays (a list of arrays for a many
    slot). `ref(**inputs, **attrs)` is the NumPy reference: one array, or a
    tuple with one entry per output slot (None to skip an output). Random
    ops give `check(outputs, inputs)` instead, asserting properties of the
    {slot: [arrays]} outputs. `grad=False` skips the gradient checks (say
    why in `name`); `grad_slots` limits them to some inputs. `symbolic`
    False skips the unknown-batch-dim shape check.

    An op with sub-blocks (cond, scan, ...) is built through its builder
    instead: `build(**variables)` gets the input Variables by slot name and
    returns the builder's result (a Variable or a tuple of them). `ref(**inputs)`
    then gives one array per returned Variable, and the gradient checks
    differentiate the returned Variables w.r.t. the float inputs.
    """
    op: str
    inputs: dict
    ref: Optional[Callable] = None
    attrs: dict = field(default_factory=dict)
    name: str = ""
    check: Optional[Callable] = None
    rtol: float = 1e-5
    atol: float = 1e-6
    grad: bool = True
    grad_slots: Optional[tuple] = None
    grad_rtol: float = 1e-4
    grad_atol: float = 1e-5
    symbolic: bool = True
    build: Optional[Callable] = None

    @property
    def id(self):
        """Test id: 'op-name'."""
        return f"{self.op}-{self.name}" if self.name else self.op


@dataclass
class Invalid:
    """Inputs an op must refuse when it is appended, with a typed error in the op's terms.

    `inputs` maps input slot names to `spec(...)` results (a list of them for a
    many slot); `expect` lists fragments the message must hold: the slot, and
    the expected and actual shapes or dtypes. `error` is the ProgdescError
    subclass raised.
    """
    op: str
    inputs: dict
    expect: tuple
    attrs: dict = field(default_factory=dict)
    name: str = ""
    error: type = ShapeError

    @property
    def id(self):
        """Test id: 'op-name'."""
        return f"{self.op}-{self.name}" if self.name else self.op


def spec(*dims, dtype="float32"):
    """An input of an Invalid case: (dims, dtype name); -1 for an unknown dim."""
    return list(dims), dtype


def _sample_modules():
    import samples  # tests/ is on sys.path under pytest
    return [importlib.import_module(f"samples.{mod.name}")
            for mod in pkgutil.iter_modules(samples.__path__)]


def all_invalid():
    """Every Invalid case of every module in tests/samples (their `INVALID` lists)."""
    return [case for mod in _sample_modules() for case in getattr(mod, "INVALID", ())]


def all_samples():
    """Every Sample of every module in tests/samples."""
    return [sample for mod in _sample_modules() for sample in mod.SAMPLES]


def rand(*shape, dtype="float32", low=-1.0, high=1.0, seed=0):
    """Deterministic uniform random array of `shape` (a sample helper)."""
    rng = np.random.default_rng(seed + sum(shape) * 7 + len(shape))
    return rng.uniform(low, high, size=shape).astype(dtype)


def positive(*shape, dtype="float32", seed=0):
    """Deterministic random array in [0.5, 2) (for log, sqrt, pow, division)."""
    return rand(*shape, dtype=dtype, low=0.5, high=2.0, seed=seed)
