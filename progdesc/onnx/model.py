"""Reading ONNX models: the ModelProto of a file, bytes or a ModelProto, its external data
read safely, its opsets, its nodes' attributes as Python values and its values' types.

A model file may come from a stranger: parsing is protobuf's; external data (`.onnx.data`
beside the model) is read only from regular files inside the model's directory, each
tensor's offset and length checked against the file before a byte is read.
"""
import os

import numpy as np
import onnx
from onnx import numpy_helper

from lowering import dtypes
from lowering.errors import FormatError
from progdesc import io
from progdesc.limits import MAX_NAME_CHARS, clean_text

DEFAULT_DOMAINS = ("", "ai.onnx")
"""The names of ONNX's default operator domain."""

MIN_OPSET = 13
"""The oldest default-domain opset the importer translates (rows hold from here on)."""


def shown(name):
    """A name read from a model, as an error message shows it."""
    return clean_text(str(name), MAX_NAME_CHARS)


def read_model(source):
    """The ModelProto of `source`: a path to a `.onnx` file, its bytes, or a ModelProto
    (used as it is). External data is read into the tensors (see the module's text);
    FormatError for anything that is not an ONNX model."""
    model = parse_model(source)
    base = None if isinstance(source, (onnx.ModelProto, bytes, bytearray, memoryview)) \
        else os.path.dirname(os.path.abspath(os.fspath(source)))
    if _has_external_data(model):
        if base is None:
            raise FormatError("the model keeps tensors in external data files; load it from "
                              "its path (the files are found beside it)")
        model = _copy(model)
        _read_external_data(model, base)
    return model


def parse_model(source):
    """The ModelProto of `source` (a path, bytes or a ModelProto, used as it is), its
    external data not read; FormatError for anything that is not an ONNX model."""
    if isinstance(source, onnx.ModelProto):
        return source
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
    else:
        data = io.read_file(os.fspath(source), "ONNX model")
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception as e:   # protobuf's DecodeError, or a message nested too deep
        raise FormatError(f"not an ONNX model: {type(e).__name__}: {e}") from None
    if not model.HasField("graph"):
        raise FormatError("not an ONNX model: it has no graph")
    _check_names(model)
    return model


def _check_names(model):
    """FormatError if a name the importer uses is not UTF-8 text (protobuf then gives
    bytes where a str is expected)."""
    def texts():
        for imp in model.opset_import:
            yield "an opset domain", imp.domain
        for graph in _graphs(model.graph):
            for info in list(graph.input) + list(graph.output) + list(graph.value_info):
                yield "a value name", info.name
                for d in info.type.tensor_type.shape.dim:
                    yield "a dim name", d.dim_param
            for tensor in graph.initializer:
                yield "an initializer name", tensor.name
            for node in graph.node:
                yield "a node name", node.name
                yield "an op type", node.op_type
                yield "an op domain", node.domain
                yield from (("a value name", v) for v in list(node.input) + list(node.output))
                yield from (("an attribute name", a.name) for a in node.attribute)
    for what, text in texts():
        if not isinstance(text, str):
            raise FormatError(f"not an ONNX model: {what} is not UTF-8 text ({text[:40]!r})")


def _copy(model):
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def _graphs(graph):
    """`graph` and every sub-graph of its nodes' attributes, depth first."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from _graphs(g)


def _tensors(model):
    for graph in _graphs(model.graph):
        yield from graph.initializer
        for node in graph.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.TENSOR:
                    yield attr.t
                elif attr.type == onnx.AttributeProto.TENSORS:
                    yield from attr.tensors


def _has_external_data(model):
    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in _tensors(model))


def _read_external_data(model, base):
    """Read each external tensor's bytes into it, from files inside `base` only."""
    opened = {}
    try:
        for tensor in _tensors(model):
            if tensor.data_location != onnx.TensorProto.EXTERNAL:
                continue
            info = {e.key: e.value for e in tensor.external_data}
            where = f"tensor '{shown(tensor.name)}'"
            location = info.get("location", "")
            path = os.path.realpath(os.path.join(base, location))
            if (not location or os.path.isabs(location)
                    or os.path.commonpath([path, os.path.realpath(base)]) != os.path.realpath(base)):
                raise FormatError(f"{where}: external data location '{shown(location)}' is not "
                                  "a file inside the model's directory")
            try:
                offset = int(info.get("offset", 0))
                length = int(info["length"]) if "length" in info else None
            except ValueError:
                raise FormatError(f"{where}: external data offset or length is not a "
                                  "number") from None
            f = opened.get(path)
            if f is None:
                try:
                    f = opened[path] = open(os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)),
                                            "rb")
                except OSError as e:
                    raise FormatError(f"{where}: cannot read external data file "
                                      f"'{shown(location)}': {e.strerror or e}") from None
            size = os.fstat(f.fileno()).st_size
            if length is None:
                length = size - offset
            if offset < 0 or length < 0 or offset + length > size:
                raise FormatError(f"{where}: external data [{offset}, {offset + length}) lies "
                                  f"outside '{shown(location)}' ({size} bytes)")
            f.seek(offset)
            tensor.raw_data = f.read(length)
            tensor.data_location = onnx.TensorProto.DEFAULT
            del tensor.external_data[:]
    finally:
        for f in opened.values():
            f.close()


def opsets(model):
    """{domain: version} of the model's opset imports ('' for the default domain)."""
    out = {}
    for imp in model.opset_import:
        domain = "" if imp.domain in DEFAULT_DOMAINS else imp.domain
        out[domain] = imp.version
    return out


def to_array(tensor):
    """The NumPy array of a TensorProto; FormatError if its data does not fit its type."""
    try:
        return numpy_helper.to_array(tensor)
    except Exception as e:
        raise FormatError(f"tensor '{shown(tensor.name)}' cannot be read: "
                          f"{type(e).__name__}: {e}") from None


def attribute_value(attr):
    """The Python value of an AttributeProto: int, float, str, NumPy array, GraphProto, or
    a list of one of them."""
    kind = onnx.AttributeProto
    if attr.type == kind.INT:
        return int(attr.i)
    if attr.type == kind.FLOAT:
        return float(attr.f)
    if attr.type == kind.STRING:
        return attr.s.decode("utf-8", "replace")
    if attr.type == kind.TENSOR:
        return to_array(attr.t)
    if attr.type == kind.GRAPH:
        return attr.g
    if attr.type == kind.INTS:
        return [int(v) for v in attr.ints]
    if attr.type == kind.FLOATS:
        return [float(v) for v in attr.floats]
    if attr.type == kind.STRINGS:
        return [s.decode("utf-8", "replace") for s in attr.strings]
    if attr.type == kind.TENSORS:
        return [to_array(t) for t in attr.tensors]
    if attr.type == kind.GRAPHS:
        return list(attr.graphs)
    if attr.type == kind.SPARSE_TENSOR:
        return numpy_helper.to_array(attr.sparse_tensor.values)   # refused by the rules
    raise FormatError(f"attribute '{shown(attr.name)}' has type {attr.type}, which ONNX "
                      "does not define")


def attributes(node):
    """{name: Python value} of a NodeProto's attributes (see `attribute_value`); a
    reference to a function's attribute (`ref_attr_name`) is left out."""
    return {a.name: attribute_value(a) for a in node.attribute if not a.ref_attr_name}


def dtype_name(elem_type):
    """Our dtype name of an ONNX element type; FormatError for one we cannot hold."""
    try:
        np_type = onnx.helper.tensor_dtype_to_np_dtype(elem_type)
        return dtypes.name_of(np_type)
    except Exception:
        name = onnx.TensorProto.DataType.Name(elem_type) if elem_type in \
            onnx.TensorProto.DataType.values() else str(elem_type)
        raise FormatError(f"element type {name} has no dtype of ours") from None


def tensor_type(type_proto):
    """(dims, dtype name) of a tensor TypeProto, or None for another kind of type (a
    sequence, an optional) or an unknown element type. A dim is an int, the name of a
    symbolic dim (`dim_param`: 'batch'), or None (unknown, unnamed); dims is None when
    even the rank is unknown."""
    if type_proto.WhichOneof("value") != "tensor_type":
        return None
    tt = type_proto.tensor_type
    if tt.elem_type == onnx.TensorProto.UNDEFINED:
        return None
    try:
        dtype = dtype_name(tt.elem_type)
    except FormatError:
        return None
    if not tt.HasField("shape"):
        return None, dtype
    dims = []
    for d in tt.shape.dim:
        which = d.WhichOneof("value")
        dims.append(int(d.dim_value) if which == "dim_value"
                    else d.dim_param if which == "dim_param" and d.dim_param else None)
    return tuple(dims), dtype


def inferred_types(model):
    """{value name: (dims, dtype)} of every value ONNX's shape inference (with data
    propagation, so that symbolic dims flow through shape computations) can type; {} if
    inference fails (a model it does not know, an opset too new) or would not end (an
    Einsum equation with a stray '.': onnx 1.23's inference loops forever on it; the
    Einsum row refuses such a node by name)."""
    if any(not _einsum_equation_ok(attr.s) for graph in _graphs(model.graph)
           for node in graph.node if node.op_type == "Einsum"
           for attr in node.attribute if attr.name == "equation"):
        return {}
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception:
        return {}
    out = {}
    for graph in _graphs(inferred.graph):
        for info in list(graph.value_info) + list(graph.input) + list(graph.output):
            typ = tensor_type(info.type)
            if typ is not None and info.name not in out:
                out[info.name] = typ
    return out


def _einsum_equation_ok(equation):
    """Whether every term of an Einsum equation is letters and spaces around at most one
    '...' (what ONNX's shape inference can read without looping)."""
    text = equation.decode("ascii", "replace")
    terms = text.replace("->", ",").split(",")
    return text.count("->") <= 1 and all(
        term.count("...") <= 1 and all(c.isalpha() or c == " " for c in term.replace("...", ""))
        for term in terms)


def as_numpy_dtype(name):
    """The NumPy dtype of one of our dtype names."""
    return np.dtype(dtypes.to_numpy(name))
