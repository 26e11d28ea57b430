"""Run ONNX's node test cases (generated from the installed onnx package's own case
definitions, `onnx.backend.test.case`) through progdesc.onnx; a development tool:

    python -m tests.onnx_node_cases                 # every case, a summary
    python -m tests.onnx_node_cases Add Conv        # the cases of these op types
    python -m tests.onnx_node_cases -v Reshape      # with each failure's reason
"""
import contextlib
import io as _io
import sys
import warnings

import numpy as np


def cases(op_types=None):
    """ONNX's node test cases (onnx.backend.test.case.test_case.TestCase), optionally only
    those whose model's nodes are all of `op_types`... or whose name starts with
    'test_<op>' lower-cased."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(_io.StringIO()):
        warnings.simplefilter("ignore")
        from onnx.backend.test.case import node
        found = list(node.collect_testcases(None))
    if not op_types:
        return found
    wanted = {o.lower() for o in op_types}
    return [c for c in found
            if {n.op_type.lower() for n in c.model.graph.node} & wanted
            or any(c.name.startswith(f"test_{w}") for w in wanted)]


def run_case(case):
    """None if progdesc reproduces every data set of the case, else the reason it fails."""
    import progdesc
    from progdesc import onnx as ponnx
    for inputs, expected in case.data_sets:
        scope = progdesc.Scope()
        try:
            program, feeds, fetches = ponnx.load(case.model, scope)
            feed = dict(zip(feeds, inputs))
            outs = progdesc.Executor().run(program, feed=feed, fetch_list=fetches, scope=scope)
        except Exception as e:   # noqa: BLE001 - a development tool reports everything
            return f"{type(e).__name__}: {str(e)[:300]}"
        for i, (out, ref) in enumerate(zip(outs, expected)):
            ref = np.asarray(ref)
            out = np.asarray(out)
            if ref.dtype == object:
                return "an output of type object"
            if out.shape != ref.shape:
                return f"output {i}: shape {out.shape}, expected {ref.shape}"
            try:
                np.testing.assert_allclose(out.astype(ref.dtype), ref, rtol=case.rtol,
                                           atol=case.atol)
            except (AssertionError, TypeError, ValueError) as e:
                return f"output {i}: values differ: {str(e)[:200]}"
    return None


def main(argv):
    verbose = "-v" in argv
    selected = cases([a for a in argv if a != "-v"])
    failed = {}
    for case in selected:
        why = run_case(case)
        if why is not None:
            failed[case.name] = why
    for name, why in sorted(failed.items()):
        print(f"FAIL {name}" + (f": {why}" if verbose else ""))
    print(f"{len(selected) - len(failed)} of {len(selected)} cases pass")


if __name__ == "__main__":
    main(sys.argv[1:])
