"""The schedule of a block: the order its ops were recorded in, and what their dependencies allow.

Ops are recorded first in, first out: the block's op list is one valid order.
`schedule(program)` (also `Program.schedule()`) reads which variables each op
reads and writes, and finds what must come before what:

- an op that reads a variable comes after the op that last wrote it (read after write);
- an op that writes a variable comes after the op that last wrote it (write after
  write) and after every op that read the earlier value (write after read), so
  in-place updates of persistables (an optimizer's parameter update) keep their place;
- an op with sub-blocks (cond, switch, scan, while) reads what its sub-blocks read
  from enclosing blocks: those are its inputs (its captures, lowering.blocks);
- feed and fetch ops each move one column of the feed/fetch lists, so those lists
  order nothing; a fetch still comes after the op writing what it fetches.

Random ops draw from a key folded with their own index, not from a shared
sequence, so they may run in any order. The ops then fall into levels: level 0
depends on nothing, and each op sits one level below the deepest op it depends
on, so the ops of one level are mutually independent; level by level is a
topological order.

Nothing here changes how a program runs. A compiled run leaves scheduling to
XLA, which sees the whole data-flow graph. Run op by op (eager mode), independent
ops overlap too, without threads: JAX dispatches each op asynchronously and returns
before its result is computed, so the device works on an op while Python is already
dispatching the next. (The checking executor waits for each op, to look at its values.)
"""
import html
from dataclasses import dataclass

from lowering.lower import FEED_VAR, FETCH_VAR

_LISTS = frozenset((FEED_VAR, FETCH_VAR))


@dataclass(frozen=True)
class Dependency:
    """Op `before` must run before the op holding this dependency, because of variable `var`:
    `kind` is 'reads' (the op reads what `before` wrote), 'rewrites' (both write it) or
    'overwrites' (the op writes what `before` read)."""
    before: int
    kind: str
    var: str


@dataclass(frozen=True)
class ScheduledOp:
    """One op of a schedule: its index in the block, type, creating line, what it reads and
    writes, the ops it must follow, and its level."""
    index: int
    type: str
    callsite: str
    reads: tuple
    writes: tuple
    after: tuple     # Dependency, one per earlier op it must follow
    level: int


@dataclass(frozen=True)
class Schedule:
    """The schedule of one block; see the module docstring.

    `ops` are in recorded (FIFO) order; `levels[k]` holds the indices of the
    ops of level k, which are mutually independent; `order` is the
    topological order level by level.
    """
    block_idx: int
    ops: tuple

    @property
    def fifo(self):
        """The recorded order: op indices as they stand in the block."""
        return tuple(op.index for op in self.ops)

    @property
    def levels(self):
        """Groups of mutually independent op indices; each op comes after every op it depends
        on, which all sit in earlier groups."""
        groups = [[] for _ in range(1 + max((op.level for op in self.ops), default=-1))]
        for op in self.ops:
            groups[op.level].append(op.index)
        return tuple(tuple(g) for g in groups)

    @property
    def order(self):
        """A topological order: level by level, recorded order within a level."""
        return tuple(i for group in self.levels for i in group)

    def __str__(self):
        levels = self.levels
        widest = max(map(len, levels), default=0)
        lines = [f"schedule of block {self.block_idx}: {len(self.ops)} ops in {len(levels)} "
                 f"levels (at most {widest} independent ops at once)"]
        for k, group in enumerate(levels):
            lines.append(f"level {k}:")
            for i in group:
                op = self.ops[i]
                after = _after_text(op.after)
                where = f"  ({op.callsite})" if op.callsite else ""
                lines.append(f"  #{i} {op.type}{' after ' + after if after else ''}{where}")
        return "\n".join(lines)

    def __repr__(self):
        return (f"<Schedule of block {self.block_idx}: {len(self.ops)} ops, "
                f"{len(self.levels)} levels>")

    def _repr_html_(self):
        rows = []
        for k, group in enumerate(self.levels):
            cells = "".join(
                f'<span class="pd-sched-op" title="{_e(_tooltip(self.ops[i]))}">'
                f"#{i} {_e(self.ops[i].type)}</span>" for i in group)
            rows.append(f"<tr><td>{k}</td><td>{len(group)}</td><td>{cells}</td></tr>")
        return (_CSS + f'<div class="pd-schedule"><b>{_e(repr(self)[1:-1])}</b>'
                "<table><tr><th>level</th><th>ops</th><th>mutually independent ops "
                "(hover: what each waits for)</th></tr>" + "".join(rows) + "</table></div>")

    def to_dot(self, rankdir="TB"):
        """Graphviz DOT text of the dependency graph: one box per op, an edge per dependency
        labelled with its variable."""
        from progdesc.display.graph import graph_dot
        return graph_dot(self._graph(), rankdir, name=f"schedule_block_{self.block_idx}")

    def render(self, path=None):
        """The dependency graph drawn as SVG (laid out in Python, levels top to bottom): a
        `Drawing` Jupyter shows, or `path` after writing it there."""
        from progdesc.display.drawing import Drawing
        from progdesc.display.svg import graph_svg
        drawing = Drawing(graph_svg(self._graph()).encode("utf-8"), "svg", "python")
        return drawing if path is None else drawing.save(path)

    def _graph(self):
        from progdesc.display.graph import Edge, Graph, Node
        graph = Graph()
        graph.roots.append(self.block_idx)
        graph.members[self.block_idx] = []
        for op in self.ops:
            graph.add_node(self.block_idx, Node(f"op_{op.index}", "op",
                                                f"#{op.index} {op.type}\nlevel {op.level}",
                                                "box", tooltip=_tooltip(op)))
        for op in self.ops:
            for dep in op.after:
                graph.add_edge(Edge(f"op_{dep.before}", f"op_{op.index}", label=dep.var,
                                    tooltip=f"{dep.kind} {dep.var}",
                                    dashed=dep.kind != "reads"))
        return graph


_CSS = """<style>
.pd-schedule {font-family: -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif;
  font-size: 12px;}
.pd-schedule table {border-collapse: collapse; margin: 2px 0 6px 0;}
.pd-schedule th, .pd-schedule td {border: 1px solid #ddd; padding: 2px 6px; text-align: left;}
.pd-schedule th {background: #f3f3f3;}
.pd-sched-op {display: inline-block; margin: 1px 3px; padding: 0 4px; background: #e7f0fd;
  border-radius: 3px; font-family: Menlo, Consolas, monospace;}
</style>"""


def _e(text):
    return html.escape(str(text), quote=True)


def _after_text(after):
    return ", ".join(f"#{d.before} ({d.kind} {d.var})" for d in after)


def _tooltip(op):
    after = _after_text(op.after)
    return (f"#{op.index} {op.type} {op.callsite}".rstrip()
            + (f"; after {after}" if after else "; depends on nothing"))


def _names(slots):
    """The variable names bound to `slots`, once each, the feed and fetch lists left out."""
    return tuple(dict.fromkeys(n for s in slots for n in s.arguments if n not in _LISTS))


def schedule(program, block_idx=0):
    """The `Schedule` of block `block_idx` of `program` (a Program or a ProgramDesc)."""
    desc = getattr(program, "desc", program)
    last_writer, readers, ops = {}, {}, []
    for j, op_desc in enumerate(desc.blocks[block_idx].ops):
        reads, writes = _names(op_desc.inputs), _names(op_desc.outputs)
        after = {}
        for n in reads:
            if n in last_writer:
                after.setdefault(last_writer[n], Dependency(last_writer[n], "reads", n))
        for n in writes:
            if n in last_writer:
                after.setdefault(last_writer[n], Dependency(last_writer[n], "rewrites", n))
            for i in readers.get(n, ()):
                after.setdefault(i, Dependency(i, "overwrites", n))
        for n in reads:
            readers.setdefault(n, []).append(j)
        for n in writes:
            last_writer[n] = j
            readers[n] = []
        after = tuple(after[i] for i in sorted(after))
        level = 1 + max((ops[d.before].level for d in after), default=-1)
        ops.append(ScheduledOp(j, op_desc.type, op_desc.callsite, reads, writes, after, level))
    return Schedule(block_idx, tuple(ops))
