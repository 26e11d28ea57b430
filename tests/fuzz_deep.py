"""Fuzz targets that go past the integrity checks (issue 22), for tests/fuzz_targets.py.

The byte mutations of fuzz_targets mostly stop at a digest or checksum. These
cases reach what lies behind them, as a forger or an accident would:

- ``program_run``: edited programs (the edits of ``program_desc_edits`` and
  shape/dims/size attributes set to huge, negative or overflowing values),
  startup or training program, loaded and then RUN on small fed inputs;
- ``checkpoint_resigned``: checkpoints whose tensors, entries or metadata were
  edited with the checksums recomputed, or removed (a checksum downgrade);
- ``inference_model_resigned``: model directories whose program or parameters
  were edited with the manifest's digests recomputed, loaded and run;
- ``compiled_resigned``: ``.pdx`` files whose payload or manifest was edited and
  re-signed, loaded and called with inputs of the manifest's types;
- ``large_programs``: many variables, ops or blocks, deeply nested sub-blocks,
  long strings (bounded so that a case stays within the runner's time limit);
- ``interrupted_save``: a save over a good file or model that fails part-way
  (ENOSPC after N bytes) or whose process is killed (SIGKILL after N bytes):
  the old one must still load with its old values, and once the next save ran
  no temporary is left;
- ``threads``: two threads building programs at once, or running one program
  on one Scope at once: the outcome must be as if serial.

A crash (a signal ends the process) is the runner's to see: bench/fuzz.py runs
every case in a worker process. Run in-process (tests/test_fuzz.py), a crash
ends the test process, so tests run these targets through that runner.
"""
import contextlib
import errno
import functools
import hashlib
import json
import os
import signal
import threading
import time
import zlib

import numpy as np
from hypothesis import strategies as st

import fuzz_targets as ft
import progdesc as pd
from lowering import dtypes
from lowering import progdesc_pb2 as pb
from lowering.errors import ProgdescError
from progdesc import export, io, layers
from progdesc.optimizer import Adam

class DeepTarget(ft.Target):
    """A target of this module: its cases may crash the process (run them in a worker), and
    each builds, saves, runs or calls programs, so it gets a tenth of a byte mutation's share
    of a run's cases (a case here takes tens of times as long)."""
    isolated = True
    share = 0.1


# Sizes for shape-like attributes and dims: small ones, and ones no machine can hold (256 GiB
# and up) or whose element count overflows. None of them is large enough to be allocated
# and slow: a huge value alone or times small ones is >= 2**36 elements, or 0, or negative.
_SMALL = [0, 1, 2, 3, -1, -2, -2**31]
_HUGE = [2**36, 2**40, 2**62, 2**63 - 1, -2**63]
_OVERFLOW_PAIRS = [[2**30, 2**30], [2**31, 2**31], [2**32, 2**32, 2**32], [2**62, 4]]
SIZE_LISTS = st.one_of(st.lists(st.sampled_from(_SMALL + _HUGE), min_size=1, max_size=4)
                       .filter(lambda v: any(abs(d) >= 2**36 or d < 0 for d in v)),
                       st.sampled_from(_OVERFLOW_PAIRS))
_SIZE_ATTRS = ("shape", "dims", "size", "num", "repeat_times", "expand_times", "max_iters")
FEED = {"x": np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4),
        "y": np.linspace(0, 1, 2, dtype=np.float32).reshape(2, 1)}


def _scope_of(values):
    """A Scope holding `values` ({name: NumPy array}), 64-bit ones kept 64-bit."""
    import jax
    scope = pd.Scope()
    with jax.enable_x64(True):
        for name, value in values.items():
            scope.set(name, jax.device_put(value))
    return scope


def _readable(scope):
    """Every value of `scope` as NumPy (raises if one was deleted)."""
    return {n: np.asarray(scope.get(n)) for n in scope.local_var_names() if n in scope}


# --- programs edited, then run ---

def _size_edit(desc, block_index, op_index, values, kind, with_dims=False):
    """Set a shape-like attribute (else the first ints attribute, else `shape`) of an op;
    `with_dims`: its first output's dims too (else loading sees they disagree)."""
    block = desc.blocks[block_index % len(desc.blocks)]
    if not block.ops:
        return
    op = block.ops[op_index % len(block.ops)]
    names = [n for n in _SIZE_ATTRS if n in op.attrs] or sorted(op.attrs) or ["shape"]
    attr = op.attrs[names[0]]
    attr.Clear()
    if kind == "one":
        attr.l = max(-2**63, min(values[0], 2**63 - 1))
    elif kind == "longs":
        attr.longs.values.extend(values)
    else:
        values = _as_int32(values)
        attr.ints.values.extend(values)
    if with_dims and op.outputs and op.outputs[0].arguments:
        for var in block.vars:
            if var.name == op.outputs[0].arguments[0]:
                var.dims[:] = [max(-1, d) for d in values]


def _as_int32(values):
    """`values` within int32, still huge: a value past it becomes 2**30, and then there are
    at least two of those (so no list means a 4 GiB tensor that could be allocated)."""
    out = [v if -2**31 <= v < 2**31 else 2**30 if v > 0 else -2**31 for v in values]
    if out.count(2**30) == 1 and not any(abs(v) >= 2**31 for v in out):
        out.append(2**30)
    return out


_MAKERS = ["uniform_random", "gaussian_random", "fill_constant", "variance_scaling_random"]


def _new_op(desc, op_type, values, kind):
    """Append to block 0 an op making a tensor of shape `values` into a new persistable."""
    block = desc.blocks[0]
    like = next(op for op in block.ops if "dtype" in op.attrs and "shape" in op.attrs)
    var = block.vars.add()
    var.CopyFrom(next(v for v in block.vars if v.name == like.outputs[0].arguments[0]))
    var.name = "fuzz.made"
    var.dims[:] = [max(-1, min(d, 2**62)) for d in values]
    op = block.ops.add(type=op_type)
    op.outputs.add(parameter="Out", arguments=[var.name])
    op.attrs["dtype"].CopyFrom(like.attrs["dtype"])
    op.attrs["shape"].ints.values.append(1)
    _size_edit(desc, 0, len(block.ops) - 1, values, kind, with_dims=True)


class ProgramRunTarget(DeepTarget):
    """Edited startup or training programs that load are run: a typed error or a clean run."""
    name = "program_run"

    def strategy(self):
        edits = ft.ProgramEditTarget().strategy()
        kinds = st.sampled_from(["ints", "longs", "one"])
        size = st.tuples(st.just("size"), st.integers(0, 1 << 16), SIZE_LISTS, kinds,
                         st.booleans())
        made = st.tuples(st.just("new_op"), st.sampled_from(_MAKERS), SIZE_LISTS, kinds)
        dims = st.tuples(st.just("var"), st.integers(0, 1 << 16), st.just("dims"), SIZE_LISTS)
        sizes = st.lists(st.one_of(size, made, dims), min_size=1, max_size=2)
        return st.one_of(st.tuples(st.sampled_from(["startup", "main"]), sizes, st.just([])),
                         st.tuples(st.sampled_from(["startup", "main"]), st.just([]), edits),
                         st.tuples(st.sampled_from(["startup", "main"]), sizes, edits))

    def prepare(self, case, work):
        which, sizes, edits = case
        desc = pb.ProgramDesc.FromString(
            ft.seeds().startup_bytes if which == "startup" else ft.seeds().program_bytes)
        for edit in sizes:
            if edit[0] == "size":
                _size_edit(desc, 0, *edit[1:])
            elif edit[0] == "new_op":
                _new_op(desc, *edit[1:])
            else:
                ft._edit(desc, *edit)
        for edit in edits:
            ft._edit(desc, *edit)
        data = desc.SerializeToString()
        scope = _scope_of(ft.seeds().values if which == "main" else {})

        def use(program):
            ft._usable(program)
            pd.Executor().run(program, feed=FEED if which == "main" else None, scope=scope)
            _readable(scope)
        return ft.Trial(lambda: io.program_from_bytes(data), lambda program: None, scope, use)


# --- checkpoints edited with their checksums recomputed ---

def _split_safetensors(data):
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8:8 + n]), data[8 + n:]


def _join_safetensors(header, body):
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    return len(head).to_bytes(8, "little") + head + body


def _crc_entry(entry, body):
    """What the checkpoint format stores for one tensor (written out here, not borrowed)."""
    begin, end = (entry.get("data_offsets") or [0, 0])[:2]
    chunk = body[begin:end] if isinstance(begin, int) and isinstance(end, int) else b""
    return {"dtype": entry.get("dtype"), "shape": [int(d) for d in entry.get("shape", [])
                                                  if isinstance(d, int)],
            "crc32": f"{zlib.crc32(chunk):08x}"}


CHECKPOINT_EDITS = st.one_of(
    st.tuples(st.just("data"), ft.mutations(1 << 12, 2)),
    st.tuples(st.just("dtype"), st.integers(0, 99), st.sampled_from(
        ["F32", "F64", "I64", "I32", "BF16", "F16", "U8", "BOOL", "F8_E4M3", "C64", "x"])),
    st.tuples(st.just("shape"), st.integers(0, 99), SIZE_LISTS | st.lists(
        st.integers(0, 9), max_size=3)),
    st.tuples(st.just("offsets"), st.integers(0, 99), st.integers(-8, 1 << 20),
              st.integers(-8, 1 << 20)),
    st.tuples(st.just("drop"), st.integers(0, 99)),
    st.tuples(st.just("rename"), st.integers(0, 99), st.sampled_from(ft._ODD_NAMES)),
    st.tuples(st.just("version"), st.sampled_from(["0", "1", "2", "3", "", "1.0", "99"])),
    st.tuples(st.just("downgrade")))


def resign_checkpoint(data, edits):
    """`data` with `edits` applied, checksums recomputed (or removed by a downgrade)."""
    header, body = _split_safetensors(data)
    meta = header.pop("__metadata__", {})
    names = sorted(header)
    for edit in edits:
        kind = edit[0]
        if kind == "data":
            body = ft.mutate(body, edit[1])
        elif kind == "version":
            meta["format_version"] = edit[1]
        elif kind == "downgrade":
            meta.pop(io.CHECKSUMS_KEY, None)
        elif names:
            name = names[edit[1] % len(names)]
            if name not in header:
                continue
            if kind == "dtype":
                header[name]["dtype"] = edit[2]
            elif kind == "shape":
                header[name]["shape"] = edit[2]
            elif kind == "offsets":
                header[name]["data_offsets"] = [edit[2], edit[3]]
            elif kind == "drop":
                del header[name]
            elif kind == "rename":
                header[edit[2]] = header.pop(name)
    if io.CHECKSUMS_KEY in meta:
        meta[io.CHECKSUMS_KEY] = json.dumps({n: _crc_entry(e, body) for n, e in header.items()},
                                            separators=(",", ":"))
    return _join_safetensors({"__metadata__": meta, **header}, body)


def _downgraded(edits):
    return any(e[0] == "downgrade" for e in edits)


def _file_holds(data):
    """{name: array} that an independent reader (safetensors itself) finds in `data`."""
    from safetensors.numpy import load
    return load(data)


def _checkpoint_check(data, edits, scope, want):
    """A re-signed file loads what it holds; a downgraded one must not load edited values."""
    def check(result):
        got = ft._scope_values(scope)
        loaded = {n: got[n] for n in result}
        if _downgraded(edits):
            return ft._differs(loaded, {n: want[n] for n in result})
        try:
            holds = _file_holds(data)
        except Exception:  # noqa: BLE001  (loaded what safetensors itself refuses)
            return "file (safetensors refuses it)"
        return ft._differs(loaded, {n: holds[n] for n in result})
    return check


class CheckpointResignedTarget(DeepTarget):
    """load_checkpoint of files edited past their checksums."""
    name = "checkpoint_resigned"

    def strategy(self):
        return st.lists(CHECKPOINT_EDITS, min_size=1, max_size=3)

    def prepare(self, case, work):
        data = resign_checkpoint(ft.seeds().checkpoint, case)
        path = os.path.join(work, "ck.safetensors")
        with open(path, "wb") as f:
            f.write(data)
        scope = ft._stale_scope(ft.seeds().values)
        return ft.Trial(lambda: io.load_checkpoint(path, ft.seeds().program, scope),
                        _checkpoint_check(data, case, scope, ft.seeds().values), scope)


# --- inference models re-signed, loaded and run ---

def resign_model(files):
    """The model files with the manifest's digests recomputed."""
    manifest = json.loads(files[io.MODEL_MANIFEST])
    for name in list(manifest.get("sha256", {})):
        if name in files:
            manifest["sha256"][name] = hashlib.sha256(files[name]).hexdigest()
    manifest.pop("manifest_sha256", None)
    manifest["manifest_sha256"] = io.json_digest(manifest)
    return {**files, io.MODEL_MANIFEST: json.dumps(manifest, indent=1).encode()}


class ModelResignedTarget(DeepTarget):
    """load_inference_model of a re-signed directory, then a run of what loaded."""
    name = "inference_model_resigned"

    def strategy(self):
        return st.one_of(
            st.tuples(st.just("program"), ft.ProgramEditTarget().strategy()),
            st.tuples(st.just("sizes"), st.lists(st.tuples(
                st.integers(0, 1 << 16), SIZE_LISTS, st.sampled_from(["ints", "longs"]),
                st.booleans()),
                min_size=1, max_size=2)),
            st.tuples(st.just("params"), st.lists(CHECKPOINT_EDITS, min_size=1, max_size=3)))

    def prepare(self, case, work):
        files = dict(ft.seeds().model_files)
        if case[0] == "params":
            files[io.MODEL_PARAMS] = resign_checkpoint(files[io.MODEL_PARAMS], case[1])
        else:
            desc = pb.ProgramDesc.FromString(files[io.MODEL_PROGRAM])
            for edit in case[1]:
                if case[0] == "sizes":
                    _size_edit(desc, 0, *edit)
                else:
                    ft._edit(desc, *edit)
            files[io.MODEL_PROGRAM] = desc.SerializeToString()
        files = resign_model(files)
        directory = os.path.join(work, "model")
        ft._write_model(directory, files)
        scope = ft._stale_scope(ft.seeds().model_values)
        if case[0] == "params":
            check = _checkpoint_check(files[io.MODEL_PARAMS], case[1], scope,
                                      ft.seeds().model_values)
            checked = lambda result: check(ft.seeds().model_values.keys() & set(  # noqa: E731
                ft._scope_values(scope)))
        else:
            checked = lambda result: None  # noqa: E731  (an edited program is the forger's)

        def use(result):
            program, feeds, fetches = result
            pd.Executor().run(program, feed={n: FEED[n] for n in feeds if n in FEED},
                              fetch_list=fetches, scope=scope)
            _readable(scope)
        return ft.Trial(lambda: io.load_inference_model(directory, None, scope), checked,
                        scope, use)


# --- .pdx files re-signed, loaded and called ---

pack_compiled = export.pack_compiled

_HEADER_EDITS = st.one_of(
    st.tuples(st.sampled_from(["feeds", "fetches", "params"]), st.integers(0, 9),
              st.sampled_from(["dtype", "shape", "name"]),
              st.sampled_from(["int32", "float16", "bool", "float64", "int8", "x", "batch"])
              | SIZE_LISTS.map(lambda v: ["batch"] + v) | st.lists(st.integers(0, 9), max_size=3)),
    st.tuples(st.just("swap")),
    st.tuples(st.just("platforms"), st.lists(st.sampled_from(["cpu", "cuda", "tpu", "rocm", "x"]),
                                             max_size=3)),
    st.tuples(st.just("params_as_inputs"), st.booleans()),
    st.tuples(st.just("x64"), st.booleans()),
    st.tuples(st.just("add_param"), SIZE_LISTS | st.lists(st.integers(0, 9), max_size=2)))


def _edit_header(header, edit):
    header = json.loads(json.dumps(header))
    kind = edit[0]
    if kind in ("feeds", "fetches", "params"):
        specs = header[kind]
        if specs:
            specs[edit[1] % len(specs)][edit[2]] = edit[3]
    elif kind == "swap":
        header["feeds"], header["fetches"] = header["fetches"], header["feeds"]
    elif kind == "add_param":
        header["params"].append({"name": "w", "dtype": "float32", "shape": edit[1],
                                 "program_dtype": "float32"})
    else:
        header[kind] = edit[1]
    return header


def _bounded(shape):
    """A call shape of at most 64 elements per dim for the manifest's `shape`."""
    return tuple(max(0, min(d, 64)) if isinstance(d, int) else 2 for d in shape)


def _numpy_dtype(name):
    """The NumPy dtype of a manifest's dtype name (bfloat16 included), or None."""
    try:
        return np.dtype(dtypes.to_numpy(name))
    except (ProgdescError, TypeError, ValueError, KeyError):
        return None


def _call_inputs(specs):
    return [np.ones(_bounded(spec["shape"]), _numpy_dtype(spec["dtype"]) or np.float32)
            for spec in specs]


class CompiledResignedTarget(DeepTarget):
    """load_compiled of a re-signed .pdx, then a call with inputs of the manifest's types."""
    name = "compiled_resigned"

    def strategy(self):
        size = len(ft.seeds().compiled_payload)
        return st.one_of(st.tuples(st.just("payload"), ft.mutations(size)),
                         st.tuples(st.just("header"), st.lists(_HEADER_EDITS, min_size=1,
                                                               max_size=2)),
                         st.tuples(st.just("both"), ft.mutations(size, 2), _HEADER_EDITS))

    def prepare(self, case, work):
        header, payload = dict(ft.seeds().compiled_header), ft.seeds().compiled_payload
        if case[0] in ("payload", "both"):
            payload = ft.mutate(payload, case[1])
        if case[0] == "header":
            for edit in case[1]:
                header = _edit_header(header, edit)
        elif case[0] == "both":
            header = _edit_header(header, case[2])
        path = os.path.join(work, "m.pdx")
        with open(path, "wb") as f:
            f.write(pack_compiled(header, payload))

        def use(model):
            specs = model.header["feeds"] + (model.header["params"]
                                             if model.header.get("params_as_inputs") else [])
            arrays = _call_inputs(specs)
            n = len(model.header["feeds"])
            out = model(*arrays[:n], params={s["name"]: a for s, a in zip(specs[n:], arrays[n:])})
            fetches = model.header["fetches"]
            if len(out) != len(fetches) or any(
                    np.dtype(o.dtype) != _numpy_dtype(s["dtype"]) for o, s in zip(out, fetches)):
                return "its results disagree with the manifest's fetches"
            return None
        return ft.Trial(lambda: export.load_compiled(path), lambda model: None, None, use)


# --- large counts, deep nesting, long strings ---

LARGE = {"vars": [10, 1000, 20000], "ops": [10, 1000, 10000], "blocks": [10, 1000, 10000],
         "chain": [10, 300, 1000], "nested": [2, 16, 64], "long_name": [1000, 1 << 20],
         "long_attr": [1000, 1 << 20], "long_callsite": [1000, 1 << 20],
         "long_list": [1000, 1 << 17]}


@functools.cache
def _nested_program(depth):
    """Bytes of a program of `depth` conds, each inside the previous one's true branch."""
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 4])
        zero = pd.ops.fill_constant(shape=[1], dtype="float32", value=0.0)
        pred = pd.ops.greater_than(pd.ops.reduce_sum(x), zero)

        def nest(v, d):
            if d == 0:
                return pd.ops.scale(v, scale=2.0)
            return pd.control_flow.cond(
                pred, lambda: nest(pd.ops.scale(v, scale=1.0), d - 1), lambda: v)
        nest(x, depth)
    return main.to_bytes()


def _first_attr(block, kind):
    return next((op, name) for op in block.ops for name in sorted(op.attrs)
                if op.attrs[name].WhichOneof("value") == kind)


def _large(kind, n):
    if kind == "nested":
        return _nested_program(n)
    desc = pb.ProgramDesc.FromString(ft.seeds().program_bytes)
    block = desc.blocks[0]
    x = next(v for v in block.vars if v.name == "x")
    if kind == "vars":
        for i in range(n):
            var = block.vars.add()
            var.CopyFrom(x)
            var.name = f"v{i}"
    elif kind == "ops":
        src = "x"
        for i in range(n):
            var = block.vars.add()
            var.CopyFrom(x)
            var.name = f"v{i}"
            op = block.ops.add(type="scale")
            op.inputs.add(parameter="X", arguments=[src])
            op.outputs.add(parameter="Out", arguments=[var.name])
            src = var.name
    elif kind in ("blocks", "chain"):
        for i in range(n):
            desc.blocks.add(idx=len(desc.blocks), parent_idx=len(desc.blocks) - 1
                            if kind == "chain" else 0)
    elif kind == "long_name":
        long = "x" * n
        x.name = long
        for op in block.ops:
            for slot in list(op.inputs) + list(op.outputs):
                slot.arguments[:] = [long if a == "x" else a for a in slot.arguments]
    elif kind == "long_attr":           # the first string attribute (dropout's implementation)
        op, name = _first_attr(block, "s")
        op.attrs[name].s = "\x1b[31m" + "s" * n
    elif kind == "long_callsite":
        block.ops[0].callsite = "File \"a.py\", line 1\n\x1b[2J" + "c" * n
    elif kind == "long_list":           # the first ints attribute (a reduction's axes)
        op, name = _first_attr(block, "ints")
        op.attrs[name].ints.values.extend(range(n))
    return desc.SerializeToString()


class LargeProgramTarget(DeepTarget):
    """program_from_bytes of programs with many parts, deep nesting or long strings; then run."""
    name = "large_programs"

    def strategy(self):
        return st.sampled_from(sorted(LARGE)).flatmap(
            lambda kind: st.tuples(st.just(kind), st.sampled_from(LARGE[kind])))

    def prepare(self, case, work):
        data = _large(*case)
        scope = _scope_of(ft.seeds().values)
        renamed = {"x": "x" * case[1]} if case[0] == "long_name" else {}

        def use(program):
            ft._usable(program)
            block = program.global_block()
            fed = {renamed.get(n, n): v for n, v in FEED.items()
                   if block.find_var(renamed.get(n, n)) is not None}
            last = block.desc.ops[-1] if block.desc.ops else None
            fetch = [last.outputs[0].arguments[0]] if last and last.outputs else []
            if case[0] != "ops" or case[1] <= 1000:     # compiling 10k ops takes too long
                pd.Executor().run(program, feed=fed, fetch_list=fetch, scope=scope)
                _readable(scope)
        return ft.Trial(lambda: io.program_from_bytes(data), lambda program: None, scope, use)


# --- saves interrupted part-way ---

class _Failing:
    """A file object whose writes stop after `budget[0]` bytes in all: ENOSPC or SIGKILL."""

    def __init__(self, f, budget, kill):
        self._f, self._budget, self._kill = f, budget, kill

    def write(self, data):
        data = bytes(data)
        if len(data) > self._budget[0]:
            self._f.write(data[:self._budget[0]])
            self._budget[0] = 0
            if self._kill:
                self._f.flush()
                os.kill(os.getpid(), signal.SIGKILL)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._budget[0] -= len(data)
        return self._f.write(data)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self._f.__exit__(*exc)

    def __getattr__(self, name):
        return getattr(self._f, name)


@contextlib.contextmanager
def failing_writes(after, kill=False):
    """Every file opened for writing by `os.fdopen` or `open` fails after `after` bytes in all."""
    import builtins
    budget = [after]
    real_fdopen, real_open = os.fdopen, builtins.open

    def fdopen(fd, mode="r", *args, **kwargs):
        f = real_fdopen(fd, mode, *args, **kwargs)
        return _Failing(f, budget, kill) if "w" in mode or "a" in mode else f

    def open_(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        return _Failing(f, budget, kill) if "w" in mode or "a" in mode else f
    os.fdopen, builtins.open = fdopen, open_
    try:
        yield
    finally:
        os.fdopen, builtins.open = real_fdopen, real_open


def _version(k):
    """The model's values, + k where they are floating point."""
    return {n: v + np.asarray(k, v.dtype) if v.dtype.kind == "f" else v
            for n, v in ft.seeds().values.items()}


def _save(what, path, k):
    if what == "checkpoint":
        io.save_checkpoint(path, ft.seeds().program, _version(k))
    else:
        io.save_inference_model(path, *ft.seeds().model_names, None, ft.seeds().program,
                                _version(k))


def _load(what, path):
    scope = pd.Scope()
    if what == "checkpoint":
        io.load_checkpoint(path, ft.seeds().program, scope)
    else:
        io.load_inference_model(path, None, scope)
    return ft._scope_values(scope)


def _killed_save(what, path, after):
    """Save version 1 in a forked child killed by SIGKILL after `after` bytes."""
    pid = os.fork()
    if pid == 0:                                    # pragma: no cover  (the child)
        try:
            with failing_writes(after, kill=True):
                _save(what, path, 1)
        finally:
            os._exit(0)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            return
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


class InterruptedSaveTarget(DeepTarget):
    """A save over a good checkpoint or model fails or is killed part-way; then another save."""
    name = "interrupted_save"

    def strategy(self):
        return st.tuples(st.sampled_from(["checkpoint", "model"]),
                         st.sampled_from(["enospc", "kill"]),
                         st.integers(0, 1 << 13) | st.integers(0, 1 << 16))

    def run(self, case, work):
        what, how, after = case
        path = os.path.join(work, "ck.safetensors" if what == "checkpoint" else "model")
        _save(what, path, 0)
        want = {n: v for n, v in _load(what, path).items()}
        listing = sorted(os.listdir(work)), (sorted(os.listdir(path)) if what == "model" else [])
        outcome, detail = "loaded", ""
        if how == "kill":
            if not hasattr(os, "fork"):
                return "loaded", "no fork here"
            _killed_save(what, path, after)
            outcome, detail = "refused", "killed"
        else:
            try:
                with failing_writes(after):
                    _save(what, path, 1)
            except ProgdescError as e:
                outcome, detail = "refused", f"{type(e).__name__}: {e}"
            except Exception as e:  # noqa: BLE001
                outcome, detail = "error", f"the failed save raised {type(e).__name__}: {e}"
        try:
            got = _load(what, path)
        except ProgdescError as e:
            return "changed", f"after a {how} save the old {what} no longer loads: {e}"
        if outcome == "loaded":                      # the save completed: the new values
            want = {n: v for n, v in _version(1).items() if n in want}
        wrong = ft._differs(got, want)
        if wrong and ft._differs(got, {n: v for n, v in _version(1).items() if n in want}):
            return "changed", f"after a {how} save the {what} loads neither version ({wrong})"
        try:
            _save(what, path, 2)
        except Exception as e:  # noqa: BLE001
            return "error", f"the next save failed: {type(e).__name__}: {e}"
        after_listing = (sorted(os.listdir(work)),
                         sorted(os.listdir(path)) if what == "model" else [])
        if after_listing != listing:
            return "changed", (f"after a {how} save and the next one, the files are "
                               f"{after_listing}, were {listing}")
        wrong = ft._differs(_load(what, path), {n: v for n, v in _version(2).items() if n in want})
        if wrong:
            return "changed", f"the save after a {how} save did not take ({wrong})"
        return outcome, detail


# --- two threads ---

@functools.cache
def _small_net():
    main, startup = pd.Program(random_seed=3), pd.Program(random_seed=3)
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 4])
        y = pd.data("y", [None, 1])
        out = layers.fc(layers.dropout(layers.fc(x, 8, act="tanh"), 0.25), 1)
        Adam(0.01).minimize(layers.mse_loss(out, y))
    scope = pd.Scope()
    executor = pd.Executor()
    executor.run(startup, scope=scope)
    return main, {n: np.asarray(scope.get(n)) for n in scope.local_var_names()}, executor


def _build(width, depth):
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        h = pd.data("x", [None, 4])
        for _ in range(depth):
            h = layers.fc(h, width, act="relu")
            time.sleep(0)
    return main, startup


def _shape_of(program):
    """What two builds of one net share (names aside): op types and output dims."""
    block = program.desc.blocks[0]
    return [op.type for op in block.ops], sorted(tuple(v.dims) for v in block.vars)


def _in_threads(fns):
    errors, results = [None] * len(fns), [None] * len(fns)
    barrier = threading.Barrier(len(fns))

    def run(i):
        try:
            barrier.wait()
            results[i] = fns[i]()
        except BaseException as e:  # noqa: BLE001  (reported by the caller)
            errors[i] = e
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, errors


class ThreadsTarget(DeepTarget):
    """Two threads: building programs, or training one program on one Scope."""
    name = "threads"

    def strategy(self):
        return st.one_of(st.tuples(st.just("build"), st.integers(1, 6)),
                         st.tuples(st.sampled_from(["run", "held"]), st.integers(1, 8)))

    def run(self, case, work):
        kind, n = case
        if kind == "build":
            return self._build(n)
        main, values, executor = _small_net()
        serial = _scope_of(values)
        for _ in range(2 * n):
            executor.run(main, feed=FEED, scope=serial)
        scope = _scope_of(values)
        held = {k: scope.get(k) for k in scope.local_var_names()}

        def steps():
            for _ in range(n):
                executor.run(main, feed=FEED, scope=scope)
        _, errors = _in_threads([steps, steps])
        error = next((e for e in errors if e is not None), None)
        if error is not None:
            return "error", f"a thread raised {type(error).__name__}: {error}"
        if kind == "held":
            try:
                wrong = ft._differs({k: np.asarray(v) for k, v in held.items()}, values)
            except Exception as e:  # noqa: BLE001
                return "changed", f"a value taken from the Scope before the runs: {e}"
            if wrong:
                return "changed", f"a value taken from the Scope before the runs changed: {wrong}"
        wrong = ft._differs(_readable(scope), _readable(serial))
        if wrong:
            return "changed", f"two threads' {2 * n} steps differ from serial ones: {wrong}"
        return "loaded", ""

    @staticmethod
    def _build(depth):
        before = pd.default_main_program().to_bytes()
        want = [_shape_of(_build(w, depth)[0]) for w in (3, 5)]
        results, errors = _in_threads([lambda: _build(3, depth), lambda: _build(5, depth)])
        error = next((e for e in errors if e is not None), None)
        if error is not None:
            kind = "refused" if isinstance(error, ProgdescError) else "error"
            return ("changed" if kind == "refused" else kind), \
                f"building in two threads: {type(error).__name__}: {error}"
        got = [_shape_of(main) for main, _ in results]
        if got != want:
            return "changed", "programs built in two threads differ from ones built serially"
        if pd.default_main_program().to_bytes() != before:
            return "changed", "building in two threads changed the default program"
        return "loaded", ""


# --- cases known to have failed (issue 22), run as they are by tests/test_fuzz.py ---

KNOWN = {
    # XLA aborts the process: "overflow in static extent product"
    "huge random shape": ("program_run", ("startup", [("new_op", "uniform_random",
                                                       [2**30, 2**30], "ints")], [])),
    "huge gaussian shape": ("program_run", ("startup", [("new_op", "gaussian_random",
                                                         [2**30, 2**30], "ints")], [])),
    # an untyped out-of-memory error from XLA, or no end
    "huge fill_constant": ("program_run", (
        "startup", [("size", 1, [2**30, 2**30], "ints", True)], [])),
    # a current checkpoint without its checksums loads unchecked
    "checksum downgrade": ("checkpoint_resigned", [("downgrade",), ("data", [("flip", 3, 6)])]),
    "checksum downgrade of a model": ("inference_model_resigned", (
        "params", [("downgrade",), ("data", [("flip", 11, 2)])])),
}


# --- the harness's own cases ---

class SelftestTarget(DeepTarget):
    """Cases that end as each outcome the runner must see: ok, typed, untyped, abort, hang."""
    name = "selftest"
    finite = True

    def strategy(self):
        return st.sampled_from(["ok", "typed", "untyped", "abort", "segv", "hang"])

    def run(self, case, work):
        if case == "ok":
            return "loaded", ""
        if case == "typed":
            return "refused", "typed"
        if case == "untyped":
            return "error", "untyped"
        if case == "abort":
            os.abort()
        if case == "segv":
            os.kill(os.getpid(), signal.SIGSEGV)
        time.sleep(3600)
        return "loaded", ""


def targets(selftest=False):
    """The targets of this module (`selftest`: with the harness's own)."""
    found = [ProgramRunTarget(), CheckpointResignedTarget(), ModelResignedTarget(),
             CompiledResignedTarget(), LargeProgramTarget(), InterruptedSaveTarget(),
             ThreadsTarget()]
    return found + ([SelftestTarget()] if selftest else [])
