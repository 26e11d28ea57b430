"""The ONNX node test cases excluded from tests/test_onnx_node_suite.py, each with why."""
EXCLUDED = {}
