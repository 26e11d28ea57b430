"""JAX's persistent compilation cache, on by default for every process that imports progdesc.

Compiled XLA programs are written to a per-user directory and read back by later
processes (a restarted notebook kernel, `progdesc run`, a server loading a `.pdx`),
which then skip the compile. The default directory is `$XDG_CACHE_HOME/progdesc/xla`,
or `~/.cache/progdesc/xla` without XDG_CACHE_HOME.

- `PROGDESC_CACHE_DIR=/some/dir` (set before importing progdesc) moves progdesc's
  cache directory; compiled programs then go to `/some/dir/xla`.
- `PROGDESC_COMPILATION_CACHE=0` (or `false`, `off`, `no`) turns the cache off.
- `set_compilation_cache(path)` moves it for this process, `set_compilation_cache(None)`
  turns it off.
- A JAX cache directory configured by the user (`JAX_COMPILATION_CACHE_DIR` or
  `jax.config.update("jax_compilation_cache_dir", ...)` before importing progdesc) is
  left as it is, together with JAX's other cache settings.

The cache is bounded: past `DEFAULT_MAX_BYTES` (2 GiB) JAX evicts the entries read
least recently (JAX's own LRU eviction, `jax_compilation_cache_max_size`). A bound
the user gave JAX (`JAX_COMPILATION_CACHE_MAX_SIZE`, or the config) is kept;
`set_compilation_cache(path, max_bytes=...)` sets another, -1 for none.

The setting is JAX's own, so it serves every JAX computation of the process. Every
compiled program is written (JAX's own default skips those that compile in under 1 s,
which is most progdesc programs on a CPU), unless the user set JAX's
`jax_persistent_cache_min_compile_time_secs` themselves. JAX trusts its cache's
contents: keep the directory writable by you only.
"""
import os

import jax
from jax.experimental.compilation_cache import compilation_cache as _jax_cache

OFF_VARIABLE = "PROGDESC_COMPILATION_CACHE"
DIR_VARIABLE = "PROGDESC_CACHE_DIR"
_OFF_VALUES = {"0", "false", "off", "no"}
DEFAULT_MAX_BYTES = 2 * 1024 ** 3
_UNBOUNDED = -1       # JAX's default for jax_compilation_cache_max_size


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
    """Use `path` as JAX's persistent compilation cache in this process; None turns it off.

    Takes effect for the next compilation, replacing any earlier setting (JAX's
    own included). Unless JAX's minimum compile time was set by the user, every
    compiled program is written. Past `max_bytes` the entries read least recently
    are evicted; -1 lets the cache grow without bound.
    """
    _use(None if path is None else os.fspath(path))
    jax.config.update("jax_compilation_cache_max_size", int(max_bytes))
    _date_entries(path)
    _jax_cache.reset_cache()   # JAX opens its cache once; let the next compile reopen it


def configure_default():
    """Turn the cache on at `default_cache_dir()`, unless switched off or set up by the user.

    Called once when progdesc is imported. Returns the directory in use, or None.
    """
    if jax.config.jax_compilation_cache_dir is None:
        if os.environ.get(OFF_VARIABLE, "").strip().lower() in _OFF_VALUES:
            return None
        _use(default_cache_dir())   # JAX has opened no cache without a directory: no reset
        bound_set_by_user = ("JAX_COMPILATION_CACHE_MAX_SIZE" in os.environ
                             or jax.config.jax_compilation_cache_max_size != _UNBOUNDED)
        if not bound_set_by_user:
            jax.config.update("jax_compilation_cache_max_size", DEFAULT_MAX_BYTES)
        _date_entries(jax.config.jax_compilation_cache_dir)
    return jax.config.jax_compilation_cache_dir


def _use(path):
    jax.config.update("jax_compilation_cache_dir", path)
    threshold_set_by_user = ("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" in os.environ
                             or jax.config.jax_persistent_cache_min_compile_time_secs != 1.0)
    if path is not None and not threshold_set_by_user:     # 1.0 s: JAX's default
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)



def _date_entries(path):
    """Give every entry in the cache at `path` the access-time file JAX's eviction reads.

    A bounded cache keeps a `<key>-atime` file beside each `<key>-cache` entry;
    entries written while the cache was unbounded (an older progdesc, or plain JAX)
    have none, and JAX then fails every later write. They get their modification time.
    """
    if path is None or jax.config.jax_compilation_cache_max_size == _UNBOUNDED:
        return
    try:
        names = set(os.listdir(path))
    except OSError:      # not there yet: JAX creates it
        return
    for name in names:
        key = name[:-len("-cache")]
        if name.endswith("-cache") and key + "-atime" not in names:
            try:
                mtime = os.stat(os.path.join(path, name)).st_mtime_ns
                with open(os.path.join(path, key + "-atime"), "wb") as f:
                    f.write(mtime.to_bytes(8, "little"))
            except OSError:   # another process evicted it, or the directory is not ours
                continue
