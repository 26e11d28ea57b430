"""ONNX's node test suite through `progdesc.onnx.Backend`: one test per case, the cases
generated from the installed onnx package's own definitions (tests/onnx_node_cases.py),
outputs compared by ONNX's own runner (`Runner.assert_similar_outputs`: its tolerances,
the declared dtypes).

- A case in tests/onnx_excluded.py is run as well: failing, it is skipped with its
  reason; passing, it fails the run (the list must shrink when support grows).
- `make test` runs a subset (`CI_CASES`: the float non-expanded default-domain cases,
  the excluded ones, the first case of every other op type); `make test-all` runs every
  case, the `_expanded` ones (an op written as the nodes of its ONNX function) included.
- `test_pass_rates`, last, prints the pass rates (tests/conftest.py shows them in the
  terminal summary) and asserts the targets: 90% of the float, non-expanded,
  default-domain cases; in a run of every case, more passing cases than onnxruntime.
"""
import pytest

import onnx_node_cases as node_cases
from onnx_excluded import EXCLUDED

CASES = {case.name: case for case in node_cases.all_cases()}
FLOAT_CASES = frozenset(n for n, c in CASES.items() if node_cases.is_float_case(c))

FLOAT_TARGET = 0.90
ONNXRUNTIME_PASSES = 1397
"""Cases onnxruntime 1.31.1 (CPU) passes of the 1884 onnx 1.23.2 generates, compared the
same way (`python -m tests.onnx_node_cases --onnxruntime`); 453 of the 550 float ones."""

_results = {}   # case name -> whether it passed, in this process


def _ci_cases():
    """The cases `make test` runs: every float non-expanded default-domain one (the rate
    asserted), every excluded one (cheap: they fail at translation; the list stays
    honest) and the first case of each other op type; the rest is `slow`."""
    chosen = set(FLOAT_CASES) | set(EXCLUDED)
    seen = set()
    for name, case in CASES.items():
        if "_expanded" in name:
            continue
        types = frozenset((n.domain, n.op_type) for n in case.model.graph.node)
        if not types <= seen:
            chosen.add(name)
            seen |= types
    return chosen


CI_CASES = _ci_cases()


@pytest.mark.parametrize("name", [
    n if n in CI_CASES else pytest.param(n, marks=pytest.mark.slow) for n in CASES])
def test_case(name):
    case = CASES[name]
    if name in EXCLUDED:
        why = node_cases.run_case(case)
        _results[name] = why is None
        if why is None:
            pytest.fail(f"{name} passes but tests/onnx_excluded.py excludes it "
                        f"({EXCLUDED[name]}): take it off the list")
        pytest.skip(f"excluded: {EXCLUDED[name]}")
    _results[name] = False
    node_cases.check_case(case)
    _results[name] = True


def test_exclusions_name_cases():
    assert not set(EXCLUDED) - set(CASES), "tests/onnx_excluded.py names cases onnx lacks"
    assert all(isinstance(why, str) and len(why) > 10 for why in EXCLUDED.values())


def test_pass_rates(request, record_property):
    selected = [i.callspec.params["name"] for i in request.session.items
                if getattr(i, "originalname", None) == "test_case"]
    ran = [n for n in selected if n in _results]
    if not ran or len(ran) < len(selected):
        pytest.skip("the node cases ran in another process (or not at all)")
    passed = sum(_results[n] for n in ran)
    floats = [n for n in ran if n in FLOAT_CASES]
    float_passed = sum(_results[n] for n in floats)
    everything = len(ran) == len(CASES)
    rest = "" if everything else f" (a subset: {len(CASES)} are generated)"
    summary = (f"ONNX node suite through progdesc.onnx.Backend: {passed} of {len(ran)} "
               f"cases pass{rest}; float non-expanded default-domain: {float_passed} of "
               f"{len(floats)} ({float_passed / max(len(floats), 1):.1%}); onnxruntime 1.31: "
               f"{ONNXRUNTIME_PASSES} of {len(CASES)}; {len(EXCLUDED)} excluded")
    record_property("onnx_node_suite", summary)
    print(summary)
    if len(floats) < len(FLOAT_CASES):   # a selection (-k): rates shown, not asserted
        pytest.skip(summary)
    assert float_passed >= FLOAT_TARGET * len(floats), summary
    if everything:
        assert passed > ONNXRUNTIME_PASSES, summary
