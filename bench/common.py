"""Timing helpers: interleaved A/B blocks, medians, and XLA analysis of compiled steps."""
import re
import statistics
import time
from collections import Counter


def interleaved(fns, steps, warmup=3, block=5):
    """Median seconds per call of each of `fns` ({name: zero-arg callable}).

    Each callable runs `warmup` untimed calls, then the callables take turns in blocks
    of `block` timed calls until each has `steps` timings (A B A B ...), so that slow
    phases of a noisy machine hit every implementation alike. Every call must return
    only once its work is finished (block_until_ready / NumPy conversion inside).
    Returns {name: {"median_s", "min_s", "n", "times"}}.
    """
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times = {name: [] for name in fns}
    order = list(fns)
    turn = 0
    while any(len(t) < steps for t in times.values()):
        # alternate which one goes first in each round
        for name in (order if turn % 2 == 0 else order[::-1]):
            fn, ts = fns[name], times[name]
            for _ in range(min(block, steps - len(ts))):
                t0 = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t0)
        turn += 1
    return {name: {"median_s": statistics.median(ts), "min_s": min(ts), "n": len(ts),
                   "times": ts} for name, ts in times.items()}


_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*.*?\s([a-z][\w\-]*)\(", re.M)


def hlo_summary(compiled):
    """Cost, memory and op counts of a jax `Compiled` (optimized HLO), as a dict."""
    out = {}
    try:
        cost = compiled.cost_analysis()
        if isinstance(cost, (list, tuple)):
            cost = cost[0] if cost else {}
        out["flops"] = float(cost.get("flops", float("nan")))
        out["transcendentals"] = float(cost.get("transcendentals", float("nan")))
        out["bytes_accessed"] = float(cost.get("bytes accessed", float("nan")))
    except Exception as e:  # noqa: BLE001
        out["cost_error"] = repr(e)
    try:
        mem = compiled.memory_analysis()
        args, outs = mem.argument_size_in_bytes, mem.output_size_in_bytes
        alias, temp = mem.alias_size_in_bytes, mem.temp_size_in_bytes
        out.update(argument_mb=args / 2**20, output_mb=outs / 2**20, alias_mb=alias / 2**20,
                   temp_mb=temp / 2**20, peak_mb=(args + outs - alias + temp) / 2**20)
    except Exception as e:  # noqa: BLE001
        out["memory_error"] = repr(e)
    try:
        text = compiled.as_text()
        entry = text[text.index("\nENTRY"):] if "\nENTRY" in text else text
        entry = entry[:entry.find("\n}")] if "\n}" in entry else entry
        out["entry_ops"] = dict(Counter(_INSTR.findall(entry)).most_common())
        out["all_ops"] = dict(Counter(_INSTR.findall(text)).most_common())
        out["n_entry_ops"] = sum(out["entry_ops"].values())
    except Exception as e:  # noqa: BLE001
        out["text_error"] = repr(e)
    return out


def fmt_s(s):
    if s != s:  # nan
        return "n/a"
    if s < 1e-3:
        return f"{s * 1e6:.0f} us"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    return f"{s:.2f} s"
