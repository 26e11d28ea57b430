"""Pipeline schedules as tick tables: which stage runs which micro-batch's forward or
backward at each tick, a forward and a backward each taking one tick.

* GPipe: every stage runs the forwards of all micro-batches, then their backwards.
* 1F1B: stage s runs `stages - 1 - s` forwards to fill the pipeline, then alternates one
  forward and one backward, then drains the backwards; it holds the activations of at
  most `stages - s` micro-batches at a time instead of all of them.

Both take 2 (M + S - 1) ticks for M micro-batches on S stages, of which each stage is
busy 2 M: the bubble (idle ticks over all ticks) is (S - 1) / (M + S - 1).
"""


def stage_orders(schedule, stages, micro_batches):
    """Per stage, the list of ("F" | "B", micro-batch) it runs, in order."""
    m = micro_batches
    if schedule == "gpipe":
        return [[("F", i) for i in range(m)] + [("B", i) for i in range(m)]
                for _ in range(stages)]
    if schedule != "1f1b":
        raise ValueError(f"unknown pipeline schedule {schedule!r}")
    orders = []
    for s in range(stages):
        warm = min(stages - 1 - s, m)
        order = [("F", i) for i in range(warm)]
        f, b = warm, 0
        while f < m:
            order += [("F", f), ("B", b)]
            f, b = f + 1, b + 1
        order += [("B", i) for i in range(b, m)]
        orders.append(order)
    return orders


def ticks(schedule, stages, micro_batches):
    """The tick table: a list of ticks, each a list of (stage, "F" | "B", micro-batch) run
    at that tick. A stage runs its next work once what it needs ran at an earlier tick:
    a forward needs the previous stage's forward of that micro-batch, a backward the next
    stage's backward (and its own forward)."""
    orders = stage_orders(schedule, stages, micro_batches)
    done, table, pos = {}, [], [0] * stages
    while any(p < len(o) for p, o in zip(pos, orders)):
        tick = []
        for s in range(stages):
            if pos[s] == len(orders[s]):
                continue
            kind, i = orders[s][pos[s]]
            needs = [(s - 1, "F", i)] if kind == "F" and s > 0 else \
                [(s + 1, "B", i)] if kind == "B" and s < stages - 1 else []
            if kind == "B":
                needs.append((s, "F", i))
            if all(n in done for n in needs):
                tick.append((s, kind, i))
        if not tick:
            raise RuntimeError(f"the {schedule} schedule is stuck")   # cannot happen
        for work in tick:
            done[work] = len(table)
            pos[work[0]] += 1
        table.append(tick)
    return table


def bubble_fraction(table, stages):
    """Idle (stage, tick) slots over all of them in a tick table."""
    busy = sum(len(t) for t in table)
    return 1 - busy / (stages * len(table))


def in_flight(table, stages):
    """Per stage, the most micro-batches whose forward ran and backward did not yet (the
    activations it holds at once)."""
    held, most = [0] * stages, [0] * stages
    for tick in table:
        for s, kind, _ in tick:
            held[s] += 1 if kind == "F" else -1
            most[s] = max(most[s], held[s])
    return most
