"""Data and tensor parallel across two processes: a 2x2 mesh over the 2 CPU devices of each
of two processes (process i holds row i of the data axis and both devices of "model"),
each feeding its half of every batch, trains like one device in one process."""
import textwrap

import numpy as np
import pytest

from test_multihost import finish, free_port, start
from test_tensor_parallel_devices import _build, _mlp, _mlp_feeds, _run

STEPS = 3

WORKER = ["-c", textwrap.dedent("""
    import os, sys
    sys.path.insert(0, os.path.join(os.getcwd(), "tests"))
    import numpy as np
    import progdesc as pd
    from progdesc import distributed as dist
    port, rank, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    dist.initialize(f"127.0.0.1:{port}", 2, rank, timeout=60)
    from test_tensor_parallel_devices import _build, _mlp, _mlp_feeds
    main, startup, x, label, loss = _build(_mlp, data_parallel=True)
    mesh = dist.Mesh({"data": 2, "model": 2})
    exe, scope = pd.Executor(mesh=mesh), pd.Scope()
    exe.run(startup, scope=scope)
    rows, losses = slice(rank * 4, rank * 4 + 4), []
    for feed in _mlp_feeds(%d):
        feed = {k: dist.global_batch(v[rows], mesh) for k, v in feed.items()}
        lost, = exe.run(main, feed=feed, fetch_list=[loss], scope=scope, return_numpy=False)
        losses.append(dist.to_host(lost))
    params = {p.name: dist.to_host(scope.get(p.name)) for p in main.all_parameters()}
    np.savez(os.path.join(out, f"process-{rank}.npz"), losses=np.array(losses), **params)
""" % STEPS)]


@pytest.mark.slow
def test_two_processes_on_a_2x2_mesh_train_like_one_device(tmp_path):
    port = free_port()
    results = finish([start(WORKER, port, i, tmp_path, devices=2) for i in (0, 1)])
    for i, (code, out) in enumerate(results):
        assert code == 0, f"process {i} failed:\n{out}"
    main, startup, _, _, loss = _build(_mlp, data_parallel=True)
    losses, want, _ = _run(main, startup, _mlp_feeds(STEPS), loss)
    first, second = (np.load(tmp_path / f"process-{i}.npz") for i in (0, 1))
    for key in first.files:
        np.testing.assert_array_equal(first[key], second[key], err_msg=key)
    np.testing.assert_allclose(first["losses"], losses, rtol=1e-5)
    for p in main.all_parameters():
        np.testing.assert_allclose(first[p.name], want[p.name], rtol=1e-5, atol=1e-5,
                                   err_msg=p.name)
