"""The generated protobuf module matches proto/progdesc.proto, and the text format round-trips."""
import os
import tempfile

import pytest
from google.protobuf import descriptor_pb2

from lowering import progdesc_pb2

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_generated_module_is_not_stale():
    protoc = pytest.importorskip("grpc_tools.protoc")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "set.pb")
        rc = protoc.main(["protoc", f"-I{ROOT}/proto", f"--descriptor_set_out={out}",
                          "progdesc.proto"])
        assert rc == 0
        with open(out, "rb") as f:
            fresh = descriptor_pb2.FileDescriptorSet.FromString(f.read()).file[0]
    for message in fresh.message_type:  # protoc adds json names the generated code leaves out
        _strip_json_names(message)
    shipped = descriptor_pb2.FileDescriptorProto.FromString(progdesc_pb2.DESCRIPTOR.serialized_pb)
    assert fresh == shipped, "lowering/progdesc_pb2.py is stale: run `make proto`"


def _strip_json_names(message):
    for f in message.field:
        f.ClearField("json_name")
    for nested in message.nested_type:
        _strip_json_names(nested)


def test_generated_module_is_not_a_bare_proto_package():
    assert progdesc_pb2.__name__ == "lowering.progdesc_pb2"
    assert not os.path.exists(os.path.join(ROOT, "proto", "__init__.py"))
