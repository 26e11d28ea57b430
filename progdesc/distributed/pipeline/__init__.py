"""Pipeline parallelism: stages marked in the program, micro-batches, transfers as ops.

    with dist.pipeline_stage(0): h = layers.fc(x, 256, act="relu")
    with dist.pipeline_stage(1): loss = ...
    dist.pipeline(main, micro_batches=4, schedule="1f1b")   # before minimize
    Adam(1e-3).minimize(loss)
    exe = pd.Executor(mesh=dist.Mesh({"pipe": 2}))

stages.py marks the stages and inserts the transfers (`c_ppermute`) and the
`pipeline_schedule` op; plan.py splits the program into what each stage runs;
schedule.py orders micro-batches (GPipe, 1F1B); driver.py runs it, one device per stage.
On one device (an Executor without a mesh) the same program runs whole, as one batch.
"""
from progdesc.distributed.pipeline.schedule import bubble_fraction, ticks
from progdesc.distributed.pipeline.stages import pipeline, pipeline_stage

__all__ = ["pipeline", "pipeline_stage", "ticks", "bubble_fraction"]
