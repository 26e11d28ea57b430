"""The persistent compilation cache of progdesc's compiles: on by default, found by a second
process, switchable, bounded, and never used by other JAX code of the process."""
import json
import os
import threading
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

import progdesc as pd
from progdesc import compile_cache

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Compiles plain JAX code (a jitted function and an un-jitted hessian), then trains one step of
# a small model and serves a .pdx (exported by the first process); prints JAX's cache
# settings and its persistent-cache hits and misses (JAX's monitoring events) for each part.
SCRIPT = textwrap.dedent("""
    import json, os, sys
    import jax
    import jax.numpy as jnp
    import numpy as np
    events = []
    jax.monitoring.register_event_listener(lambda name, **kw: events.append(name))
    import progdesc as pd
    jax_settings = [jax.config.jax_compilation_cache_dir,
                    jax.config.jax_compilation_cache_max_size,
                    jax.config.jax_persistent_cache_min_compile_time_secs]
    jax.jit(lambda v: jnp.tanh(v) * 3.0)(np.ones(3, np.float32)).block_until_ready()
    jax.hessian(lambda v: jnp.sum(jnp.sin(v) ** 3))(np.ones(3, np.float32)).block_until_ready()
    plain = {"plain_hits": events.count("/jax/compilation_cache/cache_hits"),
             "plain_misses": events.count("/jax/compilation_cache/cache_misses")}
    events.clear()
    from progdesc import layers, ops
    from progdesc.optimizer import Adam

    main, startup = pd.Program(random_seed=1), pd.Program(random_seed=1)
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 6])
        label = pd.data("label", [None, 1], "int64")
        logits = layers.fc(layers.fc(x, 16, act="relu"), 3)
        loss = ops.mean(layers.softmax_with_cross_entropy(logits, label))
        Adam(1e-2).minimize(loss)
    exe, scope = pd.Executor(), pd.Scope()
    exe.run(startup, scope=scope)
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((5, 6)).astype(np.float32)
    ys = rng.integers(0, 3, (5, 1))
    (value,) = exe.run(main, feed={"x": xs, "label": ys}, fetch_list=[loss], scope=scope)
    pdx = sys.argv[1]
    if not os.path.exists(pdx):
        pd.export.export_compiled(pdx, main, ["x"], [logits], scope)
    (served,) = pd.export.load_compiled(pdx)(xs)
    print(json.dumps({
        "cache_dir": pd.compile_cache.cache_dir(), "jax_settings": jax_settings, **plain,
        "hits": events.count("/jax/compilation_cache/cache_hits"),
        "misses": events.count("/jax/compilation_cache/cache_misses"),
        "loss": float(value), "served": served.tolist()}))
""")


def run_script(tmp_path, **env_vars):
    """Run SCRIPT in a fresh process with the cache variables in `env_vars`; its JSON."""
    script = tmp_path / "train_and_serve.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items()
           if k not in (compile_cache.OFF_VARIABLE, compile_cache.DIR_VARIABLE, "XDG_CACHE_HOME",
                        "JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS")}
    env.update(PYTHONPATH=ROOT, JAX_PLATFORMS="cpu", **env_vars)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "model.pdx")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def entries(path):
    """{file name: contents} of the cache entries under `path`."""
    if not path.exists():
        return {}
    return {p.name: p.read_bytes() for p in path.iterdir() if p.name.endswith("-cache")}


def test_a_second_process_loads_what_the_first_compiled_and_nothing_else(tmp_path):
    """progdesc's compiles are written, then read back by a second process; importing
    progdesc changes no JAX setting, and plain JAX compiles of either process neither read
    nor write the cache (issue 22)."""
    xdg = tmp_path / "xdg"
    cache_dir = xdg / "progdesc" / "xla"       # the default place under XDG_CACHE_HOME
    first = run_script(tmp_path, XDG_CACHE_HOME=str(xdg))
    written = entries(cache_dir)
    assert first["cache_dir"] == str(cache_dir)
    assert first["hits"] == 0 and first["misses"] > 0
    assert len(written) == first["misses"]

    second = run_script(tmp_path, XDG_CACHE_HOME=str(xdg))
    for out in (first, second):
        assert out["jax_settings"] == [None, -1, 1.0]         # JAX's defaults
        assert out["plain_hits"] == 0 and out["plain_misses"] == 0
    assert second["misses"] == 0 and second["hits"] == first["misses"]
    assert entries(cache_dir) == written
    # the executables read back compute what the freshly compiled ones did
    assert second["loss"] == first["loss"] and second["served"] == first["served"]


def test_the_off_switch_writes_nothing(tmp_path):
    cache_root = tmp_path / "pd_cache"
    out = run_script(tmp_path, PROGDESC_COMPILATION_CACHE="0", PROGDESC_CACHE_DIR=str(cache_root),
                     XDG_CACHE_HOME=str(tmp_path / "xdg"))
    assert out["cache_dir"] is None and out["hits"] == 0
    assert not cache_root.exists() and not (tmp_path / "xdg").exists()


@pytest.fixture
def jax_cache_settings():
    """Restore JAX's cache settings, and progdesc's (off in the suite), after a test."""
    saved = (jax.config.jax_compilation_cache_dir,
             jax.config.jax_persistent_cache_min_compile_time_secs,
             jax.config.jax_compilation_cache_max_size)
    yield
    jax.config.update("jax_compilation_cache_dir", saved[0])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", saved[1])
    jax.config.update("jax_compilation_cache_max_size", saved[2])
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(compile_cache.OFF_VARIABLE, "0")             # as tests/conftest.py sets it
        compile_cache.configure_default()


@pytest.mark.parametrize("env, expected", [
    ({"PROGDESC_CACHE_DIR": "/data/pd"}, "/data/pd/xla"),
    ({"PROGDESC_CACHE_DIR": "/data/pd", "XDG_CACHE_HOME": "/xdg"}, "/data/pd/xla"),
    ({"XDG_CACHE_HOME": "/xdg"}, "/xdg/progdesc/xla"),
    ({"XDG_CACHE_HOME": "relative/ignored", "HOME": "/home/u"}, "/home/u/.cache/progdesc/xla"),
    ({"HOME": "/home/u"}, "/home/u/.cache/progdesc/xla"),
])
def test_default_cache_dir_follows_the_variables(monkeypatch, env, expected):
    for name in ("PROGDESC_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert compile_cache.default_cache_dir() == expected


def fresh_offset():
    return float(np.random.default_rng().integers(1 << 30))   # makes a program no cache holds


def progdesc_compile(factor, offset):
    """Compile and run a small function as progdesc compiles its programs."""
    with compile_cache.compiling():
        jax.jit(lambda v: v * factor + offset).lower(np.ones(3, np.float32)).compile()


def test_the_jax_seam_progdesc_needs_is_there():
    assert compile_cache.thread_settings_supported(), (
        "jax._src.config no longer has the States compilation_cache_dir, "
        "compilation_cache_max_size and persistent_cache_min_compile_time_secs with "
        "thread-local context managers: progdesc's compiles now go uncached; update "
        "progdesc/jax_compat.py (thread_compilation_cache)")


def test_a_cache_dir_the_user_gave_jax_serves_progdesc_with_jax_settings(
        monkeypatch, tmp_path, jax_cache_settings):
    monkeypatch.delenv(compile_cache.OFF_VARIABLE, raising=False)
    monkeypatch.setenv(compile_cache.DIR_VARIABLE, str(tmp_path / "ours"))
    monkeypatch.delenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", raising=False)
    assert compile_cache.configure_default() == str(tmp_path / "ours" / "xla")
    jax.config.update("jax_compilation_cache_dir", str(tmp_path / "theirs"))   # even later
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    assert compile_cache.cache_dir() == str(tmp_path / "theirs")
    progdesc_compile(3.0, fresh_offset())
    assert len(entries(tmp_path / "theirs")) == 1 and not entries(tmp_path / "ours" / "xla")

    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)     # theirs too
    with compile_cache.compiling():
        assert jax.config.jax_persistent_cache_min_compile_time_secs == 1.0
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "theirs")


def test_progdesc_settings_hold_only_for_its_own_compiles(monkeypatch, tmp_path,
                                                          jax_cache_settings):
    monkeypatch.delenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", raising=False)
    pd.set_compilation_cache(tmp_path)
    offset = fresh_offset()
    jax.jit(lambda v: v * 2.0 + offset)(np.ones(3, np.float32)).block_until_ready()
    assert not entries(tmp_path)                               # plain JAX: not written
    progdesc_compile(3.0, offset)
    assert len(entries(tmp_path)) == 1                         # progdesc's: written
    assert jax.config.jax_compilation_cache_dir is None
    assert jax.config.jax_compilation_cache_max_size == -1

    # another thread compiling while progdesc compiles sees JAX's settings, not ours
    inside, done, seen = threading.Event(), threading.Event(), []

    def progdesc_thread():
        with compile_cache.compiling():
            inside.set()
            done.wait(30)

    worker = threading.Thread(target=progdesc_thread)
    worker.start()
    try:
        assert inside.wait(30)
        seen.append(jax.config.jax_compilation_cache_dir)
        seen.append(jax.config.jax_persistent_cache_min_compile_time_secs)
    finally:
        done.set()
        worker.join()
    assert seen == [None, 1.0]


def test_set_compilation_cache_moves_and_stops_the_cache(tmp_path, jax_cache_settings):
    offset = fresh_offset()
    pd.set_compilation_cache(tmp_path / "a")
    progdesc_compile(3.0, offset)
    assert len(entries(tmp_path / "a")) == 1

    pd.set_compilation_cache(tmp_path / "b")
    progdesc_compile(5.0, offset)
    assert len(entries(tmp_path / "a")) == 1 and len(entries(tmp_path / "b")) == 1

    jax.config.update("jax_compilation_cache_dir", str(tmp_path / "theirs"))
    pd.set_compilation_cache(None)               # off for progdesc, over the user's JAX cache
    progdesc_compile(7.0, offset)
    assert len(entries(tmp_path / "a")) == 1 and len(entries(tmp_path / "b")) == 1
    assert not entries(tmp_path / "theirs")


def test_a_compile_time_threshold_the_user_set_is_kept(monkeypatch, tmp_path,
                                                       jax_cache_settings):
    monkeypatch.delenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", raising=False)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 2.5)
    pd.set_compilation_cache(tmp_path)
    with compile_cache.compiling():
        assert jax.config.jax_persistent_cache_min_compile_time_secs == 2.5
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    with compile_cache.compiling():
        assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.0   # write all


def sizes(path):
    """Total bytes of the cache entries under `path`."""
    return sum(len(v) for v in entries(path).values())


def test_past_the_bound_the_least_recently_used_entries_go(tmp_path, jax_cache_settings):
    offset = fresh_offset()
    pd.set_compilation_cache(tmp_path)
    for factor in (3.0, 5.0, 7.0, 11.0):
        progdesc_compile(factor, offset)
    found = entries(tmp_path)
    names = sorted(found)
    assert len(names) == 4
    (tmp_path / (names[3][:-len("-cache")] + "-atime")).write_bytes(b"\0" * 8)  # older progdesc
    for age, name in enumerate(names):          # names[0] used last, names[3] longest ago
        stamp = 1_000_000_000 - 1000 * age      # (reading an entry would move its atime)
        os.utime(tmp_path / name, (stamp, stamp))
    kept_bytes = len(found[names[0]]) + len(found[names[1]])

    assert sorted(compile_cache.evict(tmp_path, kept_bytes)) == sorted(names[2:])
    assert sorted(entries(tmp_path)) == names[:2] and not list(tmp_path.glob("*-atime"))
    assert compile_cache.evict(tmp_path, kept_bytes) == []


def test_eviction_never_waits_for_another_process(tmp_path, jax_cache_settings):
    pd.set_compilation_cache(tmp_path)
    progdesc_compile(3.0, fresh_offset())
    script = ("import filelock, sys, time; lock = filelock.FileLock(sys.argv[1]); "
              "lock.acquire(); print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", script,
                               str(tmp_path / ".progdesc-evict.lock")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert compile_cache.evict(tmp_path, 0) == []          # at once, nothing deleted
        assert len(entries(tmp_path)) == 1
    finally:
        holder.kill()
        holder.wait()
    assert len(compile_cache.evict(tmp_path, 0)) == 1


def test_the_default_bound_leaves_jax_unbounded(monkeypatch, tmp_path, jax_cache_settings):
    monkeypatch.delenv(compile_cache.OFF_VARIABLE, raising=False)
    monkeypatch.setenv(compile_cache.DIR_VARIABLE, str(tmp_path))
    compile_cache.configure_default()
    with compile_cache.compiling():      # JAX's lock-taking LRU eviction stays off
        assert jax.config.jax_compilation_cache_max_size == -1
    big = tmp_path / "xla"
    big.mkdir()
    (big / "k-cache").write_bytes(b"x" * 100)
    assert compile_cache.evict() == []                       # under DEFAULT_MAX_BYTES
    assert compile_cache.evict(big, 50) == ["k-cache"]
