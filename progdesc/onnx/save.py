"""Programs of ours written as ONNX models: the forward part of a program, pruned to its
fetch targets, op by op through the export table (`progdesc.onnx.export_rules.EXPORT`).

What becomes what:

- The program is pruned as `progdesc.io.save_inference_model` prunes it (test mode; no
  gradient or optimizer ops; only what the fetches need).
- Feeds become graph inputs under their names, each -1 dim a `dim_param` ('batch' for
  dim 0 when every feed's dim 0 is unknown, else '<feed>_dim<axis>', or the name
  `dim_names` gives it), so the model runs at any size.
- Persistable variables the kept ops read become initializers, with their values from
  the Scope (trained parameters, batch norm statistics).
- Fetch targets become graph outputs under their names.
- Ops of ours become ONNX nodes through their rows; ops with no row, or whose
  attributes a row refuses, are all named in one UnsupportedOpError (type, index in the
  program, source line), and nothing is written.
"""
import os

import onnx
from onnx import helper

from lowering.errors import FeedError, FormatError
from progdesc.atomic import atomic_write
from progdesc.framework import Variable
from progdesc.onnx.export_graph import GraphWriter, original_indices
from progdesc.onnx.export_table import MAX_OPSET, MIN_OPSET, value_info
from progdesc.prune import prune
from progdesc.scope import global_scope

__all__ = ["save", "to_onnx"]


def save(program, path, feed_names, fetch_vars, opset=17, scope=None, *, dim_names=None):
    """Write the forward part of `program` from `feed_names` to `fetch_vars` as the ONNX
    model file `path` (see the module's text), parameters read from `scope` (default:
    the global one). Returns the ModelProto.

    `opset` is the default domain's opset (13 to 21). `dim_names` names the unknown
    dims of feeds: {feed name: a tuple with a name or None (the default name) for each
    dim, None for known ones}, e.g. {"x": ("batch", None)}; feeds that share a name
    share the size. The model is checked with `onnx.checker.check_model(full_check=True)`
    and written atomically: on any error no file is written (a previous one is kept).
    """
    model = to_onnx(program, feed_names, fetch_vars, opset=opset, scope=scope,
                    dim_names=dim_names)
    atomic_write(os.fspath(path), model.SerializeToString())
    return model


def to_onnx(program, feed_names, fetch_vars, opset=17, scope=None, *, dim_names=None):
    """The checked ONNX ModelProto `save` writes (nothing is written)."""
    if not (isinstance(opset, int) and MIN_OPSET <= opset <= MAX_OPSET):
        raise ValueError(f"opset must be an int from {MIN_OPSET} to {MAX_OPSET}, got {opset!r}")
    feeds = [_name(v) for v in feed_names]
    fetches = [_name(v) for v in fetch_vars]
    if not fetches:
        raise FormatError("an ONNX model needs at least one fetch variable")
    block = program.global_block()
    for name in feeds:
        if block.find_var(name) is None:
            raise FeedError("is a feed but not a variable of the program", var=name)
    pruned = prune(program, feeds, fetches)
    graph = GraphWriter(pruned, opset, global_scope() if scope is None else scope)
    inputs = [value_info(n, *pruned.global_block().var_type(n), dims)
              for n, dims in zip(feeds, _dim_params(pruned, feeds, dim_names))]
    graph.walk(feeds, original_indices(program, pruned))
    outputs = [graph.output(n) for n in fetches]
    graph_proto = helper.make_graph(graph.e.nodes, "progdesc", inputs, outputs,
                                    initializer=graph.used_initializers())
    opsets = [helper.make_opsetid("", opset)]
    model = helper.make_model(graph_proto, opset_imports=opsets, producer_name="progdesc",
                              ir_version=helper.find_min_ir_version_for(opsets))
    onnx.checker.check_model(model, full_check=True)
    return model


def _name(v):
    return v.name if isinstance(v, Variable) else str(v)


def _dim_params(program, feeds, dim_names):
    """The dim_param of each -1 dim of each feed (None for the known dims)."""
    dim_names = dict(dim_names or {})
    unknown = sorted(set(dim_names) - set(feeds))
    if unknown:
        raise FeedError(f"dim_names names '{unknown[0]}', which is no feed (the feeds: {feeds})",
                        var=unknown[0])
    shapes = [program.global_block().var_type(n)[0] for n in feeds]
    batch = bool(shapes) and all(len(s) and s[0] == -1 for s in shapes)
    out = []
    for name, dims in zip(feeds, shapes):
        given = dim_names.get(name)
        if given is not None and (not isinstance(given, (tuple, list)) or len(given) != len(dims)):
            raise FeedError(f"dim_names gives {given!r} for a feed of {len(dims)} dims: give a "
                            "tuple with a name or None for each", var=name)
        params = []
        for axis, d in enumerate(dims):
            chosen = given[axis] if given is not None else None
            if d >= 0:
                if chosen is not None:
                    raise FeedError(f"dim_names names dim {axis}, of known size {d}: name only "
                                    "the unknown (-1) dims", var=name)
                params.append(None)
            elif chosen is not None:
                if not isinstance(chosen, str) or not chosen:
                    raise FeedError(f"dim_names[{name!r}][{axis}] must be a name, got "
                                    f"{chosen!r}", var=name)
                params.append(chosen)
            else:
                params.append("batch" if axis == 0 and batch else f"{name}_dim{axis}")
        out.append(params)
    return out
