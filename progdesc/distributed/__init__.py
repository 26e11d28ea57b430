"""More than one device: a mesh, sharding annotations, the data-parallel pass; and more
than one process (progdesc/distributed/multihost.py).

    mesh = progdesc.distributed.Mesh({"data": 4})
    optimizer.minimize(loss, data_parallel=True)      # all-reduce ops on the gradients
    # accumulate_steps=k: one update every k runs (progdesc/distributed/accumulate.py)
    exe = progdesc.Executor(mesh=mesh)
    exe.run(startup); exe.run(main, feed={...}, fetch_list=[loss])

Tensor parallel layers (`layers.fc(..., tensor_parallel="column")` and the others, on a
mesh with a "model" axis, e.g. `Mesh({"data": 2, "model": 2})`):
progdesc/distributed/tensor_parallel.py.

See progdesc/distributed/run.py for how each mode runs and the rule for feeds and fetches,
and progdesc/distributed/pipeline/ for pipeline parallelism (`pipeline_stage`, `pipeline`).
"""
from progdesc.distributed.accumulate import accumulate_gradients
from progdesc.distributed.data_parallel import all_reduce_gradients, data_parallel
from progdesc.distributed.mesh import Mesh
from progdesc.distributed.multihost import (global_batch, initialize, load_checkpoint_shards,
                                            save_checkpoint, save_checkpoint_shards, to_host)
from progdesc.distributed.pipeline import pipeline, pipeline_stage
from progdesc.distributed.resume import checkpoint_path, latest_checkpoint, restart_count
from progdesc.distributed.sharding import shard, sharding_of

__all__ = ["Mesh", "data_parallel", "all_reduce_gradients", "shard", "sharding_of",
           "initialize", "global_batch", "to_host", "save_checkpoint", "save_checkpoint_shards",
           "load_checkpoint_shards", "restart_count", "checkpoint_path", "latest_checkpoint",
           "pipeline", "pipeline_stage", "accumulate_gradients"]
