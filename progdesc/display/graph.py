"""The graph of a program, built once and drawn twice: as Graphviz DOT here, as SVG in svg.py.

`build_graph` turns a program into a `Graph` of nodes (ops, layer groups,
variables), edges and nested blocks, with every label, shape, colour and
tooltip decided; `graph_dot` writes it as DOT text. Both drawings read the
same `Graph`, so they show the same thing.
"""
from dataclasses import dataclass, field

from progdesc.display.text import ROLE_NAMES, non_default_attrs, type_str

# role -> (table row background, node fill colour)
ROLE_COLORS = {"forward": ("#ffffff", "#e7f0fd"), "loss": ("#fff8e6", "#fde9b8"),
               "backward": ("#fdf0e9", "#f9d3bf"), "optimize": ("#eaf7ec", "#c6ebcd"),
               "lr_sched": ("#f1f0fa", "#d9d5f3")}
_ROLE_GROUP = {"forward": "forward", "loss": "forward", "backward": "backward",
               "optimize": "optimize", "lr_sched": "optimize"}
_VAR_FILLS = {"parameter": "#cfe2ff", "data": "#fff3bf", "state": "#e9ecef"}


def role_of(op_desc):
    """The role name of an op ('forward', 'backward', 'optimize', ...)."""
    return ROLE_NAMES.get(op_desc.role, "forward")


def sub_blocks(op_desc):
    """Indices of the blocks an op refers to through 'block'/'blocks' attributes."""
    out = []
    for _, v, kind in non_default_attrs(op_desc):
        if kind == "block":
            out.append(int(v))
        elif kind == "blocks":
            out.extend(int(b) for b in v)
    return out


@dataclass
class Node:
    """One box or ellipse: an op, a group of ops (a layer), a variable, or a note.

    `kind` is 'op', 'group', 'var' or 'note'; `shape` is a Graphviz shape
    name ('box', 'ellipse', 'invhouse', 'plaintext'); `label` may hold
    several lines separated by newlines.
    """
    id: str
    kind: str
    label: str
    shape: str
    fill: str = ""
    bold: bool = False
    dashed: bool = False
    rounded: bool = False
    tooltip: str = ""


@dataclass
class Edge:
    """An arrow; `block` names the sub-block an op's dashed edge points into."""
    src: str
    dst: str
    label: str = ""
    tooltip: str = ""
    dashed: bool = False
    block: int = None


@dataclass
class Graph:
    """Nodes (in the order they were met), edges, and where each node sits.

    `members[b]` lists the ids of the nodes drawn inside block `b`; `roots`
    are the blocks drawn at the top level, and `nested[b]` the blocks drawn
    as dashed boxes inside block `b`.
    """
    nodes: dict = field(default_factory=dict)
    edges: list = field(default_factory=list)
    members: dict = field(default_factory=dict)
    roots: list = field(default_factory=list)
    nested: dict = field(default_factory=dict)
    _edge_keys: set = field(default_factory=set, repr=False)

    def add_node(self, block_idx, node):
        self.nodes[node.id] = node
        self.members.setdefault(block_idx, []).append(node.id)

    def add_edge(self, edge):
        key = (edge.src, edge.dst, edge.label, edge.dashed)
        if key not in self._edge_keys:
            self._edge_keys.add(key)
            self.edges.append(edge)


def _visible(op_desc, show_backward, show_optimizer):
    group = _ROLE_GROUP.get(role_of(op_desc), "forward")
    return not ((group == "backward" and not show_backward)
                or (group == "optimize" and not show_optimizer))


def _prefix(name):
    base = name.split(".", 1)[0]
    if "@GRAD" in base:
        base = base[:base.index("@GRAD")]
    return base or name


def _strip_grad(name):
    i = name.find("@GRAD")
    return name[:i] if i > 0 else None


def _names(mapping):
    return [a for s in mapping for a in s.arguments]


def _scopes(block, ops):
    """{op index: name scope} for the ops of one block (see `build_graph`)."""
    consumers = {}
    for i, d in ops:
        for n in _names(d.inputs):
            consumers.setdefault(n, []).append(i)

    def is_param(n):
        v = block.find_var(n)
        return v is not None and v.is_parameter

    scope, var_scope = {}, {}
    layer_scopes = set()
    # forward ops: the layer of the parameters they use, else their own outputs' prefix
    for i, d in ops:
        if _ROLE_GROUP.get(role_of(d)) != "forward":
            continue
        ins, outs = _names(d.inputs), _names(d.outputs)
        params = [n for n in ins + outs if is_param(n)]
        if params:
            scope[i] = _prefix(params[0])
            layer_scopes.add(scope[i])
        elif len(ins) == 1 and len(outs) == 1 and ins[0] in var_scope \
                and var_scope[ins[0]] in layer_scopes and consumers.get(ins[0]) == [i] \
                and _same_shape(block, ins[0], outs[0]):
            scope[i] = var_scope[ins[0]]      # an activation that follows a layer joins it
        else:
            scope[i] = _prefix(outs[0]) if outs else f"{d.type}_{i}"
        for n in outs:
            var_scope.setdefault(n, scope[i])
    # backward and optimizer ops: the scope of the forward variable whose gradient (or
    # parameter) they write; helper ops take the scope of the next op that has one
    current = None
    for i, d in reversed(ops):
        if i in scope:
            continue
        outs = _names(d.outputs)
        found = None
        for n in outs:
            base = _strip_grad(n)
            target = base if base is not None else n
            if target in var_scope:
                found = var_scope[target]
            elif is_param(target):
                found = _prefix(target)
            if found:
                break
        if found is None and _ROLE_GROUP.get(role_of(d)) == "backward" and current is not None:
            found = current
        if found is None:
            found = _prefix(outs[0]) if outs else f"{d.type}_{i}"
        scope[i] = found
        if _ROLE_GROUP.get(role_of(d)) == "backward":
            current = found
    return scope


def _same_shape(block, a, b):
    va, vb = block.find_var(a), block.find_var(b)
    return va is not None and vb is not None and list(va.desc.dims) == list(vb.desc.dims)


class _Builder:
    def __init__(self, show_shapes):
        self.graph = Graph()
        self.show_shapes = show_shapes
        self.var_ids = {}

    def var(self, block, name):
        """The id of the node of variable `name` seen from `block`, added on first use."""
        var = block.find_var(name)
        key = (var.block.idx if var is not None else block.idx, name)
        if key in self.var_ids:
            return self.var_ids[key]
        node = Node(f"var_{len(self.var_ids)}", "var", name, "ellipse")
        self.var_ids[key] = node.id
        if var is not None:
            if self.show_shapes:
                node.label += "\n" + type_str(var.desc)
            if var.desc.need_check_feed:
                node.shape, node.fill = "invhouse", _VAR_FILLS["data"]
            elif var.is_parameter:
                node.fill, node.bold = _VAR_FILLS["parameter"], True
            elif var.persistable:
                node.fill = _VAR_FILLS["state"]
            elif "@GRAD" in name:
                node.dashed = True
        self.graph.add_node(block.idx, node)
        return node.id

    def ops(self, block, ops):
        """One node per op; edges variable -> op -> variable. {op index: node id}."""
        op_node = {}
        for i, o in ops:
            node = Node(f"op_{block.idx}_{i}", "op", o.type, "box",
                        fill=ROLE_COLORS.get(role_of(o), ROLE_COLORS["forward"])[1],
                        tooltip=f"#{i} {role_of(o)} {o.callsite}")
            self.graph.add_node(block.idx, node)
            op_node[i] = node.id
        for i, o in ops:
            for n in _names(o.inputs):
                self.graph.add_edge(Edge(self.var(block, n), op_node[i]))
            for n in _names(o.outputs):
                self.graph.add_edge(Edge(op_node[i], self.var(block, n)))
        return op_node

    def groups(self, block, ops):
        """One node per (name scope, role group); see `build_graph`. {op index: node id}."""
        scopes = _scopes(block, ops)
        groups = {}
        for i, o in ops:
            groups.setdefault((scopes[i], _ROLE_GROUP.get(role_of(o), "forward")), []).append(
                (i, o))
        op_node = {}
        for k, ((scope_name, group), members) in enumerate(groups.items()):
            types = list(dict.fromkeys(o.type for _, o in members))
            shown = ", ".join(types[:4]) + (", \u2026" if len(types) > 4 else "")
            title = scope_name if group == "forward" else f"{scope_name} ({group})"
            node = Node(f"grp_{block.idx}_{k}", "group",
                        f"{title}\n{len(members)} op{'s' if len(members) != 1 else ''}: {shown}",
                        "box", fill=ROLE_COLORS[group][1], rounded=True,
                        tooltip=", ".join(f"#{i} {o.type}" for i, o in members))
            self.graph.add_node(block.idx, node)
            for i, _ in members:
                op_node[i] = node.id
        # which group(s) produce and consume each variable
        touched = {}
        for i, o in ops:
            for n in _names(o.inputs):
                touched.setdefault(n, [set(), set()])[1].add(op_node[i])
            for n in _names(o.outputs):
                touched.setdefault(n, [set(), set()])[0].add(op_node[i])
        # a temporary used inside one group is hidden; one made by one group and used by
        # others becomes a direct group -> group edge; any other variable is a node
        links = {}
        for i, o in ops:
            g = op_node[i]
            for n, is_out in [(a, False) for a in _names(o.inputs)] + [
                    (a, True) for a in _names(o.outputs)]:
                prod, cons = touched[n]
                var = block.find_var(n)
                special = var is None or var.persistable or var.desc.need_check_feed
                if not special and cons and len(prod | cons) == 1:
                    continue
                if not special and cons and len(prod) == 1:
                    if is_out:
                        for c in sorted(cons - prod):
                            links.setdefault((g, c), []).append(n)
                    continue
                vid = self.var(block, n)
                self.graph.add_edge(Edge(g, vid) if is_out else Edge(vid, g))
        for (a, b), names in links.items():
            first = block.find_var(names[0])
            label = type_str(first.desc) if self.show_shapes else names[0]
            if len(names) > 1:
                label += f" +{len(names) - 1}"
            self.graph.add_edge(Edge(a, b, label=label, tooltip=", ".join(names)))
        return op_node


def build_graph(program, collapse=False, *, show_backward=True, show_optimizer=True,
                show_shapes=True):
    """The `Graph` of `program`; the options are `program_dot`'s."""
    b = _Builder(show_shapes)
    graph = b.graph
    op_node = {}     # (block idx, op index) -> node id
    first_node = {}  # block idx -> the id of its first node
    for block in program.blocks:
        graph.members.setdefault(block.idx, [])
        ops = [(i, o) for i, o in enumerate(block.desc.ops)
               if _visible(o, show_backward, show_optimizer)]
        made = b.groups(block, ops) if collapse else b.ops(block, ops)
        op_node.update({(block.idx, i): n for i, n in made.items()})
        if ops:
            first_node[block.idx] = made[ops[0][0]]

    # blocks are drawn nested in their parent; a malformed parent chain starts a new root
    seen = set()

    def place(block_idx):
        seen.add(block_idx)
        for child in program.blocks:
            if child.parent_idx == block_idx and child.idx != block_idx and child.idx not in seen:
                graph.nested.setdefault(block_idx, []).append(child.idx)
                place(child.idx)
                if child.idx not in first_node:   # an empty block still shows as a box
                    node = Node(f"empty_{child.idx}", "note", "(no ops)", "plaintext")
                    graph.add_node(child.idx, node)
                    first_node[child.idx] = node.id

    n_blocks = len(program.blocks)
    for block in program.blocks:
        if block.idx not in seen and not 0 <= block.parent_idx < n_blocks:
            graph.roots.append(block.idx)
            place(block.idx)
    for block in program.blocks:
        if block.idx not in seen:
            graph.roots.append(block.idx)
            place(block.idx)
    linked = set()   # a dashed edge from the first op that refers to each sub-block
    for block in program.blocks:
        for i, op_desc in enumerate(block.desc.ops):
            for sub in sub_blocks(op_desc):
                src = op_node.get((block.idx, i))
                if sub not in linked and src is not None and sub in first_node:
                    graph.add_edge(Edge(src, first_node[sub], dashed=True, block=sub))
                linked.add(sub)
    return graph


# --- DOT ---

def _q(text):
    """A DOT double-quoted string."""
    return '"' + str(text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _node_dot(node):
    attrs = [f"label={_q(node.label)}", f"shape={node.shape}"]
    style = [s for s, on in (("rounded", node.rounded), ("filled", bool(node.fill)),
                             ("bold", node.bold), ("dashed", node.dashed)) if on]
    if style:
        attrs.append(f"style={_q(','.join(style))}")
    if node.fill:
        attrs.append(f"fillcolor={_q(node.fill)}")
    if node.bold:
        attrs.append("penwidth=2")
    if node.tooltip:
        attrs.append(f"tooltip={_q(node.tooltip)}")
    return f"{node.id} [{', '.join(attrs)}];"


def _edge_dot(edge):
    attrs = []
    if edge.label:
        attrs += [f"label={_q(edge.label)}", f"tooltip={_q(edge.tooltip)}", "fontsize=8"]
    if edge.dashed:
        attrs.append("style=dashed")
    if edge.block is not None:
        attrs.append(f'lhead="cluster_block_{edge.block}"')
    return f"{edge.src} -> {edge.dst}{(' [' + ', '.join(attrs) + ']') if attrs else ''};"


def graph_dot(graph, rankdir="TB", name="program", note=""):
    """DOT text of a `Graph`: nested blocks become dashed clusters; `note` is a title."""
    def emit(block_idx, indent):
        pad = "  " * indent
        out = [pad + _node_dot(graph.nodes[n]) for n in graph.members[block_idx]]
        for child in graph.nested.get(block_idx, []):
            out.append(f"{pad}subgraph cluster_block_{child} {{")
            out.append(f"{pad}  label={_q(f'block {child}')}; style=dashed; color=\"#8888aa\";")
            out.extend(emit(child, indent + 1))
            out.append(pad + "}")
        return out

    title = f", label={_q(note)}, labelloc=t" if note else ""
    lines = [f"digraph {_q(name)} {{",
             f'  graph [rankdir={rankdir}, compound=true, fontname="Helvetica", fontsize=10'
             f"{title}];",
             '  node [fontname="Helvetica", fontsize=10];',
             '  edge [color="#555555", arrowsize=0.7];']
    for root in graph.roots:
        lines.extend(emit(root, 1))
    lines.extend("  " + _edge_dot(e) for e in graph.edges)
    return "\n".join(lines + ["}"]) + "\n"


def program_dot(program, collapse=False, *, show_backward=True, show_optimizer=True,
                show_shapes=True, rankdir="TB", name="program"):
    """Graphviz DOT text of `program` (a `digraph`).

    Ops are boxes coloured by role (forward blue, backward orange, optimizer
    green), variables are ellipses labelled with dtype and shape: parameters
    bold and filled blue, data (feed) variables yellow house shapes, other
    persistable state grey, gradients dashed. Edges go variable -> op ->
    variable. Sub-blocks referred to by an op are drawn as clusters with a
    dashed edge from that op.

    `collapse=True` draws one node per name scope instead of one per op: a
    forward op belongs to the layer of the parameters it uses (`fc_0` for
    `fc_0.w_0`), an activation that directly follows a layer joins it, and
    any other op to the prefix of its output names before the first '.'
    (`mean_0` for `mean_0.out`). Backward and optimizer ops join the scope of
    the variable whose gradient or value they write (drawn as separate
    'scope (backward)' / 'scope (optimize)' nodes). Variables used only
    inside one scope are hidden.

    `show_backward=False` / `show_optimizer=False` leave out gradient ops /
    optimizer and learning-rate ops; `show_shapes=False` drops dtype and
    shape from variable labels; `rankdir` is Graphviz's ('TB', 'LR').
    """
    graph = build_graph(program, collapse, show_backward=show_backward,
                        show_optimizer=show_optimizer, show_shapes=show_shapes)
    return graph_dot(graph, rankdir, name)
