"""Programs as readable text: `print(program)`, an op's one-line form, attribute values.

The tables and drawings of progdesc.display show the same names and values.
"""
from lowering import dtypes, registry
from lowering import progdesc_pb2 as pb
from lowering.desc import read_attrs, slot_map
from lowering.errors import ProgdescError

ROLE_NAMES = {pb.FORWARD: "forward", pb.BACKWARD: "backward", pb.OPTIMIZE: "optimize",
              pb.LR_SCHED: "lr_sched", pb.LOSS: "loss"}



def type_str(var_desc):
    """'float32[-1, 10]' for a VarDesc."""
    return f"{dtypes.name_of(var_desc.dtype)}[{', '.join(map(str, var_desc.dims))}]"


def param_settings_text(var_desc):
    """'{lr=0.5, l2=0.01}': the optimizer settings a parameter's VarDesc records, '' if none."""
    settings = var_desc.param_settings
    parts = []
    if settings.HasField("learning_rate"):
        parts.append(f"lr={settings.learning_rate:g}")
    if settings.regularizer.l2:
        parts.append(f"l2={settings.regularizer.l2:g}")
    return "{" + ", ".join(parts) + "}" if parts else ""


def sharding_text(var_desc):
    """'sharding=[data, -]' ('-': a dim not split), 'sharding=replicated', or '' when the
    VarDesc has no sharding annotation (progdesc.distributed)."""
    if not var_desc.HasField("sharding"):
        return ""
    dims = [a or "-" for a in var_desc.sharding.dims]
    if all(a == "-" for a in dims):
        return "sharding=replicated"
    return f"sharding=[{', '.join(dims)}]"


def op_line(block, op_desc):
    """One readable line: outputs = type(inputs) {non-default attrs}."""
    def names(mapping, with_type):
        parts = []
        for slot, args in slot_map(mapping).items():
            shown = []
            for a in args:
                v = block.find_var(a)
                shown.append(f"{a}: {type_str(v.desc)}" if with_type and v is not None else a)
            shown = shown[0] if len(shown) == 1 else "[" + ", ".join(shown) + "]"
            parts.append(f"{slot}={shown}" if not with_type else shown)
        return ", ".join(parts)

    line = f"{names(op_desc.outputs, True)} = {op_desc.type}({names(op_desc.inputs, False)})"
    shown = non_default_attrs(op_desc)
    if shown:
        line += " {" + ", ".join(f"{k}={format_value(v)}" for k, v, _ in shown) + "}"
    return line


def format_value(value):
    """An attribute value as text: floats short, lists bracketed, strings quoted."""
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    return repr(value) if isinstance(value, str) else str(value)


def non_default_attrs(op_desc):
    """[(name, value, attribute type)] of the attributes that differ from their defaults."""
    if not registry.is_registered(op_desc.type):
        return [(k, "?", "") for k in sorted(op_desc.attrs)]
    opdef = registry.get(op_desc.type)
    try:
        values = read_attrs(opdef, op_desc)
    except ProgdescError:
        return [(k, "?", "") for k in sorted(op_desc.attrs)]
    shown = []
    for a in opdef.attrs:
        v = values[a.name]
        if a.type in ("block", "blocks"):
            shown.append((a.name, v, a.type))
            continue
        try:
            default = None if a.default is registry.REQUIRED else a.check(a.default)
        except ProgdescError:
            default = None
        if a.default is registry.REQUIRED or v != default:
            shown.append((a.name, v, a.type))
    return shown


def attr_texts(op_desc, max_chars):
    """[(name, text)] of an op's non-default attributes as shown to a person: sub-blocks as
    'block k', values by `format_value`, each cut to `max_chars` with an ellipsis."""
    shown = []
    for name, value, kind in non_default_attrs(op_desc):
        if kind == "block":
            text = f"block {value}"
        elif kind == "blocks":
            text = "blocks " + ", ".join(str(b) for b in value)
        else:
            text = format_value(value)
        if len(text) > max_chars:
            text = text[:max_chars - 1] + "\u2026"
        shown.append((name, text))
    return shown


def block_text(block):
    """The readable listing of one block."""
    lines = [f"block {block.idx} (parent {block.parent_idx}) {{"]
    for v in block.desc.vars:
        if v.need_check_feed:
            lines.append(f"  data  {v.name}: {type_str(v)}")
        elif v.persistable and v.kind == pb.DENSE_TENSOR:
            what = "param" if v.is_parameter else "state"
            settings = param_settings_text(v) if v.is_parameter else ""
            notes = " ".join(t for t in (settings, sharding_text(v)) if t)
            lines.append(f"  {what} {v.name}: {type_str(v)} {notes}".rstrip())
    role = None
    for op_desc in block.desc.ops:
        if op_desc.role != role and role is not None:
            lines.append(f"  # {ROLE_NAMES.get(op_desc.role, '')}")
        role = op_desc.role
        lines.append("  " + op_line(block, op_desc))
    lines.append("}")
    return "\n".join(lines)


def _indented(text, block):
    """`text` indented two spaces per enclosing block of `block` (sub-blocks show nested)."""
    depth = 0
    while block.idx != 0 and block.parent_idx >= 0:
        depth, block = depth + 1, block.parent
    return "\n".join("  " * depth + line for line in text.splitlines())


def program_text(program):
    """The readable listing of a whole program: a header, then each block (sub-blocks
    indented under their parents)."""
    precision = "" if program.precision == "default" else f", precision {program.precision}"
    head = (f"program (format {program.desc.format_version}, seed {program.random_seed}"
            f"{precision})")
    return "\n".join([head] + [_indented(block_text(b), b) for b in program.blocks])
