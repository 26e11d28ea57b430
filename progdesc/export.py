"""Compiled artifacts: a program (feed -> fetch) as one file of serialized StableHLO.

`export_compiled` prunes the program, lowers it through `jax.export` for
several platforms at once, with every unknown (-1) dim a symbolic dim, so one
file serves every batch size on CPU, GPU and TPU. The file is:

    8 bytes   magic b"PDEXPORT"
    4 bytes   format version, uint32 little-endian (1)
    4 bytes   header length N, uint32 little-endian
    N bytes   header, UTF-8 JSON
    rest      jax.export's Exported.serialize() bytes

The header promises: "feeds", "fetches" (in call and result order) and
"params" (only when "params_as_inputs"), each a list of {"name", "dtype",
"shape", "program_dtype"}, where "dtype" is the dtype at the artifact
boundary and "shape" holds ints and symbol names ("batch" for leading -1
dims, or the name `batch_polymorphic` gives a feed's); "platforms"; "x64";
"precision" (the program's precision policy, traced into every dot and
convolution of the payload); "payload_sha256" of the
serialized bytes; "header_sha256", SHA-256 of the header without this key as
canonical JSON (sorted keys, no spaces, ASCII; `progdesc.io.json_digest`).
Readers of version 1 ignore keys they do not know, so files with and without
"header_sha256" or "precision" are all version 1, and all load.

Programs are traced with 64-bit types on, but a process calling the artifact
usually has x64 off. Unless `keep_64bit=True`, every int64/float64 value
crossing the boundary is 32-bit in the artifact ("x64": false) and cast
inside, so `exported.call` works with plain JAX defaults.
"""
import hashlib
import json
import struct

import jax
import jax.numpy as jnp
import numpy as np

from lowering import dtypes
from lowering.errors import (CompiledCallError, FeedError, FormatError, ProgdescError,
                             ProgramError, ScopeError)
from lowering.lower import RNG_VAR, lower_block
from progdesc import compile_cache, export_check
from progdesc.feeding import names_of, raw_key_data, with_feed_fetch
from progdesc.prune import prune
from progdesc.scope import global_scope

MAGIC = b"PDEXPORT"
FORMAT_VERSION = 1
_PREFIX = struct.Struct("<8sII")
_MAX_HEADER = 16 << 20
_NARROW = {"int64": "int32", "float64": "float32"}


def _boundary(dtype, keep_64bit):
    return dtype if keep_64bit else _NARROW.get(dtype, dtype)


def _spec(name, dtype, shape, keep_64bit):
    return {"name": name, "dtype": _boundary(dtype, keep_64bit), "shape": list(shape),
            "program_dtype": dtype}


def _feed_shape(var, index, batch_polymorphic, batch_size):
    """Dims of a feed with each -1 replaced by a symbol name (or `batch_size`)."""
    named = _choice_for(var.name, batch_polymorphic)
    if isinstance(named, (tuple, list)):
        return _named_dims(var, named)
    dims = []
    for i, d in enumerate(var.desc.dims):
        leading = _leading_symbol(var.name, batch_polymorphic) if i == 0 else None
        if d >= 0:
            dims.append(int(d))
        elif leading:
            dims.append(leading)
        elif (batch_polymorphic or isinstance(batch_polymorphic, dict)) and i > 0:
            dims.append(f"d{index}_{i}")
        elif i == 0 and batch_size is not None:
            dims.append(int(batch_size))
        else:
            raise FeedError(f"dim {i} is unknown (-1): export with batch_polymorphic=True or "
                            "give batch_size", var=var.name)
    return dims


def _named_dims(var, names):
    """Dims of a feed whose every dim `batch_polymorphic` names: a symbol for each unknown
    dim (feeds sharing a name share the dim), None for each known one."""
    dims = list(var.desc.dims)
    if len(names) != len(dims):
        raise FeedError(f"batch_polymorphic names {len(names)} dims of a feed of rank "
                        f"{len(dims)} ({list(names)} for {dims})", var=var.name)
    out = []
    for i, (d, name) in enumerate(zip(dims, names)):
        if d >= 0 and name is None:
            out.append(int(d))
        elif d < 0 and name is not None:
            out.append(name)
        else:
            raise FeedError(f"batch_polymorphic gives dim {i} of {list(names)} for dims {dims}:"
                            " name each unknown (-1) dim and give None for each known one",
                            var=var.name)
    return out


def _choice_for(name, choice):
    """What a dict `batch_polymorphic` says of feed `name` (the longest key that is the
    feed's name or a prefix `key.` of it; True when none is)."""
    if not isinstance(choice, dict):
        return choice
    keys = [k for k in choice if name == k or name.startswith(f"{k}.")]
    return choice[max(keys, key=len)] if keys else True


def _leading_symbol(name, choice):
    """The symbol of feed `name`'s unknown leading dim under `batch_polymorphic`: 'batch',
    the dim name a dict gives it (True: 'batch'), or None (fixed)."""
    dim = _choice_for(name, choice)
    if isinstance(dim, (tuple, list)):
        return dim[0] if dim else None
    return "batch" if dim is True else dim or None


def _check_dims_choice(choice, feed_names):
    """FeedError unless a dict `batch_polymorphic` maps feeds (or argument prefixes) to
    True, False, a dim name, or a tuple of a dim name or None per dim."""
    if not isinstance(choice, dict):
        return
    for key, dim in choice.items():
        if not any(n == key or n.startswith(f"{key}.") for n in feed_names):
            raise FeedError(f"batch_polymorphic names '{key}', which is no feed (the feeds: "
                            f"{feed_names})", var=key)
        if isinstance(dim, (tuple, list)) and all(
                d is None or isinstance(d, str) and d.isidentifier() for d in dim):
            continue
        if not (isinstance(dim, bool) or isinstance(dim, str) and dim.isidentifier()):
            raise FeedError(f"batch_polymorphic['{key}'] must be True, False, a dim name "
                            "(a Python identifier) or a tuple naming each dim (None for a "
                            f"known one), got {dim!r}", var=key)


def _symbolic(shapes, constraints=()):
    """ShapeDtypeStruct-ready shapes, all symbols in one jax.export scope (under
    `constraints`, such as 'seq <= 1024')."""
    try:
        scope = jax.export.SymbolicScope(list(constraints))
    except (ValueError, TypeError) as e:
        raise FeedError(f"dim_constraints {list(constraints)}: {e}") from None
    out = []
    for dims in shapes:
        if all(isinstance(d, int) for d in dims):
            out.append(tuple(dims))
        else:
            spec = "(" + ", ".join(str(d) for d in dims) + ("," if len(dims) == 1 else "") + ")"
            out.append(jax.export.symbolic_shape(spec, scope=scope))
    return out


def _state(program, names, scope):
    values = {}
    for name in names:
        if name in scope:
            values[name] = scope.get(name)
        elif name == RNG_VAR:
            values[name] = jax.random.PRNGKey(program.random_seed)
        else:
            raise ScopeError("has no value in the scope: run the startup program or load the "
                             "model first", var=name)
    return values


def export_compiled(path, program, feed_vars, fetch_vars, scope=None, *,
                    platforms=("cpu", "cuda", "tpu"), embed_params=True, batch_polymorphic=True,
                    batch_size=None, keep_64bit=False, dim_constraints=()):
    """Write `program` (pruned to `feed_vars` -> `fetch_vars`, test mode) as one compiled file.

    Parameters come from `scope` and are embedded as constants, or with
    `embed_params=False` become inputs after the feeds (listed in the
    header). Returns the header dict. See the module docstring for the file.

    With `batch_polymorphic` (the default) every feed's unknown leading dim is the one
    symbolic dim 'batch'; a dict chooses per feed as `from_jax` does (a feed's name, or
    an argument's for all its leaves: True the batch dim, a name a dim of its own shared
    by the feeds given it, False the fixed `batch_size`): a graph's
    `{"graphs.nodes": "nodes", "graphs.edges": "edges", "graphs.senders": "edges"}`.
    A tuple names every dim of a feed (None for a known one), so that unknown inner dims
    are shared: `{"ids": ("batch", "seq"), "mask": ("batch", "seq")}`; other unknown inner
    dims get a symbol of their own.

    `dim_constraints` bound the symbolic dims, in jax.export's syntax ('seq <= 1024'), for
    programs valid only within them (an imported model slicing a causal-mask buffer of
    1024 positions to the sequence's length); the artifact refuses inputs outside them.
    """
    from progdesc.io import atomic_write
    scope = scope or global_scope()
    feed_names = list(names_of(feed_vars, "feed_vars"))
    fetch_names = list(names_of(fetch_vars, "fetch_vars"))
    _check_dims_choice(batch_polymorphic, feed_names)
    pruned = prune(program, feed_names, fetch_names)
    block = pruned.global_block()
    for name in feed_names:
        if block.find_var(name) is None:
            raise FeedError("is a feed but not a variable of the program", var=name)
    lowered = lower_block(with_feed_fetch(pruned, tuple(feed_names), tuple(fetch_names)), 0)
    state = _state(pruned, lowered.reads, scope)
    param_names = [] if embed_params else [n for n in lowered.reads if n != RNG_VAR]
    feed_vars_ = [block.var(n) for n in feed_names]
    feeds = [_spec(v.name, v.dtype, _feed_shape(v, i, batch_polymorphic, batch_size), keep_64bit)
             for i, v in enumerate(feed_vars_)]
    params = [_spec(n, dtypes.name_of(state[n].dtype), state[n].shape, keep_64bit)
              for n in param_names]
    inputs = feeds + params

    def fn(*args):
        args = [jnp.asarray(a).astype(s["program_dtype"]) for a, s in zip(args, inputs)]
        values = {**state, **dict(zip(param_names, args[len(feeds):]))}
        fetched, _ = lowered.fn(tuple(args[:len(feeds)]), {}, values)
        return tuple(f.astype(_boundary(dtypes.name_of(f.dtype), keep_64bit)) for f in fetched)

    shapes = _symbolic([s["shape"] for s in inputs], dim_constraints)
    avals = [jax.ShapeDtypeStruct(shape, dtypes.to_numpy(s["dtype"]))
             for shape, s in zip(shapes, inputs)]
    try:
        with jax.enable_x64(True):
            exported = jax.export.export(jax.jit(fn), platforms=tuple(platforms))(*avals)
    except ProgdescError:
        raise
    except Exception as e:  # noqa: BLE001  (shape polymorphism or platform lowering failures)
        raise ProgramError(f"jax.export failed for platforms {list(platforms)}: "
                           f"{type(e).__name__}: {e}") from e
    payload = bytes(exported.serialize())
    fetches = [{"name": n, "dtype": dtypes.name_of(a.dtype),
                "shape": [d if isinstance(d, int) else str(d) for d in a.shape],
                "program_dtype": dtypes.name_of(block.var(n).desc.dtype)}
               for n, a in zip(fetch_names, exported.out_avals)]
    header = {"format": "progdesc.compiled", "format_version": FORMAT_VERSION,
              "feeds": feeds, "fetches": fetches, "params": params,
              "params_as_inputs": not embed_params, "platforms": list(exported.platforms),
              "x64": bool(keep_64bit), "precision": pruned.precision,
              "jax_version": jax.__version__}
    data = pack_compiled(header, payload)
    atomic_write(path, data)
    return split_compiled(data)[0]


def pack_compiled(header, payload):
    """The bytes of a compiled artifact of `header` (a dict) and `payload`, digests recomputed.

    "payload_sha256" and "header_sha256" are (re)computed, so
    ``pack_compiled(*split_compiled(data))`` re-signs a file whose payload or
    header was edited: the digests are integrity checks, not signatures.
    """
    from progdesc.io import json_digest
    header = {k: v for k, v in header.items() if k != "header_sha256"}
    header["payload_sha256"] = hashlib.sha256(payload).hexdigest()
    header["header_sha256"] = json_digest(header)
    head = json.dumps(header).encode("utf-8")
    return _PREFIX.pack(MAGIC, FORMAT_VERSION, len(head)) + head + bytes(payload)


def split_compiled(data, path="<bytes>"):
    """(header dict, payload bytes) of `data` by the file layout alone, digests unchecked.

    FormatError if the magic, the version, the header's length or its JSON is
    wrong. `read_compiled` checks the rest.
    """
    where = f"'{path}'"
    if len(data) < _PREFIX.size or data[:8] != MAGIC:
        raise FormatError(f"{where} is not a progdesc compiled artifact (bad magic)")
    _, version, n = _PREFIX.unpack_from(data)
    if version != FORMAT_VERSION:
        raise FormatError(f"{where} has artifact format version {version}; this progdesc "
                          f"reads {FORMAT_VERSION}")
    if n > _MAX_HEADER or _PREFIX.size + n > len(data):
        raise FormatError(f"{where} is truncated (header of {n} bytes)")
    from progdesc.io import parse_json
    header = parse_json(data[_PREFIX.size:_PREFIX.size + n], f"{where} header")
    if not isinstance(header, dict):
        raise FormatError(f"{where} has an invalid header: not a JSON object")
    return header, bytes(data[_PREFIX.size + n:])


def read_compiled(data, path="<bytes>"):
    """(header, payload bytes) of a compiled artifact; FormatError if it is not a valid one."""
    where = f"'{path}'"
    header, payload = split_compiled(data, path)
    try:
        feeds, fetches, params = header["feeds"], header["fetches"], header["params"]
        for spec in feeds + fetches + params:
            dtypes.to_numpy(spec["dtype"])
            if not isinstance(spec["name"], str) or not isinstance(spec["shape"], list):
                raise TypeError("each input and output has a name (a string) and a shape "
                                f"(a list), got {spec['name']!r} and {spec['shape']!r}")
        names = [spec["name"] for spec in feeds + params]
        if len(set(names)) != len(names):
            raise ValueError(f"input names must differ, got {names}")
        if not all(isinstance(p, str) for p in header["platforms"]):
            raise TypeError("platforms must be names")
        if not isinstance(header["x64"], bool) or header["format_version"] != FORMAT_VERSION:
            raise ValueError("x64 must be true or false, format_version that of the file")
    except (ValueError, KeyError, TypeError, ProgdescError) as e:
        raise FormatError(f"{where} has an invalid header: {type(e).__name__}: {e}") from None
    from progdesc.io import json_digest
    own = header.get("header_sha256")       # absent in files written before it existed
    if own is not None and own != json_digest(
            {k: v for k, v in header.items() if k != "header_sha256"}):
        raise FormatError(f"{where} has a corrupted header (header digest mismatch)")
    if hashlib.sha256(payload).hexdigest() != header.get("payload_sha256"):
        raise FormatError(f"{where} is truncated or corrupted (payload digest mismatch)")
    return header, payload


class CompiledModel:
    """A loaded artifact: call it with the feeds (positionally or by name); returns NumPy arrays.

    `params` (name -> array) is required when the artifact takes its
    parameters as inputs. Attributes: `header`, `exported`, `feed_names`,
    `fetch_names`, `path`. A failure inside the compiled program raises
    `CompiledCallError` naming the file and the inputs.
    """

    def __init__(self, header, exported, params=None, path="<bytes>"):
        self.path = str(path)
        self.header = header
        self.exported = exported
        self.feed_names = [s["name"] for s in header["feeds"]]
        self.fetch_names = [s["name"] for s in header["fetches"]]
        self.params = dict(params or {})
        self._compiled = set()   # input signatures called once (compiled) already

    def __call__(self, *args, params=None, **named):
        if len(args) + len(named) != len(self.feed_names) or set(named) - set(self.feed_names):
            raise FeedError(f"expected the feeds {self.feed_names}, positionally or by name")
        values = dict(zip(self.feed_names, args), **named)
        params = {**self.params, **(params or {})}
        specs = self.header["feeds"] + self.header["params"]
        missing = [s["name"] for s in specs if s["name"] not in values and s["name"] not in params]
        if missing:
            raise FeedError("has no value (pass params={...} for parameter inputs)",
                            var=missing[0])
        arrays = [_convert(s, values[s["name"]] if s["name"] in values else params[s["name"]])
                  for s in specs]
        signature = tuple((a.shape, a.dtype) for a in arrays)
        try:
            if signature in self._compiled:
                out = self.exported.call(*arrays)
            else:
                with compile_cache.compiling():    # the first call per signature compiles
                    out = self.exported.call(*arrays)
                self._compiled.add(signature)
        except (ValueError, TypeError) as e:
            inputs = _describe(specs, arrays)
            raise FeedError(f"the artifact '{self.path}' rejected the inputs ({inputs}): "
                            f"{e}") from None
        except Exception as e:  # noqa: BLE001  (XLA's JaxRuntimeError and the like)
            raise CompiledCallError(f"the artifact '{self.path}' failed when called with "
                                    f"{_describe(specs, arrays)}: {type(e).__name__}: {e}") from e
        try:
            return [np.asarray(o) for o in out]
        except Exception as e:  # noqa: BLE001  (errors raised asynchronously by the device)
            raise CompiledCallError(f"the artifact '{self.path}' failed when called with "
                                    f"{_describe(specs, arrays)}: {type(e).__name__}: {e}") from e


def _describe(specs, arrays):
    return ", ".join(f"{s['name']}: {a.dtype}{list(a.shape)}" for s, a in zip(specs, arrays))


def _convert(spec, value):
    want = dtypes.to_numpy(spec["dtype"])
    arr = np.asarray(raw_key_data(value))
    if arr.dtype != want:
        if dtypes.kind_of(want) == "int" and arr.dtype.kind not in "iub":
            raise FeedError(f"got dtype {arr.dtype}, the artifact takes {spec['dtype']}",
                            var=spec["name"])
        arr = arr.astype(want)
    shape = spec["shape"]
    if len(arr.shape) != len(shape) or any(isinstance(d, int) and d != n
                                           for d, n in zip(shape, arr.shape)):
        raise FeedError(f"got shape {list(arr.shape)}, the artifact takes {shape}",
                        var=spec["name"])
    return arr


def load_compiled(path, params=None):
    """Load an artifact written by `export_compiled`; returns a callable `CompiledModel`.

    Before anything of the file runs, its module is checked against its
    manifest and for what a progdesc artifact may hold (`progdesc.export_check`);
    FormatError says what is wrong. A file that passes is still a program: load
    only files you would run.
    """
    from progdesc.io import read_file
    header, payload = read_compiled(read_file(path, "compiled artifact"), path)
    try:
        exported = jax.export.deserialize(bytearray(payload))
        problem = export_check.check_exported(exported, header)
    except Exception as e:  # noqa: BLE001  (flatbuffer parse errors: any Python exception)
        raise FormatError(f"'{path}' holds no valid serialized module: "
                          f"{type(e).__name__}: {e}") from None
    problem = problem or export_check.check_module_isolated(payload)
    if problem:
        raise FormatError(f"'{path}' is refused: {problem}")
    return CompiledModel(header, exported, params, path)
