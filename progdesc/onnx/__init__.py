"""ONNX models as programs of ours, and programs of ours as ONNX models.

`load` reads an ONNX model (a `.onnx` file, with its external data, or a ModelProto)
and translates it node by node (`progdesc.onnx.rules`) into an ordinary Program: it
runs through the Executor, `minimize` trains it, `progdesc.export` compiles it. Needs the
`onnx` package (`pip install progdesc[onnx]`).

    program, feed_names, fetch_targets = progdesc.onnx.load("model.onnx")
    out, = exe.run(program, feed={feed_names[0]: images}, fetch_list=fetch_targets)

`Backend` (`progdesc.onnx.backend`) is the same importer behind ONNX's backend API
(`onnx.backend.base.Backend`): `Backend.prepare(model).run(inputs)`.
"""
import os

from progdesc import io
from progdesc.onnx.model import read_model
from progdesc.onnx.translate import translate

__all__ = ["Backend", "BackendRep", "is_onnx_model", "load"]


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
