"""The view model of a program: the JSON-ready dict the interactive viewer's page draws.

`view_model(program)` follows the contract in the viewer's schema (regions,
nested layer groups, sub-block groups, op and data nodes, dataflow edges,
variables). It reads the program's protobuf description once, in one pass
per block, so its cost grows with the number of ops (a 10,000-op program
takes a fraction of a second).

- Regions: an op's role puts it in 'forward' (forward and loss ops),
  'backward' or 'optimizer' (optimizer and learning-rate ops).
- Layer groups: a forward op's group path is the dotted prefixes of its first
  output's name (`enc_0.attn.query.matmul_0.out` -> `enc_0` > `enc_0.attn` >
  `enc_0.attn.query` > `enc_0.attn.query.matmul_0`). When that name holds no
  layer (imported programs: 'conv2d_2.output'), the op joins the layer of the
  parameter it reads, or the one the ops it reads from joined (the later of two
  layers with nothing in common: a norm reading a conv's result). A gradient op
  takes the path of its forward op, an optimizer op that of the parameter it
  updates. A group that would hold a single op is dissolved into its parent; one
  holding every op of its parent is left out.
- Sub-blocks (cond, scan, while) are `b:<k>` groups under the group of the op
  that owns them.
- Parameters and other persistable variables are not nodes and make no edges;
  feed variables (and variables no op writes) are data nodes.
"""
import bisect

from lowering import dtypes
from lowering.desc import FORWARD_OP
from lowering.gc_pause import gc_paused
from progdesc.display.text import ROLE_NAMES, attr_texts
from progdesc.display.viewer.sources import SourceLines

__all__ = ["SCHEMA_VERSION", "view_model"]

SCHEMA_VERSION = 1
_REGION_OF_ROLE = {"forward": "forward", "loss": "forward", "backward": "backward",
                   "optimize": "optimizer", "lr_sched": "optimizer"}
_REGIONS = ("forward", "backward", "optimizer")
_MAX_ATTR_CHARS = 200
_GRAD = "@GRAD"


def _names(slots):
    return [a for s in slots for a in s.arguments]


def _path(name):
    """The group path of a variable name: its dotted prefixes, the name's own '@GRAD...'
    suffix and last component left out (`a.b.out` -> ['a', 'a.b'])."""
    cut = name.find(_GRAD)
    if cut > 0:
        name = name[:cut]
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _sub_blocks(op_desc):
    """[(what the block is to the op, block index)] of the blocks an op's attributes refer
    to, by block index: 'body' (attribute 'block' or 'sub_block'), 'true branch'
    ('true_block'), 'branch 2' (the third of 'blocks')."""
    out = []
    for attr_name, attr in op_desc.attrs.items():
        which = attr.WhichOneof("value")
        if which == "block_idx":
            what = attr_name.removesuffix("_block")
            out.append(("body" if what in ("block", "sub") else f"{what} branch", attr.block_idx))
        elif which == "blocks_idx":
            out.extend((f"branch {j}", b) for j, b in enumerate(attr.blocks_idx.values))
    return sorted(out, key=lambda item: item[1])


def _attrs(op_desc):
    return [[name, text] for name, text in attr_texts(op_desc, _MAX_ATTR_CHARS)]


class _Vars:
    """Variable descriptions by (block, name), looked up through the parent chain."""

    def __init__(self, desc):
        self.desc = desc
        self.local = [{v.name: v for v in b.vars} for b in desc.blocks]
        self._found = {}

    def find(self, block_idx, name):
        """(VarDesc, index of the declaring block), or (None, None)."""
        key = (block_idx, name)
        if key not in self._found:
            found, seen, k = (None, None), set(), block_idx
            while 0 <= k < len(self.local) and k not in seen:
                seen.add(k)
                v = self.local[k].get(name)
                if v is not None:
                    found = (v, k)
                    break
                k = self.desc.blocks[k].parent_idx
            self._found[key] = found
        return self._found[key]


def _var_entry(var, block_idx, name, scope):
    if var is None:
        return {"shape": None, "dtype": None, "kind": "grad" if _GRAD in name else "temp",
                "persistable": False, "sharding": None, "block": None}
    if var.need_check_feed:
        kind = "data"
    elif var.is_parameter:
        kind = "parameter"
    elif var.persistable:
        kind = "state"
    else:
        kind = "grad" if _GRAD in name else "temp"
    try:
        dtype = dtypes.name_of(var.dtype)
    except Exception:  # noqa: BLE001  (an enum this version does not know: shown as a number)
        dtype = str(var.dtype)
    sharding = None
    if var.HasField("sharding"):
        sharding = [a or None for a in var.sharding.dims]
    entry = {"shape": list(var.dims), "dtype": dtype, "kind": kind,
             "persistable": bool(var.persistable), "sharding": sharding, "block": block_idx}
    if scope is not None and var.persistable:
        held = scope.find_var(name)
        value = held.current() if held is not None else None
        if value is not None and hasattr(value, "shape"):
            entry["value"] = {"shape": [int(d) for d in value.shape],
                              "dtype": str(getattr(value, "dtype", ""))}
    return entry


def _block_order(desc, owners):
    """Block indices, each after the block holding its owner op (or its parent)."""
    n = len(desc.blocks)
    children = {}
    for k in range(n):
        up = owners[k][0] if k in owners else desc.blocks[k].parent_idx
        if k != 0 and 0 <= up < n and up != k:
            children.setdefault(up, []).append(k)
    order, seen = [], set()
    for root in range(n):
        if root in seen:
            continue
        stack = [root]
        while stack:
            k = stack.pop()
            if k in seen:
                continue
            seen.add(k)
            order.append(k)
            stack.extend(reversed(children.get(k, [])))
    return order


class _Builder:
    def __init__(self, program, scope):
        self.desc = program.desc
        self.scope = scope
        self.vars = _Vars(self.desc)
        self.sources = SourceLines()
        self.groups, self.nodes, self.edges = [], [], []
        self.group_ids = set()
        self.var_entries = {}
        self.data_ids = {}
        self.op_group = {}      # op id -> its group id
        self.op_region = {}     # op id -> region
        self.raw_path = {}      # op id -> the op's group path before dissolving
        self.path_rank = {}     # tuple(path) -> how many paths an op took before it
        self.inferred = set()   # ids of the ops whose path came from parameters or dataflow
        self.plumbing = set()   # ids of the ops with a name of their own that compute from
                                # constants and feeds only (a shape, a mask, a constant)
        self.first_reader = {}  # (block, name) -> the id of the first op that reads it
        self.producer = {}      # (block, name) -> (op index, op type) of the first writer
        self.writes = {}        # block -> {name: [(op index, op id)]}
        self._edge_keys = set()

    # --- variables, data nodes, edges ---

    def note_var(self, block_idx, name):
        if name not in self.var_entries:
            var, where = self.vars.find(block_idx, name)
            self.var_entries[name] = _var_entry(var, where, name, self.scope)
        return self.vars.find(block_idx, name)[0]

    def data_node(self, block_idx, name, group, region):
        var, where = self.vars.find(block_idx, name)
        where = block_idx if where is None else where
        key = (where, name)
        if key not in self.data_ids:
            nid = f"v:{name}" if where == 0 else f"v:{where}:{name}"
            self.data_ids[key] = nid
            self.note_var(block_idx, name)
            self.nodes.append({"id": nid, "kind": "data", "label": name, "group": group,
                               "region": region, "var": name})
        return self.data_ids[key]

    def writer(self, block_idx, name, before, owners):
        """The id of the op that last wrote `name` before op `before` of `block_idx`, looking
        into enclosing blocks (up to the op owning each block); None if no op did."""
        seen = set()
        while block_idx is not None and block_idx not in seen:
            seen.add(block_idx)
            written = self.writes.get(block_idx, {}).get(name)
            if written:   # [(op index, op id)] in op order
                n = len(written) if before is None else bisect.bisect_left(
                    written, before, key=lambda w: w[0])
                if n:
                    return written[n - 1][1]
            if block_idx in owners:
                block_idx, before = owners[block_idx]
            else:
                parent = self.desc.blocks[block_idx].parent_idx
                block_idx = parent if 0 <= parent < len(self.desc.blocks) else None
                before = None
        return None

    def edge(self, src, dst, name):
        key = (src, dst, name)
        if key not in self._edge_keys:
            self._edge_keys.add(key)
            self.edges.append({"src": src, "dst": dst, "var": name})

    # --- groups ---

    def add_group(self, gid, label, kind, region, parent, ops, **extra):
        if gid in self.group_ids:
            return
        self.group_ids.add(gid)
        self.groups.append({"id": gid, "label": label, "kind": kind, "region": region,
                            "parent": parent, "collapsed": True, "ops": ops, **extra})

    def layer_groups(self, container, prefix, region, members):
        """Give each of `members` ([(op id, path)]) its innermost group of at least two ops
        under `container` (ids `g:<prefix>/<path>`), adding the groups. A group holding
        all the ops of its parent group, or of the sub-block `container`, is left out (its
        parent shows the same ops)."""
        whole = len(members) if container.startswith("b:") else None
        counts = {}
        for _, path in members:
            for p in path:
                counts[p] = counts.get(p, 0) + 1
        for op_id, path in members:
            parent, parent_path, parent_count = container, "", whole
            for p in path:
                if counts[p] < 2:
                    break
                if counts[p] == parent_count:
                    continue
                gid = f"g:{prefix}/{p}"
                label = p[len(parent_path) + 1:] if parent_path else p
                self.add_group(gid, label, "layer", region, parent, counts[p])
                parent, parent_path, parent_count = gid, p, counts[p]
            self.op_group[op_id] = parent

    # --- the pass over the program ---

    def build(self):
        desc = self.desc
        n_blocks = len(desc.blocks)
        owners, owned = {}, {}     # block -> (owner block, op index); op id -> [(attr, block)]
        for b in desc.blocks:
            for i, op_desc in enumerate(b.ops):
                subs = _sub_blocks(op_desc)
                if subs:
                    owned[f"op:{b.idx}:{i}"] = subs
                for what, k in subs:
                    if 0 <= k < n_blocks and k != b.idx and k not in owners:
                        owners[k] = (b.idx, i, op_desc.type, what)
        owner_pos = {k: (v[0], v[1]) for k, v in owners.items()}

        present = set()
        for b in desc.blocks:
            for op_desc in b.ops:
                present.add(_REGION_OF_ROLE.get(ROLE_NAMES.get(op_desc.role, "forward"),
                                                "forward"))
        present.add("forward")
        for region in _REGIONS:
            if region in present:
                self.groups.append({"id": f"r:{region}", "label": region, "kind": "region",
                                    "region": region, "parent": None,
                                    "collapsed": region != "forward"})
                self.group_ids.add(f"r:{region}")

        for v in desc.blocks[0].vars if n_blocks else ():
            if v.need_check_feed:
                self.data_node(0, v.name, "r:forward", "forward")

        block_region = {}
        for k in _block_order(desc, owner_pos):
            self.block(k, owners, owner_pos, owned, block_region)
        return owners

    def block(self, k, owners, owner_pos, owned, block_region):
        b = self.desc.blocks[k]
        if k in owners:
            ob, oi, otype, what = owners[k]
            owner_id = f"op:{ob}:{oi}"
            region = self.op_region.get(owner_id, "forward")
            container = f"b:{k}"
            self.add_group(container, f"block {k} ({otype} {what})", "block", region,
                           self.op_group.get(owner_id, f"r:{region}"), len(b.ops),
                           owner=owner_id)
        elif k != 0:
            role = ROLE_NAMES.get(b.ops[0].role, "forward") if b.ops else "forward"
            region = _REGION_OF_ROLE.get(role, "forward")
            container = f"b:{k}"
            self.add_group(container, f"block {k}", "block", region, f"r:{region}",
                           len(b.ops), owner=None)
        else:
            region, container = None, None
        block_region[k] = region

        writes = self.writes.setdefault(k, {})
        members = {}   # (container, region) -> [op id]
        for i, op_desc in enumerate(b.ops):
            op_id = f"op:{k}:{i}"
            op_region = region or _REGION_OF_ROLE.get(
                ROLE_NAMES.get(op_desc.role, "forward"), "forward")
            self.op_region[op_id] = op_region
            ins, outs = _names(op_desc.inputs), _names(op_desc.outputs)
            forward = self.forward_link(k, op_desc, ins)
            path = self.op_path(k, i, op_desc, op_region, ins, outs, forward, owner_pos)
            self.raw_path[op_id] = path
            self.path_rank.setdefault(tuple(path), len(self.path_rank))
            box = container or f"r:{op_region}"
            members.setdefault((box, op_region), []).append(op_id)
            for name in outs:
                self.producer.setdefault((k, name), (i, op_desc.type))
            # edges in: from the last writer of each non-persistable input
            for name in ins:
                var = self.note_var(k, name)
                if var is not None and var.persistable:
                    continue
                self.first_reader.setdefault((k, name), op_id)
                src = self.writer(k, name, i, owner_pos)
                if src is None:
                    src = self.data_node(k, name, container or "r:forward",
                                         region or "forward")
                self.edge(src, op_id, name)
            for name in outs:
                self.note_var(k, name)
                writes.setdefault(name, []).append((i, op_id))
            self.nodes.append({
                "id": op_id, "kind": "op", "type": op_desc.type, "label": op_desc.type,
                "group": None, "region": op_region,
                "inputs": [[s.parameter, list(s.arguments)] for s in op_desc.inputs],
                "outputs": [[s.parameter, list(s.arguments)] for s in op_desc.outputs],
                "attrs": _attrs(op_desc), "callsite": self.sources(op_desc.callsite),
                "forward": forward,
                "blocks": [f"b:{sb}" for _, sb in owned.get(op_id, ())
                           if 0 <= sb < len(self.desc.blocks) and sb != k]})
        for i in range(len(b.ops) - 1, -1, -1):   # plumbing goes where its first reader went
            op_id = f"op:{k}:{i}"
            outs = _names(b.ops[i].outputs) if op_id in self.plumbing else ()
            reader = self.first_reader.get((k, outs[0])) if outs else None
            if reader in self.inferred:
                self.raw_path[op_id] = self.raw_path[reader]
                self.inferred.add(op_id)
        for (box, op_region), ids in members.items():
            prefix = op_region if container is None else f"b{k}"
            self.layer_groups(box, prefix, op_region,
                              [(op_id, self.raw_path[op_id]) for op_id in ids])

    def forward_link(self, k, op_desc, ins):
        """The id of the forward op a gradient op comes from: recorded by append_backward
        (attribute '@forward_op'); for a '<type>_grad' op that has none (an imported
        program), the op of that type that wrote one of its inputs; else None."""
        if FORWARD_OP in op_desc.attrs:
            link = op_desc.attrs[FORWARD_OP].ints.values
            if len(link) == 2 and 0 <= link[0] < len(self.desc.blocks) \
                    and 0 <= link[1] < len(self.desc.blocks[link[0]].ops):
                return f"op:{link[0]}:{link[1]}"
            return None
        if op_desc.type.endswith("_grad"):
            fwd_type = op_desc.type[:-len("_grad")]
            for name in ins:
                made = self.producer.get((k, name))
                if made is not None and made[1] == fwd_type:
                    return f"op:{k}:{made[0]}"
        return None

    def op_path(self, k, i, op_desc, region, ins, outs, forward, owner_pos):
        """The op's group path: for a gradient op that of its forward op (or of the op that
        wrote the value whose gradient it writes), for an optimizer op that of the
        parameter it updates, else that of its first output's name; see `inferred_path`
        for an op whose output name holds no layer (an imported program's)."""
        if region == "backward":
            if forward in self.raw_path:
                return self.raw_path[forward]
            for name in outs:
                cut = name.find(_GRAD)
                made = self.producer.get((k, name[:cut])) if cut > 0 else None
                if made is not None:
                    return self.raw_path[f"op:{k}:{made[0]}"]
        elif region == "optimizer":
            for name in outs + _names(op_desc.inputs):
                var = self.vars.find(k, name)[0]
                if var is not None and var.is_parameter:
                    return _path(name)
        path = _path(outs[0]) if outs else []
        if len(path) <= 1:
            inferred = self.inferred_path(k, i, ins, owner_pos)
            if inferred and inferred != path:   # (not a layer's own op, 'fc_0.out')
                self.inferred.add(f"op:{k}:{i}")
                return inferred
            if all(self.from_plumbing(k, i, name, owner_pos) for name in ins):
                self.plumbing.add(f"op:{k}:{i}")
        return path

    def from_plumbing(self, k, i, name, owner_pos):
        """Whether input `name` of op `i` of block `k` is persistable, a feed, or written by
        plumbing (see `inferred_path`)."""
        var = self.vars.find(k, name)[0]
        if var is not None and var.persistable:
            return True
        src = self.writer(k, name, i, owner_pos)
        return src is None or src in self.plumbing

    def inferred_path(self, k, i, ins, owner_pos):
        """The layer of an op whose output name names no layer ('conv2d_2.output',
        'add_0.out', as imported programs name them): that of the first parameter (or other
        persistable variable) it reads with one ('conv2d_0.w_0' -> conv2d_0), else the
        deepest layer shared by the ops that wrote its inputs if each of them got its layer
        this way, plumbing and feeds aside (the bias add and activation after a convolution
        join it; q @ k joins the attention holding both projections); where they share
        none, the layer that began last (a norm's arithmetic on a conv's result joins the
        norm, a dropout mask applied to it the dropout); [] if none. Plumbing (an op
        computing from constants and feeds only: `fill_constant`, `dim_size(x)`) joins
        the layer of its first reader, if that got its layer this way."""
        found = [self.vars.find(k, name)[0] for name in ins]
        for name, var in zip(ins, found):   # a parameter, or a layer's state (norm.mean)
            if var is not None and var.persistable and _path(name):
                return _path(name)
        shared = latest = None
        for name, var in zip(ins, found):
            if var is not None and var.persistable:
                continue
            src = self.writer(k, name, i, owner_pos)
            if src is None or src in self.plumbing:   # a feed, a constant
                continue
            if src not in self.inferred:
                return []
            path = self.raw_path[src]
            if shared is None:
                shared = latest = path
            else:
                n = 0
                while n < len(shared) and n < len(path) and shared[n] == path[n]:
                    n += 1
                shared = shared[:n]
                if self.path_rank.get(tuple(path), -1) > self.path_rank.get(tuple(latest), -1):
                    latest = path
        if shared == [] and latest:   # layers with nothing in common: the later one reads
            return latest              # the earlier one's result (a norm applied to a conv's)
        return shared or []


def view_model(program, *, scope=None, title=None, fetch=None):
    """The view model of `program`: a JSON-ready dict of groups, nodes, edges and variables
    (see the viewer's schema), for `Viewer` and `viewer_html`.

    `scope` (a Scope, optional) adds the shape and dtype of each persistable variable's
    value it holds (`vars[name]["value"]`); `title` names the program in the page's title
    (default 'program'); `fetch` lists the names (or Variables) the program's results are
    fetched as, marked in the page.
    """
    b = _Builder(program, scope)
    with gc_paused():   # tens of thousands of small dicts and lists, none of them garbage
        b.build()
    for node in b.nodes:
        if node["kind"] == "op":
            node["group"] = b.op_group.get(node["id"], f"r:{node['region']}")
    # the page lists each group's children in this order: parents before their children
    n_ops = sum(len(blk.ops) for blk in program.desc.blocks)
    fetched = [getattr(f, "name", f) for f in (fetch or ())]
    for name in fetched:
        if name not in b.var_entries:
            b.note_var(0, name)
    return {"version": SCHEMA_VERSION,
            "title": f"{title or 'program'} ({n_ops} op{'s' if n_ops != 1 else ''})",
            "groups": b.groups, "nodes": b.nodes, "edges": b.edges, "vars": b.var_entries,
            "fetch": fetched}
