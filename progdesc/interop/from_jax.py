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
  batch dim for `zeros_like` and the like), a slice or gather that takes the dim whole,
  a count (`dim_size`) for a mean over the batch, a scan over it. A shape
  that needs more raises `BatchPolymorphismError` naming the primitive and line; with
  `batch_polymorphic=False` the program is made for the example's shapes, as `jax.jit`
  makes one executable per shape.
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

import jax
import numpy as np
from jax.extend import core as jcore

from lowering import dtypes
from lowering.errors import BatchPolymorphismError, ProgramError, UnsupportedPrimitiveError
from progdesc import io, jax_compat
from progdesc.callsites import PACKAGE_DIRS, cell_name
from progdesc.framework import Program, program_guard
from lowering.ops.prng import key_shape
from progdesc.interop.jax_random_rules import is_key   # also registers the rules of keys
from progdesc.interop.jax_rules import RULES, BatchDependent, is_batch_dim
from progdesc.translate import FAILED, Environment, Literal, Node, Translator


class JaxTranslator(Translator):
    """The translator of jaxprs: each equation becomes a `Node` (its `params` the
    attributes, its avals the types), translated by `jax_rules.RULES`.

    What is JAX's own stays here: `batch_ref`, the feed whose dim 0 is the symbolic
    batch dim (and that dim), which the rules for sizes read; an attribute computed from
    the batch dim is refused (`BatchDependent`), and an error of only such sizes is a
    BatchPolymorphismError.
    """

    error_class = UnsupportedPrimitiveError

    def __init__(self, program, strip_names=0, batch_ref=(None, None)):
        super().__init__(program, RULES)
        self.batch_ref = batch_ref
        self._strip = strip_names
        self._jaxprs = 0   # jaxprs walked: the 'block' of an equation's place

    def call(self, op_type, *args, **attrs):
        for key, value in attrs.items():
            if any(map(is_batch_dim, value if isinstance(value, (list, tuple)) else [value])):
                raise BatchDependent(f"{op_type}'s attribute {key}={_dims_text(value)} depends "
                                     "on the batch size")
        return super().call(op_type, *args, **attrs)

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
    """'Dense_0.kernel' of a pytree key path."""
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


def build(flat_fn, inputs, writes=(), strip_names=0, scope=None, batch_polymorphic=True):
    """Trace `flat_fn(*arrays) -> [arrays]` and translate it into a new program.

    `inputs` is [(name, example value, kind)], kind 'feed', 'param' (trainable),
    'state' (persistable, not trained) or 'rng' (a PRNG key drawn afresh from the
    program's RNG state at each run, by a `random_key` op). The last `len(writes)` results are written into
    the state variables `writes` (skipped where one is that variable unchanged); the
    others are the fetch targets. Parameter, state and constant values go into `scope`.
    With `batch_polymorphic`, the leading dim of every feed that is not a scalar is
    traced as one symbolic batch dim and declared -1. Returns (program, feed names,
    fetch Variables).
    """
    names = [name for name, _, _ in inputs]
    clash = sorted({n for n in names if names.count(n) > 1})
    if clash:
        raise ProgramError(f"two inputs would share the variable name '{clash[0]}' (a "
                           "parameter's path and an argument's name?)", var=clash[0])
    values = [v if isinstance(v, jax.Array) else np.asarray(v) for _, v, _ in inputs]
    flat_fn, values, keys = _keys_as_data(flat_fn, values)
    batched = [name for (name, _, kind), v, key in zip(inputs, values, keys)
               if batch_polymorphic and kind == "feed" and v.ndim and not key]
    closed, batch = _trace(flat_fn, inputs, values, batched)
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
    translator = JaxTranslator(program, strip_names, (batched[0] if batched else None, batch))
    with program_guard(program):   # control-flow builders append to the current program
        outs = translator.run(closed.jaxpr, closed.consts, names)
    translator.check()
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


def _trace(flat_fn, inputs, values, batched):
    """The jaxpr of `flat_fn`, with dim 0 of the inputs named in `batched` one symbolic
    dim; returns (closed jaxpr, that dim or None)."""
    if not batched:
        return jax.make_jaxpr(flat_fn)(*values), None
    leading = {name: v.shape[0] for (name, _, _), v in zip(inputs, values) if name in batched}
    if len(set(leading.values())) > 1:
        raise BatchPolymorphismError(
            f"the feeds' leading dims differ ({leading}), so they are not one batch dim"
            + _FIXED_HINT, unsupported=[])
    (batch,) = jax.export.symbolic_shape("batch")
    specs = [jax.ShapeDtypeStruct((batch, *v.shape[1:]), v.dtype) if name in batched else v
             for (name, _, _), v in zip(inputs, values)]
    try:
        return jax.make_jaxpr(flat_fn)(*specs), batch
    except Exception as e:   # noqa: BLE001  (told apart below)
        error = e
    jax.make_jaxpr(flat_fn)(*values)   # raises the function's own error, if the batch dim's is not
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
            jax.make_jaxpr(flat_fn)(*specs)
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
             program_keys=()):
    """Trace `fn(*example_args)` (or `fn(params, *example_args)`) into a program.

    Each array leaf of the example arguments becomes a feed variable named after `fn`'s
    parameter (`x`; `batch.image` for a leaf of a dict argument `batch`), of the
    example's shape and dtype, except that with `batch_polymorphic` (the default) the
    leading dim of every feed that is not a scalar is the batch dim, -1: the function is
    traced with that dim symbolic and the program runs at any batch size (all feeds
    sharing it). The leaves of `params`, if given, become trainable
    parameters named by their path (`w`, `layer1.b`), their values placed in `scope`
    (default: the global one) with the program's constants. The results of `fn` (any
    pytree of arrays) are the fetch targets, flattened in pytree order.

    Returns `(program, feed_names, fetch_targets)`, as `progdesc.io.load_inference_model`
    does. Raises UnsupportedPrimitiveError listing every primitive it cannot translate,
    each with the line of your code that made it, and BatchPolymorphismError (a subclass)
    naming the primitive and line where the function needs a fixed batch size (then pass
    `batch_polymorphic=False`); see the module's docstring for how constants, nested
    calls and custom derivatives are translated.

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

    return build(flat_fn, inputs, scope=scope, batch_polymorphic=batch_polymorphic)


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
