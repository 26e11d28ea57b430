"""Every use progdesc makes of JAX's internals, in one place.

JAX's public API (`jax`, `jax.export`, `jax.extend`, `jax.config`, `jax.distributed`)
lacks a few things progdesc needs. Each is reached here by one function (or constant)
whose docstring says what it reaches, why no public API serves, and what happens on a
JAX without it: either a `JaxCompatError` naming the internal, the JAX version found and
the progdesc feature that needs it, raised when that feature is used, or a public
fallback, said there. Nothing is resolved at import: a JAX release that moves an
internal breaks only the feature that uses it, never `import progdesc`.

tests/test_jax_compat.py checks each one against the installed JAX (written against
JAX 0.10.2): that it resolves, that it does what progdesc relies on, and what happens
when it is missing.
"""
import contextlib
import importlib
import inspect

import jax

from lowering.errors import JaxCompatError

# A path in JAX's source tree, matched against a custom_jvp function's source location
# by the from_jax rule for `custom_jvp_call` (progdesc/interop/jax_rules.py): JAX's own
# `jax.nn.relu` (a custom_jvp, gradient 0 at 0) becomes our `relu` op. JAX offers no
# public way to tell its own custom_jvp functions from a user's of the same name. Where
# JAX moved the file, `jax.nn.relu` is inlined instead: the same values, but the
# gradient at exactly 0 is that of the inlined body, not JAX's.
JAX_NN_SOURCE = "jax/_src/nn/functions.py"

_TESTED_ON = "0.10.2"


def _missing(internal, feature, consequence):
    return JaxCompatError(
        f"{feature} needs JAX's internal {internal}, which JAX {jax.__version__} does not "
        f"have (progdesc is tested with JAX {_TESTED_ON}); {consequence}. Use a JAX version "
        "progdesc supports, or update progdesc/jax_compat.py",
        internal=internal, jax_version=jax.__version__, feature=feature)


def _resolve(module, attr, feature, consequence):
    """`module.attr`, or the JaxCompatError saying it is missing."""
    internal = f"{module}.{attr}"
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError):
        raise _missing(internal, feature, consequence) from None


# --- the C++ call of a compiled function (Executor, eager mode) ---

def compiled_call(compiled):
    """The fastest way to call `compiled`, a `jax.stages.Compiled` already called once.

    Reaches `Compiled._call`: after its first call, a Compiled keeps the C++ call its
    `__call__` forwards to (jax/_src/stages.py). Calling that directly saves a Python
    frame per call, on the Executor's and eager mode's hot path; JAX has no public
    handle on it. Where `_call` is missing or not callable (a JAX that renamed it, or a
    Compiled not called yet), returns `compiled` itself: the same results, slower by a
    Python frame per call.
    """
    call = getattr(compiled, "_call", None)
    return call if callable(call) else compiled


# --- custom-call targets (checking a loaded .pdx) ---

def stable_custom_call_targets():
    """The custom-call targets JAX guarantees stable across versions, a frozenset.

    Reaches `jax._src.export._export._CUSTOM_CALL_TARGETS_GUARANTEED_STABLE`, the list
    `jax.export` checks every module it exports against; JAX does not publish it. The
    loader of compiled `.pdx` files accepts custom calls to these targets only
    (progdesc/export_check.py). On a JAX without it raises JaxCompatError; the loader
    then falls back to the targets of shape polymorphism and sharding, and refuses a
    file calling any other target with this error's message.
    """
    targets = _resolve("jax._src.export._export", "_CUSTOM_CALL_TARGETS_GUARANTEED_STABLE",
                       "checking the custom calls of a loaded .pdx",
                       "only the targets of shape polymorphism and sharding are accepted")
    return frozenset(targets)


# --- JAX's persistent compilation cache, per thread (progdesc.compile_cache) ---

_CACHE_OPTIONS = {"cache_dir": "compilation_cache_dir",
                  "max_size": "compilation_cache_max_size",
                  "min_compile_time": "persistent_cache_min_compile_time_secs"}
_CACHE_FEATURE = "progdesc's compilation cache"
_CACHE_CONSEQUENCE = "progdesc's compiles go uncached (JAX's own settings are unaffected)"


def _cache_option(key):
    option = _resolve("jax._src.config", _CACHE_OPTIONS[key], _CACHE_FEATURE, _CACHE_CONSEQUENCE)
    if not callable(option):
        raise _missing(f"jax._src.config.{_CACHE_OPTIONS[key]}(value) (a thread-local setting)",
                       _CACHE_FEATURE, _CACHE_CONSEQUENCE)
    return option


def thread_compilation_cache(**values):
    """A context manager setting JAX's persistent-cache options for the current thread only.

    `values` maps "cache_dir", "max_size" and "min_compile_time" to the values of
    `jax_compilation_cache_dir`, `jax_compilation_cache_max_size` and
    `jax_persistent_cache_min_compile_time_secs`. Reaches the `State`s of those options
    in `jax._src.config`, whose call overrides the option in this thread: the public
    `jax.config.update` sets it for the whole process, and progdesc must leave other
    JAX code's settings alone. On a JAX without them raises JaxCompatError (resolved
    here, before anything is set); progdesc.compile_cache then compiles uncached.
    """
    return _setting_all([(_cache_option(key), value) for key, value in values.items()])


@contextlib.contextmanager
def _setting_all(options):
    with contextlib.ExitStack() as stack:
        for option, value in options:
            stack.enter_context(option(value))
        yield


def global_compilation_cache_dir():
    """JAX's process-wide `jax_compilation_cache_dir` (the user's), whatever this thread
    overrides through `thread_compilation_cache`.

    Reaches `jax._src.config.compilation_cache_dir.get_global`; the public
    `jax.config.jax_compilation_cache_dir` reads this thread's value. Where it is missing,
    returns that public value: the same outside `thread_compilation_cache` (and always,
    on a JAX where that is missing too).
    """
    try:
        return _cache_option("cache_dir").get_global()
    except (JaxCompatError, AttributeError):
        return jax.config.jax_compilation_cache_dir


# --- tracebacks with JAX's frames (from_jax's errors) ---

def unfiltered_tracebacks():
    """A context manager under which errors JAX raises in this thread keep JAX's frames.

    Reaches the `State` `jax._src.config.traceback_filtering`, whose call sets the
    public option `jax_traceback_filtering` for the current thread only
    (`jax.config.update` would set it for every thread). from_jax reads those frames to
    name the JAX function the user's code called when tracing with a symbolic batch dim
    fails. Where it is missing, a null context: the error then names what the frames JAX
    keeps show, sometimes no function or line.
    """
    try:
        from jax._src.config import traceback_filtering
        return traceback_filtering("off")
    except (ImportError, TypeError, ValueError):
        return contextlib.nullcontext()


# --- dead-code elimination of a traced function (from_jax) ---

def dead_code_removed(closed):
    """`closed`, a `jax.extend.core.ClosedJaxpr`, without the equations whose results
    nobody uses and that have no effects (inside nested jaxprs too); its inputs and
    outputs stay as they are.

    Reaches `jax.interpreters.partial_eval.dce_jaxpr`, JAX's own dead-code pass, which
    `jax.interpreters` exports but JAX does not list among its public APIs (no `jax.extend`
    function does this). from_jax runs it before translating, so that an equation nobody
    reads (a PRNG key made and never used) is neither translated nor reported. Where it is
    missing, returns `closed` itself: dead equations are then translated (and an
    untranslatable one among them is reported) as before.
    """
    try:
        dce_jaxpr = _resolve("jax.interpreters.partial_eval", "dce_jaxpr",
                             "from_jax's dead-code removal", "dead equations are translated")
    except JaxCompatError:
        return closed
    jaxpr, _ = dce_jaxpr(closed.jaxpr, [True] * len(closed.jaxpr.outvars), instantiate=True)
    from jax.extend import core
    return core.ClosedJaxpr(jaxpr, closed.consts)


# --- the least and greatest of two dims (shape polymorphism) ---

def dim_min_max():
    """(min, max) of two dims, each an int or a `jax.export` symbolic dim.

    Reaches `jax._src.core.min_dim` and `max_dim`: a slice clamped to a dim known only
    at run time (`slice_dims`) has the size `min(end, n) - start`, which `jax.export`
    keeps symbolic; JAX exports no public function making such a dim. Where they are
    missing, ints still work (Python's min and max); a symbolic dim raises the
    JaxCompatError when the slice is traced.
    """
    try:
        core = importlib.import_module("jax._src.core")
        return core.min_dim, core.max_dim
    except (ImportError, AttributeError):
        def missing(a, b, which):
            if isinstance(a, int) and isinstance(b, int):
                return which(a, b)
            raise _missing(f"jax._src.core.{which.__name__}_dim", "slice_dims of a dim known "
                           "only at run time", "such slices cannot be exported")
        return (lambda a, b: missing(a, b, min)), (lambda a, b: missing(a, b, max))


# --- JAX's distributed runtime (progdesc.distributed.initialize) ---

_DISTRIBUTED_FEATURE = "progdesc.distributed.initialize (runs across processes)"
_DISTRIBUTED_CONSEQUENCE = "progdesc cannot join a multi-process run on this JAX"
_STATE_FIELDS = ("client", "service", "coordinator_address", "process_id", "num_processes")


def backends_are_initialized():
    """Whether JAX has started its backends (anything touched a device) in this process.

    Reaches `jax._src.xla_bridge.backends_are_initialized`; JAX has no public query.
    `initialize` refuses to join a run afterwards with a DistributedError of its own,
    which JAX would report as a bare RuntimeError that progdesc cannot tell from a failed
    join. On a JAX without it raises JaxCompatError.
    """
    return _resolve("jax._src.xla_bridge", "backends_are_initialized", _DISTRIBUTED_FEATURE,
                    _DISTRIBUTED_CONSEQUENCE)()


def distributed_state():
    """JAX's distributed runtime state of this process, `jax._src.distributed.global_state`.

    progdesc reads and resets its `client`, `service`, `coordinator_address`,
    `process_id` and `num_processes` (to name the coordinator, to tell a coordinator that
    could not serve from peers that did not join, and to forget a failed join so the
    process goes on alone), and asks the client `get_live_nodes` to notice a lost
    process (progdesc/distributed/peers.py). `jax.distributed` exposes none of these.
    On a JAX without them raises JaxCompatError, checked before joining.
    """
    distributed = "jax._src.distributed"
    state = _resolve(distributed, "global_state", _DISTRIBUTED_FEATURE,
                     _DISTRIBUTED_CONSEQUENCE)
    for field in _STATE_FIELDS:
        if not hasattr(state, field):
            raise _missing(f"{distributed}.global_state.{field}", _DISTRIBUTED_FEATURE,
                           _DISTRIBUTED_CONSEQUENCE)
    runtime = _resolve(distributed, "_jax", _DISTRIBUTED_FEATURE, _DISTRIBUTED_CONSEQUENCE)
    client_type = getattr(runtime, "DistributedRuntimeClient", None)
    if not hasattr(client_type, "get_live_nodes"):
        raise _missing(f"{distributed}._jax.DistributedRuntimeClient.get_live_nodes",
                       _DISTRIBUTED_FEATURE, _DISTRIBUTED_CONSEQUENCE)
    return state


@contextlib.contextmanager
def distributed_clients_calling(missed_heartbeat_callback):
    """While active, the distributed runtime clients JAX makes get
    `missed_heartbeat_callback` (unless JAX passes one); yields whether that took hold.

    Reaches `jax._src.distributed._jax.get_distributed_runtime_client`, which
    `jax.distributed.initialize` calls (without a callback, so jaxlib ends the process on
    an error) and which has no public form. `initialize` uses it so that a client that
    fails to connect raises instead. On a JAX without it, nothing is changed and JAX's
    own behaviour stands: a failed connection ends the process.
    """
    try:
        module = importlib.import_module("jax._src.distributed")._jax
    except (ImportError, AttributeError):
        module = None
    make_client = getattr(module, "get_distributed_runtime_client", None)
    if make_client is None:
        yield False
        return

    def make_calling_client(*args, **kwargs):
        kwargs.setdefault("missed_heartbeat_callback", missed_heartbeat_callback)
        return make_client(*args, **kwargs)

    module.get_distributed_runtime_client = make_calling_client
    try:
        yield True
    finally:
        module.get_distributed_runtime_client = make_client


# --- the cluster environments jax.distributed.initialize() detects ---

def detect_cluster(coordinator, num_processes, process_id, timeout):
    """(environment name, coordinator, num_processes, process_id) as JAX's own cluster
    detection fills in the ones given as None; (None, ...) unchanged where no environment
    is found.

    Reaches `jax._src.clusters.ClusterEnv`, the registry of environments (SLURM, Open MPI,
    Kubernetes, Cloud TPU...) and `auto_detect_unset_distributed_params`, what
    `jax.distributed.initialize()` runs when arguments are missing. JAX has no public way
    to ask what it would detect without joining; `progdesc.distributed.initialize` needs
    the values first (to check them, to check the coordinator's port, to name them in its
    errors). Environments JAX only uses when asked by name (mpi4py) are left out, as JAX
    leaves them out. On a JAX without it raises JaxCompatError.
    """
    feature = "progdesc.distributed.initialize() without arguments (cluster detection)"
    consequence = "pass coordinator, num_processes and process_id to initialize"
    cluster_env = _resolve("jax._src.clusters", "ClusterEnv", feature, consequence)
    kinds = getattr(cluster_env, "_cluster_types", None)
    if kinds is None:
        raise _missing("jax._src.clusters.ClusterEnv._cluster_types", feature, consequence)
    detect = getattr(cluster_env, "auto_detect_unset_distributed_params", None)
    try:
        takes = set(inspect.signature(detect).parameters)
    except (TypeError, ValueError):
        takes = set()
    if not takes >= _DETECT_PARAMETERS:
        raise _missing("jax._src.clusters.ClusterEnv.auto_detect_unset_distributed_params("
                       f"{', '.join(sorted(_DETECT_PARAMETERS))})", feature, consequence)
    found = next((kind for kind in kinds
                  if not kind.opt_in_only_method and kind.is_env_present()), None)
    if found is None:
        return None, coordinator, num_processes, process_id
    coordinator, num_processes, process_id, _ = detect(
        coordinator_address=coordinator, num_processes=num_processes, process_id=process_id,
        local_device_ids=[], cluster_detection_method=None, initialization_timeout=timeout)
    return found.__name__, coordinator, num_processes, process_id


_DETECT_PARAMETERS = {"coordinator_address", "num_processes", "process_id", "local_device_ids",
                      "cluster_detection_method", "initialization_timeout"}
