"""Looking at programs: HTML tables for Jupyter, Graphviz DOT, and rendered drawings.

`Program._repr_html_`, `Block._repr_html_` and `Scope._repr_html_` call
`program_html`, `block_html` and `scope_html`, so a program or a scope left
as the last expression of a notebook cell shows as a table:

- one row per op: index, role, type, inputs and outputs (slot, variable,
  dtype and shape; parameters in bold) and the attributes that differ from
  their defaults. Forward, backward and optimizer ops are told apart by
  section rows, a role column and a row colour (class `pd-role-<role>`);
  the sub-blocks an op refers to (attributes of type 'block'/'blocks') are
  shown nested under it.
- a scope lists its variables: name, shape, dtype, device and bytes, and
  (optionally) its child scopes, nested.

`program_dot` (also `Program.to_dot`) writes the program as a Graphviz
digraph: ops are boxes, variables ellipses (parameters bold and filled),
edges run variable -> op -> variable. `collapse=True` draws one node per
name scope (a layer such as `fc_0`), and `show_backward` /
`show_optimizer` hide the gradient or update ops, which keeps large programs
legible. `render` (also `Program.render`) draws it through the `graphviz`
package when Graphviz's `dot` program is installed, and otherwise raises
`RenderError`, which carries the DOT text.
"""
import html
import shutil
import subprocess

from lowering import dtypes
from lowering import progdesc_pb2 as pb
from lowering.desc import slot_map
from lowering.errors import ProgdescError
from progdesc.framework import ROLE_NAMES, format_value, non_default_attrs

__all__ = ["RenderError", "block_html", "program_dot", "program_html", "render", "scope_html"]

# role -> (row background, DOT fill colour)
_ROLE_COLORS = {"forward": ("#ffffff", "#e7f0fd"), "loss": ("#fff8e6", "#fde9b8"),
                "backward": ("#fdf0e9", "#f9d3bf"), "optimize": ("#eaf7ec", "#c6ebcd"),
                "lr_sched": ("#f1f0fa", "#d9d5f3")}
_ROLE_GROUP = {"forward": "forward", "loss": "forward", "backward": "backward",
               "optimize": "optimize", "lr_sched": "optimize"}
_MAX_ATTR_CHARS = 80

_CSS = """<style>
.pd-program, .pd-scope {font-family: -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif;
  font-size: 12px;}
.pd-program table, .pd-scope table {border-collapse: collapse; margin: 2px 0 6px 0;}
.pd-program th, .pd-program td, .pd-scope th, .pd-scope td {border: 1px solid #ddd;
  padding: 2px 6px; text-align: left; vertical-align: top;}
.pd-program th, .pd-scope th {background: #f3f3f3;}
.pd-var {font-family: Menlo, Consolas, monospace;}
.pd-type {color: #666; font-family: Menlo, Consolas, monospace;}
.pd-slot {color: #888;}
.pd-param {font-weight: bold;}
.pd-section td {font-weight: bold; background: #fafafa; color: #555;}
.pd-subblock {margin-left: 2em; border-left: 3px solid #ccd; padding-left: 6px;}
</style>"""


# --- HTML ---

def _e(value):
    return html.escape(str(value), quote=True)


def _role(op_desc):
    return ROLE_NAMES.get(op_desc.role, "forward")


def _type_str(var_desc):
    return f"{dtypes.name_of(var_desc.dtype)}[{', '.join(map(str, var_desc.dims))}]"


def _var_kind(var_desc):
    if var_desc.need_check_feed:
        return "data"
    if var_desc.is_parameter:
        return "parameter"
    if var_desc.persistable:
        return "state"
    return "temporary"




def _sub_blocks(op_desc):
    """Indices of the blocks an op refers to through 'block'/'blocks' attributes."""
    out = []
    for _, v, kind in non_default_attrs(op_desc):
        if kind == "block":
            out.append(int(v))
        elif kind == "blocks":
            out.extend(int(b) for b in v)
    return out


def _vars_cell(block, mapping):
    lines = []
    for slot, names in slot_map(mapping).items():
        shown = []
        for n in names:
            var = block.find_var(n)
            cls = "pd-var pd-param" if var is not None and var.is_parameter else "pd-var"
            text = f'<span class="{cls}">{_e(n)}</span>'
            if var is not None:
                text += f' <span class="pd-type">{_e(_type_str(var.desc))}</span>'
            shown.append(text)
        lines.append(f'<span class="pd-slot">{_e(slot)}:</span> ' + ", ".join(shown))
    return "<br>".join(lines)


def _attrs_cell(op_desc):
    parts = []
    for name, value, kind in non_default_attrs(op_desc):
        if kind == "block":
            text = f"block {value}"
        elif kind == "blocks":
            text = "blocks " + ", ".join(str(b) for b in value)
        else:
            text = format_value(value)
        if len(text) > _MAX_ATTR_CHARS:
            text = text[:_MAX_ATTR_CHARS - 1] + "\u2026"
        parts.append(f"{_e(name)}={_e(text)}")
    return "<br>".join(parts)


def _block_table(block, shown):
    """The HTML of one block's ops, with the sub-blocks it refers to nested in it."""
    program = block.program
    shown.add(block.idx)
    head = (f'<div class="pd-block-title"><b>block {block.idx}</b>'
            + (f" (parent {block.parent_idx})" if block.parent_idx >= 0 else "")
            + f" \u00b7 {len(block.desc.ops)} ops \u00b7 {len(block.desc.vars)} variables</div>")
    rows = ['<table class="pd-ops"><thead><tr><th>#</th><th>role</th><th>op</th>'
            '<th>inputs</th><th>outputs</th><th>attributes</th></tr></thead><tbody>']
    role = None
    for i, op_desc in enumerate(block.desc.ops):
        r = _role(op_desc)
        if r != role:
            rows.append(f'<tr class="pd-section"><td colspan="6">{_e(r)} ops</td></tr>')
            role = r
        bg = _ROLE_COLORS.get(r, _ROLE_COLORS["forward"])[0]
        title = f' title="{_e(op_desc.callsite)}"' if op_desc.callsite else ""
        rows.append(
            f'<tr class="pd-op pd-role-{_e(r)}" data-role="{_e(r)}" style="background:{bg}">'
            f"<td>{i}</td><td>{_e(r)}</td><td{title}><b>{_e(op_desc.type)}</b></td>"
            f"<td>{_vars_cell(block, op_desc.inputs)}</td>"
            f"<td>{_vars_cell(block, op_desc.outputs)}</td>"
            f"<td>{_attrs_cell(op_desc)}</td></tr>")
        for sub in _sub_blocks(op_desc):
            if 0 <= sub < len(program.blocks) and sub not in shown:
                rows.append(f'<tr class="pd-nested"><td></td><td colspan="5">'
                            f'<div class="pd-subblock">{_block_table(program.blocks[sub], shown)}'
                            "</div></td></tr>")
    rows.append("</tbody></table>")
    # child blocks no op refers to: shown nested under their parent
    for child in program.blocks:
        if child.parent_idx == block.idx and child.idx != block.idx and child.idx not in shown:
            rows.append(f'<div class="pd-subblock">{_block_table(child, shown)}</div>')
    return head + "".join(rows)


def _vars_table(program):
    rows = ['<table class="pd-vars"><thead><tr><th>variable</th><th>kind</th><th>dtype</th>'
            "<th>shape</th><th>block</th></tr></thead><tbody>"]
    count = 0
    for block in program.blocks:
        for v in block.desc.vars:
            kind = _var_kind(v)
            if kind == "temporary" or v.kind != pb.DENSE_TENSOR:
                continue
            count += 1
            cls = "pd-var pd-param" if v.is_parameter else "pd-var"
            rows.append(f'<tr><td class="{cls}">{_e(v.name)}</td><td>{kind}</td>'
                        f"<td>{_e(dtypes.name_of(v.dtype))}</td><td>{_e(list(v.dims))}</td>"
                        f"<td>{block.idx}</td></tr>")
    rows.append("</tbody></table>")
    return count, "".join(rows)


def _summary(program):
    counts = {}
    for block in program.blocks:
        for op_desc in block.desc.ops:
            r = _role(op_desc)
            counts[r] = counts.get(r, 0) + 1
    n_ops = sum(counts.values())
    roles = ", ".join(f"{n} {r}" for r, n in counts.items())
    n_params = sum(1 for b in program.blocks for v in b.desc.vars if v.is_parameter)
    size = sum(_numel(v.dims) for b in program.blocks for v in b.desc.vars if v.is_parameter)
    return (f"<b>Program</b> \u00b7 {len(program.blocks)} block(s) \u00b7 {n_ops} ops"
            + (f" ({roles})" if roles else "")
            + f" \u00b7 {n_params} parameters ({size:,} values) \u00b7 seed {program.random_seed}")


def _numel(dims):
    n = 1
    for d in dims:
        if d < 0:
            return 0
        n *= d
    return n


def program_html(program):
    """The HTML table of a whole program (what Jupyter shows for a Program)."""
    count, vars_table = _vars_table(program)
    shown = set()
    parts = [_CSS, '<div class="pd-program">', f'<div class="pd-summary">{_summary(program)}</div>',
             f"<details><summary>{count} data / parameter / state variables</summary>"
             f"{vars_table}</details>"]
    for block in program.blocks:
        if block.idx not in shown and (block.parent_idx < 0 or block.parent_idx >= len(
                program.blocks) or block.parent_idx == block.idx):
            parts.append(_block_table(block, shown))
    for block in program.blocks:   # anything not reached (malformed parents)
        if block.idx not in shown:
            parts.append(_block_table(block, shown))
    parts.append("</div>")
    return "".join(parts)


def block_html(block):
    """The HTML table of one block, its sub-blocks nested (what Jupyter shows for a Block)."""
    return _CSS + '<div class="pd-program">' + _block_table(block, set()) + "</div>"


def _human(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _scope_table(scope, kids, depth):
    rows = ['<table class="pd-scope-vars"><thead><tr><th>variable</th><th>shape</th>'
            "<th>dtype</th><th>device</th><th>bytes</th></tr></thead><tbody>"]
    total = 0
    names = scope.local_var_names()
    for name in names:
        var = scope.find_var(name)
        value = None if var is None else var.value
        if value is None:
            rows.append(f'<tr><td class="pd-var">{_e(name)}</td><td colspan="4">unset</td></tr>')
            continue
        nbytes = int(getattr(value, "nbytes", 0))
        total += nbytes
        devices = getattr(value, "devices", None)
        try:
            device = ", ".join(sorted(str(d) for d in devices())) if callable(devices) else ""
        except Exception:  # noqa: BLE001  (a deleted/donated buffer)
            device = "?"
        rows.append(f'<tr><td class="pd-var">{_e(name)}</td><td>{_e(list(value.shape))}</td>'
                    f"<td>{_e(value.dtype)}</td><td>{_e(device)}</td>"
                    f'<td style="text-align:right">{nbytes:,}</td></tr>')
    rows.append("</tbody></table>")
    head = (f"<div><b>{'Scope' if depth == 0 else f'child scope (depth {depth})'}</b> \u00b7 "
            f"{len(names)} variables \u00b7 {_human(total)}</div>")
    out = head + "".join(rows)
    if kids:
        for i, kid in enumerate(scope.kids):
            out += (f'<details class="pd-subblock"><summary>child scope {i}</summary>'
                    f"{_scope_table(kid, kids, depth + 1)}</details>")
    elif scope.kids:
        out += f"<div>{len(scope.kids)} child scope(s) not shown</div>"
    return out


def scope_html(scope, kids=True):
    """The HTML table of a Scope's variables: name, shape, dtype, device, bytes.

    With `kids` the child scopes are listed too, each nested and folded.
    """
    return (_CSS + '<div class="pd-scope">' + _scope_table(scope, kids, 0) + "</div>")


# --- DOT ---

def _q(text):
    """A DOT double-quoted string."""
    return '"' + str(text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _visible(op_desc, show_backward, show_optimizer):
    group = _ROLE_GROUP.get(_role(op_desc), "forward")
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


def _scopes(block, ops):
    """{op index: name scope} for the ops of one block (see `program_dot`)."""
    producers = {}
    consumers = {}
    for i, d in ops:
        for n in (a for s in d.outputs for a in s.arguments):
            producers.setdefault(n, []).append(i)
        for n in (a for s in d.inputs for a in s.arguments):
            consumers.setdefault(n, []).append(i)

    def is_param(n):
        v = block.find_var(n)
        return v is not None and v.is_parameter

    scope, var_scope = {}, {}
    layer_scopes = set()
    # forward ops: the layer of the parameters they use, else their own outputs' prefix
    for i, d in ops:
        if _ROLE_GROUP.get(_role(d)) != "forward":
            continue
        ins = [a for s in d.inputs for a in s.arguments]
        outs = [a for s in d.outputs for a in s.arguments]
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
        outs = [a for s in d.outputs for a in s.arguments]
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
        if found is None and _ROLE_GROUP.get(_role(d)) == "backward" and current is not None:
            found = current
        if found is None:
            found = _prefix(outs[0]) if outs else f"{d.type}_{i}"
        scope[i] = found
        if _ROLE_GROUP.get(_role(d)) == "backward":
            current = found
    return scope


def _same_shape(block, a, b):
    va, vb = block.find_var(a), block.find_var(b)
    return va is not None and vb is not None and list(va.desc.dims) == list(vb.desc.dims)


class _Dot:
    def __init__(self, program, show_shapes):
        self.program = program
        self.show_shapes = show_shapes
        self.var_ids = {}
        self.edges = []
        self.edge_set = set()

    def var_node(self, block, name):
        var = block.find_var(name)
        owner = var.block.idx if var is not None else block.idx
        key = (owner, name)
        if key in self.var_ids:
            return self.var_ids[key], None
        node_id = f"var_{len(self.var_ids)}"
        self.var_ids[key] = node_id
        label = name
        attrs = ["shape=invhouse" if var is not None and var.desc.need_check_feed
                 else "shape=ellipse"]
        if var is not None:
            if self.show_shapes:
                label += "\n" + _type_str(var.desc)
            if var.is_parameter:
                attrs += ['style="filled,bold"', 'fillcolor="#cfe2ff"', "penwidth=2"]
            elif var.desc.need_check_feed:
                attrs += ['style="filled"', 'fillcolor="#fff3bf"']
            elif var.persistable:
                attrs += ['style="filled"', 'fillcolor="#e9ecef"']
            elif "@GRAD" in name:
                attrs += ['style="dashed"']
        return node_id, f"{node_id} [label={_q(label)}, {', '.join(attrs)}];"

    def edge(self, a, b, extra=""):
        if (a, b, extra) not in self.edge_set:
            self.edge_set.add((a, b, extra))
            self.edges.append(f"{a} -> {b}{(' [' + extra + ']') if extra else ''};")


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
    d = _Dot(program, show_shapes)
    body = []
    referenced = {}
    for block in program.blocks:
        for i, op_desc in enumerate(block.desc.ops):
            for sub in _sub_blocks(op_desc):
                referenced.setdefault(sub, (block.idx, i))
    first_node = {}
    block_lines = {}
    op_node = {}   # (block idx, op index) -> node id
    for block in program.blocks:
        ops = [(i, o) for i, o in enumerate(block.desc.ops)
               if _visible(o, show_backward, show_optimizer)]
        lines = []
        if collapse:
            scopes = _scopes(block, ops)
            groups = {}
            for i, o in ops:
                key = (scopes[i], _ROLE_GROUP.get(_role(o), "forward"))
                groups.setdefault(key, []).append((i, o))
            group_id = {}
            for k, (key, members) in enumerate(groups.items()):
                node_id = f"grp_{block.idx}_{k}"
                group_id[key] = node_id
                types = list(dict.fromkeys(o.type for _, o in members))
                shown = ", ".join(types[:4]) + (", \u2026" if len(types) > 4 else "")
                scope_name, group = key
                title = scope_name if group == "forward" else f"{scope_name} ({group})"
                label = f"{title}\n{len(members)} op{'s' if len(members) != 1 else ''}: {shown}"
                fill = _ROLE_COLORS["forward" if group == "forward" else group][1]
                lines.append(f'{node_id} [label={_q(label)}, shape=box, style="rounded,filled",'
                             f' fillcolor="{fill}"];')
                for i, _ in members:
                    op_node[(block.idx, i)] = node_id
            # which group(s) produce and consume each variable
            touched = {}
            for i, o in ops:
                g = op_node[(block.idx, i)]
                for n in (a for s in o.inputs for a in s.arguments):
                    touched.setdefault(n, [set(), set()])[1].add(g)
                for n in (a for s in o.outputs for a in s.arguments):
                    touched.setdefault(n, [set(), set()])[0].add(g)

            # a temporary used inside one scope is hidden; one made by one scope and used by
            # others becomes a direct scope -> scope edge; any other variable is a node
            links = {}
            for i, o in ops:
                g = op_node[(block.idx, i)]
                names = [(a, False) for s in o.inputs for a in s.arguments] + [
                    (a, True) for s in o.outputs for a in s.arguments]
                for n, is_out in names:
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
                    vid, decl = d.var_node(block, n)
                    if decl:
                        lines.append(decl)
                    d.edge(g, vid) if is_out else d.edge(vid, g)
            for (a, b), names in links.items():
                first = block.find_var(names[0])
                label = _type_str(first.desc) if show_shapes else names[0]
                if len(names) > 1:
                    label += f" +{len(names) - 1}"
                d.edge(a, b, f"label={_q(label)}, tooltip={_q(', '.join(names))}, fontsize=8")
        else:
            for i, o in ops:
                node_id = f"op_{block.idx}_{i}"
                op_node[(block.idx, i)] = node_id
                fill = _ROLE_COLORS.get(_role(o), _ROLE_COLORS["forward"])[1]
                lines.append(f'{node_id} [label={_q(o.type)}, shape=box, style="filled", '
                             f'fillcolor="{fill}", tooltip={_q(f"#{i} {_role(o)} {o.callsite}")}];')
            for i, o in ops:
                node_id = op_node[(block.idx, i)]
                for n in (a for s in o.inputs for a in s.arguments):
                    vid, decl = d.var_node(block, n)
                    if decl:
                        lines.append(decl)
                    d.edge(vid, node_id)
                for n in (a for s in o.outputs for a in s.arguments):
                    vid, decl = d.var_node(block, n)
                    if decl:
                        lines.append(decl)
                    d.edge(node_id, vid)
        if ops:
            first_node[block.idx] = op_node[(block.idx, ops[0][0])]
        block_lines[block.idx] = lines

    def emit(block_idx, indent, seen):
        seen.add(block_idx)
        pad = "  " * indent
        out = [pad + line for line in block_lines[block_idx]]
        for child in program.blocks:
            if child.parent_idx == block_idx and child.idx != block_idx and child.idx not in seen:
                out.append(f"{pad}subgraph cluster_block_{child.idx} {{")
                out.append(f"{pad}  label={_q(f'block {child.idx}')}; style=dashed; "
                           'color="#8888aa";')
                out.extend(emit(child.idx, indent + 1, seen))
                if child.idx not in first_node:   # an empty block still shows as a cluster
                    first_node[child.idx] = f"empty_{child.idx}"
                    out.append(f'{pad}  empty_{child.idx} [label="(no ops)", shape=plaintext];')
                out.append(pad + "}")
        return out

    seen = set()
    for block in program.blocks:
        if block.idx not in seen and (block.parent_idx < 0 or block.parent_idx not in range(
                len(program.blocks))):
            body.extend(emit(block.idx, 1, seen))
    for block in program.blocks:
        if block.idx not in seen:
            body.extend(emit(block.idx, 1, seen))
    for sub, (parent, i) in referenced.items():
        src = op_node.get((parent, i))
        if src is not None and sub in first_node and sub < len(program.blocks):
            d.edge(src, first_node[sub], f'style=dashed, lhead="cluster_block_{sub}"')
    header = [f"digraph {_q(name)} {{",
              f'  graph [rankdir={rankdir}, compound=true, fontname="Helvetica", fontsize=10];',
              '  node [fontname="Helvetica", fontsize=10];',
              '  edge [color="#555555", arrowsize=0.7];']
    return "\n".join(header + body + ["  " + e for e in d.edges] + ["}"]) + "\n"


# --- rendering ---

class RenderError(ProgdescError, RuntimeError):
    """A program could not be drawn (no Graphviz); the DOT text is in `.dot`."""

    def __init__(self, message, dot):
        super().__init__(message)
        self.dot = dot


_INSTALL_HINT = ("install Graphviz (apt-get install graphviz, brew install graphviz or "
                 "conda install graphviz) and the Python package (pip install graphviz), or "
                 "paste the DOT text (this error's .dot, or program.to_dot()) into any "
                 "Graphviz viewer")


def render(program, path=None, format="svg", **options):
    """Draw `program` with Graphviz; `options` go to `program_dot`.

    Returns the drawing's bytes (`format` 'svg', 'png', 'pdf', ...) when
    `path` is None, else writes them to `path` and returns the path. Raises
    `RenderError` (a `ProgdescError` and `RuntimeError`, with the DOT text in
    its `.dot` attribute) when Graphviz's `dot` program is not installed or
    fails. In a notebook: `IPython.display.SVG(program.render())`.
    """
    dot_text = program_dot(program, **options)
    exe = shutil.which("dot")
    if exe is None:
        raise RenderError("cannot render the program: Graphviz's 'dot' program is not on PATH; "
                          + _INSTALL_HINT, dot_text)
    try:
        import graphviz
    except ImportError:
        graphviz = None
    try:
        if graphviz is not None:
            data = graphviz.Source(dot_text).pipe(format=format)
        else:
            data = subprocess.run([exe, f"-T{format}"], input=dot_text.encode("utf-8"),
                                  capture_output=True, check=True, timeout=120).stdout
    except Exception as e:  # noqa: BLE001  (graphviz.ExecutableNotFound, CalledProcessError, ...)
        msg = " ".join(str(e).split())[:300]
        raise RenderError(f"cannot render the program: Graphviz failed ({type(e).__name__}: "
                          f"{msg})", dot_text) from None
    if path is None:
        return data
    with open(path, "wb") as f:
        f.write(data)
    return path
