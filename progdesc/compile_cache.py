"""A persistent cache of progdesc's own compiled programs, on by default.

Compiled XLA programs are written to a per-user directory and read back by later
processes (a restarted notebook kernel, `progdesc run`, a server loading a `.pdx`),
which then skip the compile. The default directory is `$XDG_CACHE_HOME/progdesc/xla`,
or `~/.cache/progdesc/xla` without XDG_CACHE_HOME.

- `PROGDESC_CACHE_DIR=/some/dir` (set before importing progdesc) moves the directory;
  compiled programs then go to `/some/dir/xla`.
- `PROGDESC_COMPILATION_CACHE=0` (or `false`, `off`, `no`) turns the cache off.
- `set_compilation_cache(path)` moves it for this process, `set_compilation_cache(None)`
  turns it off.
- A JAX cache directory the user configured (`JAX_COMPILATION_CACHE_DIR` or
  `jax.config.update("jax_compilation_cache_dir", ...)`, at any time) serves progdesc's
  compiles as it serves all others, with JAX's settings, unless `set_compilation_cache`
  was called.

Only progdesc's own compiles use it: the Executor's programs, eager ops and calls of a
loaded `.pdx` run inside `compiling()`, which points JAX's persistent cache at the
directory for the current thread only. JAX's global configuration is left as it is, so
importing progdesc changes nothing for other JAX code. JAX's cache takes a file lock
shared by all processes around every read and write when it is bounded; progdesc's is
run unbounded for JAX (no lock: processes compiling at once never wait on each other)
and bounded by progdesc: past `DEFAULT_MAX_BYTES` (2 GiB), `evict` deletes the entries
used least recently, in a background thread that skips its turn while another process
evicts. Every one of progdesc's programs is written (JAX's own default skips those that
compile in under 1 s, which is most on a CPU), unless the user set JAX's
`jax_persistent_cache_min_compile_time_secs`. JAX trusts its cache's contents: keep
the directory writable by you only.
"""
import contextlib
import os
import threading
import time
import warnings

import filelock
import jax
from jax.experimental.compilation_cache import compilation_cache as _jax_cache

from lowering.errors import JaxCompatError
from progdesc import jax_compat

OFF_VARIABLE = "PROGDESC_COMPILATION_CACHE"
DIR_VARIABLE = "PROGDESC_CACHE_DIR"
_OFF_VALUES = {"0", "false", "off", "no"}
DEFAULT_MAX_BYTES = 2 * 1024 ** 3
EVICT_EVERY_S = 60.0      # at most one eviction pass per process in this time
_JAX_DEFAULT_MIN_COMPILE_S = 1.0

_state = {"path": None, "max_bytes": DEFAULT_MAX_BYTES, "explicit": False}
_lock = threading.Lock()
_active = 0               # progdesc compiles in progress in this process (all threads)
_last_eviction = -float("inf")


def default_cache_dir():
    """The directory progdesc uses for compiled programs unless told otherwise.

    `$PROGDESC_CACHE_DIR/xla`, else `$XDG_CACHE_HOME/progdesc/xla` (an absolute
    XDG_CACHE_HOME only, as the XDG spec asks), else `~/.cache/progdesc/xla`.
    """
    root = os.environ.get(DIR_VARIABLE)
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME", "")
        base = xdg if os.path.isabs(xdg) else os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(base, "progdesc")
    return os.path.join(root, "xla")


def set_compilation_cache(path, max_bytes=DEFAULT_MAX_BYTES):
    """Keep progdesc's compiled programs in `path` in this process; None turns the cache off.

    Takes effect for the next compilation and replaces any earlier setting, a JAX cache
    directory the user configured included (for progdesc's compiles only: other JAX code
    keeps JAX's settings). Past `max_bytes` the entries used least recently are evicted;
    -1 lets the cache grow without bound.
    """
    _state.update(path=None if path is None else os.fspath(path), max_bytes=int(max_bytes),
                  explicit=True)


def configure_default():
    """Read the environment once, when progdesc is imported: the directory progdesc's
    compiles use (None when off). Changes no JAX setting."""
    off = os.environ.get(OFF_VARIABLE, "").strip().lower() in _OFF_VALUES
    _state.update(path=None if off else default_cache_dir(), max_bytes=DEFAULT_MAX_BYTES,
                  explicit=False)
    return cache_dir()


def cache_dir():
    """The directory that progdesc's compiles are read from and written to now, or None."""
    if not _state["explicit"] and _jax_global_dir() is not None:
        return _jax_global_dir()
    return _state["path"]


@contextlib.contextmanager
def compiling():
    """Run one of progdesc's own compiles (or first calls) with progdesc's cache settings.

    They hold for this thread only; every other compile, in this thread outside the
    block or in any other thread, sees JAX's configuration unchanged.
    """
    settings = _settings()
    if settings is None:
        yield
        return
    _enter()
    try:
        with _jax_thread_settings(**settings):
            yield
    finally:
        _leave()


def _settings():
    """The JAX settings progdesc's compiles get, or None where JAX's own global ones serve."""
    user_dir = _jax_global_dir()
    if not _state["explicit"] and user_dir is not None:
        return None            # the user's JAX cache serves every compile, as configured
    if _state["path"] is None and user_dir is None:
        return None            # no cache anywhere
    settings = {"cache_dir": _state["path"], "max_size": -1}   # -1: no lock; `evict` bounds it
    threshold_set_by_user = ("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" in os.environ
                             or jax.config.jax_persistent_cache_min_compile_time_secs
                             != _JAX_DEFAULT_MIN_COMPILE_S)
    if not threshold_set_by_user:
        settings["min_compile_time"] = 0.0
    return settings


def _enter():
    global _active
    with _lock:
        _active += 1
        if _active == 1:
            _jax_cache.reset_cache()   # JAX opens its cache once: let this compile open ours


def _leave():
    global _active, _last_eviction
    with _lock:
        _active -= 1
        if _active:
            return
        _jax_cache.reset_cache()       # and the next compile outside reopens JAX's own
        path, bound = _state["path"], _state["max_bytes"]
        due = time.monotonic() - _last_eviction > EVICT_EVERY_S
        if path is None or bound < 0 or not due:
            return
        _last_eviction = time.monotonic()
    threading.Thread(target=evict, args=(path, bound), name="progdesc-cache-evict",
                     daemon=True).start()


def evict(path=None, max_bytes=None):
    """Delete the entries of the cache at `path` used least recently until it holds at most
    `max_bytes` (default: progdesc's cache and bound). Returns the names deleted.

    Never waits: when another process is evicting the same directory, returns at once.
    An entry's last use is the later of its file's access and modification times.
    """
    path = _state["path"] if path is None else os.fspath(path)
    max_bytes = _state["max_bytes"] if max_bytes is None else int(max_bytes)
    if path is None or max_bytes < 0 or not os.path.isdir(path):
        return []
    try:
        with filelock.FileLock(os.path.join(path, ".progdesc-evict.lock"), timeout=0):
            return _evict_unlocked(path, max_bytes)
    except (filelock.Timeout, OSError):   # another process evicts, or the directory is not ours
        return []


def _evict_unlocked(path, max_bytes):
    entries = []
    for item in os.scandir(path):
        if item.name.endswith("-cache"):
            try:
                st = item.stat()
            except OSError:       # deleted meanwhile
                continue
            entries.append((max(st.st_atime_ns, st.st_mtime_ns), item.name, st.st_size))
    total = sum(size for _, _, size in entries)
    deleted = []
    for _, name, size in sorted(entries):
        if total <= max_bytes:
            break
        for victim in (name, name[:-len("-cache")] + "-atime"):   # -atime: older progdesc
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(path, victim))
        total -= size
        deleted.append(name)
    return deleted


# --- JAX's cache settings for one thread (through progdesc.jax_compat) ---

def thread_settings_supported():
    """Whether this JAX has the per-thread cache settings progdesc's compiles need (else
    they go uncached, and other JAX code is unaffected either way)."""
    try:
        jax_compat.thread_compilation_cache(cache_dir=None, max_size=-1, min_compile_time=0.0)
    except JaxCompatError:
        return False
    return True


def _jax_global_dir():
    """JAX's process-wide cache directory (the user's), whatever this thread overrides."""
    return jax_compat.global_compilation_cache_dir()


_warned = []


@contextlib.contextmanager
def _jax_thread_settings(**values):
    """JAX's cache options `values` (cache_dir, max_size, min_compile_time) for the current
    thread. On a JAX without per-thread settings, progdesc's compiles go uncached, with
    one warning per process saying why."""
    try:
        settings = jax_compat.thread_compilation_cache(**values)
    except JaxCompatError as e:
        if not _warned:
            _warned.append(e)
            warnings.warn(str(e), RuntimeWarning, stacklevel=3)
        settings = contextlib.nullcontext()
    with settings:
        yield
