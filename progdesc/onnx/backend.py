"""progdesc as an ONNX backend (`onnx.backend.base`): the standard way ONNX's tools and
test runners execute a model.

    from progdesc.onnx import Backend
    rep = Backend.prepare(model, "CPU")        # translated and put in a Scope once
    outputs = rep.run([x])                     # compiled at the first run, per input shape
    outputs = Backend.run_node(node, [x, y])   # one node, its types taken from the inputs

Each prepared model gets its own Scope and Executor. JAX computes without 64-bit types
here (int64 and float64 compute as int32 and float32); each output is cast back to the
element type the ONNX graph declares (or shape inference finds) for it. Models of a
default opset older than 13 are first upgraded with ONNX's own version converter. Inputs
that the translation needs the values of (a TopK's K fed rather than held by an
initializer) are bound to the values fed, one translation per set of values (see
`BackendRep`).

Devices: 'CPU', and 'CUDA' / 'GPU' / 'TPU' where JAX has such a device, each with an
optional ':index' ('CUDA:1').
"""
import numpy as np
import onnx
from onnx import numpy_helper
from onnx.backend import base

from lowering.errors import FeedError
from progdesc.onnx import model as onnx_model

__all__ = ["Backend", "BackendRep"]

_PLATFORMS = {"CPU": "cpu", "CUDA": "gpu", "GPU": "gpu", "TPU": "tpu"}
MAX_BOUND_TRANSLATIONS = 16
"""How many translations a BackendRep with bound inputs keeps (one per set of values fed;
the least recently used goes first), so that a stream of values cannot grow it without
end."""


def jax_device(device):
    """The `jax.Device` an ONNX device string ('CPU', 'CUDA:1') names; ValueError for a
    string that names none, RuntimeError for a device JAX does not have."""
    import jax
    kind, _, index = str(device).upper().partition(":")
    platform = _PLATFORMS.get(kind)
    if platform is None or (index and not index.isdigit()):
        raise ValueError(f"'{device}' is not a device name: 'CPU', 'CUDA', 'GPU' or 'TPU', "
                         "optionally with ':index'")
    try:
        devices = jax.devices(platform)
    except RuntimeError:
        devices = []
    number = int(index or 0)
    if number >= len(devices):
        raise RuntimeError(f"JAX has no device '{device}' ({len(devices)} {platform} "
                           "device(s))")
    return devices[number]


def _upgraded(model):
    """`model`, converted to the oldest default opset the importer translates if it is
    older (ONNX's version converter); unchanged where the converter fails, so that
    `load` names the opset in its error."""
    version = onnx_model.opsets(model).get("")
    if version is None or version >= onnx_model.MIN_OPSET:
        return model
    try:
        return onnx.version_converter.convert_version(model, onnx_model.MIN_OPSET)
    except Exception:   # noqa: BLE001 - the converter's own errors are of many kinds
        return model


def _output_dtypes(model):
    """The NumPy dtype each graph output is declared (or inferred) to have; None where
    neither says."""
    inferred = None
    out = []
    for info in model.graph.output:
        elem = info.type.tensor_type.elem_type if info.type.HasField("tensor_type") else 0
        if elem:
            try:
                out.append(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem)))
            except Exception:   # noqa: BLE001 - an element type NumPy has no dtype for
                out.append(None)
            continue
        if inferred is None:
            inferred = onnx_model.inferred_types(model)
        typ = inferred.get(info.name)
        out.append(onnx_model.as_numpy_dtype(typ[1]) if typ and typ[1] else None)
    return out


def as_array(value):
    """A NumPy array of an input value (an array, a number, an `onnx.TensorProto`)."""
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    return np.asarray(value)


def _bound(model, values):
    """A copy of `model` whose graph inputs named in `values` are initializers holding
    those values."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    kept = [i for i in out.graph.input if i.name not in values]
    del out.graph.input[:]
    out.graph.input.extend(kept)
    out.graph.initializer.extend(numpy_helper.from_array(np.asarray(v), name)
                                 for name, v in values.items())
    return out


def _bindable(model):
    """The names of the graph inputs a translation may need the values of at import: the
    integer ones (shapes, counts, indices fed as data), the scalars (a Range's limits, a
    OneHot's depth) and the float ones that a Resize reads as its roi or scales."""
    ints = {onnx.TensorProto.INT8, onnx.TensorProto.INT16, onnx.TensorProto.INT32,
            onnx.TensorProto.INT64, onnx.TensorProto.UINT8, onnx.TensorProto.UINT16,
            onnx.TensorProto.UINT32, onnx.TensorProto.UINT64}
    scales = {name for n in model.graph.node if n.op_type == "Resize"
              for name in n.input[1:3] if name}
    return [i.name for i in model.graph.input
            if i.type.tensor_type.elem_type in ints or i.name in scales
            or (i.type.tensor_type.HasField("shape") and not i.type.tensor_type.shape.dim)]


class _Prepared:
    """One translation of a model: its program, in its own Scope, run by its own
    Executor."""

    def __init__(self, model, device, for_training):
        import progdesc
        from progdesc.onnx import load
        self.scope = progdesc.Scope()
        self.executor = progdesc.Executor(device)
        self.program, self.input_names, self.fetch_targets = load(
            model, self.scope, for_training=for_training)

    def run(self, feed):
        return self.executor.run(self.program, feed=feed, fetch_list=self.fetch_targets,
                                 scope=self.scope)


class BackendRep(base.BackendRep):
    """A model translated into a Program of ours, its initializers in its own Scope, run by
    its own Executor (compiled once per set of input shapes).

    A model whose translation needs the values of some of its inputs (a TopK's K or a
    Reshape's shape fed as an input rather than held by an initializer) is translated at
    each run with those inputs bound to the values fed (the integer inputs, the scalars
    and a Resize's roi and scales), once per distinct set of values, the way the Executor
    compiles once per set of shapes (the last `MAX_BOUND_TRANSLATIONS` kept). Where even that fails, the first run raises the
    error."""

    def __init__(self, model, device="CPU", *, for_training=False):
        from lowering.errors import UnsupportedOpError
        model = _upgraded(onnx_model.read_model(model))
        self.device = jax_device(device)
        self.for_training = for_training
        self.model = model
        self.graph_inputs = [i.name for i in model.graph.input
                             if i.name not in {t.name for t in model.graph.initializer}]
        self.output_names = [o.name for o in model.graph.output]
        self.output_dtypes = _output_dtypes(model)
        self._outputs = base.namedtupledict("Outputs", self.output_names)
        self._bound = {}      # the values of the bound inputs -> _Prepared
        self.bound_inputs = ()
        """The inputs bound to their values at each run (empty: translated once)."""
        try:
            self._plain = _Prepared(model, self.device, for_training)
        except UnsupportedOpError:
            self.bound_inputs = tuple(_bindable(model))
            if not self.bound_inputs:
                raise
            self._plain = None

    @property
    def program(self):
        """The translated Program (None where inputs are bound: one per their values)."""
        return self._plain.program if self._plain is not None else None

    @property
    def scope(self):
        """The Scope holding the model's initializers (None where inputs are bound)."""
        return self._plain.scope if self._plain is not None else None

    @property
    def input_names(self):
        """The names of the inputs `run` takes, in order."""
        return self.graph_inputs

    def _feed(self, inputs):
        if isinstance(inputs, dict):
            unknown = sorted(set(inputs) - set(self.input_names))
            if unknown:
                raise FeedError(f"the model has no input named {', '.join(map(repr, unknown))} "
                                f"(its inputs: {', '.join(self.input_names)})")
            return {name: as_array(value) for name, value in inputs.items()}
        if isinstance(inputs, (np.ndarray, onnx.TensorProto)) or np.isscalar(inputs):
            inputs = [inputs]
        inputs = list(inputs)
        if len(inputs) != len(self.input_names):
            raise FeedError(f"the model takes {len(self.input_names)} input(s) "
                            f"({', '.join(self.input_names)}), got {len(inputs)}")
        return {name: as_array(value) for name, value in zip(self.input_names, inputs)}

    def _prepared(self, feed):
        if self._plain is not None:
            return self._plain, feed
        values = {}
        for name in self.bound_inputs:
            if name not in feed:
                raise FeedError(f"input '{onnx_model.shown(name)}' must be fed: the "
                                "translation needs its value")
            values[name] = feed[name]
        key = tuple((n, v.dtype.str, v.shape, v.tobytes()) for n, v in values.items())
        prepared = self._bound.pop(key, None)   # put back last: the most recently used
        if prepared is None:
            prepared = _Prepared(_bound(self.model, values), self.device, self.for_training)
        self._bound[key] = prepared
        while len(self._bound) > MAX_BOUND_TRANSLATIONS:
            del self._bound[next(iter(self._bound))]   # the least recently used
        return prepared, {n: v for n, v in feed.items() if n not in values}

    def run(self, inputs, **kwargs):
        """The model's outputs for `inputs` (a list in the order of the graph's inputs that
        no initializer gives, a dict by name, or one array), as a namedtuple by output
        name, each in its declared element type."""
        prepared, feed = self._prepared(self._feed(inputs))
        outs = prepared.run(feed)
        outs = [out if dtype is None or out.dtype == dtype else out.astype(dtype)
                for out, dtype in zip(outs, self.output_dtypes)]
        return self._outputs(*outs)


class Backend(base.Backend):
    """progdesc as an ONNX backend; see the module's text."""

    @classmethod
    def is_compatible(cls, model, device="CPU", **kwargs):
        """Whether the table has a row for every node of the model's main graph (a model
        may still hold a node whose attributes a row refuses) and the device exists."""
        from progdesc.onnx.rules import RULES
        from progdesc.onnx.table import key
        if not cls.supports_device(device):
            return False
        versions = onnx_model.opsets(model)
        return all(RULES.lookup(key(n.domain, n.op_type),
                                versions.get("" if n.domain in onnx_model.DEFAULT_DOMAINS
                                             else n.domain)) is not None
                   for n in model.graph.node)

    @classmethod
    def prepare(cls, model, device="CPU", **kwargs):
        """Translate `model` (a ModelProto, its bytes or a `.onnx` path) into a
        `BackendRep`. `for_training=True` imports BatchNormalization and Dropout in
        training mode. Raises UnsupportedOpError naming every node it cannot translate."""
        return BackendRep(model, device, for_training=kwargs.get("for_training", False))

    @classmethod
    def run_model(cls, model, inputs, device="CPU", **kwargs):
        """`prepare(model, device).run(inputs)`."""
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node, inputs, device="CPU", outputs_info=None, **kwargs):
        """Run one NodeProto on `inputs` (arrays for its non-empty inputs, in order); the
        input types come from the arrays, the output types from `outputs_info`
        ([(dtype, shape)]) or shape inference. `opset_version` (default: the installed
        onnx's newest) is the default domain's opset."""
        names = [n for n in node.input if n]
        inputs = [as_array(v) for v in (inputs.values() if isinstance(inputs, dict)
                                         else inputs)]
        if len(inputs) != len(names):
            raise FeedError(f"node '{onnx_model.shown(node.name or node.op_type)}' has "
                            f"{len(names)} input(s), got {len(inputs)}")
        graph_inputs = [onnx.helper.make_tensor_value_info(
            name, onnx.helper.np_dtype_to_tensor_dtype(value.dtype), value.shape)
            for name, value in zip(names, inputs)]
        outs = [o for o in node.output if o]
        if outputs_info is not None:
            graph_outputs = [onnx.helper.make_tensor_value_info(
                name, onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), shape)
                for name, (dtype, shape) in zip(outs, outputs_info)]
        else:
            graph_outputs = [onnx.helper.make_empty_tensor_value_info(name) for name in outs]
        graph = onnx.helper.make_graph([node], node.name or node.op_type, graph_inputs,
                                       graph_outputs)
        imports = [onnx.helper.make_opsetid("", kwargs.get("opset_version",
                                                           onnx.defs.onnx_opset_version()))]
        if node.domain not in onnx_model.DEFAULT_DOMAINS:
            imports.append(onnx.helper.make_opsetid(node.domain, 1))
        model = onnx.helper.make_model(graph, opset_imports=imports)
        return cls.prepare(model, device).run(inputs)

    @classmethod
    def supports_device(cls, device):
        """Whether JAX has the device `device` names ('CPU', 'CUDA', 'CUDA:1', ...)."""
        try:
            jax_device(device)
        except (ValueError, RuntimeError):
            return False
        return True

