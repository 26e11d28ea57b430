"""More than one device: a mesh, sharding annotations, the data-parallel pass.

    mesh = progdesc.distributed.Mesh({"data": 4})
    optimizer.minimize(loss, data_parallel=True)      # all-reduce ops on the gradients
    exe = progdesc.Executor(mesh=mesh)
    exe.run(startup); exe.run(main, feed={...}, fetch_list=[loss])

See progdesc/distributed/run.py for how each mode runs and the rule for feeds and fetches.
"""
from progdesc.distributed.data_parallel import all_reduce_gradients, data_parallel
from progdesc.distributed.mesh import Mesh
from progdesc.distributed.sharding import shard, sharding_of

__all__ = ["Mesh", "data_parallel", "all_reduce_gradients", "shard", "sharding_of"]
