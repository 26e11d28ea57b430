"""PaddlePaddle models as programs of ours: `load_inference_model` reads a model saved by
`paddle.static.save_inference_model` or `paddle.jit.save` (a legacy `.pdmodel`
ProgramDesc or a Paddle 3 PIR `.json` program, with its `.pdiparams` parameters) and
translates it op by op (`progdesc.paddle.rules`) into an ordinary Program: it runs
through the Executor, `minimize` trains it, `clone(for_test=True)` gives its eval mode,
`io.save_inference_model` writes it in our format. No Paddle install is needed.

    program, feed_names, fetch_targets = progdesc.paddle.load_inference_model(
        "resnet/inference", exe)
    out, = exe.run(program, feed={feed_names[0]: images}, fetch_list=fetch_targets)
"""
import os

from lowering.errors import FormatError
from progdesc import io
from progdesc.paddle.params import read_combined, read_tensor_file
from progdesc.paddle.pdmodel import read_pdmodel
from progdesc.paddle.translate import translate
from progdesc.paddle.training import TrainingProgram, load_training_program

__all__ = ["TrainingProgram", "is_paddle_model", "load_inference_model",
           "load_training_program", "read_program"]

_PROGRAM_SUFFIXES = (".pdmodel", ".json")


def _find(path, model_filename=None, params_filename=None):
    """(program file, params file or None, params dir or None) of a model directory, a
    path prefix, or a program file."""
    path = os.fspath(path)
    if os.path.isdir(path):
        if model_filename:
            model = os.path.join(path, model_filename)
        else:
            found = sorted(f for f in os.listdir(path) if f.endswith(_PROGRAM_SUFFIXES))
            if "__model__" in os.listdir(path) and not found:
                found = ["__model__"]
            pdmodels = [f for f in found if f.endswith(".pdmodel")]
            with_params = [f for f in found if os.path.isfile(
                os.path.join(path, os.path.splitext(f)[0] + ".pdiparams"))]
            # both formats saved side by side: the legacy one; a .json beside no
            # .pdiparams (a config file) is no program
            found = pdmodels or with_params or found
            if len(found) != 1:
                raise FormatError(f"'{path}' holds {len(found)} Paddle programs "
                                  f"({', '.join(found) or 'no .pdmodel, .json or __model__'}); "
                                  "pass model_filename, or the path prefix of one")
            model = os.path.join(path, found[0])
        if params_filename:
            return model, os.path.join(path, params_filename), None
        prefix = os.path.splitext(model)[0]
        if os.path.isfile(prefix + ".pdiparams"):
            return model, prefix + ".pdiparams", None
        if os.path.isfile(os.path.join(path, "__params__")):
            return model, os.path.join(path, "__params__"), None
        return model, None, path   # one file per variable
    if path.endswith(_PROGRAM_SUFFIXES) and os.path.isfile(path):
        prefix = os.path.splitext(path)[0]
        model = path
    else:
        prefix = path
        model = next((prefix + s for s in _PROGRAM_SUFFIXES if os.path.isfile(prefix + s)),
                     None)
        if model is None:
            raise FormatError(f"no Paddle model at '{path}': neither a directory nor the "
                              "prefix of a .pdmodel or .json file")
    params = params_filename or prefix + ".pdiparams"
    return model, params if os.path.isfile(params) else None, None


def is_paddle_model(path):
    """Whether `path` names a Paddle model `load_inference_model` would look for: a
    `.pdmodel` or PIR `.json` file, the path prefix of one, or a directory holding one (or
    `__model__`). A directory saved by `progdesc.io.save_inference_model` (its
    `model.pb` beside a `model.json` manifest) is not one."""
    path = os.fspath(path)
    if os.path.isdir(path):
        names = os.listdir(path)
        if io.MODEL_PROGRAM in names:
            return False
        return "__model__" in names or any(n.endswith(_PROGRAM_SUFFIXES) for n in names)
    if os.path.isfile(path):
        return path.endswith(_PROGRAM_SUFFIXES)
    return any(os.path.isfile(path + suffix) for suffix in _PROGRAM_SUFFIXES)


def read_program(path):
    """The PaddleProgram of a `.pdmodel` (or `__model__`) or PIR `.json` file."""
    data = io.read_file(path, "Paddle program")
    if os.fspath(path).endswith(".json"):
        from progdesc.paddle.pir import read_pir   # the PIR reader, loaded when needed
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise FormatError(f"'{path}' is not UTF-8 text (byte offset {e.start})") from None
        return read_pir(text)
    return read_pdmodel(data)


def persistable_names(paddle):
    """The names of the persistable tensors of a PaddleProgram's global block: those its
    parameter file holds, in the order the file stores them."""
    return sorted(v.name for v in paddle.blocks[0].vars.values()
                  if v.persistable and v.kind == "dense"
                  and not v.name.endswith("__non_persistable"))


def read_values(paddle, params_file=None, params_dir=None):
    """{name: array} of a PaddleProgram's persistables from its combined parameter file,
    or from a directory of one file per variable."""
    names = persistable_names(paddle)
    if params_file is not None:
        data = io.read_file(params_file, "Paddle parameter file")
        return read_combined(data, names, what=f"'{params_file}'")
    if params_dir is None:
        if names:
            raise FormatError(f"the program has {len(names)} persistable variables "
                              f"('{names[0]}', ...) but no parameter file was found")
        return {}
    values = {}
    for name in names:
        file = os.path.join(params_dir, name)
        if not os.path.isfile(file):
            raise FormatError(f"no parameter file for persistable variable '{name}' in "
                              f"'{params_dir}'", var=name)
        values[name] = read_tensor_file(io.read_file(file, "Paddle parameter file"),
                                                name)
    return values


def load_inference_model(path, executor=None, scope=None, *, for_training=False,
                         overwrite=False, model_filename=None, params_filename=None):
    """Load a Paddle inference model into `scope` (default: the global one).

    `path` is a model directory, a path prefix (`.../inference` for `inference.pdmodel`
    or `inference.json` with `inference.pdiparams`), or the program file itself; a
    directory of the old layout (`__model__` and one file per variable) works too.
    Returns `(program, feed_names, fetch_targets)` as `progdesc.io.load_inference_model`
    does; run it with ``executor.run(program, feed={...}, fetch_list=fetch_targets,
    scope=scope)``.

    Batch norm and dropout keep the mode the file has (an inference model is in eval
    mode). `for_training=True` imports them in training mode, to fine-tune the model:
    `program.clone(for_test=True)` then gives Paddle's eval outputs.

    Everything is read, checked and translated before anything is written to the Scope;
    a variable the Scope already holds with other values is refused (ScopeError) unless
    `overwrite`. Ops the table cannot translate are reported all at once
    (UnsupportedOpError, with their type, block and index).
    """
    from progdesc.interop.from_jax import check_not_held
    model, params_file, params_dir = _find(path, model_filename, params_filename)
    paddle = read_program(model)
    values = read_values(paddle, params_file, params_dir)
    program, feeds, fetches, state = translate(paddle, values, for_training=for_training)
    if not overwrite:
        check_not_held(scope, state.items())
    io.set_values(program, state, scope)
    block = program.global_block()
    return program, feeds, [block.var(n) for n in fetches]
