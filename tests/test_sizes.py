"""Shapes too large for the machine are refused with a typed error, never handed to XLA.

XLA aborts the process on a static shape whose element count overflows and fails to
allocate one larger than memory, so each case runs in a fresh interpreter: an abort
shows as a signal (a negative return code), not as a pass.
"""
import os
import pathlib
import subprocess
import sys
import textwrap

ROOT = pathlib.Path(__file__).resolve().parent.parent

SCRIPT = """
import numpy as np
import progdesc as pd
from lowering import sizes
from lowering import progdesc_pb2 as pb
from progdesc import ops

HUGE = [2**30, 2**30]   # 2^60 elements: XLA's static extent product overflows


def report(case, run):
    try:
        run()
    except pd.ProgdescError as e:
        print(f"{case}: {type(e).__name__}: {e}", flush=True)
    else:
        print(f"{case}: no error", flush=True)


def forged(op_type, attrs, path):
    # A program file whose op carries `attrs`: built small, then edited as a stranger could.
    main = pd.Program()
    with pd.program_guard(main):
        main.global_block().append_op(op_type, attrs={"shape": [2, 3]})
    desc = pb.ProgramDesc()
    desc.CopyFrom(main.desc)
    op = desc.blocks[0].ops[0]
    for name, value in attrs.items():
        del op.attrs[name].ints.values[:]
        op.attrs[name].ints.values.extend(value)
    with open(path, "wb") as f:
        f.write(desc.SerializeToString())
    return path


for op_type in ("uniform_random", "gaussian_random", "fill_constant"):
    def built(op_type=op_type):
        main = pd.Program()
        with pd.program_guard(main):
            main.global_block().append_op(op_type, attrs={"shape": HUGE})
    report(f"{op_type} built", built)
    path = forged(op_type, {"shape": HUGE}, f"{op_type}.pb")
    report(f"{op_type} loaded", lambda: pd.io.load_program(path))


def big_var(dims):
    main = pd.Program()
    with pd.program_guard(main):
        pd.data("x", [2, 3])
    desc = pb.ProgramDesc()
    desc.CopyFrom(main.desc)
    desc.blocks[0].vars[0].dims[:] = dims
    pd.Program.from_bytes(desc.SerializeToString())
report("variable loaded", lambda: big_var(HUGE))
# no elements, but an extent XLA aborts on (its static extent product overflows)
report("zero-size variable loaded", lambda: big_var([2**63 - 1, 0]))

# Known dims that fit, a batch dim (-1) that makes the result too large only once fed:
# each row is half the machine's memory, four rows are twice it.
row = sizes.max_buffer_bytes() // 4 // 2 // 1024
main = pd.Program()
with pd.program_guard(main):
    x = pd.data("x", [None, 1, 1])
    y = ops.expand(x, shape=[-1, 1024, row])
    total = ops.reduce_sum(y)
report("batch dim at run", lambda: pd.Executor().run(
    main, feed={"x": np.ones((4, 1, 1), "float32")}, fetch_list=[total], scope=pd.Scope()))
print(pd.Executor().run(main, feed={"x": np.ones((0, 1, 1), "float32")}, fetch_list=[total],
                        scope=pd.Scope())[0])
"""


def test_shapes_too_large_for_the_machine_raise_typed_errors(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
        JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(SCRIPT)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"exit {done.returncode}:\n{done.stdout}\n{done.stderr[-3000:]}"
    lines = dict(line.split(": ", 1) for line in done.stdout.splitlines() if ": " in line)
    for op_type in ("uniform_random", "gaussian_random", "fill_constant"):
        for how in ("built", "loaded"):
            said = lines[f"{op_type} {how}"]
            assert said.startswith("AttributeValueError: "), said
            assert f"'{op_type}'" in said and "1,152,921,504,606,846,976 elements" in said, said
            assert "physical memory" in said, said
    assert lines["variable loaded"].startswith("FormatError: "), lines["variable loaded"]
    assert "variable 'x'" in lines["variable loaded"], lines["variable loaded"]
    said = lines["zero-size variable loaded"]
    assert said.startswith("FormatError: ") and "holds no element, but its other dims span more than" in said, said
    said = lines["batch dim at run"]
    assert said.startswith("ShapeError: op #0 'expand'") and "output Out float32[4, " in said, said
    assert done.stdout.splitlines()[-1] == "0.0"   # the same program runs where it fits
