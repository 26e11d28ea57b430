"""Saving and loading programs, checkpoints and inference models.

Nothing here uses pickle: files may come from strangers.

- **Programs** are binary protobuf (``.pb``) or protobuf text (``.pbtxt``).
  Loading checks the format version and validates every op against the
  registry (`Program.from_bytes` / `from_text`).
- **Checkpoints** are one safetensors file holding every persistable of a
  program (parameters, optimizer state, step counters, the RNG state). We
  chose safetensors over ``np.savez``: its header is plain JSON parsed by a
  small audited parser with offsets checked against the file size, it has no
  object or pickle path at all (``np.load`` only refuses pickle when asked
  to), it stores bfloat16 natively, and other tools (PyTorch, Hugging Face)
  read the files. The file's ``__metadata__`` names the format and version,
  and ``tensor_checksums`` gives each tensor's dtype, shape and CRC-32,
  checked on load. Version 2 files must carry checksums (one without them is
  refused as corrupted); version 1 files, written before checksums existed,
  load unchecked.
  Variable names are only keys inside that one file, so no name can make a
  save write anywhere else. `save_checkpoint(..., background=True)` writes the
  same file in a thread while training goes on (progdesc.checkpointing).
- **Inference models** are a directory: ``model.pb`` (the pruned, test-mode
  program), ``params.safetensors`` (its persistables) and ``model.json``
  (format version, feed and fetch names, SHA-256 of the other two files and
  of the manifest itself, required from version 2 on). Every file must lie inside the directory.

Every write is atomic (progdesc.atomic): a file goes to a temporary beside the
target and is renamed over it; an inference model directory is written whole
beside the old one and swapped in. A failure (disk full, read-only) raises
`SaveError` naming the path, and it or a crash part-way through leaves the
previous file or model as it was; temporaries of killed writers are removed by
the next save of the same target. Loading validates everything (names, shapes against
the program's VarDescs with -1 matching any size, dtypes) before it writes a
single value to the Scope.
"""
import contextlib
import hashlib
import json
import os
import stat
import zlib

import jax
import numpy as np

from lowering import dtypes
from lowering import progdesc_pb2 as pb
from lowering.errors import (FeedError, FetchError, FormatError, ProgdescError, ScopeError,
                             did_you_mean)
from lowering.lower import RNG_VAR
from progdesc import checkpointing
from progdesc.atomic import Pieces, atomic_write, write_directory
from progdesc.framework import Program, Variable, default_main_program, dims_compatible
from progdesc.limits import MAX_NAME_CHARS, clean_text
from progdesc.prune import prune
from progdesc.scope import global_scope

CHECKPOINT_FORMAT = "progdesc.checkpoint"
CHECKPOINT_VERSION = 2      # 2: tensor_checksums required; 1: optional (files before them)
MODEL_FORMAT = "progdesc.inference_model"
MODEL_VERSION = 2      # 2: manifest_sha256 required; 1: optional (manifests before it)
MODEL_PROGRAM, MODEL_PARAMS, MODEL_MANIFEST = "model.pb", "params.safetensors", "model.json"
TEXT_SUFFIXES = (".pbtxt", ".prototxt", ".txt")

_ST_DTYPES = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "I32": "int32",
              "I64": "int64", "U32": "uint32", "F16": "float16", "BF16": "bfloat16",
              "F32": "float32", "F64": "float64"}
_ST_CODES = {name: code for code, name in _ST_DTYPES.items()}
_PERSISTED_KINDS = (pb.DENSE_TENSOR, pb.RNG_STATE)
# Checkpoint checksums are CRC-32 (zlib): the integrity check of zip, gzip and PNG. It catches
# every error burst of up to 32 bits and all but 1 in 2**32 of other random corruption, and it
# runs at 3.8 GB/s on this project's CPU against 1.3 GB/s for SHA-256 (checkpoints are written
# often while training). It guards against damage, not deliberate edits: nothing stored beside
# the data can. The file's metadata keys are exactly these (checksums absent in older files),
# so a corrupted key name cannot pass for an old file.
CHECKSUMS_KEY = "tensor_checksums"
_CHECKPOINT_META = {"format", "format_version", CHECKSUMS_KEY}
_CHECKPOINT_VERSIONS = {str(v) for v in range(1, CHECKPOINT_VERSION + 1)}
_MANIFEST_KEYS = {"format", "format_version", "feed", "fetch", "sha256", "manifest_sha256"}


# --- files ---

def read_file(path, what="file"):
    """The bytes of the regular file `path`; FormatError naming the path if it cannot be read.

    A FIFO or a device (``/dev/zero``) is refused before a byte is read: reading
    one could block or never end. Opening is non-blocking for the same reason.
    """
    try:
        with open(os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)), "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise FormatError(f"{what} '{os.fspath(path)}' is not a regular file")
            return f.read()
    except OSError as e:
        raise FormatError(f"cannot read {what} '{os.fspath(path)}': {e.strerror or e}") from None


def json_digest(obj):
    """SHA-256 of `obj` as canonical JSON (sorted keys, no spaces, ASCII): for self-digests."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def parse_json(data, where):
    """The JSON value of `data` (bytes); FormatError naming `where` if it is not JSON."""
    try:
        return json.loads(bytes(data).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise FormatError(f"{where} is not valid JSON: {type(e).__name__}: {e}") from None


def _shown(name):
    """A name read from a file, as an error message may show it (see progdesc.limits)."""
    return clean_text(name, MAX_NAME_CHARS)


def _with_path(err, path):
    """`err` again, of the same type and fields, with `path` in its message."""
    return type(err)(f"{err.detail} (in '{os.fspath(path)}')", op_type=err.op_type,
                     op_index=err.op_index, block_idx=err.block_idx, var=err.var,
                     callsite=err.callsite)


# --- programs ---

def save_program(program, path, text=None):
    """Save `program` to `path` atomically: protobuf text if `text`, else binary.

    `text=None` picks text for a .pbtxt, .prototxt or .txt suffix.
    """
    text = os.fspath(path).endswith(TEXT_SUFFIXES) if text is None else text
    atomic_write(path, program.to_text() if text else program.to_bytes())


def program_from_bytes(data, path="<bytes>", text=None):
    """Parse a program from file contents: text or binary (`text=None` tries binary, then text)."""
    try:
        if text:
            try:
                return Program.from_text(data.decode("utf-8"))
            except UnicodeDecodeError:
                raise FormatError("text program is not valid UTF-8") from None
        try:
            return Program.from_bytes(data)
        except FormatError as binary_error:
            if text is not None:
                raise
            try:
                source = data.decode("utf-8")
            except UnicodeDecodeError:
                raise binary_error from None
            try:
                return Program.from_text(source)
            except FormatError:
                raise FormatError("neither a binary nor a text ProgramDesc "
                                  f"({binary_error.detail})") from None
    except ProgdescError as e:
        raise _with_path(e, path) from None


def load_program(path, text=None):
    """Load and validate a program file (binary or text, chosen by suffix or by trying both)."""
    if text is None and os.fspath(path).endswith(TEXT_SUFFIXES):
        text = True
    return program_from_bytes(read_file(path, "program"), path, text)


# --- checkpoints ---

def persistable_vars(program):
    """{name: Variable} of every persistable tensor of `program` (global block first)."""
    found = {}
    for block in program.blocks:
        for var in block.vars.values():
            if var.persistable and var.desc.kind in _PERSISTED_KINDS:
                found.setdefault(var.name, var)
    return found


def checkpoint_bytes(program, scope=None):
    """The safetensors bytes of every persistable of `program`, read from `scope` (a Scope,
    or a {name: array} dict)."""
    return tensors_bytes(checkpoint_values(program, scope))


def checkpoint_values(program, scope=None):
    """{name: array} of every persistable of `program` in `scope` (a Scope, or a {name:
    array} dict), all of one step: a Scope's are taken under its lock, as jax arrays that
    stay valid after later runs (see progdesc.scope), their transfer to the host started."""
    scope = global_scope() if scope is None else scope
    values = {}
    with getattr(scope, "lock", contextlib.nullcontext()):
        for name, var in persistable_vars(program).items():
            if name in scope:
                values[name] = scope.get(name)
            elif name == RNG_VAR:          # what the Executor would start from
                values[name] = np.asarray(jax.random.PRNGKey(program.random_seed))
            else:
                raise ScopeError("has no value in the scope: run the startup program first "
                                 "(or load a checkpoint)", var=name)
    for value in values.values():
        if isinstance(value, jax.Array) and value.is_fully_addressable:
            value.copy_to_host_async()
    return values


def tensors_bytes(tensors):
    """The safetensors checkpoint bytes (format metadata, checksums) of {key: array}."""
    return bytes(tensors_file(tensors))


def tensors_file(tensors):
    """The safetensors checkpoint file (format metadata, checksums) of {key: array}, as
    `progdesc.atomic.Pieces`: the header, then each tensor's own buffer.

    The layout is safetensors' (an 8-byte header size, the JSON header padded with spaces
    to 8 bytes, the tensors' bytes back to back, the widest dtypes first so that each
    starts aligned), read back by the safetensors library. It is laid out here rather
    than by `safetensors.numpy.save`, which builds the whole file through two copies of
    every tensor while holding the GIL: 5 to 8 times slower on this project's CPU, and a
    background save would stall the training thread meanwhile. Here the tensors are
    checksummed (zlib releases the GIL) and written from their own memory.
    """
    tensors = {name: np.ascontiguousarray(value) for name, value in tensors.items()}
    order = sorted(tensors, key=lambda n: (-tensors[n].dtype.itemsize, n))
    entries, checksums, offset = {}, {}, 0
    for name in order:
        value = tensors[name]
        code = _ST_CODES[dtypes.name_of(value.dtype)]
        entries[name] = {"dtype": code, "shape": [int(d) for d in value.shape],
                         "data_offsets": [offset, offset + value.nbytes]}
        checksums[name] = _checksum(code, value.shape, value.reshape(-1).view(np.uint8))
        offset += value.nbytes
    meta = {"format": CHECKPOINT_FORMAT, "format_version": str(CHECKPOINT_VERSION),
            CHECKSUMS_KEY: json.dumps(checksums, separators=(",", ":"))}
    header = json.dumps({"__metadata__": meta, **entries}, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    return Pieces((len(header).to_bytes(8, "little") + header,
                   *(tensors[name].reshape(-1).view(np.uint8) for name in order)))


def _checksum(code, shape, data):
    """A tensor's checksum entry: its safetensors dtype code, its shape and CRC-32 of its bytes."""
    return {"dtype": code, "shape": [int(d) for d in shape], "crc32": f"{zlib.crc32(data):08x}"}


def save_checkpoint(path, program=None, scope=None, background=False):
    """Atomically write every persistable of `program` (default main) held by `scope` to `path`.

    With `background=True` the values are taken now (those of the last finished step)
    and the file is written by a thread while training goes on: returns a
    `progdesc.checkpointing.PendingSave` (`wait()` raises the error if the write failed,
    `done()` polls). The file is the same as a blocking save's; see progdesc.checkpointing
    for the rules (one save in flight per path, errors raised on the next save if no one
    waited, exit waits for the write). A blocking save returns None.
    """
    program = program or default_main_program()
    checkpointing.before_save(path)
    values = checkpoint_values(program, scope)
    if not background:
        atomic_write(path, tensors_file(values))
        return None
    return checkpointing.submit(path, lambda: atomic_write(path, tensors_file(values)))


def checkpoint_from_bytes(data, path="<bytes>"):
    """{name: numpy array} of safetensors checkpoint bytes, checksums verified; else FormatError."""
    import safetensors
    where = f"'{os.fspath(path)}'"
    try:
        entries = safetensors.deserialize(bytes(data))
    except Exception as e:  # noqa: BLE001  (the parser's own error type)
        raise FormatError(f"{where} is not a checkpoint (safetensors): {e}") from None
    n = int.from_bytes(data[:8], "little")
    meta = parse_json(data[8:8 + n], where).get("__metadata__") or {}
    if meta.get("format") != CHECKPOINT_FORMAT:
        raise FormatError(f"{where} is a safetensors file but not a progdesc checkpoint")
    version = meta.get("format_version")
    if version not in _CHECKPOINT_VERSIONS:
        raise FormatError(f"{where} has checkpoint format version {version!r}; "
                          f"this progdesc reads 1 to {CHECKPOINT_VERSION}")
    unknown = sorted(set(meta) - _CHECKPOINT_META)
    if unknown:
        raise FormatError(f"{where} has unknown metadata {unknown[0]!r} (corrupted?)")
    if CHECKSUMS_KEY not in meta and version != "1":
        raise FormatError(f"{where} is corrupted: it has no tensor checksums, which format "
                          f"version {version} requires")
    if CHECKSUMS_KEY in meta:
        _verify_checksums(parse_json(meta[CHECKSUMS_KEY].encode(), f"{where} checksums"),
                          entries, where)
    values = {}
    for name, entry in entries:
        dtype = _ST_DTYPES.get(entry["dtype"])
        if dtype is None:
            raise FormatError(f"{where} stores unsupported dtype {entry['dtype']}",
                              var=_shown(name))
        values[name] = np.frombuffer(entry["data"], dtypes.to_numpy(dtype)).reshape(
            entry["shape"]).copy()
    return values


def _verify_checksums(checksums, entries, where):
    """FormatError naming the first tensor of `entries` whose checksum entry disagrees."""
    if not isinstance(checksums, dict):
        raise FormatError(f"{where} has malformed tensor checksums")
    for name, entry in entries:
        if checksums.get(name) != _checksum(entry["dtype"], entry["shape"], entry["data"]):
            raise FormatError(f"{where} is corrupted: the tensor's dtype, shape or bytes do not "
                              "match its checksum", var=_shown(name))
    extra = sorted(set(checksums) - {name for name, _ in entries})
    if extra:
        raise FormatError(f"{where} is corrupted: a checksum names a tensor the file lacks",
                          var=_shown(extra[0]))


def read_checkpoint(path):
    """{name: numpy array} of a checkpoint file (validated as a file, not against a program).

    A background save of `path` still in flight in this process is waited for first."""
    checkpointing.wait_for(path, raising=False)
    return checkpoint_from_bytes(read_file(path, "checkpoint"), path)


def check_values(program, values, allow_missing=False, where="checkpoint"):
    """Raise FormatError unless `values` fit every persistable of `program` (names, dims, dtype)."""
    for name, var in persistable_vars(program).items():
        if name not in values:
            if allow_missing or name == RNG_VAR:
                continue
            raise FormatError(f"the {where} has no value for this persistable variable "
                              f"(expected {dtypes.name_of(var.desc.dtype)}{list(var.shape)})",
                              var=name)
        value = values[name]
        want_dtype, want_dims = dtypes.to_numpy(var.desc.dtype), tuple(var.desc.dims)
        if value.dtype != want_dtype or not dims_compatible(want_dims, value.shape):
            found = f"{dtypes.name_of(value.dtype)}{list(value.shape)}"
            raise FormatError(f"the {where} holds {found}, the program expects "
                              f"{dtypes.name_of(want_dtype)}{list(want_dims)} "
                              "(-1: any size)", var=name)


def set_values(program, values, scope=None):
    """Store the values of `program`'s persistables into `scope` at once (after `check_values`)."""
    scope = scope or global_scope()
    names = [n for n in persistable_vars(program) if n in values]
    with jax.enable_x64(True):        # int64/float64 state stays 64-bit, as the program says
        arrays = {n: jax.device_put(values[n]) for n in names}
    scope.write_many(arrays)
    return names


def load_checkpoint(path, program=None, scope=None, allow_missing=False):
    """Load `path` into `scope` for `program`: all checked first; returns the names loaded.

    Variables in the file that the program does not declare are ignored. A
    missing value, or one whose shape or dtype disagrees with the program,
    raises FormatError naming the variable, expected vs found, and leaves the
    Scope unchanged. A missing RNG state is allowed (the Executor seeds it).
    """
    program = program or default_main_program()
    values = read_checkpoint(path)
    try:
        check_values(program, values, allow_missing)
    except FormatError as e:
        raise _with_path(e, path) from None
    return set_values(program, values, scope)


# --- inference models ---

def _names(targets):
    return [t.name if isinstance(t, Variable) else str(t) for t in targets]


def save_inference_model(dirname, feed_vars, fetch_vars, executor=None, program=None,
                         scope=None, *, main_program=None):
    """Prune `program` to `feed_vars` -> `fetch_vars` in test mode; save it and its parameters.

    Writes `model.pb`, `params.safetensors` and `model.json` as the directory
    `dirname`, whole or not at all (see progdesc.atomic): a failure raises
    SaveError and leaves a model saved there before as it was. Returns the pruned
    program.
    `executor` is accepted for API compatibility; values come from `scope`.
    `main_program` is Paddle's spelling of `program` (progdesc.paddle_names); without
    either, the default main program is saved, and an error about it says so.
    """
    if main_program is not None:
        if program is not None and program is not main_program:
            raise TypeError("save_inference_model: give `program` or Paddle's `main_program`, "
                            "not both")
        program = main_program
    which = "the program"
    if program is None:
        program = default_main_program()
        which = "the default main program (no program= given)"
    feed_names, fetch_names = _names(feed_vars), _names(fetch_vars)
    if not fetch_names:
        raise FormatError("save_inference_model needs at least one fetch variable")
    block = program.global_block()
    for name, error, role in [(n, FeedError, "a feed") for n in feed_names] + \
            [(n, FetchError, "a fetch target") for n in fetch_names]:
        if block.find_var(name) is None:
            raise error(f"is {role} but not a variable of {which}"
                        + did_you_mean(name, block.vars), var=name)
    pruned = prune(program, feed_names, fetch_names)
    program_data = pruned.to_bytes()
    params_data = checkpoint_bytes(pruned, scope)
    manifest = {"format": MODEL_FORMAT, "format_version": MODEL_VERSION,
                "feed": feed_names, "fetch": fetch_names,
                "sha256": {MODEL_PROGRAM: hashlib.sha256(program_data).hexdigest(),
                           MODEL_PARAMS: hashlib.sha256(params_data).hexdigest()}}
    manifest["manifest_sha256"] = json_digest(manifest)
    write_directory(dirname, {MODEL_PROGRAM: program_data, MODEL_PARAMS: params_data,
                              MODEL_MANIFEST: json.dumps(manifest, indent=1) + "\n"})
    return pruned


def _model_path(dirname, name):
    """`dirname`/`name`; FormatError if it resolves (through links) outside `dirname`."""
    path = os.path.join(dirname, name)
    root = os.path.realpath(dirname)
    if os.path.commonpath([root, os.path.realpath(path)]) != root:
        raise FormatError(f"'{path}' links to a file outside the model directory")
    return path


def read_manifest(dirname):
    """The validated `model.json` of an inference model directory."""
    path = _model_path(dirname, MODEL_MANIFEST)
    if not os.path.isfile(path):
        raise FormatError(f"'{os.fspath(dirname)}' is not an inference model directory "
                          f"(no {MODEL_MANIFEST})")
    manifest = parse_json(read_file(path, "model manifest"), f"'{path}'")
    if not isinstance(manifest, dict) or manifest.get("format") != MODEL_FORMAT:
        raise FormatError(f"'{path}' is not a progdesc inference model manifest")
    version = manifest.get("format_version")
    if type(version) is not int or not 1 <= version <= MODEL_VERSION:
        raise FormatError(f"'{path}' has format version {version!r}; "
                          f"this progdesc reads 1 to {MODEL_VERSION}")
    unknown = sorted(set(manifest) - _MANIFEST_KEYS)
    if unknown:
        raise FormatError(f"'{path}' has unknown key {unknown[0]!r} (corrupted?)")
    own = manifest.get("manifest_sha256")      # absent in version 1, written before it existed
    if own is None and version > 1:
        raise FormatError(f"'{path}' is corrupted: it has no manifest_sha256, which format "
                          f"version {version} requires")
    if own is not None and own != json_digest(
            {k: v for k, v in manifest.items() if k != "manifest_sha256"}):
        raise FormatError(f"'{path}' is corrupted (its manifest_sha256 does not match)")
    for key in ("feed", "fetch"):
        names = manifest.get(key)
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise FormatError(f"'{path}': '{key}' must be a list of variable names")
    digests = manifest.get("sha256")
    if not isinstance(digests, dict) or sorted(digests) != sorted([MODEL_PROGRAM, MODEL_PARAMS]):
        raise FormatError(f"'{path}': 'sha256' must map exactly {MODEL_PROGRAM} and "
                          f"{MODEL_PARAMS} to their digests")
    return manifest


def _model_file(dirname, manifest, name):
    path = _model_path(dirname, name)
    data = read_file(path)
    if hashlib.sha256(data).hexdigest() != manifest["sha256"][name]:
        raise FormatError(f"'{path}' does not match the digest in {MODEL_MANIFEST} "
                          "(modified, truncated, or from another save)")
    return data, path


def read_inference_model(dirname):
    """(manifest, program, {name: array}) of a model directory, every file verified."""
    manifest = read_manifest(dirname)
    program = program_from_bytes(*_model_file(dirname, manifest, MODEL_PROGRAM), text=False)
    params_data, params_path = _model_file(dirname, manifest, MODEL_PARAMS)
    values = checkpoint_from_bytes(params_data, params_path)
    block = program.global_block()
    for name in manifest["feed"] + manifest["fetch"]:
        if block.find_var(name) is None:
            raise FormatError(f"the manifest of '{os.fspath(dirname)}' names a variable the "
                              "program does not declare", var=_shown(name))
    try:
        check_values(program, values, where="parameter file")
    except FormatError as e:
        raise _with_path(e, params_path) from None
    return manifest, program, values


def load_inference_model(dirname, executor=None, scope=None):
    """Load a directory saved by `save_inference_model` into `scope` (default: the global one).

    Returns `(program, feed_names, fetch_targets)`; run it with
    ``executor.run(program, feed={...}, fetch_list=fetch_targets, scope=scope)``.
    Everything is validated before anything is written to the Scope.
    """
    manifest, program, values = read_inference_model(dirname)
    set_values(program, values, scope)
    block = program.global_block()
    return program, list(manifest["feed"]), [block.var(n) for n in manifest["fetch"]]
