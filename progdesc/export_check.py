"""What a `.pdx` loader checks before anything of the file runs.

A compiled artifact is a program. Its digests are integrity checks that anyone
can recompute, so a loaded file is checked for what can be checked:

- `check_exported` (in process, pure Python over the deserialized
  `jax.export.Exported`): the calling convention is one this JAX supports, the
  platforms are known and those of the manifest, one device, no effects, no
  disabled safety checks, and the inputs and outputs (count, dtypes, shapes)
  are those of the manifest;
- `check_module` (the StableHLO module): it parses and verifies, its public
  @main takes and returns the manifest's types, it holds only ops of the
  dialects JAX emits, no host communication (infeed, outfeed, send, recv), no
  tensor over `MAX_TENSOR_BYTES`, and no custom call outside
  `allowed_custom_call_targets(platforms)`.

StableHLO's own deserializer is not hardened: some damaged modules crash it
(a segfault while converting VHLO to StableHLO, seen with one flipped byte).
So `check_module` runs in a helper process (`ModuleChecker`, this file run as
a script, importing only JAX): a crash there is a refusal, not the caller's
death. The same bytes are then known to parse in the caller.
"""
import json
import os
import struct
import subprocess
import sys
import threading

import jax
import numpy as np

KNOWN_PLATFORMS = ("cpu", "cuda", "rocm", "tpu")
MAX_TENSOR_BYTES = 1 << 40
_DIALECTS = {"builtin", "func", "stablehlo", "chlo", "sdy"}
_HOST_COMMUNICATION = {"stablehlo.infeed", "stablehlo.outfeed", "stablehlo.send",
                       "stablehlo.recv"}
# Stable targets that carry arbitrary code (kernels, TF graphs): never emitted for a
# progdesc program, so never accepted from a file.
_CODE_CARRYING = {"tpu_custom_call", "mosaic_gpu_v2", "tf.call_tf_function",
                  "__gpu$xla.gpu.triton"}
_TPU_TARGETS = {"Eigh", "Qr", "ProductOfElementaryHouseholderReflectors", "LuDecomposition",
                "ApproxTopK"}
# Used only if this JAX lacks its list (see jax_stable_custom_call_targets).
_FALLBACK_TARGETS = {"Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape",
                     "shape_assertion", "annotate_device_placement", "AllocateBuffer"}


def stable_targets_and_note():
    """(the custom-call targets JAX guarantees stable across versions, a note or "").

    The targets are JAX's own list (`progdesc.jax_compat.stable_custom_call_targets`).
    Where this JAX lacks it, they are the targets of shape polymorphism and sharding,
    and the note (the JaxCompatError's message) says why: a refused custom call quotes it.
    Computed in the loading process: the helper process that checks modules imports
    nothing of progdesc, and gets them with each module.
    """
    from progdesc import jax_compat
    try:
        return jax_compat.stable_custom_call_targets(), ""
    except jax_compat.JaxCompatError as e:
        return frozenset(_FALLBACK_TARGETS), str(e)


def jax_stable_custom_call_targets():
    """The custom-call targets JAX guarantees stable across versions (what its lowerings
    emit), or the fallback of `stable_targets_and_note`."""
    return stable_targets_and_note()[0]


def _platform_of(target):
    if target.startswith("lapack_"):
        return "cpu"
    if target.startswith("hip"):
        return "rocm"
    if target.startswith("cu"):
        return "cuda"
    return "tpu" if target in _TPU_TARGETS else None


def allowed_custom_call_targets(platforms, stable=None):
    """The custom-call targets a loaded module may hold when declared for `platforms`,
    among `stable` (default: `jax_stable_custom_call_targets()`)."""
    stable = jax_stable_custom_call_targets() if stable is None else stable
    return frozenset(t for t in stable - _CODE_CARRYING if _platform_of(t) in (None, *platforms))


def _dims_match(want, dims):
    """Manifest dims (ints, symbol names) against an aval's shape (ints, symbolic dims)."""
    if len(want) != len(dims):
        return False
    return all(w == d if isinstance(w, int) else (not isinstance(d, int) and str(w) == str(d))
               for w, d in zip(want, dims))


def check_exported(exported, header):
    """None, or what is wrong with `exported` (a jax.export.Exported) against the manifest."""
    version = exported.calling_convention_version
    lo = jax.export.minimum_supported_calling_convention_version
    hi = jax.export.maximum_supported_calling_convention_version
    if not lo <= version <= hi:
        return f"calling convention version {version}; this JAX supports {lo} to {hi}"
    platforms = list(exported.platforms)
    unknown = [p for p in platforms if p not in KNOWN_PLATFORMS]
    if not platforms or unknown or len(set(platforms)) != len(platforms):
        return f"platforms {platforms}: expected distinct names among {list(KNOWN_PLATFORMS)}"
    if platforms != list(header["platforms"]):
        return f"module for platforms {platforms}, manifest says {header['platforms']}"
    if exported.nr_devices != 1:
        return f"module for {exported.nr_devices} devices; progdesc artifacts run on one"
    if exported.ordered_effects or exported.unordered_effects:
        return "module has side effects"
    if exported.disabled_safety_checks:
        return f"module disables JAX's safety checks {list(exported.disabled_safety_checks)}"
    if any(s is not None for s in (*exported.in_shardings_hlo, *exported.out_shardings_hlo)):
        return "module has shardings; progdesc artifacts have none"
    specs = [("input", header["feeds"] + header["params"], exported.in_avals),
             ("output", header["fetches"], exported.out_avals)]
    for kind, want, avals in specs:
        if len(want) != len(avals):
            return f"module has {len(avals)} {kind}s, manifest {len(want)}"
        for spec, aval in zip(want, avals):
            if np.dtype(spec["dtype"]) != aval.dtype or not _dims_match(spec["shape"], aval.shape):
                dims = ", ".join(str(d) for d in spec["shape"])
                return (f"{kind} '{spec['name']}' is {aval.str_short()} in the module, "
                        f"{spec['dtype']}[{dims}] in the manifest")
    n_in, n_out = len(exported.in_avals), len(exported.out_avals)
    if (exported.in_tree != jax.tree.structure((tuple(range(n_in)), {}))
            or exported.out_tree != jax.tree.structure(tuple(range(n_out)))):
        return "module's argument or result structure is not a flat list"
    kept = list(exported.module_kept_var_idx)
    if kept != sorted(set(kept)) or any(not 0 <= i < n_in for i in kept):
        return f"module keeps inputs {kept} of {n_in}"
    symbolic = any(not isinstance(d, int) for a in exported.in_avals for d in a.shape)
    if symbolic and not exported.uses_global_constants:
        return "module has symbolic dims but does not say it uses them"
    return None


def _ir_type_name(dtype):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return "i1"
    if dtype.name == "bfloat16":
        return "bf16"
    bits = dtype.itemsize * 8
    if dtype.kind == "c":
        return f"complex<f{bits // 2}>"
    return {"f": "f", "i": "i", "u": "ui"}.get(dtype.kind, "?") + str(bits)


def _ranked(ir_type):
    """`ir_type` as an ir.RankedTensorType, or None if it is not one."""
    from jax.extend.mlir import ir
    try:
        return ir.RankedTensorType(ir_type)
    except ValueError:
        return None


def _type_error(ir_type, aval):
    t = _ranked(ir_type)
    if t is None:
        return f"{ir_type} is not a ranked tensor"
    dims = [None if t.is_dynamic_dim(i) else t.get_dim_size(i) for i in range(t.rank)]
    want = [d if isinstance(d, int) else None for d in aval.shape]
    if str(t.element_type) != _ir_type_name(aval.dtype) or dims != want:
        return f"{ir_type} where the manifest says {aval.str_short()}"
    return None


def _signature_error(main, exported):
    from jax.extend.mlir import ir
    fn_type = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)
    inputs, results = list(fn_type.inputs), list(fn_type.results)
    if len(exported.platforms) > 1:          # the platform index comes first
        if not inputs or str(inputs[0]) not in ("tensor<i32>", "tensor<i64>"):
            return "@main does not take the platform index first"
        inputs = inputs[1:]
    kept = [exported.in_avals[i] for i in exported.module_kept_var_idx]
    for kind, types, avals in (("inputs", inputs, kept), ("results", results,
                                                          exported.out_avals)):
        if len(types) != len(avals):
            return f"@main has {len(types)} {kind}, the manifest {len(avals)}"
        for i, (ir_type, aval) in enumerate(zip(types, avals)):
            problem = _type_error(ir_type, aval)
            if problem:
                return f"@main's {kind[:-1]} {i} is {problem}"
    return None


def _tensor_bytes(ir_type):
    t = _ranked(ir_type)
    if t is None or not t.has_static_shape:
        return 0
    n = 1
    for i in range(t.rank):
        n *= t.get_dim_size(i)
    return n * max(1, getattr(t.element_type, "width", 32) // 8)


def _op_error(op, allowed, note=""):
    name = op.name
    if name.split(".", 1)[0] not in _DIALECTS or name in _HOST_COMMUNICATION:
        return f"op {name} is not one a progdesc artifact may hold"
    if name == "stablehlo.custom_call":
        from jax.extend.mlir import ir
        target = ir.StringAttr(op.attributes["call_target_name"]).value
        if target not in allowed:
            return (f"custom call to '{target}', outside the targets JAX emits for its platforms"
                    + (f" ({note})" if note else ""))
    for value in (*op.results, *(a for r in op.regions for b in r for a in b.arguments)):
        size = _tensor_bytes(value.type)
        if size > MAX_TENSOR_BYTES:
            return f"op {name} makes a tensor {value.type} of {size} bytes"
    return None


def check_module(exported, stable=None, note=""):
    """None, or what is wrong with the StableHLO module of `exported` (run in a helper process).

    `stable`, `note`: those of `stable_targets_and_note` (computed here if None)."""
    if stable is None:
        stable, note = stable_targets_and_note()
    from jax.extend import mlir as jax_mlir
    from jax.extend.mlir import ir
    from jax.interpreters import mlir as jax_interp_mlir
    with jax_interp_mlir.make_ir_context():
        try:
            module = jax_mlir.deserialize_portable_artifact(exported.mlir_module_serialized)
        except Exception as e:  # noqa: BLE001  (the deserializer raises bare runtime errors)
            return f"module does not parse: {type(e).__name__}: {e}"
        try:
            if not module.operation.verify():
                return "module does not verify"
        except ir.MLIRError as e:
            return f"module does not verify: {e}"
        symbols = ir.SymbolTable(module.operation)
        if "main" not in symbols or symbols["main"].operation.name != "func.func":
            return "module has no @main function"
        problem = _signature_error(symbols["main"].operation, exported)
        if problem:
            return problem
        allowed = allowed_custom_call_targets(exported.platforms, stable)
        stack = [module.operation]
        while stack:
            op = stack.pop()
            problem = _op_error(op, allowed, note)
            if problem:
                return problem
            stack.extend(inner.operation for r in op.regions for b in r for inner in b)
    return None


def _serve():
    """Helper process: read length-prefixed requests on stdin (the JSON of the stable
    targets and their note, then the payload), answer a JSON verdict each."""
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while len(size := stdin.read(8)) == 8:
        given = json.loads(stdin.read(struct.unpack("<Q", size)[0]))
        payload = stdin.read(struct.unpack("<Q", stdin.read(8))[0])
        try:
            verdict = check_module(jax.export.deserialize(bytearray(payload)),
                                   frozenset(given["stable"]), given["note"])
        except Exception as e:  # noqa: BLE001  (reported to the loader as a refusal)
            verdict = f"{type(e).__name__}: {e}"
        answer = json.dumps({"problem": verdict}).encode()
        stdout.write(struct.pack("<Q", len(answer)) + answer)
        stdout.flush()


# The helper runs this file by path, as a script, with the caller's working
# directory and this file's directory off sys.path (their modules would shadow).
_HELPER = ("import runpy, sys; del sys.path[0]; "
           "runpy.run_path(sys.argv[1], run_name='__main__')")


class ModuleChecker:
    """Runs `check_module` in a helper process, started on first use and again after a crash."""

    def __init__(self):
        self._proc = None
        self._lock = threading.Lock()

    def check(self, payload):
        """None, or what is wrong with the module in `payload` (jax.export's serialized bytes)."""
        stable, note = stable_targets_and_note()
        given = json.dumps({"stable": sorted(stable), "note": note}).encode()
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                env = {**os.environ, "JAX_PLATFORMS": "cpu"}   # parsing needs no accelerator
                self._proc = subprocess.Popen(
                    [sys.executable, "-c", _HELPER, os.path.abspath(__file__)], env=env,
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            proc = self._proc
            try:
                proc.stdin.write(struct.pack("<Q", len(given)) + given
                                 + struct.pack("<Q", len(payload)) + payload)
                proc.stdin.flush()
                size = proc.stdout.read(8)
                if len(size) == 8:
                    return json.loads(proc.stdout.read(struct.unpack("<Q", size)[0]))["problem"]
            except OSError:
                pass
            rc = proc.wait()
            return (f"module crashed the process checking it (exit status {rc}): StableHLO's "
                    "deserializer does not survive every damaged module")


_CHECKER = ModuleChecker()


def check_module_isolated(payload):
    """`check_module` of the serialized Exported `payload`, run in the helper process."""
    return _CHECKER.check(bytes(payload))


if __name__ == "__main__":
    _serve()
