"""HTML tables for Jupyter: a Program, a Block, a Scope.

`Program._repr_html_`, `Block._repr_html_` and `Scope._repr_html_` call
`program_html`, `block_html` and `scope_html`, so a program or a scope left
as the last expression of a notebook cell shows as a table:

- one row per op: index, role, type, inputs and outputs (slot, variable,
  dtype and shape; parameters in bold) and the attributes that differ from
  their defaults. Forward, backward and optimizer ops are told apart by
  section rows, a role column and a row colour (class `pd-role-<role>`);
  the sub-blocks an op refers to (attributes of type 'block'/'blocks') are
  shown nested under it. The summary line names the precision policy when
  it is not "default"; the variables table shows a parameter's optimizer
  settings (learning-rate scale, L2 regularizer) when its description
  records them.
- a scope lists its variables: name, shape, dtype, device and bytes, and
  (optionally) its child scopes, nested.
"""
import html

from lowering import dtypes
from lowering import progdesc_pb2 as pb
from lowering.desc import slot_map
from progdesc.display.graph import ROLE_COLORS, role_of, sub_blocks
from progdesc.display.text import attr_texts, param_settings_text, type_str

__all__ = ["ProgramTable", "block_html", "program_html", "scope_html"]

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


def _e(value):
    return html.escape(str(value), quote=True)


def _var_kind(var_desc):
    if var_desc.need_check_feed:
        return "data"
    if var_desc.is_parameter:
        return "parameter"
    if var_desc.persistable:
        return "state"
    return "temporary"


def _vars_cell(block, mapping):
    lines = []
    for slot, names in slot_map(mapping).items():
        shown = []
        for n in names:
            var = block.find_var(n)
            cls = "pd-var pd-param" if var is not None and var.is_parameter else "pd-var"
            text = f'<span class="{cls}">{_e(n)}</span>'
            if var is not None:
                text += f' <span class="pd-type">{_e(type_str(var.desc))}</span>'
            shown.append(text)
        lines.append(f'<span class="pd-slot">{_e(slot)}:</span> ' + ", ".join(shown))
    return "<br>".join(lines)


def _attrs_cell(op_desc):
    return "<br>".join(f"{_e(name)}={_e(text)}"
                       for name, text in attr_texts(op_desc, _MAX_ATTR_CHARS))


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
        r = role_of(op_desc)
        if r != role:
            rows.append(f'<tr class="pd-section"><td colspan="6">{_e(r)} ops</td></tr>')
            role = r
        bg = ROLE_COLORS.get(r, ROLE_COLORS["forward"])[0]
        title = f' title="{_e(op_desc.callsite)}"' if op_desc.callsite else ""
        rows.append(
            f'<tr class="pd-op pd-role-{_e(r)}" data-role="{_e(r)}" style="background:{bg}">'
            f"<td>{i}</td><td>{_e(r)}</td><td{title}><b>{_e(op_desc.type)}</b></td>"
            f"<td>{_vars_cell(block, op_desc.inputs)}</td>"
            f"<td>{_vars_cell(block, op_desc.outputs)}</td>"
            f"<td>{_attrs_cell(op_desc)}</td></tr>")
        for sub in sub_blocks(op_desc):
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
            "<th>shape</th><th>block</th><th>optimizer settings</th></tr></thead><tbody>"]
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
                        f"<td>{block.idx}</td><td>{_e(param_settings_text(v))}</td></tr>")
    rows.append("</tbody></table>")
    return count, "".join(rows)


def _summary(program):
    counts = {}
    for block in program.blocks:
        for op_desc in block.desc.ops:
            r = role_of(op_desc)
            counts[r] = counts.get(r, 0) + 1
    n_ops = sum(counts.values())
    roles = ", ".join(f"{n} {r}" for r, n in counts.items())
    n_params = sum(1 for b in program.blocks for v in b.desc.vars if v.is_parameter)
    size = sum(_numel(v.dims) for b in program.blocks for v in b.desc.vars if v.is_parameter)
    return (f"<b>Program</b> \u00b7 {len(program.blocks)} block(s) \u00b7 {n_ops} ops"
            + (f" ({roles})" if roles else "")
            + f" \u00b7 {n_params} parameters ({size:,} values) \u00b7 seed {program.random_seed}"
            + ("" if program.precision == "default" else f" \u00b7 precision {program.precision}"))


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


class ProgramTable:
    """A program shown as a table (`Program.table()`): Jupyter shows `program_html`, `str()`
    gives the text listing."""

    def __init__(self, program):
        self.program = program

    def __str__(self):
        return str(self.program)

    def __repr__(self):
        return f"<ProgramTable of {self.program!r}>"

    def _repr_html_(self):
        return program_html(self.program)


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
        value = None if var is None else var.current()   # not handed out: shown only
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
