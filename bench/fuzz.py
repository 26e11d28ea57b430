"""`python -m bench.fuzz` (`make fuzz`): a soak of every loader with mutated inputs.

Runs the targets of tests/fuzz_targets.py (the ones tests/test_fuzz.py runs a
few dozen cases of) for --cases in all, split evenly between the targets (one
whose cases are few, `finite`, runs them all and leaves the rest to the others),
in --jobs worker processes. Each case runs under a time limit (--timeout): a
worker that overruns it is killed and restarted, and its case counts as a
hang; a worker that dies (a signal: SIGABRT from XLA, SIGSEGV, SIGKILL from the
out-of-memory killer) counts its case as a crash, and a fresh worker goes on
with the rest. At the end it prints, per target, the inputs tried and their
outcomes, then every finding (anything but a clean load or a typed refusal)
with the job's seed and the case that reproduces it
(`fuzz_targets.run_case(targets()[name], case)`), and exits 1 if there was one.
"""
import argparse
import collections
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import time

# tests/ holds the targets, imported as pytest imports them (pyproject's pythonpath).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tests"))
import fuzz_targets  # noqa: E402

OUTCOMES = fuzz_targets.OUTCOMES + ("hang", "crash")

HEADINGS = ("loaded", "typed error", "other error", "changed", "undetected", "hang", "crash")
CHUNK = 1000            # cases per hypothesis run inside a worker (and for a finite target)
STARTUP_TIMEOUT = 900   # seconds for a worker to import JAX and build the valid inputs


def _worker(conn, selftest=False, prebuild=True):
    """Run the jobs (target name, seed, count, cases to skip) sent on `conn`; report each case."""
    import tempfile

    from hypothesis import HealthCheck, Phase, given, seed, settings

    targets = fuzz_targets.targets(selftest)
    if prebuild:                # built here, its time counts against the startup limit
        fuzz_targets.seeds()
    conn.send(("ready",))
    with tempfile.TemporaryDirectory(prefix="progdesc-fuzz-") as base:
        for name, job_seed, count, skip in iter(conn.recv, None):
            target, skip = targets[name], set(skip)
            if isinstance(job_seed, list):      # given cases, in order
                for case in job_seed:
                    conn.send(("start", repr(case)))
                    conn.send(("done",) + fuzz_targets.run_case(target, case, base))
                conn.send(("finished",))
                continue

            @settings(max_examples=count, deadline=None, database=None,
                      phases=[Phase.generate], suppress_health_check=list(HealthCheck))
            @seed(job_seed)
            @given(target.strategy())
            def run(case):
                if repr(case) in skip:      # hung or crashed a worker before (hypothesis
                    return                  # starts each run with its simplest case)
                conn.send(("start", repr(case)))
                conn.send(("done",) + fuzz_targets.run_case(target, case, base))

            run()
            conn.send(("finished",))


class Worker:
    """One worker process and the job and case it is on."""

    def __init__(self, context, selftest=False, prebuild=True):
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_worker, args=(child, selftest, prebuild),
                                       daemon=True)
        self.process.start()
        child.close()
        self.since = time.monotonic()
        self.ready = False
        self.job = None          # [name, cases left, seed]
        self.case = None         # repr of the case under way

    def give(self, job, skip):
        self.job = job
        name, count, job_seed = job
        self.conn.send((name, job_seed, count, sorted(skip)))

    def stop(self):
        self.process.kill()
        self.process.join()


def _death(exitcode):
    """How a worker process ended: 'killed by SIGABRT', or its exit status."""
    if exitcode is not None and exitcode < 0:
        try:
            return f"worker killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"worker killed by signal {-exitcode}"
    return f"worker exited with status {exitcode}"


def _split(targets, cases):
    """{name: cases} for a run of `cases` in all: a finite target gets one chunk (all of its
    cases), the others share the rest in proportion to their `share`, and the total is exact."""
    if cases <= 0:
        return dict.fromkeys(targets, 0)
    finite = [n for n, t in targets.items() if t.finite]
    rest = max(0, cases - CHUNK * len(finite))
    weights = {n: t.share for n, t in targets.items() if not t.finite}
    total = sum(weights.values()) or 1.0
    split = {n: int(rest * w / total) for n, w in weights.items()}
    for name in list(split)[:rest - sum(split.values())]:   # what rounding down left over
        split[name] += 1
    return {n: CHUNK if n in finite else split[n] for n in targets}


class Soak:
    """The job queue, the workers and the tallies."""

    def __init__(self, targets, cases, jobs, timeout, base_seed, selftest=False, given=None):
        """`given`: {target name: [case, ...]} to run as they are, besides the `cases` (split
        between `targets`; a target only in `given` gets none)."""
        names = list(targets)
        self.targets = list(targets)
        self.finite = {n for n in names if targets[n].finite}   # all their cases fit one chunk
        self.queue = collections.deque()
        self.seeds = iter(range(base_seed * 1_000_003, sys.maxsize))   # seed per job: reproducible
        for name, left in _split(targets, cases).items():
            while left > 0:
                self.queue.append([name, min(CHUNK, left), next(self.seeds)])
                left -= CHUNK
        for name, listed in (given or {}).items():
            self.queue.append([name, len(listed), list(listed)])
        names += [name for name in given or {} if name not in names]
        self.counts = {name: collections.Counter() for name in names}
        self.fatal = {name: set() for name in names}     # cases that hung or crashed a worker
        self.findings = []
        self.timeout = timeout
        self.context = multiprocessing.get_context("spawn")
        self.selftest = selftest
        self.prebuild = set(names) != {"selftest"}      # the harness's own cases need no seeds
        self.workers = [Worker(self.context, selftest, self.prebuild) for _ in range(jobs)]

    def run(self, report_every):
        last_report = time.monotonic()
        while self.queue or any(w.job for w in self.workers):
            for w in self.workers:
                if w.ready and w.job is None and self.queue:
                    job = self.queue.popleft()
                    w.give(job, self.fatal[job[0]])
            ready = multiprocessing.connection.wait([w.conn for w in self.workers], timeout=1)
            for w in self.workers:
                if w.conn in ready:
                    self._receive(w)
                self._check_time(w)
            if time.monotonic() - last_report > report_every:
                last_report = time.monotonic()
                print(f"[{time.strftime('%H:%M:%S')}] {self.tried()} cases", flush=True)
        for w in self.workers:
            w.conn.send(None)
            w.process.join(10)
            w.stop()

    def tried(self):
        return sum(sum(c.values()) for c in self.counts.values())

    def _receive(self, w):
        try:
            message = w.conn.recv()
        except (EOFError, OSError):
            w.process.join(5)
            return self._replace(w, "crash", _death(w.process.exitcode))
        kind = message[0]
        if kind == "ready":
            w.ready = True
        elif kind == "start":
            w.case, w.since = message[1], time.monotonic()
        elif kind == "done":
            outcome, detail = message[1], message[2]
            self._count(w.job[0], outcome, detail, w.case, w.job[2])
            self._advance(w.job)
            w.case = None
        elif kind == "finished":
            name, left, job_seed = w.job
            w.job = None
            if not isinstance(job_seed, list):
                self._spread(left, name)

    @staticmethod
    def _advance(job):
        job[1] -= 1
        if isinstance(job[2], list):
            job[2] = job[2][1:]

    def _spread(self, cases, done):
        """Share `cases` left by target `done` (it ran out of distinct cases) among the others."""
        others = [n for n in self.targets if n != done and n not in self.finite]
        if not others:
            return
        for i, name in enumerate(others):
            share = cases // len(others) + (i < cases % len(others))
            if share:
                self.queue.append([name, share, next(self.seeds)])

    def _check_time(self, w):
        elapsed = time.monotonic() - w.since
        if w.case is not None and elapsed > self.timeout:
            self._replace(w, "hang", f"no result after {self.timeout} s")
        elif not w.ready and elapsed > STARTUP_TIMEOUT:
            raise RuntimeError(f"a fuzz worker did not start in {STARTUP_TIMEOUT} s")

    def _replace(self, w, outcome, detail):
        """Count the case `w` was on as `outcome`, start a fresh worker, requeue the rest."""
        if w.job is None or not w.ready:
            raise RuntimeError(f"a fuzz worker failed outside a case: {detail}")
        if w.case is not None:
            self._count(w.job[0], outcome, detail, w.case, w.job[2])
            self.fatal[w.job[0]].add(w.case)
            self._advance(w.job)
        if w.job[1] > 0:             # the rest, from another seed (or the given cases left)
            rest = w.job[2] if isinstance(w.job[2], list) else next(self.seeds)
            self.queue.appendleft([w.job[0], w.job[1], rest])
        w.stop()
        self.workers[self.workers.index(w)] = Worker(self.context, self.selftest, self.prebuild)

    def _count(self, name, outcome, detail, case, job_seed=None):
        job_seed = "given" if isinstance(job_seed, list) else job_seed
        self.counts[name][outcome] += 1
        if outcome not in ("loaded", "refused"):
            self.findings.append((name, outcome, detail, case, job_seed))

    def summary(self, seconds):
        width = max(len(n) for n in self.counts) + 2
        lines = [f"{'target':{width}}{'tried':>8}" + "".join(f"{h:>13}" for h in HEADINGS)]
        total = collections.Counter()
        for name, counts in self.counts.items():
            total.update(counts)
            lines.append(self._row(name, counts, width))
        lines.append(self._row("all", total, width))
        lines.append(f"{sum(total.values())} cases in {seconds:.0f} s; "
                     f"{len(self.findings)} finding(s)")
        for name, outcome, detail, case, job_seed in self.findings:
            lines.append(f"  {name}: {outcome}: {detail[:300]}\n"
                         f"    seed {job_seed}, case: {case[:2000]}")
        return "\n".join(lines)

    @staticmethod
    def _row(name, counts, width):
        return f"{name:{width}}{sum(counts.values()):>8}" + "".join(
            f"{counts[o]:>13}" for o in OUTCOMES)


def main(argv=None):
    targets = fuzz_targets.targets()
    parser = argparse.ArgumentParser(prog="python -m bench.fuzz",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--cases", type=int, default=100_000, help="in all (default %(default)s)")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--timeout", type=float, default=20.0,
                        help="seconds a case may take before it counts as a hang (default 20)")
    parser.add_argument("--seed", type=int, default=0, help="base seed (default 0)")
    parser.add_argument("--only", nargs="*", choices=sorted(targets), metavar="TARGET",
                        help=f"some of: {', '.join(targets)} (default: all)")
    parser.add_argument("--report-every", type=float, default=60.0, help="progress, in seconds")
    args = parser.parse_args(argv)
    targets = {n: targets[n] for n in args.only} if args.only else targets
    started = time.monotonic()
    soak = Soak(targets, args.cases, args.jobs, args.timeout, args.seed)
    soak.run(args.report_every)
    print(soak.summary(time.monotonic() - started), flush=True)
    return 1 if soak.findings else 0


if __name__ == "__main__":
    sys.exit(main())
