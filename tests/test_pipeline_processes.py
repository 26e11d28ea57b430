"""Pipelines across two processes: 2 stages over 2 processes of 1 CPU device each, and 4
stages over 2 processes of 2 devices each (stages 0-1 in process 0, 2-3 in process 1),
every process feeding the whole batch, train like one device in one process: the same
per-step losses and last fetches in both processes, and the checkpoint
`dist.save_checkpoint` gathers (each stage's state from its own process), as the shards
`dist.save_checkpoint_shards` writes (each process its own stages'), holds the one-device
run's parameters and optimizer state.
"""
import textwrap

import numpy as np
import pytest

import progdesc as pd
from progdesc.distributed import multihost
from test_multihost import finish, free_port, start
from test_pipeline_devices import _NOISE, _mlp, _train

STEPS = 3

WORKER = ["-c", textwrap.dedent("""
    import os, sys
    sys.path.insert(0, os.path.join(os.getcwd(), "tests"))
    import numpy as np
    import jax
    import progdesc as pd
    from progdesc import distributed as dist
    port, rank, out, stages, schedule = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3],
                                         int(sys.argv[4]), sys.argv[5])
    dist.initialize(f"127.0.0.1:{port}", 2, rank, timeout=60)
    from test_pipeline_devices import _batch, _build, _mlp
    main, startup, x, label, loss, (logits, correct) = _build(_mlp, stages, schedule=schedule)
    exe, scope = pd.Executor(mesh=dist.Mesh({"pipe": stages})), pd.Scope()
    # in every process, the same values: without a mesh, or on it (replicated)
    (exe if stages == 4 else pd.Executor()).run(startup, scope=scope)
    bx, by = _batch(_mlp)
    try:   # a global array of each process's rows is refused: every process feeds it all
        ends = dist.Mesh({"data": 2}, devices=[jax.devices()[0], jax.devices()[-1]])
        rows = dist.global_batch(bx[rank * 8:rank * 8 + 8], ends)
        exe.run(main, feed={x: rows, label: by}, fetch_list=[loss], scope=scope)
    except pd.FeedError as e:
        assert e.var == "x" and "whole batch in every process" in str(e), e
    else:
        raise AssertionError("a global batch was fed to a pipeline")
    losses = []
    for step in range(%d):
        lost, lg, c = exe.run(main, feed={x: bx, label: by}, fetch_list=[loss, logits, correct],
                              scope=scope)
        losses.append(lost)
        if step == 0:   # a checkpoint mid-run, then training goes on
            dist.save_checkpoint(os.path.join(out, f"first-{stages}.safetensors"), main, scope)
    dist.save_checkpoint(os.path.join(out, f"last-{stages}.safetensors"), main, scope)
    dist.save_checkpoint_shards(os.path.join(out, f"shards-{stages}"), main, scope)
    mine = sorted(n for n in (p.name for p in main.all_parameters())
                  if scope.get(n).is_fully_addressable)
    np.savez(os.path.join(out, f"process-{rank}.npz"), losses=np.array(losses), logits=lg,
             correct=c, mine=np.array(mine))
""" % STEPS)]


def _one_device_run(steps):
    return _train(_mlp, steps=steps, fetch_extra=True)


def _checkpoint(path, program):
    scope = pd.Scope()
    pd.io.load_checkpoint(str(path), program, scope)
    return {n: np.asarray(scope.get(n)) for n in scope.local_var_names()}


@pytest.mark.slow
@pytest.mark.parametrize("stages,devices,schedule", [(2, 1, "1f1b"), (4, 2, "gpipe")])
def test_a_pipeline_over_two_processes_trains_like_one_device(tmp_path, stages, devices,
                                                              schedule):
    port = free_port()
    results = finish([start(WORKER, port, i, tmp_path, stages, schedule, devices=devices)
                      for i in (0, 1)])
    for i, (code, out) in enumerate(results):
        assert code == 0, f"process {i} failed:\n{out}"
    want, want_losses, (logits, correct), main, _ = _one_device_run(STEPS)
    after_one, *_ = _one_device_run(1)
    first, second = (np.load(tmp_path / f"process-{i}.npz") for i in (0, 1))
    for got in (first, second):   # fetched values come back whole in every process
        np.testing.assert_allclose(got["losses"], want_losses, rtol=1e-5)
        np.testing.assert_allclose(got["logits"], logits, atol=1e-5)
        assert got["correct"] == correct
    # each process holds its own stages' parameters only
    assert set(first["mine"]).isdisjoint(second["mine"])
    assert len(first["mine"]) + len(second["mine"]) == len(main.all_parameters())
    assert {"fc_0.w_0", "fc_3.w_0"} <= {*first["mine"], *second["mine"]}
    assert "fc_0.w_0" in first["mine"] and "fc_3.w_0" in second["mine"]
    shards = multihost.read_checkpoint_shards(tmp_path / f"shards-{stages}")
    for name, reference in (("first", after_one), ("last", want), ("shards", want)):
        saved = shards if name == "shards" else \
            _checkpoint(tmp_path / f"{name}-{stages}.safetensors", main)
        assert saved.keys() == reference.keys()
        for n in reference:
            if not n.endswith(_NOISE):
                np.testing.assert_allclose(saved[n], reference[n], atol=1e-5, rtol=1e-5,
                                           err_msg=f"{name}: {n}")
