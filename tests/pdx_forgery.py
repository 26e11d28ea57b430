"""Forged `.pdx` files: a seeded generator of payload and manifest edits with digests recomputed.

`forge(data, seed)` takes a valid artifact (exported for cpu, cuda and tpu) and
returns 60 `(name, bytes)` cases, every one re-signed with
`export.pack_compiled`, so it passes the digest checks and reaches the deep
parsers: bytes flipped in the flatbuffer and in the StableHLO module, truncated
payloads and modules, fields of the `jax.export.Exported` edited (avals swapped
or changed, platforms, calling convention, devices, kept inputs, safety checks),
modules with a custom call to a foreign target, with a signature that
disagrees with the manifest, with a tensor too large for any machine, and
manifests edited against their payload. Shared by tests/test_export_forged.py
and the fuzz targets.
"""
import dataclasses
import re

import jax
import numpy as np
from jax.extend import mlir as jax_mlir
from jax.interpreters import mlir as jax_interp_mlir
from jaxlib.mlir.dialects import stablehlo

from progdesc import export

N_CASES = 60


def _module_text(exported):
    with jax_interp_mlir.make_ir_context():
        return str(jax_mlir.deserialize_portable_artifact(exported.mlir_module_serialized))


def _module_bytes(text):
    return stablehlo.serialize_portable_artifact_str(text, stablehlo.get_minimum_version())


def _replace(exported, **changes):
    return bytes(dataclasses.replace(exported, **changes).serialize())


def _with_module(exported, text):
    return _replace(exported, mlir_module_serialized=_module_bytes(text))


def _inject_in_main(text, line):
    """`text` with `line` as the first op of the public @main."""
    at = text.index("\n", text.index("func.func public @main")) + 1   # its line ends with '{'
    return text[:at] + "    " + line + "\n" + text[at:]


def _flip(blob, rng, k, lo=0, hi=None):
    out = bytearray(blob)
    hi = len(out) if hi is None else hi
    for at in rng.integers(lo, hi, size=k):
        out[at] ^= int(rng.integers(1, 256))
    return bytes(out)


# Bytes of the test model's module, without locations, whose change segfaults
# StableHLO's deserializer (jax 0.10.2): found by flipping each byte in turn.
_CRASHING_FLIPS = ((60, 0x76), (414, 0x76), (557, 0x76))


def _crasher(text, i):
    """The module of `text`, without locations, with the i-th crashing flip."""
    with jax_interp_mlir.make_ir_context():
        module = jax_mlir.deserialize_portable_artifact(_module_bytes(text))
        plain = bytearray(_module_bytes(module.operation.get_asm(enable_debug_info=False)))
    at, bits = _CRASHING_FLIPS[i]
    plain[at % len(plain)] ^= bits
    return bytes(plain)


def _other_function(platforms):
    """A valid Exported of another signature: f32[7] -> f32[7]."""
    fn = jax.jit(lambda v: v * 2.0)
    return jax.export.export(fn, platforms=platforms)(jax.ShapeDtypeStruct((7,), np.float32))


def forge(data, seed=0):
    """60 (name, file bytes) forged from the artifact `data`, deterministic in `seed`."""
    header, payload = export.split_compiled(data)
    header = {k: v for k, v in header.items() if k not in ("payload_sha256", "header_sha256")}
    exp = jax.export.deserialize(bytearray(payload))
    rng = np.random.default_rng(seed)
    text = _module_text(exp)
    mod = exp.mlir_module_serialized
    mod_at = payload.find(mod)
    assert mod_at > 0, "the module's bytes are not found in the flatbuffer"
    ins, outs = exp.in_avals, exp.out_avals
    i32 = np.dtype(np.int32)
    platforms = tuple(exp.platforms)

    payloads = {
        # the Exported's own fields, edited and serialized by jax.export
        "avals swapped": _replace(exp, in_avals=outs, out_avals=ins),
        "in dtype": _replace(exp, in_avals=(ins[0].update(dtype=i32),) + ins[1:]),
        "in shape": _replace(exp, in_avals=(ins[0].update(shape=(ins[0].shape[0], 5)),) + ins[1:]),
        "in count": _replace(exp, in_avals=ins[:1], module_kept_var_idx=(0,),
                             in_tree=jax.tree.structure(((0,), {}))),
        "out extra": _replace(exp, out_avals=outs + outs[:1],
                              out_tree=jax.tree.structure(tuple(range(len(outs) + 1)))),
        "out dtype": _replace(exp, out_avals=(outs[0].update(dtype=i32),) + outs[1:]),
        "out shape": _replace(exp, out_avals=(outs[0].update(shape=(4, 4)),) + outs[1:]),
        "platform unknown": _replace(exp, platforms=("quantum",)),
        "platform dropped": _replace(exp, platforms=platforms[:1]),
        "platform added": _replace(exp, platforms=platforms + ("rocm",)),
        "calling convention 99": _replace(exp, calling_convention_version=99),
        "calling convention 1": _replace(exp, calling_convention_version=1),
        "devices 8": _replace(exp, nr_devices=8),
        "kept inputs short": _replace(exp, module_kept_var_idx=(0,)),
        "kept inputs out of range": _replace(exp, module_kept_var_idx=(0, 7)),
        "safety check disabled": _replace(exp, disabled_safety_checks=(
            jax.export.DisabledSafetyCheck.custom_call("evil_kernel"),)),
        "platform check disabled": _replace(exp, disabled_safety_checks=(
            jax.export.DisabledSafetyCheck.platform(),)),
        "in tree": _replace(exp, in_tree=jax.tree.structure((tuple(range(len(ins))), {"k": 0}))),
        "global constants off": _replace(exp, uses_global_constants=False),
        # the StableHLO module, edited as text and serialized as a portable artifact
        "foreign custom call": _with_module(exp, _inject_in_main(
            text, 'stablehlo.custom_call @evil_kernel() {has_side_effect = true} : () -> ()')),
        "pallas kernel": _with_module(exp, _inject_in_main(
            text, 'stablehlo.custom_call @tpu_custom_call() {has_side_effect = true} : () -> ()')),
        "custom call in a callee": _with_module(exp, re.sub(
            r"(func\.func private @relu\(.*\{\n)",
            r'\1    stablehlo.custom_call @"__gpu$xla.gpu.triton"() : () -> ()\n', text, count=1)),
        "host callback": _with_module(exp, _inject_in_main(
            text, 'stablehlo.custom_call @xla_python_cpu_callback() '
                  '{has_side_effect = true} : () -> ()')),
        "huge tensor": _with_module(exp, _inject_in_main(
            text, "%huge = stablehlo.iota dim = 0 : tensor<1073741824x1073741824xf32>")),
        "overflowing tensor": _with_module(exp, _inject_in_main(
            text, "%huge = stablehlo.iota dim = 0 : "
                  "tensor<4294967296x4294967296x4294967296xf32>")),
        "infeed": _with_module(exp, _inject_in_main(
            text, '%tok = stablehlo.create_token : !stablehlo.token\n'
                  '    %in:2 = "stablehlo.infeed"(%tok) {infeed_config = ""} : '
                  '(!stablehlo.token) -> (tensor<4xf32>, !stablehlo.token)')),
        "main renamed": _with_module(exp, text.replace("@main(", "@other(", 1)),
        "signature of another function": _replace(
            exp, mlir_module_serialized=_other_function(platforms).mlir_module_serialized),
        "module of one platform": _replace(
            exp, mlir_module_serialized=_other_function(platforms[:1]).mlir_module_serialized),
        "module truncated": _replace(exp, mlir_module_serialized=mod[:len(mod) // 2]),
        "module empty": _replace(exp, mlir_module_serialized=b""),
        "module garbage": _replace(exp, mlir_module_serialized=rng.bytes(len(mod))),
        "module as text": _replace(exp, mlir_module_serialized=text.encode()),
        # the flatbuffer, raw
        "payload truncated": payload[:len(payload) // 2],
        "root offset": (0xFFFFFFF0).to_bytes(4, "little") + payload[4:],
    }
    # bytes flipped in the module (the bytecode reader) and in the rest of the
    # flatbuffer (offsets, vtables, lengths, avals)
    for i in range(len(_CRASHING_FLIPS)):
        payloads[f"module crashing the deserializer {i}"] = _replace(
            exp, mlir_module_serialized=_crasher(text, i))
    for i in range(6):
        flipped = _flip(mod, rng, 1 + i % 4)
        payloads[f"module bytes flipped {i}"] = _replace(exp, mlir_module_serialized=flipped)
    for i in range(10):
        lo, hi = (0, mod_at) if i % 2 else (mod_at + len(mod), len(payload))
        payloads[f"flatbuffer bytes flipped {i}"] = _flip(payload, rng, 1 + i % 3, lo, hi)
    files = {name: export.pack_compiled(header, blob) for name, blob in payloads.items()}

    def manifest(**changes):
        return export.pack_compiled({**header, **changes}, payload)
    feeds, fetches = header["feeds"], header["fetches"]
    files.update({
        "manifest swaps feeds and fetches": manifest(feeds=fetches, fetches=feeds),
        "manifest feed dtype": manifest(feeds=[{**feeds[0], "dtype": "int32"}] + feeds[1:]),
        "manifest feed shape": manifest(feeds=[{**feeds[0], "shape": ["batch", 5]}] + feeds[1:]),
        "manifest fetch dtype": manifest(fetches=[{**fetches[0], "dtype": "float16"}] + fetches[1:]),
        "manifest platforms": manifest(platforms=["cpu"]),
        "manifest parameter input": manifest(params_as_inputs=True, params=[
            {"name": "w", "dtype": "float32", "shape": [4], "program_dtype": "float32"}]),
    })
    assert len(files) == N_CASES, len(files)
    return list(files.items())
