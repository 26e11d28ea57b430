"""JAX functions as programs: `from_jax` traces a function to a jaxpr and translates each
equation into registered ops with the shared translator (`progdesc.translate`), one small
rule per primitive (`jax_rules.RULES`).

What becomes what:

- The example arguments become feed variables named after the function's parameters
  (`x`, or `batch.image` for a leaf of a pytree argument), with the example's shape
  and dtype, but for the batch dim: by default (`batch_polymorphic=True`) the leading
  dim of every non-scalar feed is traced as one symbolic dim (`jax.export.symbolic_shape`)
  and declared -1, and a size computed from it becomes a form an op computes from its
  inputs at run time: a reshape's -1, a broadcast's -1 (the operand's dim, or a feed's
  leading dim for `zeros_like` and the like), a slice, dynamic slice, pad or gather
  that keeps the dim whole, a count (`dim_size`) for a mean over the batch, a scan over
  it. A shape that needs more raises `BatchPolymorphismError` naming the primitive and
  line; with `batch_polymorphic=False` the program is made for the example's shapes, as
  `jax.jit` makes one executable per shape. A dict chooses per input: a leading dim of
  its own (a graph's nodes and edges: `{"nodes": "nodes", "edges": "edges"}`), the
  shared batch dim, or fixed (`{"w": False}`); see `leading_dims`.
- A PRNG key argument (`jax.random.key(0)`, or a `PRNGKey`'s uint32[2]) becomes a feed
  variable holding the key's raw data (`jax.random.key_data`), never a batch dim; JAX's
  random primitives become the ops of `lowering/ops/prng.py` and `bits.py`
  (`jax_random_rules`), so the program draws the original's numbers, bit for bit.
- `params` (a pytree passed as the function's first argument) become trainable
  parameters named by their path (`Dense_0.kernel`), their values put in the Scope.
- Constants (arrays the function closes over, and literals) are made as every importer
  makes them (`progdesc.constants.imported_constant`): one whose elements are all equal
  (and exact in float32) becomes a `fill_constant` op, whatever its size; any other an
  `assign_value` op holding its elements, or, above `LARGE_CONSTANT` elements, a
  persistable, non-trainable variable named after a hash of its contents
  (`const_3f2a...`, so that programs sharing a Scope never overwrite each other's)
  whose value goes to the Scope with the parameters and is saved with them.
- Equations whose results nobody uses (and that have no effects) are removed before
  translation (`jax_compat.dead_code_removed`): a PRNG key made only to be dropped, say,
  is neither translated nor reported.
- Calls (`jit`, `custom_jvp_call`, `custom_vjp_call`, `remat`) are inlined. The
  program's gradients are then those of the primal computation: a custom JVP or VJP
  rule is replaced by the gradient makers of the ops it was inlined into (`relu`'s,
  whose custom rule an op of ours implements, keeps it).
- Control flow becomes our control-flow ops, built by `progdesc.control_flow`: `cond`
  (lax.cond and lax.switch) a `switch`, `scan` (also a fori_loop with static bounds) a
  `scan`, `while` a `while` (which, as in JAX, has no reverse-mode gradient).
- Every op records the user's source line of its equation (shown by `print(program)`
  and in errors), and its outputs are named after JAX's name stack (a Flax module's
  path) and the op type.

A primitive without a rule, or whose parameters its rule cannot translate, is
collected; once the whole jaxpr has been walked, all of them are reported together in
one `UnsupportedPrimitiveError`, each with the user's source line.
"""
import functools
import inspect
import os
import re

import jax
import numpy as np
from jax.extend import core as jcore

from lowering import dtypes
from lowering.errors import (BatchPolymorphismError, ProgramError, ScopeError,
                             UnsupportedPrimitiveError, did_you_mean)
from progdesc import io, jax_compat
from progdesc.callsites import PACKAGE_DIRS, cell_name
from progdesc.framework import Program, program_guard
from progdesc.scope import global_scope
from lowering.ops.prng import key_shape
from progdesc.interop.jax_collective_rules import AXIS_SIZES
from progdesc.interop.jax_random_rules import is_key   # also registers the rules of keys
from progdesc.interop.jax_rules import RULES, BatchDependent, is_batch_dim, same_dim
from progdesc.translate import FAILED, Environment, Literal, Node, Translator


class JaxTranslator(Translator):
    """The translator of jaxprs: each equation becomes a `Node` (its `params` the
    attributes, its avals the types), translated by `jax_rules.RULES`.

    What is JAX's own stays here: `leading`, {symbolic dim: the first feed whose dim 0
    it is}, which the rules for sizes read (`feed_with_leading`, `counted`); an attribute
    computed from a symbolic dim is refused (`BatchDependent`), and an error of only such
    sizes is a BatchPolymorphismError.
    """

    error_class = UnsupportedPrimitiveError

    def __init__(self, program, strip_names=0, leading=None, axis_names=None):
        super().__init__(program, RULES)
        self.leading = dict(leading or {})
        self.axis_names = dict(axis_names or {})   # the function's axis -> our mesh axis
        self._axis_sizes = dict(zip(AXIS_SIZES, self.axis_names.values()))
        self._strip = strip_names
        self._jaxprs = 0   # jaxprs walked: the 'block' of an equation's place

    def feed_with_leading(self, dim):
        """The name of a feed whose dim 0 is the symbolic dim `dim`, or None."""
        for d, name in self.leading.items():
            if same_dim(d, dim):
                return name
        return None

    def counted(self, dim):
        """(feed, k, c) for a feed whose dim 0, d, gives the symbolic dim `dim` as
        k * d + c (ints; an offset c with k up to 8: `batch - 1`), or None."""
        for d, name in self.leading.items():
            try:
                factor = dim // d
                if not is_batch_dim(factor) and factor * d == dim:
                    return name, int(factor), 0
            except Exception:   # noqa: BLE001  (JAX's symbolic arithmetic: not a multiple)
                pass
            for factor in range(1, 9):
                offset = dim - factor * d
                if not is_batch_dim(offset):
                    return name, factor, int(offset)
        return None

    def call(self, op_type, *args, **attrs):
        for key, value in attrs.items():
            if any(map(is_batch_dim, value if isinstance(value, (list, tuple)) else [value])):
                raise BatchDependent(f"{op_type}'s attribute {key}={_dims_text(value)} depends "
                                     "on the batch size")
        return super().call(op_type, *args, **attrs)

    def constant(self, value):
        """`Translator.constant`; a scalar equal to the size a named axis was traced with
        (see jax_collective_rules) is that axis's size, a `c_axis_size` op."""
        value = np.asarray(value)
        if value.ndim == 0 and value.dtype.kind in "iuf" and self._axis_sizes:
            mesh_axis = self._axis_sizes.get(value.item())
            if mesh_axis is not None:
                return self.call("c_axis_size", axis_name=mesh_axis,
                                 dtype=dtypes.name_of(value.dtype))
        return super().constant(value)

    def inline(self, graph, args=None):
        """Translate a nested (closed or open) jaxpr applied to `args`; returns its outputs."""
        if isinstance(graph, jcore.ClosedJaxpr):
            return self.run(graph.jaxpr, graph.consts, args)
        return self.run(graph, (), args)

    def run(self, jaxpr, consts, args=None):
        """Translate `jaxpr` with its constvars bound to `consts` (arrays) and its invars to
        `args` (our names; None: all FAILED); returns the names of its outputs."""
        env = Environment(self)
        env.bind(jaxpr.constvars, [self.constant(jax.random.key_data(c) if is_key(c) else c)
                                   for c in consts])   # a key: its raw data
        env.bind(jaxpr.invars, [FAILED] * len(jaxpr.invars) if args is None else args)
        block, self._jaxprs = self._jaxprs, self._jaxprs + 1
        self.translate((self._node(eqn, block, i) for i, eqn in enumerate(jaxpr.eqns)), env)
        return [env.read(_operand(v)) for v in jaxpr.outvars]

    def _node(self, eqn, block, index):
        stack = str(eqn.source_info.name_stack).split("/")[self._strip:]
        return Node(eqn.primitive.name, [_operand(a) for a in eqn.invars],
                    [None if isinstance(v, jcore.DropVar) else v for v in eqn.outvars],
                    eqn.params, _source_line(eqn.source_info), ".".join(p for p in stack if p),
                    block, index, [a.aval for a in eqn.invars], [v.aval for v in eqn.outvars],
                    _sub_jaxprs(eqn))

    def check(self):
        """Raise UnsupportedPrimitiveError if any equation could not be translated
        (BatchPolymorphismError if only sizes depending on the batch dim were at fault)."""
        if self.unsupported:
            if all(p.error is not None and issubclass(p.error, BatchDependent)
                   for p in self.unsupported):
                raise BatchPolymorphismError(self.message() + _FIXED_HINT,
                                             **self.error_fields())
            super().check()


_FIXED_HINT = ("; the function cannot run at any batch size: pass batch_polymorphic=False "
               "for a program of the example's shapes")
_PER_INPUT_HINT = (", or give an input a leading dim of its own (batch_polymorphic={'w': "
                   "False} keeps w's fixed; {'edges': 'edges'} makes it a dim 'edges')")


def _operand(atom):
    """A jaxpr atom as a key of the Environment (a literal: its value)."""
    if isinstance(atom, jcore.Literal):
        return Literal(np.asarray(atom.val, dtype=atom.aval.dtype))
    return atom


def _dims_text(value):
    return str(list(map(str, value)) if isinstance(value, (list, tuple)) else value)


def _sub_jaxprs(eqn):
    """The jaxprs among an equation's params (a cond's `branches` among them)."""
    return tuple(j for p in eqn.params.values() for j in (p if isinstance(p, tuple) else (p,))
                 if isinstance(j, (jcore.ClosedJaxpr, jcore.Jaxpr)))


def _source_line(source_info):
    """'file.py:12' ('In[3]:2' in a notebook) of the user's frame that made an equation:
    the innermost frame outside JAX, Flax and progdesc."""
    frames = source_info.traceback.frames if source_info.traceback is not None else ()
    for frame in frames:
        if not os.path.abspath(frame.file_name).startswith(_library_dirs()):
            name = cell_name(frame.file_name) or os.path.basename(frame.file_name)
            return f"{name}:{frame.line_num}"
    return ""


@functools.lru_cache(maxsize=1)
def _library_dirs():
    """The directories of the code that is not the user's: JAX's, Flax's and ours."""
    import importlib.util
    dirs = list(PACKAGE_DIRS)
    for package in ("jax", "jaxlib", "flax"):
        spec = importlib.util.find_spec(package)
        if spec is not None and spec.origin:
            dirs.append(os.path.dirname(os.path.abspath(spec.origin)) + os.sep)
    return tuple(dirs)


# --- building a program ---

def _path_name(path):
    """'Dense_0.kernel' of a pytree key path. A last key that is the attribute `value` (the
    field where a box keeps its array: Flax's `Partitioned`, an nnx `Variable`) is left
    out: the box's name is its array's."""
    if path and isinstance(path[-1], jax.tree_util.GetAttrKey) and path[-1].name == "value":
        path = path[:-1]
    parts = []
    for key in path:
        for attr in ("key", "idx", "name"):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
    return ".".join(parts)


def named_leaves(tree, prefix=""):
    """[(name, leaf)] of a pytree, names joined from the key path (`prefix` first)."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return [(".".join(p for p in (prefix, _path_name(path)) if p), leaf) for path, leaf in leaves]


def build(flat_fn, inputs, writes=(), strip_names=0, scope=None, batch_polymorphic=True,
          overwrite=False, axis_names=None, eval_fn=None):
    """Trace `flat_fn(*arrays) -> [arrays]` and translate it into a new program.

    `inputs` is [(name, example value, kind)], kind 'feed', 'param' (trainable),
    'state' (persistable, not trained) or 'rng' (a PRNG key drawn afresh from the
    program's RNG state at each run, by a `random_key` op). The last `len(writes)` results are written into
    the state variables `writes` (skipped where one is that variable unchanged); the
    others are the fetch targets. Parameter, state and constant values go into `scope`.
    `batch_polymorphic` says which feeds' leading dims are traced as which symbolic dim
    and declared -1 (see `leading_dims`). Returns (program, feed names,
    fetch Variables). Unless `overwrite`, a parameter or state variable `scope` already
    holds with another value is refused (`check_not_held`) before anything is traced.
    `axis_names` maps the named axes the function's collectives use to mesh axes (see
    jax_collective_rules). `eval_fn`, a second function of the same inputs and results,
    is the evaluation behaviour: each result that differs becomes a `mode_select` of the
    two, which `clone(for_test=True)` switches to `eval_fn`'s.
    """
    axis_names = _axis_names(axis_names)
    names = [name for name, _, _ in inputs]
    clash = sorted({n for n in names if names.count(n) > 1})
    if clash:
        raise ProgramError(f"two inputs would share the variable name '{clash[0]}' (a "
                           "parameter's path and an argument's name?)", var=clash[0])
    values = [v if isinstance(v, jax.Array) else np.asarray(v) for _, v, _ in inputs]
    if not overwrite:
        check_not_held(scope, [(n, jax.random.key_data(v) if is_key(v) else v)
                               for (n, _, kind), v in zip(inputs, values)
                               if kind not in ("feed", "rng")])
    if eval_fn is not None:
        eval_fn = _with_axes(_keys_as_data(eval_fn, values)[0], axis_names)
    flat_fn, values, keys = _keys_as_data(flat_fn, values)
    flat_fn = _with_axes(flat_fn, axis_names)
    leading = {name: dim for name, dim in leading_dims(inputs, values, batch_polymorphic).items()
               if not keys[names.index(name)]}   # a key is never a batch
    closed, refs = _traced(flat_fn, inputs, values, leading)
    program = Program()
    block = program.global_block()
    for (name, value, kind), aval in zip(inputs, closed.in_avals):
        shape = [-1 if is_batch_dim(d) else d for d in aval.shape]
        dtype = dtypes.name_of(aval.dtype)
        if kind == "feed":
            block.create_var(name, shape, dtype, stop_gradient=True, need_check_feed=True)
        elif kind == "param":
            block.create_parameter(name, shape, dtype)
        elif kind == "rng":
            impl = _impl_name(value)
            block.append_op("random_key", outputs={"Out": name}, callsite="", attrs={
                "shape": shape[:len(shape) - len(key_shape(impl))], "impl": impl})
        else:
            block.create_var(name, shape, dtype, persistable=True, stop_gradient=True)
    translator = JaxTranslator(program, strip_names, refs, axis_names)
    with program_guard(program):   # control-flow builders append to the current program
        outs = translator.run(closed.jaxpr, closed.consts, names)
    translator.check()
    if eval_fn is not None:
        outs = _with_eval_mode(program, outs, eval_fn, inputs, values, leading, strip_names,
                               axis_names, translator.values)
    n_fetch = len(outs) - len(writes)
    for target, out in zip(writes, outs[n_fetch:]):
        if out != target:
            block.append_op("assign", {"X": out}, {"Out": target}, callsite="")
    state = {name: jax.random.key_data(value) if is_key(value) else value   # a key: its data
             for name, value, kind in inputs if kind not in ("feed", "rng")}
    state.update(translator.values)
    io.set_values(program, {k: np.asarray(v) for k, v in state.items()}, scope)
    feeds = [name for name, _, kind in inputs if kind == "feed"]
    return program, feeds, [block.var(n) for n in outs[:n_fetch]]


def _impl_name(key):
    """The name of the PRNG implementation of `key` (JAX's default for old-style keys)."""
    return str(jax.random.key_impl(key) if is_key(key) else jax.config.jax_default_prng_impl)


def _keys_as_data(flat_fn, values):
    """A PRNG key input is held as its raw data (`jax.random.key_data`): returns (`flat_fn`
    taking that data in its place, the values with each typed key's data, which inputs are
    keys). A single key of the old style (`PRNGKey`, uint32[2]) counts as a key too, so that
    it is not taken for a batch of 2."""
    impls = [jax.random.key_impl(v) if is_key(v) else None for v in values]
    keys = [impl is not None or (v.dtype == np.uint32 and v.shape == (2,))
            for v, impl in zip(values, impls)]
    if not any(impl is not None for impl in impls):
        return flat_fn, values, keys

    def fn(*leaves):
        return flat_fn(*(leaf if impl is None else jax.random.wrap_key_data(leaf, impl=impl)
                         for leaf, impl in zip(leaves, impls)))
    return fn, [v if impl is None else jax.random.key_data(v)
                for v, impl in zip(values, impls)], keys


def _traced(flat_fn, inputs, values, leading):
    """(the closed jaxpr of `flat_fn`, dead code removed, {symbolic dim: the first feed
    whose dim 0 it is}); a collective over an unbound axis is an UnsupportedPrimitiveError
    saying what to pass."""
    try:
        closed, symbols = _trace(flat_fn, inputs, values, leading)
    except NameError as e:   # JAX's "unbound axis name: batch" of a collective
        axis = re.search(r"unbound axis name: ([^\s.]+)", str(e))
        if axis is None:
            raise
        raise UnsupportedPrimitiveError(
            f"a collective reduces over axis '{axis[1]}', which is not bound: pass "
            f"axis_names={{'{axis[1]}': 'data'}} (the mesh axis it reduces over under "
            "Executor(mesh=...))", unsupported=[(axis[1], "", "unbound axis name")]) from None
    refs = {}
    for name, _, _ in inputs:
        if name in leading:
            refs.setdefault(symbols[leading[name]], name)
    return jax_compat.dead_code_removed(closed), refs   # what nobody reads is not translated


def _with_eval_mode(program, outs, eval_fn, inputs, values, leading, strip_names, axis_names,
                    constants):
    """`outs` (the training results' names), each that `eval_fn` computes otherwise made a
    `mode_select` of the two; `eval_fn`'s ops are translated into the same block and its
    constants' values added to `constants`."""
    closed, refs = _traced(eval_fn, inputs, values, leading)
    translator = JaxTranslator(program, strip_names, refs, axis_names)
    with program_guard(program):
        eval_outs = translator.run(closed.jaxpr, closed.consts, [name for name, _, _ in inputs])
    translator.check()
    constants.update(translator.values)
    if len(eval_outs) != len(outs):
        raise ProgramError(f"the evaluation mode gives {len(eval_outs)} results and "
                           f"variables where training gives {len(outs)}")
    block = program.global_block()
    return [out if out == other else block.append_op(
                "mode_select", {"Train": out, "Eval": other}, callsite="").output("Out")[0]
            for out, other in zip(outs, eval_outs)]


def _axis_names(axis_names):
    """{axis of the function: mesh axis} from a dict or a list of names kept as they are."""
    if axis_names is None:
        return {}
    if not isinstance(axis_names, dict):
        axis_names = {name: name for name in axis_names}
    if len(axis_names) > len(AXIS_SIZES) or not all(
            isinstance(k, str) and isinstance(v, str) and v for k, v in axis_names.items()):
        raise TypeError(f"axis_names maps at most {len(AXIS_SIZES)} axis names of the function "
                        f"to mesh axis names (strings), got {axis_names!r}")
    return axis_names


def _with_axes(flat_fn, axis_names):
    """`flat_fn`, marked to be traced with its named axes bound (`_jaxpr_maker`), each to
    a size of AXIS_SIZES."""
    if not axis_names:
        return flat_fn

    @functools.wraps(flat_fn)
    def with_axes(*leaves):
        return flat_fn(*leaves)
    with_axes.axis_env = list(zip(axis_names, AXIS_SIZES))
    return with_axes


def _jaxpr_maker(flat_fn):
    """`jax.make_jaxpr(flat_fn)`, with the axis environment `_with_axes` gave it."""
    return jax.make_jaxpr(flat_fn, axis_env=getattr(flat_fn, "axis_env", None))


def check_not_held(scope, values):
    """Raise ScopeError if `scope` (None: the global one) holds any of the variables
    `values` ([(name, value)]) with another shape, dtype or value: importing would
    overwrite it (a parameter trained since, or another model's)."""
    scope = scope or global_scope()
    for name, value in values:
        if name not in scope:
            continue
        held = np.asarray(scope.get(name))
        value = np.asarray(value)
        if held.shape == value.shape and held.dtype == value.dtype and np.array_equal(
                held, value, equal_nan=held.dtype.kind in "fc"):
            continue
        raise ScopeError(
            f"the Scope already holds '{name}' ({held.dtype}{list(held.shape)}) with other "
            f"values than the import's ({value.dtype}{list(value.shape)}), and importing "
            "would overwrite it (a parameter trained since, or another model's?): pass "
            "overwrite=True to replace it, or scope=pd.Scope() to import into a Scope of "
            "its own; to import with the held values, pass them as the parameters",
            var=name)


def leading_dims(inputs, values, choice):
    """{feed name: the name of the symbolic dim its dim 0 is}, from `batch_polymorphic`.

    True: every feed that is not a scalar has the dim 'batch'. False or None: none has.
    A dict {input: True, False or a name}: an input is a feed's name (`graph.nodes`) or
    an argument's (then it holds for each of its leaves; the longest matching input
    wins); True is 'batch', False a fixed dim, a name (`'edges'`) a symbolic dim of its
    own that the feeds given that name share. Feeds not named have 'batch'.
    """
    feeds = [(name, v) for (name, _, kind), v in zip(inputs, values) if kind == "feed"]
    if choice is None or choice is False:
        return {}
    if choice is True:
        choice = {}
    if not isinstance(choice, dict):
        raise ProgramError("batch_polymorphic must be True, False or a dict {input name: "
                           f"True, False or a dim name}}, got {type(choice).__name__}")
    names = [name for name, _ in feeds]
    for key, dim in choice.items():
        if not any(n == key or n.startswith(f"{key}.") for n in names):
            raise ProgramError(f"batch_polymorphic names '{key}', which is no input of the "
                               f"function (its inputs: {names}){did_you_mean(key, names)}")
        if not (isinstance(dim, bool) or dim is None
                or isinstance(dim, str) and dim.isidentifier()):
            raise ProgramError(f"batch_polymorphic['{key}'] must be True, False or a dim name "
                               f"(a Python identifier), got {dim!r}")
    dims = {}
    for name, value in feeds:
        keys = [k for k in choice if name == k or name.startswith(f"{k}.")]
        dim = choice[max(keys, key=len)] if keys else True
        if value.ndim and dim is not False and dim is not None:
            dims[name] = "batch" if dim is True else dim
    return dims


def _trace(flat_fn, inputs, values, leading):
    """The jaxpr of `flat_fn`, with dim 0 of each input named in `leading` the symbolic
    dim named there; returns (closed jaxpr, {dim name: symbolic dim})."""
    if not leading:
        return _jaxpr_maker(flat_fn)(*values), {}
    groups = {}
    for (name, _, _), v in zip(inputs, values):
        if name in leading:
            groups.setdefault(leading[name], {})[name] = v.shape[0]
    for dim, sizes in groups.items():
        if len(set(sizes.values())) > 1:
            what = "one batch dim" if dim == "batch" else f"one dim '{dim}'"
            raise BatchPolymorphismError(
                f"the feeds' leading dims differ ({sizes}), so they are not {what}"
                + _FIXED_HINT + _PER_INPUT_HINT, unsupported=[])
    symbols = dict(zip(groups, jax.export.symbolic_shape(", ".join(groups))))
    specs = [jax.ShapeDtypeStruct((symbols[leading[name]], *v.shape[1:]), v.dtype)
             if name in leading else v for (name, _, _), v in zip(inputs, values)]
    try:
        return _jaxpr_maker(flat_fn)(*specs), symbols
    except Exception as e:   # noqa: BLE001  (told apart below)
        error = e
    _jaxpr_maker(flat_fn)(*values)   # raises the function's own error, if the batch dim's is not
    called, line = _failed_call(flat_fn, specs)
    first = (str(error).strip() or type(error).__name__).splitlines()[0]
    raise BatchPolymorphismError(
        f"'{called}' at {line or 'an unknown line'} cannot be traced with a symbolic batch "
        f"dim ({type(error).__name__}: {first})" + _FIXED_HINT,
        unsupported=[(called, line, first)]) from error


def _failed_call(flat_fn, specs):
    """(the primitive, else the JAX function, at fault; 'file.py:12' of the user's call)
    of the error tracing `flat_fn(*specs)` raises, traced again with JAX's frames kept."""
    unfiltered = jax_compat.unfiltered_tracebacks()   # else only the frames JAX keeps
    try:
        with unfiltered:
            _jaxpr_maker(flat_fn)(*specs)
        return "", ""
    except Exception as error:
        traceback = error.__traceback__
    frames = []
    while traceback is not None:
        frames.append(traceback.tb_frame)
        traceback = traceback.tb_next
    called, line = "", ""
    for frame, inner in zip(frames, frames[1:]):
        if not _is_library(frame) and _is_library(inner):
            path = frame.f_code.co_filename
            called = inner.f_code.co_name
            line = f"{cell_name(path) or os.path.basename(path)}:{frame.f_lineno}"
    for frame in reversed(frames):   # the innermost primitive being bound or checked
        found = [v for k, v in frame.f_locals.items()
                 if k in ("prim", "primitive", "self") and isinstance(v, jcore.Primitive)]
        if found:
            return found[0].name, line
    return called, line


def _is_library(frame):
    return os.path.abspath(frame.f_code.co_filename).startswith(_library_dirs())


def from_jax(fn, *example_args, params=None, scope=None, batch_polymorphic=True,
             overwrite=False, axis_names=None, program_keys=()):
    """Trace `fn(*example_args)` (or `fn(params, *example_args)`) into a program.

    Each array leaf of the example arguments becomes a feed variable named after `fn`'s
    parameter (`x`; `batch.image` for a leaf of a dict argument `batch`), of the
    example's shape and dtype, except that with `batch_polymorphic` (the default) the
    leading dim of every feed that is not a scalar is the batch dim, -1: the function is
    traced with that dim symbolic and the program runs at any batch size (all feeds
    sharing it). `batch_polymorphic` may also be a dict choosing per input (a feed's name,
    or an argument's for all its leaves): `True` the shared batch dim, `False` the
    example's fixed size, a name a symbolic dim of its own, shared by the inputs given
    that name; inputs not named have the batch dim. A graph whose node and edge counts
    differ: `{"nodes": "nodes", "edges": "edges", "senders": "edges"}`. The leaves of
    `params`, if given, become trainable parameters named by their path (`w`,
    `layer1.b`), their values placed in `scope` (default: the global one) with the
    program's constants; a parameter the Scope already holds with other values (one
    trained since) is never replaced unless `overwrite=True`: a ScopeError naming it is
    raised instead. The results of `fn` (any pytree of arrays) are the fetch targets,
    flattened in pytree order.

    Returns `(program, feed_names, fetch_targets)`, as `progdesc.io.load_inference_model`
    does. Raises UnsupportedPrimitiveError listing every primitive it cannot translate,
    each with the line of your code that made it, and BatchPolymorphismError (a subclass)
    naming the primitive and line where the function needs a fixed batch size (then pass
    `batch_polymorphic=False`); see the module's docstring for how constants, nested
    calls and custom derivatives are translated.

    `axis_names` ({axis name of fn's collectives: mesh axis}, or a list of names kept)
    binds the named axes `fn`'s collectives (`lax.psum`, `pmean`, `pmax`, `pmin`,
    `axis_index`: a function written for `pmap` / `shard_map`) reduce over, and maps each
    to a mesh axis of the program: under `Executor(mesh=...)` they reduce across the
    devices of that axis; on one device they are the identity.

    A PRNG key argument is a feed of the key's raw data (`jax.random.key_data(key)`, or
    a `PRNGKey` as it is), and the program draws the numbers `fn` draws from that key,
    bit for bit. The arguments named in `program_keys` instead take a fresh key from the
    program's RNG state at each run (different at every step, reproducible from
    `program.random_seed`), as our own random ops (dropout) do; they are not feeds.
    """
    arg_names = parameter_names(fn, len(example_args), skip=1 if params is not None else 0)
    unknown = sorted(set(program_keys) - set(arg_names))
    if unknown:
        raise ProgramError(f"program_keys names {unknown}, which are not arguments of the "
                           f"function (its arguments: {arg_names})", var=unknown[0])
    inputs = []
    if params is not None:
        inputs += [(n, v, "param") for n, v in named_leaves(params)]
    for arg_name, arg in zip(arg_names, example_args):
        kind = "rng" if arg_name in program_keys else "feed"
        inputs += [(n, v, kind) for n, v in named_leaves(arg, arg_name)]
    for name, value, kind in inputs:
        if kind == "rng" and not (is_key(value) or np.asarray(value).dtype == np.uint32):
            raise ProgramError(f"program_keys: '{name}' is no PRNG key (a jax.random.key, "
                               f"or a PRNGKey's uint32 data), got {np.asarray(value).dtype}",
                               var=name)
    param_tree = jax.tree_util.tree_structure(params) if params is not None else None
    arg_tree = jax.tree_util.tree_structure(tuple(example_args))
    n_params = param_tree.num_leaves if param_tree is not None else 0

    def flat_fn(*leaves):
        args = jax.tree_util.tree_unflatten(arg_tree, leaves[n_params:])
        if param_tree is None:
            return jax.tree_util.tree_leaves(fn(*args))
        return jax.tree_util.tree_leaves(
            fn(jax.tree_util.tree_unflatten(param_tree, leaves[:n_params]), *args))

    return build(flat_fn, inputs, scope=scope, batch_polymorphic=batch_polymorphic,
                 overwrite=overwrite, axis_names=axis_names)


def parameter_names(fn, count, skip=0):
    """Names for `count` positional arguments of `fn` after the first `skip`: its parameter
    names where it has them, else x0, x1, ..."""
    try:
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][skip:]
    except (TypeError, ValueError):
        params = []
    names = [p.name for p in params[:count]]
    return names + [f"x{i}" for i in range(len(names), count)]
