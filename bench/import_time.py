"""`import progdesc` against `import jax`, each in fresh processes (issue 27).

    python -m bench.import_time [--rounds 9] [--progdesc-root DIR]

Each round starts, one after the other, a process that imports only JAX and one that
imports progdesc (which imports JAX itself); each times its own import with
`time.perf_counter` (wall) and `time.process_time` (CPU, which a busy machine disturbs
less) around it, so interpreter start-up is left out. The figures are medians over the
rounds; the ratios are progdesc's over JAX's, and `extra_s` what progdesc adds.
`heavy` lists the optional packages (Flax, optax, scikit-learn, SciPy, Matplotlib, ONNX,
jax.extend) the progdesc process had loaded once imported: none, since they load on first
use. `--progdesc-root` imports another checkout's progdesc (an older commit, to compare).
Prints one JSON line last.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEAVY = ("flax", "optax", "sklearn", "scipy", "matplotlib", "onnx", "jax.extend")
_TIMED = """\
import json, sys, time
start, cpu = time.perf_counter(), time.process_time()
import {module}
seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
print(json.dumps({{"s": seconds, "cpu_s": cpu,
                  "heavy": [m for m in {heavy!r} if m in sys.modules]}}))
"""


def _timed(module, progdesc_root):
    env = dict(os.environ, PYTHONPATH=progdesc_root, JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, "-c", _TIMED.format(module=module, heavy=HEAVY)],
                          env=env, cwd=progdesc_root, capture_output=True, text=True,
                          timeout=300, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(rounds=9, log=print, progdesc_root=ROOT):
    """{"jax_s", "progdesc_s", "jax_cpu_s", "progdesc_cpu_s", "extra_s", "ratio",
    "cpu_ratio", "rounds", "heavy"}: medians over `rounds`."""
    _timed("progdesc", progdesc_root)   # warm the file-system caches for both
    times = {key: [] for key in ("jax_s", "jax_cpu_s", "progdesc_s", "progdesc_cpu_s")}
    heavy = set()
    for _ in range(rounds):
        for module in ("jax", "progdesc"):
            got = _timed(module, progdesc_root)
            times[f"{module}_s"].append(got["s"])
            times[f"{module}_cpu_s"].append(got["cpu_s"])
        heavy.update(got["heavy"])
    result = {key: statistics.median(values) for key, values in times.items()}
    result.update(rounds=rounds, heavy=sorted(heavy))
    result["extra_s"] = result["progdesc_s"] - result["jax_s"]
    result["ratio"] = result["progdesc_s"] / result["jax_s"]
    result["cpu_ratio"] = result["progdesc_cpu_s"] / result["jax_cpu_s"]
    log(f"  import jax {result['jax_s']:.3f} s, import progdesc {result['progdesc_s']:.3f} s "
        f"(x{result['ratio']:.2f}, +{result['extra_s']:.3f} s; CPU time "
        f"{result['jax_cpu_s']:.3f} s / {result['progdesc_cpu_s']:.3f} s, "
        f"x{result['cpu_ratio']:.2f}); optional packages loaded: "
        f"{', '.join(result['heavy']) or 'none'}")
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--progdesc-root", default=ROOT)
    args = parser.parse_args(argv)
    print(json.dumps(run(args.rounds, progdesc_root=args.progdesc_root)))


if __name__ == "__main__":
    main()
