"""Mutation fuzzing of progdesc's loaders, shared by tests/test_fuzz.py and `make fuzz`.

Each target holds a valid file (or model directory) made once per process, a
hypothesis strategy of cases (a list of byte mutations, or an attack on a
model directory's layout) and the loader it runs on the mutated input.
`run_case` runs one case in a fresh directory and sorts the outcome:

- ``loaded``: accepted, and what was loaded equals what was saved (a mutation
  that changes nothing the loader reads, such as JSON whitespace);
- ``refused``: a `ProgdescError` was raised, the Scope and every file as before;
- ``error``: any other exception;
- ``changed``: refused, but the Scope or a file changed;
- ``undetected``: accepted, but the loaded values differ from the saved ones.

Programs carry no checksum, so a mutated program that still validates counts
as ``loaded`` if it can be used: printed, cloned, saved and loaded again.
A trial may also `use` what loaded (run a program, call a `.pdx`): a typed
error there is a refusal, anything else a finding. Hangs and crashes are the
runner's business (bench/fuzz.py runs each case in a worker process under a
time limit). The targets that go past the integrity checks, and may crash the
process (`Target.isolated`), are in tests/fuzz_deep.py.
"""
import dataclasses
import functools
import json
import os
import shutil
import tempfile

import numpy as np
from hypothesis import strategies as st

import progdesc as pd
from lowering import progdesc_pb2 as pb
from lowering import registry
from lowering.errors import ProgdescError
from progdesc import export, io, layers
from progdesc.optimizer import Adam

OUTCOMES = ("loaded", "refused", "error", "changed", "undetected")
_SPECIAL_BYTES = list(b'\x00\x01\x7f\x80\xff{}[]":,-.0123456789 \n')


# --- mutations ---

def mutations(size, max_count=4):
    """Strategy: 1 to `max_count` byte mutations of a file of `size` bytes (plain tuples)."""
    at = st.integers(0, size)
    one = st.one_of(
        st.tuples(st.just("flip"), at, st.integers(0, 7)),
        st.tuples(st.just("byte"), at, st.sampled_from(_SPECIAL_BYTES) | st.integers(0, 255)),
        st.tuples(st.just("delete"), at, st.integers(1, 64)),
        st.tuples(st.just("insert"), at, st.binary(min_size=1, max_size=16)),
        st.tuples(st.just("duplicate"), at, st.integers(1, 64)),
        st.tuples(st.just("truncate"), at),
    )
    return st.lists(one, min_size=1, max_size=max_count)


def mutate(data, changes):
    """`data` with each (kind, position, argument) change applied in turn."""
    buf = bytearray(data)
    for kind, pos, *arg in changes:
        at = pos % (len(buf) + 1)
        if kind == "flip" and at < len(buf):
            buf[at] ^= 1 << arg[0]
        elif kind == "byte" and at < len(buf):
            buf[at] = arg[0]
        elif kind == "delete":
            del buf[at:at + arg[0]]
        elif kind == "insert":
            buf[at:at] = arg[0]
        elif kind == "duplicate":
            buf[at:at] = buf[at:at + arg[0]]
        elif kind == "truncate":
            del buf[at:]
    return bytes(buf)


# --- the valid inputs ---

@dataclasses.dataclass
class Seeds:
    """Valid files of one small trained-state model, and the values they hold."""
    program: object            # the training program (batch_norm, dropout, Adam)
    program_bytes: bytes
    program_text: bytes
    checkpoint: bytes
    values: dict               # name -> array held by `checkpoint`
    model_files: dict          # inference-model file name -> bytes
    model_program: bytes       # the pruned program's bytes
    model_values: dict
    model_names: tuple         # (feed names, fetch names)
    compiled: bytes
    compiled_header: dict      # without its header_sha256 (a renamed key loses nothing)
    compiled_payload: bytes
    startup_bytes: bytes       # the startup program of `program`


@functools.cache
def seeds():
    """The valid inputs every target mutates (built once per process)."""
    main, startup = pd.Program(random_seed=1), pd.Program(random_seed=1)
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 4])
        y = pd.data("y", [None, 1])
        h = layers.batch_norm(layers.fc(x, 8, act="tanh"))
        out = layers.fc(layers.dropout(h, 0.25), 1)
        Adam(0.01).minimize(layers.mse_loss(out, y))
    scope = pd.Scope()
    pd.Executor().run(startup, scope=scope)
    checkpoint = io.checkpoint_bytes(main, scope)
    work = tempfile.mkdtemp(prefix="progdesc-fuzz-seeds-")
    try:
        pruned = io.save_inference_model(os.path.join(work, "m"), ["x"], [out], None, main, scope)
        files = {name: open(os.path.join(work, "m", name), "rb").read()
                 for name in (io.MODEL_MANIFEST, io.MODEL_PROGRAM, io.MODEL_PARAMS)}
        header = export.export_compiled(os.path.join(work, "m.pdx"), pruned, ["x"], [out.name],
                                        scope, platforms=("cpu",))
        compiled = open(os.path.join(work, "m.pdx"), "rb").read()
    finally:
        shutil.rmtree(work)
    return Seeds(main, main.to_bytes(), main.to_text().encode(), checkpoint,
                 io.checkpoint_from_bytes(checkpoint), files, pruned.to_bytes(),
                 io.checkpoint_from_bytes(files[io.MODEL_PARAMS]), (["x"], [out.name]),
                 compiled, {k: v for k, v in header.items() if k != "header_sha256"},
                 export.read_compiled(compiled)[1], startup.to_bytes())


def _stale_scope(values):
    """A Scope holding other values under the same names (so a load is visible)."""
    scope = pd.Scope()
    for name, value in values.items():
        scope.set(name, np.zeros_like(value) if value.dtype.kind != "b" else ~value)
    return scope


def _differs(got, want):
    """What differs between two {name: array} maps (names, dtypes, shapes, bytes), or None."""
    if sorted(got) != sorted(want):
        return f"names {sorted(set(got) ^ set(want))}"
    for name, value in want.items():
        other = np.asarray(got[name])
        if other.dtype != value.dtype or other.shape != value.shape or \
                other.tobytes() != value.tobytes():
            return f"value of '{name}'"
    return None


def _scope_values(scope):
    return {n: np.asarray(scope.get(n)) for n in scope.local_var_names() if n in scope}


# --- targets ---

@dataclasses.dataclass
class Trial:
    """One prepared case: `load()` runs the loader; `check(result)` says what loaded wrong.

    `use(result)`, if given, then runs what was loaded (a program on fed inputs,
    a compiled model called): a typed error there is a refusal if it left the
    Scope as the load left it.
    """
    load: object
    check: object
    scope: object = None
    use: object = None


class Target:
    """A loader and the inputs it is fuzzed with (`finite`: few enough cases to try them all;
    `isolated`: a case may end the process, so run it only in a worker process; `share`: its
    part of a run's cases, relative to a byte-mutation target's 1)."""
    name = ""
    finite = False
    isolated = False
    share = 1.0

    def strategy(self):
        """Hypothesis strategy of this target's cases."""
        raise NotImplementedError

    def prepare(self, case, work):
        """Write the case's input under the directory `work`; returns a Trial."""
        raise NotImplementedError

    def run(self, case, work):
        """(outcome, detail) of `case`, run in the empty directory `work`."""
        return _run_trial(self.prepare(case, work), work)


class BytesTarget(Target):
    """A loader of one file or byte string, fed mutated copies of a valid one."""

    def __init__(self, name, original, load, check=lambda result: None, filename=None):
        self.name, self._original, self._load, self._check = name, original, load, check
        self.filename = filename

    def strategy(self):
        return mutations(len(self._original()))

    def prepare(self, case, work):
        data = mutate(self._original(), case)
        if self.filename is None:
            return Trial(lambda: self._load(data, None), self._check)
        path = os.path.join(work, self.filename)
        with open(path, "wb") as f:
            f.write(data)
        return Trial(lambda: self._load(path, None), self._check)


class CheckpointTarget(Target):
    """load_checkpoint into a Scope holding other values."""
    name = "load_checkpoint"

    def strategy(self):
        return mutations(len(seeds().checkpoint))

    def prepare(self, case, work):
        path = os.path.join(work, "ck.safetensors")
        with open(path, "wb") as f:
            f.write(mutate(seeds().checkpoint, case))
        scope = _stale_scope(seeds().values)
        return Trial(lambda: io.load_checkpoint(path, seeds().program, scope),
                     lambda result: _differs(_scope_values(scope), seeds().values), scope)


def _model_check(scope):
    def check(result):
        program, feeds, fetches = result
        if program.to_bytes() != seeds().model_program:
            return "program"
        if (feeds, [v.name for v in fetches]) != tuple(seeds().model_names):
            return "feed or fetch names"
        return _differs(_scope_values(scope), seeds().model_values)
    return check


def _write_model(directory, files):
    os.makedirs(directory)
    for name, data in files.items():
        with open(os.path.join(directory, name), "wb") as f:
            f.write(data)


class ModelTarget(Target):
    """load_inference_model of a directory with one of its files mutated."""
    name = "load_inference_model"

    def strategy(self):
        return st.sampled_from(sorted(seeds().model_files)).flatmap(
            lambda name: st.tuples(st.just(name), mutations(len(seeds().model_files[name]))))

    def prepare(self, case, work):
        name, changes = case
        files = dict(seeds().model_files)
        files[name] = mutate(files[name], changes)
        directory = os.path.join(work, "model")
        _write_model(directory, files)
        scope = _stale_scope(seeds().model_values)
        return Trial(lambda: io.load_inference_model(directory, None, scope),
                     _model_check(scope), scope)


class ModelLayoutTarget(Target):
    """load_inference_model of a directory whose manifest or files point elsewhere.

    Manifests are rewritten with a valid self-digest (as a forger would), or
    without one (as an old manifest). Every case but the legitimate links
    (`dir-link`, `inner-link`) must be refused.
    """
    name = "inference_model_layout"
    finite = True
    ENTRIES = ("../params.safetensors", "/etc/passwd", "sub/../model.pb", "", "extra.bin",
               "./model.pb", "model.pb/..")
    LINKS = ("outside-copy", "dev-zero", "fifo", "directory", "loop", "dangling", "absolute")

    def strategy(self):
        files = st.sampled_from(sorted(seeds().model_files))
        return st.one_of(
            st.tuples(st.just("entry"), st.sampled_from(self.ENTRIES),
                      st.sampled_from(["add", "replace"]), st.booleans()),
            st.tuples(st.just("link"), files, st.sampled_from(self.LINKS)),
            st.tuples(st.just("dir-link")),
            st.tuples(st.just("inner-link"), files))

    def prepare(self, case, work):
        files = dict(seeds().model_files)
        directory = os.path.join(work, "model")
        outside = os.path.join(work, "outside")
        kind = case[0]
        if kind == "entry":
            files[io.MODEL_MANIFEST] = self._manifest_with(case[1:])
        _write_model(directory, files)
        _write_model(outside, files)
        if kind == "link":
            self._link(directory, outside, *case[1:])
        elif kind == "dir-link":
            os.symlink(directory, os.path.join(work, "alias"))
            directory = os.path.join(work, "alias")
        elif kind == "inner-link":
            os.rename(os.path.join(directory, case[1]), os.path.join(directory, "real"))
            os.symlink("real", os.path.join(directory, case[1]))
        scope = _stale_scope(seeds().model_values)
        legitimate = kind in ("dir-link", "inner-link")
        check = _model_check(scope) if legitimate else (lambda result: "an unsafe layout loaded")
        return Trial(lambda: io.load_inference_model(directory, None, scope), check, scope)

    @staticmethod
    def _manifest_with(case):
        entry, how, signed = case
        manifest = json.loads(seeds().model_files[io.MODEL_MANIFEST])
        manifest.pop("manifest_sha256")
        digests = manifest["sha256"]
        if how == "replace":        # the entry takes the place of the params digest
            digests[entry] = digests.pop(io.MODEL_PARAMS)
        else:
            digests[entry] = digests[io.MODEL_PARAMS]
        if signed:
            manifest["manifest_sha256"] = io.json_digest(manifest)
        return json.dumps(manifest).encode()

    @staticmethod
    def _link(directory, outside, name, how):
        path = os.path.join(directory, name)
        os.unlink(path)
        if how == "outside-copy":        # the right bytes, but outside the directory
            os.symlink(os.path.join("..", "outside", name), path)
        elif how == "absolute":
            os.symlink(os.path.join(outside, name), path)
        elif how == "dev-zero":
            os.symlink("/dev/zero", path)
        elif how == "fifo":
            os.mkfifo(path)
        elif how == "directory":
            os.mkdir(path)
        elif how == "loop":
            os.symlink(name, path)
        elif how == "dangling":
            os.symlink("nowhere", path)


def _names(desc):
    return sorted({v.name for b in desc.blocks for v in b.vars})


_ODD_NAMES = ["", "@RNG@", "../x", "a" * 300, "\x00", "x"]
_ATTR_VALUES = st.one_of(
    st.tuples(st.sampled_from(["i", "block_idx"]), st.integers(-2**31, 2**31 - 1)),
    st.tuples(st.just("l"), st.integers(-2**63, 2**63 - 1)),
    st.tuples(st.sampled_from(["f", "d"]), st.floats(allow_nan=True, width=32)),
    st.tuples(st.just("s"), st.text(max_size=8)),
    st.tuples(st.just("b"), st.booleans()),
    st.tuples(st.sampled_from(["ints", "blocks_idx"]),
              st.lists(st.integers(-2**31, 2**31 - 1), max_size=4)),
    st.tuples(st.just("longs"), st.lists(st.integers(-2**63, 2**63 - 1), max_size=4)),
    st.tuples(st.sampled_from(["floats", "doubles"]),
              st.lists(st.floats(allow_nan=True, width=32), max_size=4)),
    st.tuples(st.just("strings"), st.lists(st.text(max_size=4), max_size=4)),
    st.tuples(st.just("bools"), st.lists(st.booleans(), max_size=4)))


def _set_attr(attribute, kind, value):
    attribute.Clear()
    if isinstance(value, list):
        getattr(attribute, kind).values.extend(value)
    else:
        setattr(attribute, kind, value)


class ProgramEditTarget(Target):
    """program_from_bytes of a well-formed ProgramDesc with fields of its ops and variables edited.

    Byte mutations mostly break the protobuf encoding; these keep it valid and
    change what validation has to judge: dims, dtypes, kinds, names, op types,
    slots, attributes, roles and blocks.
    """
    name = "program_desc_edits"

    def strategy(self):
        names = st.sampled_from(_names(pb.ProgramDesc.FromString(seeds().program_bytes))
                                + _ODD_NAMES)
        index = st.integers(0, 1 << 16)
        small = st.integers(-8, 16) | st.integers(-2**40, 2**40)
        edit = st.one_of(
            st.tuples(st.just("var"), index, st.sampled_from(["dtype", "kind"]), small),
            st.tuples(st.just("var"), index, st.just("dims"), st.lists(small, max_size=5)),
            st.tuples(st.just("var"), index, st.just("name"), names),
            st.tuples(st.just("var"), index, st.sampled_from(
                ["persistable", "stop_gradient", "is_parameter", "need_check_feed"])),
            st.tuples(st.sampled_from(["drop_var", "dup_var", "drop_op", "dup_op"]), index),
            st.tuples(st.just("op"), index, st.just("type"),
                      st.sampled_from([o.type for o in registry.all_ops()] + ["", "nosuch"])),
            st.tuples(st.just("op"), index, st.just("role"), small),
            st.tuples(st.just("op"), index, st.sampled_from(["inputs", "outputs"]), index, names),
            st.tuples(st.just("op"), index, st.sampled_from(["in_slot", "out_slot"]), index,
                      st.sampled_from(["X", "Y", "Out", "nosuch", ""])),
            st.tuples(st.just("op"), index, st.just("attr"), index, _ATTR_VALUES),
            st.tuples(st.just("op"), index, st.just("new_attr"),
                      st.sampled_from(["is_test", "axis", "nosuch"]), _ATTR_VALUES),
            st.tuples(st.just("block"), small, small),
            st.tuples(st.just("program"), st.sampled_from(["format_version", "random_seed"]),
                      small))
        return st.lists(edit, min_size=1, max_size=3)

    def prepare(self, case, work):
        desc = pb.ProgramDesc.FromString(seeds().program_bytes)
        for edit in case:
            _edit(desc, *edit)
        data = desc.SerializeToString()
        return Trial(lambda: io.program_from_bytes(data), _usable)


def _edit(desc, what, *args):
    """Apply one edit of ProgramEditTarget's strategy to the ProgramDesc `desc`."""
    block = desc.blocks[0]
    if what == "block":
        desc.blocks.add(idx=max(-2**31, min(args[0], 2**31 - 1)),
                        parent_idx=max(-2**31, min(args[1], 2**31 - 1)))
    elif what == "program":
        bound = 2**31 - 1 if args[0] == "format_version" else 2**63 - 1
        setattr(desc, args[0], max(-bound - 1, min(args[1], bound)))
    elif what in ("drop_var", "dup_var", "var"):
        if not block.vars:
            return
        var = block.vars[args[0] % len(block.vars)]
        if what == "drop_var":
            block.vars.remove(var)
        elif what == "dup_var":
            block.vars.add().CopyFrom(var)
        elif args[1] in ("dtype", "kind"):
            setattr(var, args[1], max(-2**31, min(args[2], 2**31 - 1)))
        elif args[1] == "dims":
            var.dims[:] = args[2]
        elif args[1] == "name":
            var.name = args[2]
        else:
            setattr(var, args[1], not getattr(var, args[1]))
    elif block.ops:
        op = block.ops[args[0] % len(block.ops)]
        if what == "drop_op":
            block.ops.remove(op)
        elif what == "dup_op":
            block.ops.add().CopyFrom(op)
        elif args[1] == "type":
            op.type = args[2]
        elif args[1] == "role":
            op.role = max(-2**31, min(args[2], 2**31 - 1))
        elif args[1] in ("inputs", "outputs"):
            slots = [(slot, k) for slot in getattr(op, args[1]) for k in range(len(slot.arguments))]
            if slots:
                slot, k = slots[args[2] % len(slots)]
                slot.arguments[k] = args[3]
        elif args[1] in ("in_slot", "out_slot"):
            slots = op.inputs if args[1] == "in_slot" else op.outputs
            if slots:
                slots[args[2] % len(slots)].parameter = args[3]
        elif args[1] == "attr" and op.attrs:
            _set_attr(op.attrs[sorted(op.attrs)[args[2] % len(op.attrs)]], *args[3])
        elif args[1] == "new_attr":
            _set_attr(op.attrs[args[2]], *args[3])


def _compiled_check(result):
    header = result.header if isinstance(result, export.CompiledModel) else result[0]
    want = seeds().compiled_header
    if {k: header.get(k) for k in want} != want:
        return "header"
    if not isinstance(result, export.CompiledModel) and result[1] != seeds().compiled_payload:
        return "payload"
    return None


def _usable(program):
    """A loaded program can be printed, cloned for test and saved and loaded again."""
    str(program)
    program.clone(for_test=True)
    if pd.Program.from_bytes(program.to_bytes()).to_bytes() != program.to_bytes():
        return "program's round trip"
    return None


def _usable_text(program):
    """As `_usable`, and its text form reads back as the same program."""
    if pd.Program.from_text(program.to_text()).to_bytes() != program.to_bytes():
        return "program's text round trip"
    return _usable(program)


@functools.lru_cache(maxsize=None)
def _paddle_file(name):
    """A file of the MLP that Paddle saved (tests/fixtures/paddle/mlp/legacy)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "paddle",
                        "mlp", "legacy", name)
    with open(path, "rb") as f:
        return f.read()


class PaddleModelTarget(Target):
    """progdesc.paddle.load_inference_model of Paddle's MLP with one of its two files
    mutated, into a Scope holding other values (which a refusal must leave as they were)."""

    def __init__(self, filename):
        self.filename = filename
        self.name = "paddle_" + filename.replace(".", "_")

    def strategy(self):
        return mutations(len(_paddle_file(self.filename)))

    def prepare(self, case, work):
        from progdesc.paddle import load_inference_model
        for name in ("model.pdmodel", "model.pdiparams"):
            data = _paddle_file(name)
            with open(os.path.join(work, name), "wb") as f:
                f.write(mutate(data, case) if name == self.filename else data)
        scope = _stale_scope(seeds().values)
        return Trial(lambda: load_inference_model(work, None, scope=scope),
                     lambda result: None, scope)


def targets(selftest=False):
    """Every fuzz target, by name (`selftest`: also the harness's own, see fuzz_deep)."""
    import fuzz_deep
    s = seeds
    found = [
        BytesTarget("load_program", lambda: s().program_bytes,
                    lambda path, _: io.load_program(path), _usable, "program.pb"),
        BytesTarget("load_program_text", lambda: s().program_text,
                    lambda path, _: io.load_program(path), _usable_text, "program.pbtxt"),
        BytesTarget("program_from_bytes", lambda: s().program_bytes,
                    lambda data, _: io.program_from_bytes(data), _usable),
        ProgramEditTarget(),
        CheckpointTarget(),
        BytesTarget("checkpoint_from_bytes", lambda: s().checkpoint,
                    lambda data, _: io.checkpoint_from_bytes(data),
                    lambda result: _differs(result, s().values)),
        ModelTarget(),
        ModelLayoutTarget(),
        BytesTarget("load_compiled", lambda: s().compiled,
                    lambda path, _: export.load_compiled(path), _compiled_check, "m.pdx"),
        BytesTarget("read_compiled", lambda: s().compiled,
                    lambda data, _: export.read_compiled(data), _compiled_check),
        PaddleModelTarget("model.pdmodel"),
        PaddleModelTarget("model.pdiparams"),
    ] + fuzz_deep.targets(selftest)
    return {t.name: t for t in found}


# --- one case ---

def _files(root):
    """{relative path: bytes, link target or kind} of everything under `root`."""
    found = {}
    for top, dirs, names in os.walk(root):
        for name in dirs + names:
            path = os.path.join(top, name)
            rel = os.path.relpath(path, root)
            if os.path.islink(path):
                found[rel] = ("link", os.readlink(path))
            elif os.path.isfile(path):
                with open(path, "rb") as f:
                    found[rel] = f.read()
            else:
                found[rel] = ("dir" if os.path.isdir(path) else "other",)
    return found


def run_case(target, case, base=None):
    """(outcome, detail) of one case of `target`; see the module docstring for the outcomes."""
    work = tempfile.mkdtemp(prefix="case-", dir=base)
    try:
        return target.run(case, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _held(scope):
    # Scope values are immutable jax arrays: the same objects after a refusal mean the
    # same values, so the snapshot holds the objects.
    return {} if scope is None else {n: scope.get(n) for n in scope.local_var_names()
                                     if n in scope}


def _refusal(err, trial, work, files, held):
    """The outcome of a typed error `err`: refused, or changed if a file or the Scope moved."""
    if _files(work) != files:
        return "changed", f"a file changed; refused with {type(err).__name__}: {err}"
    if trial.scope is not None and (
            sorted(n for n in trial.scope.local_var_names() if n in trial.scope) != sorted(held)
            or any(trial.scope.get(n) is not v for n, v in held.items())):
        return "changed", f"the Scope changed; refused with {type(err).__name__}: {err}"
    return "refused", f"{type(err).__name__}: {err}"


def _run_trial(trial, work):
    files, held = _files(work), _held(trial.scope)
    try:
        result = trial.load()
    except ProgdescError as e:
        return _refusal(e, trial, work, files, held)
    except Exception as e:  # noqa: BLE001  (the finding this harness exists for)
        return "error", f"{type(e).__name__}: {e}"
    if _files(work) != files:
        return "changed", "a file changed on a successful load"
    try:
        wrong = trial.check(result)
    except Exception as e:  # noqa: BLE001
        return "error", f"after loading: {type(e).__name__}: {e}"
    if wrong:
        return "undetected", f"loaded, but the {wrong} differs"
    if trial.use is None:
        return "loaded", ""
    files, held = _files(work), _held(trial.scope)
    try:
        wrong = trial.use(result)
    except ProgdescError as e:
        return _refusal(e, trial, work, files, held)
    except Exception as e:  # noqa: BLE001
        return "error", f"running what loaded: {type(e).__name__}: {e}"
    return ("undetected", f"loaded and ran, but {wrong}") if wrong else ("loaded", "")
