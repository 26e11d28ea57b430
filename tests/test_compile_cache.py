"""The persistent compilation cache: on by default, found by a second process, switchable."""
import json
import os
import subprocess
import sys
import textwrap
import warnings

import jax
import numpy as np
import pytest

import progdesc as pd
from progdesc import compile_cache

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Trains one step of a small model and serves a .pdx (exported by the first process),
# then prints JAX's persistent-cache hits and misses, read from JAX's monitoring events.
SCRIPT = textwrap.dedent("""
    import json, os, sys
    import jax
    import numpy as np
    events = []
    jax.monitoring.register_event_listener(lambda name, **kw: events.append(name))
    import progdesc as pd
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
        "cache_dir": jax.config.jax_compilation_cache_dir,
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


def test_a_second_process_loads_what_the_first_compiled(tmp_path):
    xdg = tmp_path / "xdg"
    cache_dir = xdg / "progdesc" / "xla"       # the default place under XDG_CACHE_HOME
    first = run_script(tmp_path, XDG_CACHE_HOME=str(xdg))
    written = entries(cache_dir)
    assert first["cache_dir"] == str(cache_dir)
    assert first["hits"] == 0 and first["misses"] > 0
    assert len(written) == first["misses"]

    second = run_script(tmp_path, XDG_CACHE_HOME=str(xdg))
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
    """Restore JAX's cache settings (the suite runs with the cache off) after a test."""
    saved = (jax.config.jax_compilation_cache_dir,
             jax.config.jax_persistent_cache_min_compile_time_secs,
             jax.config.jax_compilation_cache_max_size)
    yield
    jax.config.update("jax_persistent_cache_min_compile_time_secs", saved[1])
    pd.set_compilation_cache(saved[0], max_bytes=saved[2])


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


def test_a_cache_dir_the_user_gave_jax_is_kept(monkeypatch, tmp_path, jax_cache_settings):
    monkeypatch.delenv("PROGDESC_COMPILATION_CACHE", raising=False)
    monkeypatch.setenv("PROGDESC_CACHE_DIR", str(tmp_path / "ours"))
    monkeypatch.delenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", raising=False)
    jax.config.update("jax_compilation_cache_dir", str(tmp_path / "theirs"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    assert compile_cache.configure_default() == str(tmp_path / "theirs")
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / "theirs")
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 1.0

    jax.config.update("jax_compilation_cache_dir", None)     # nothing set: progdesc's default
    assert compile_cache.configure_default() == str(tmp_path / "ours" / "xla")
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.0    # write everything


def test_set_compilation_cache_moves_and_stops_the_cache(tmp_path, jax_cache_settings):
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    offset = float(np.random.default_rng().integers(1 << 30))   # a program no cache holds

    pd.set_compilation_cache(tmp_path / "a")
    jax.jit(lambda v: v * 3.0 + offset)(np.ones(3, np.float32)).block_until_ready()
    assert len(entries(tmp_path / "a")) == 1

    pd.set_compilation_cache(tmp_path / "b")
    jax.jit(lambda v: v * 5.0 + offset)(np.ones(3, np.float32)).block_until_ready()
    assert len(entries(tmp_path / "a")) == 1 and len(entries(tmp_path / "b")) == 1

    pd.set_compilation_cache(None)
    jax.jit(lambda v: v * 7.0 + offset)(np.ones(3, np.float32)).block_until_ready()
    assert len(entries(tmp_path / "a")) == 1 and len(entries(tmp_path / "b")) == 1


def test_a_compile_time_threshold_the_user_set_is_kept(monkeypatch, tmp_path,
                                                       jax_cache_settings):
    monkeypatch.delenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", raising=False)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 2.5)
    pd.set_compilation_cache(tmp_path)
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 2.5


def test_the_default_cache_is_bounded_unless_the_user_bounded_it(monkeypatch, tmp_path,
                                                                jax_cache_settings):
    monkeypatch.delenv("PROGDESC_COMPILATION_CACHE", raising=False)
    monkeypatch.delenv("JAX_COMPILATION_CACHE_MAX_SIZE", raising=False)
    monkeypatch.setenv("PROGDESC_CACHE_DIR", str(tmp_path))
    jax.config.update("jax_compilation_cache_dir", None)
    jax.config.update("jax_compilation_cache_max_size", -1)
    compile_cache.configure_default()
    assert jax.config.jax_compilation_cache_max_size == compile_cache.DEFAULT_MAX_BYTES

    jax.config.update("jax_compilation_cache_dir", None)
    jax.config.update("jax_compilation_cache_max_size", 12345)      # the user's own bound
    compile_cache.configure_default()
    assert jax.config.jax_compilation_cache_max_size == 12345


def sizes(path):
    """Total bytes of the cache entries under `path`."""
    return sum(len(v) for v in entries(path).values())


def test_past_the_bound_the_least_recently_read_entries_go(tmp_path, jax_cache_settings):
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    offset = float(np.random.default_rng().integers(1 << 30))   # programs no cache holds
    probe = tmp_path / "probe"
    pd.set_compilation_cache(probe, max_bytes=-1)
    jax.jit(lambda v: v * 2.0 + offset)(np.ones(3, np.float32)).block_until_ready()
    entry_bytes = sizes(probe)
    assert entry_bytes > 0

    bounded = tmp_path / "bounded"
    pd.set_compilation_cache(bounded, max_bytes=int(2.5 * entry_bytes))
    for factor in (3.0, 5.0, 7.0, 11.0):
        jax.jit(lambda v, f=factor: v * f + offset)(np.ones(3, np.float32)).block_until_ready()
        assert sizes(bounded) <= 2.5 * entry_bytes
    assert len(entries(bounded)) == 2


def test_entries_written_while_unbounded_are_kept_and_later_writes_work(tmp_path,
                                                                       jax_cache_settings):
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    offset = float(np.random.default_rng().integers(1 << 30))
    pd.set_compilation_cache(tmp_path, max_bytes=-1)       # an older, unbounded cache
    jax.jit(lambda v: v * 2.0 + offset)(np.ones(3, np.float32)).block_until_ready()
    old = entries(tmp_path)
    assert len(old) == 1 and not list(tmp_path.glob("*-atime"))

    pd.set_compilation_cache(tmp_path)                     # bounded by default
    with warnings.catch_warnings():
        warnings.simplefilter("error")                      # JAX warns when a write fails
        jax.jit(lambda v: v * 3.0 + offset)(np.ones(3, np.float32)).block_until_ready()
    now = entries(tmp_path)
    assert len(now) == 2 and all(now[name] == value for name, value in old.items())
