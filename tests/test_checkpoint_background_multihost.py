"""Background checkpoints of a two-process run: the gathered file (process 0 writes it)
and the per-process shards, taken at the call and written while both processes train on.

Two processes of 2 forced CPU devices each train tests/multihost_worker.py's FSDP MLP on
a 4-device mesh (see tests/test_multihost.py). The reference for the files is the
values both processes gathered with `to_host` at the step that asked; for training
after the save, a one-process run of the same steps.
"""
import os
import textwrap

import numpy as np
import pytest

import progdesc as pd
from progdesc import distributed as dist
from progdesc import io

from multihost_worker import global_batches, mlp_program
from test_multihost import finish, free_port, start

BEFORE = 2      # steps before the saves; the other steps of global_batches() run during them

WORKER = ["-c", textwrap.dedent("""
    import os, sys, threading
    sys.path.insert(0, os.path.join(os.getcwd(), "tests"))
    import numpy as np
    port, me, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    from progdesc import distributed as dist
    dist.initialize(f"127.0.0.1:{port}", 2, me)
    import progdesc as pd
    from progdesc import atomic, checkpointing, io
    from multihost_worker import GLOBAL_BATCH, global_batches, mlp_program
    os.chdir(out)
    rows = slice(me * GLOBAL_BATCH // 2, (me + 1) * GLOBAL_BATCH // 2)
    mesh = dist.Mesh({"data": 4})
    main, startup, loss, _ = mlp_program("fsdp")
    exe, scope = pd.Executor(mesh=mesh), pd.Scope()
    exe.run(startup, scope=scope)

    def train(batches):
        for x, y in batches:
            exe.run(main, feed={"x": dist.global_batch(x[rows], mesh),
                                "y": dist.global_batch(y[rows], mesh)},
                    fetch_list=[loss], scope=scope, return_numpy=False)

    train(global_batches()[:BEFORE])
    at_save = {n: dist.to_host(scope.get(n)) for n in io.persistable_vars(main) if n in scope}
    gate, submit = threading.Event(), checkpointing.submit    # writers wait for the steps
    checkpointing.submit = lambda path, write: submit(path, lambda: (gate.wait(), write()))
    whole = dist.save_checkpoint("ck.safetensors", main, scope, background=True)
    shards = dist.save_checkpoint_shards("shards", main, scope, background=True)
    train(global_batches()[BEFORE:])
    during = [whole.done(), shards.done()]
    gate.set()
    whole.wait()
    shards.wait()
    params = {p.name: dist.to_host(scope.get(p.name)) for p in main.all_parameters()}
    np.savez(f"process-{me}.npz", **{"at_save/" + n: v for n, v in at_save.items()},
             **{"after/" + n: v for n, v in params.items()})

    def disk_full(f, data):
        raise OSError(28, "No space left on device")
    if me == 1:                     # process 1 cannot write its shard: both saves fail
        atomic._write_all = disk_full
    failed = dist.save_checkpoint_shards("shards-failed", main, scope, background=True)
    try:
        failed.wait()
        error = "none"
    except Exception as e:
        error = f"{type(e).__name__}: {e}"
    with open(f"process-{me}.txt", "w") as f:
        f.write(f"{during}\\n{error}\\n")
""").replace("BEFORE", str(BEFORE))]


def one_process_run():
    """{name: value} of the MLP after every step of global_batches() on one device."""
    main, startup, loss, _ = mlp_program()
    exe, scope = pd.Executor(), pd.Scope()
    exe.run(startup, scope=scope)
    for x, y in global_batches():
        exe.run(main, feed={"x": x, "y": y}, fetch_list=[loss], scope=scope)
    return {p.name: np.asarray(scope.get(p.name)) for p in main.all_parameters()}


@pytest.mark.slow     # ~15 s: two processes joining a run; the one-process promises run in CI
def test_two_processes_save_in_the_background_while_they_train(tmp_path):
    port = free_port()
    results = finish([start(WORKER, port, i, tmp_path, devices=2) for i in (0, 1)])
    for i, (code, out) in enumerate(results):
        assert code == 0, f"process {i} failed:\n{out}"
    main = mlp_program()[0]
    saved = [np.load(tmp_path / f"process-{i}.npz") for i in (0, 1)]
    at_save = {k.split("/", 1)[1]: saved[0][k] for k in saved[0].files if k.startswith("at_")}
    assert sorted(at_save) == sorted(io.persistable_vars(main))
    for name, value in at_save.items():
        np.testing.assert_array_equal(saved[1]["at_save/" + name], value, err_msg=name)
    whole = io.read_checkpoint(tmp_path / "ck.safetensors")
    shards = dist.multihost.read_checkpoint_shards(tmp_path / "shards")
    for found in (whole, shards):
        assert sorted(found) == sorted(at_save)
        for name, value in at_save.items():
            assert found[name].dtype == value.dtype, name
            np.testing.assert_array_equal(found[name], value, err_msg=name)
    alone = one_process_run()
    for name, value in alone.items():
        for i in (0, 1):
            np.testing.assert_allclose(saved[i]["after/" + name], value, rtol=1e-5, atol=1e-5,
                                       err_msg=name)
    reports = [(tmp_path / f"process-{i}.txt").read_text().splitlines() for i in (0, 1)]
    assert [r[0] for r in reports] == ["[False, False]"] * 2   # steps ran during the writes
    assert reports[0][1].startswith("SaveError: process 1 could not write its part of "
                                    "checkpoint shards 'shards-failed'"), reports[0]
    assert reports[1][1].startswith("SaveError: cannot save") and "No space left" in \
        reports[1][1], reports[1]
    assert os.listdir(tmp_path / "shards-failed") == ["shard-00000-of-00002.safetensors"]
