"""ONNX's node test cases, generated from the installed onnx package's own case definitions
(`onnx.backend.test.case`; onnx 1.23 no longer ships their data files), run through
`progdesc.onnx.Backend` and compared as ONNX's backend test runner compares (same
tolerances, same dtypes). tests/test_onnx_node_suite.py runs them under pytest; this is
also a development tool:

    python -m tests.onnx_node_cases                 # every case, a summary
    python -m tests.onnx_node_cases Add Conv        # the cases of these op types
    python -m tests.onnx_node_cases -v Reshape      # with each failure's reason
    python -m tests.onnx_node_cases --onnxruntime   # onnxruntime on the same cases
"""
import contextlib
import functools
import io as _io
import sys
import time
import warnings

import numpy as np

FLOAT_TYPES = frozenset((1, 10, 11, 16))   # TensorProto FLOAT, FLOAT16, DOUBLE, BFLOAT16


@functools.lru_cache(maxsize=None)
def all_cases():
    """Every node test case (onnx.backend.test.case.test_case.TestCase) of the installed
    onnx, in ONNX's order (generating them runs ONNX's reference code: a few seconds)."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(_io.StringIO()):
        warnings.simplefilter("ignore")
        from onnx.backend.test.case import node
        return tuple(node.collect_testcases(None))


def cases(op_types=None):
    """ONNX's node test cases, optionally only those with a node of one of `op_types` or
    whose name starts with 'test_<op>' lower-cased."""
    found = all_cases()
    if not op_types:
        return list(found)
    wanted = {o.lower() for o in op_types}
    return [c for c in found
            if {n.op_type.lower() for n in c.model.graph.node} & wanted
            or any(c.name.startswith(f"test_{w}") for w in wanted)]


def is_float_case(case):
    """Whether a case is of the headline group: non-expanded (the op itself, not its
    function body), default domain only, every graph input and output a float tensor
    (float16, bfloat16, float32, float64)."""
    graph = case.model.graph
    if "_expanded" in case.name:
        return False
    if any(n.domain not in ("", "ai.onnx") for n in graph.node):
        return False
    values = list(graph.input) + list(graph.output)
    return bool(values) and all(v.type.HasField("tensor_type")
                                and v.type.tensor_type.elem_type in FLOAT_TYPES
                                for v in values)


def _array(value):
    import onnx
    from onnx import numpy_helper
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    if isinstance(value, (list, tuple)):
        return [_array(v) for v in value]
    return value


def check_case(case, backend=None):
    """Run every data set of `case` through `backend` (default: progdesc.onnx.Backend)
    and compare with ONNX's expected outputs as ONNX's runner does; raises what fails."""
    from onnx.backend.test.runner import Runner
    if backend is None:
        from progdesc.onnx import Backend as backend
    rep = backend.prepare(case.model, "CPU")
    for inputs, expected in case.data_sets:
        outputs = rep.run([_array(v) for v in inputs])
        Runner.assert_similar_outputs([_array(v) for v in expected], list(outputs),
                                      rtol=case.rtol, atol=case.atol, model_dir=case.name)


def run_case(case, backend=None):
    """None if the backend reproduces every data set of the case, else why it fails."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            check_case(case, backend)
    except Exception as e:   # noqa: BLE001 - a development tool reports everything
        text = " ".join(str(e).split())
        return f"{type(e).__name__}: {text[:300]}"
    return None


class OnnxRuntimeBackend:
    """onnxruntime behind the same `prepare(model).run(inputs)` interface (CPU), to
    measure it on the same cases."""

    @staticmethod
    def prepare(model, device="CPU"):
        import onnxruntime
        options = onnxruntime.SessionOptions()
        options.log_severity_level = 4
        session = onnxruntime.InferenceSession(model.SerializeToString(), options,
                                               providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]

        class Rep:
            def run(self, inputs):
                return session.run(None, {n: v if isinstance(v, list) else np.asarray(v)
                                          for n, v in zip(names, inputs)})
        return Rep()


def main(argv):
    verbose = "-v" in argv
    backend = OnnxRuntimeBackend if "--onnxruntime" in argv else None
    selected = cases([a for a in argv if not a.startswith("-")])
    start = time.perf_counter()
    failed = {}
    for case in selected:
        why = run_case(case, backend)
        if why is not None:
            failed[case.name] = why
    for name, why in sorted(failed.items()):
        print(f"FAIL {name}" + (f": {why}" if verbose else ""))
    floats = [c for c in selected if is_float_case(c)]
    float_pass = sum(c.name not in failed for c in floats)
    print(f"{len(selected) - len(failed)} of {len(selected)} cases pass "
          f"({float_pass} of {len(floats)} float non-expanded default-domain ones) "
          f"in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
