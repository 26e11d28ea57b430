"""ONNX models as programs of ours, and programs of ours as ONNX models.

`load` reads an ONNX model (a `.onnx` file, with its external data, or a ModelProto)
and translates it node by node (`progdesc.onnx.rules`) into an ordinary Program: it
runs through the Executor, `minimize` trains it, `progdesc.export` compiles it. Needs the
`onnx` package (`pip install progdesc[onnx]`).

    program, feed_names, fetch_targets = progdesc.onnx.load("model.onnx")
    out, = exe.run(program, feed={feed_names[0]: images}, fetch_list=fetch_targets)

`save` writes the forward part of a program back as an ONNX model
(`progdesc.onnx.save`: one export rule per op of ours, `progdesc.onnx.export_rules`):

    progdesc.onnx.save(main, "model.onnx", ["x"], [logits], scope=scope)

`Backend` (`progdesc.onnx.backend`) is the same importer behind ONNX's backend API
(`onnx.backend.base.Backend`): `Backend.prepare(model).run(inputs)`.
"""
import os
import re

from progdesc import io
from progdesc.onnx.model import parse_model, read_model, tensor_type
from progdesc.onnx.save import save, to_onnx
from progdesc.onnx.translate import translate

__all__ = ["Backend", "BackendRep", "input_dims", "is_onnx_model", "load", "save", "to_onnx"]


def __getattr__(name):
    """`Backend` and `BackendRep`, imported on first use (`import progdesc.onnx` stays
    cheap)."""
    if name in ("Backend", "BackendRep"):
        from progdesc.onnx import backend
        return getattr(backend, name)
    raise AttributeError(f"module 'progdesc.onnx' has no attribute '{name}'")


def is_onnx_model(path):
    """Whether `path` names an ONNX model file (by its `.onnx` suffix)."""
    path = os.fspath(path)
    return path.endswith(".onnx") and os.path.isfile(path)


def load(source, scope=None, *, for_training=False, overwrite=False):
    """Load an ONNX model into `scope` (default: the global one).

    `source` is the path of a `.onnx` file (its external data files beside it), its
    bytes, or an `onnx.ModelProto`. Returns `(program, feed_names, fetch_targets)` as
    `progdesc.io.load_inference_model` does: the graph inputs by name, the graph outputs
    as Variables; the initializers' values are put into `scope`, floating-point ones as
    trainable parameters (but those that give shapes at import).

    Symbolic dims of the inputs (`dim_param`: batch, sequence length) become -1 dims;
    shapes computed from them are folded at import, so the program runs, trains and
    exports at any size. `for_training=True` imports BatchNormalization and Dropout in
    training mode, to fine-tune the model (`program.clone(for_test=True)` gives its
    eval mode).

    Everything is read, checked and translated before anything is written to the Scope;
    a variable the Scope already holds with other values is refused (ScopeError) unless
    `overwrite`. Nodes the table cannot translate are reported all at once
    (UnsupportedOpError, with their type and node name).
    """
    from progdesc.interop.from_jax import check_not_held
    model = read_model(source)
    program, feeds, fetches, state = translate(model, for_training=for_training)
    if not overwrite:
        check_not_held(scope, state.items())
    io.set_values(program, state, scope)
    block = program.global_block()
    return program, feeds, [block.var(n) for n in fetches]


def input_dims(source):
    """{graph input name: dims} of the model's inputs that no initializer gives a value:
    each dim its size, or the name of its symbolic dim (the `dim_param`, made a Python
    identifier; '<input>_<axis>' for an unnamed one), as `progdesc.export`'s
    `batch_polymorphic` takes them, so that an exported model keeps the ONNX names and
    inputs sharing a dim_param share the dim. External data is not read."""
    model = parse_model(source)
    values = {t.name for t in model.graph.initializer}
    out = {}
    for info in model.graph.input:
        typ = tensor_type(info.type)
        if info.name in values or typ is None or typ[0] is None:
            continue
        out[info.name] = tuple(d if isinstance(d, int) else _identifier(d or f"{info.name}_{axis}")
                               for axis, d in enumerate(typ[0]))
    return out


_NOT_DIM_NAMES = {"max", "min", "mod", "floordiv"}   # jax.export's functions in shapes


def _identifier(name):
    name = re.sub(r"\W", "_", name, flags=re.ASCII)
    return name if name[:1].isalpha() and name not in _NOT_DIM_NAMES else f"d_{name}"
