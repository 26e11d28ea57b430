"""Pipeline parallel on one device: the stages, transfers and schedule in the program, the
pass's errors, the schedules' tick tables. (Runs on 2 and 4 devices:
tests/test_pipeline_devices.py.)"""
import contextlib

import numpy as np
import pytest

import progdesc as pd
from lowering.errors import ProgramError
from progdesc import distributed as dist
from progdesc import layers, ops
from progdesc.distributed.pipeline.schedule import bubble_fraction, in_flight, ticks
from progdesc.optimizer import Adam


def _model(stages=(0, 1, 1), piped=True, micro_batches=2, schedule="gpipe"):
    main, startup = pd.Program(random_seed=5), pd.Program(random_seed=5)
    with pd.program_guard(main, startup):
        x = pd.data("x", [-1, 6])
        y = pd.data("y", [-1, 1])
        h = x
        for k, stage in enumerate(stages):
            with dist.pipeline_stage(stage) if piped else contextlib.nullcontext():
                h = layers.fc(h, 8 if k < len(stages) - 1 else 1,
                              act="tanh" if k < len(stages) - 1 else None)
        loss = ops.mean(ops.square(h - y))     # unmarked: the stage of what it reads
        if piped:
            dist.pipeline(main, micro_batches, schedule)
        Adam(1e-2).minimize(loss)
    return main, startup, loss


def test_stages_transfers_and_schedule_are_in_the_program_and_survive_save_load(tmp_path):
    main, startup, _ = _model()
    # the initializers are not marked: the startup program runs whole, on a mesh too
    assert startup.global_block().ops and not any(
        "@pipeline_stage" in op.desc.attrs for op in startup.global_block().ops)
    text = str(main)
    assert "pipeline_schedule() {stages=2, micro_batches=2}" in text
    ops_ = main.global_block().ops
    (send,) = [op for op in ops_ if op.type == "c_ppermute" and op.desc.role == 0]
    (back,) = [op for op in ops_ if op.type == "c_ppermute" and op.desc.role != 0]
    assert send.attr("shift") == 1 and back.attr("shift") == -1
    # stage 1 reads stage 0's activation under the name the transfer writes
    assert send.input("X") == ["fc_0.out"] and send.output("Out") == ["fc_0.out@STAGE1"]
    assert back.input("X") == ["fc_0.out@STAGE1@GRAD"] and back.output("Out") == \
        ["fc_0.out@GRAD"]
    stage = {op.desc.outputs[0].arguments[0]: op.desc.attrs["@pipeline_stage"].i
             for op in ops_ if "@pipeline_stage" in op.desc.attrs}
    assert stage["fc_0.out"] == 0 and stage["fc_1.out"] == 1 and stage["fc_2.out"] == 1
    assert stage[next(op.output("Out")[0] for op in ops_ if op.type == "mean")] == 1
    path = str(tmp_path / "prog.pdmodel")
    pd.io.save_program(main, path)
    loaded = pd.io.load_program(path)
    assert str(loaded) == text
    assert [op.desc.attrs["@pipeline_stage"].i for op in loaded.global_block().ops
            if "@pipeline_stage" in op.desc.attrs] == \
        [op.desc.attrs["@pipeline_stage"].i for op in ops_ if "@pipeline_stage" in op.desc.attrs]


def test_a_pipeline_program_runs_whole_on_one_device_as_the_plain_program_does():
    rng = np.random.default_rng(0)
    feed = {"x": rng.normal(size=(8, 6)).astype("f"), "y": rng.normal(size=(8, 1)).astype("f")}
    results = []
    for piped in (False, True):
        main, startup, loss = _model(piped=piped)
        scope = pd.Scope()
        exe = pd.Executor()
        exe.run(startup, scope=scope)
        losses = [exe.run(main, feed=feed, fetch_list=[loss], scope=scope)[0]
                  for _ in range(2)]
        results.append((losses, np.asarray(scope.get("fc_0.w_0"))))
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_array_equal(results[0][1], results[1][1])


def _forward_only(stages, shared_param=False):
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [-1, 4])
        h = x
        for k, stage in enumerate(stages):
            with dist.pipeline_stage(stage):
                if shared_param and k:   # tied weights: stage 0's parameter again
                    h = ops.matmul(h, main.global_block().var("fc_0.w_0"))
                else:
                    h = layers.fc(h, 4, bias_attr=False)
        loss = ops.mean(h)
    return main, loss


@pytest.mark.parametrize("stages,shared,match", [
    ((1, 0), False, "stage 0 reads a value of stage 1"),
    ((0, 2), False, "stage 1 has no op"),
    ((0, 1), True, "read by pipeline stages 0 and 1"),
])
def test_the_pass_refuses_programs_it_cannot_split_and_leaves_them_as_they_were(
        stages, shared, match):
    main, _ = _forward_only(stages, shared)
    before = main.desc.SerializeToString()
    with pytest.raises(ProgramError, match=match) as e:
        dist.pipeline(main, 2)
    assert e.value.op_type is not None or "has no op" in match
    assert main.desc.SerializeToString() == before


def test_the_pass_comes_before_minimize_and_once():
    main, loss = _forward_only((0, 1))
    dist.pipeline(main, 2)
    with pytest.raises(ProgramError, match="a pipeline already"):
        dist.pipeline(main, 2)
    main, loss = _forward_only((0, 1))
    with pd.program_guard(main, pd.Program()):
        Adam(0.1).minimize(loss)
    with pytest.raises(ProgramError, match="before minimize"):
        dist.pipeline(main, 2)
    with pytest.raises(ValueError, match="micro_batches"):
        dist.pipeline(_forward_only((0, 1))[0], 0)
    with pytest.raises(ValueError, match="schedule"):
        dist.pipeline(_forward_only((0, 1))[0], 2, schedule="interleaved")
    with pytest.raises(ValueError, match="stage"):
        with dist.pipeline_stage(-1):
            pass


def _check_table(table, stages, micro_batches):
    """Every (stage, kind, micro-batch) runs once, after what it depends on."""
    when = {}
    for t, tick in enumerate(table):
        assert len({s for s, _, _ in tick}) == len(tick)     # a stage does one thing a tick
        for work in tick:
            assert work not in when
            when[work] = t
    assert set(when) == {(s, k, i) for s in range(stages) for k in "FB"
                         for i in range(micro_batches)}
    for (s, kind, i), t in when.items():
        if kind == "F" and s > 0:
            assert when[s - 1, "F", i] < t
        if kind == "B":
            assert when[s, "F", i] < t
            if s < stages - 1:
                assert when[s + 1, "B", i] < t


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages,micro_batches", [(2, 4), (4, 8), (4, 2), (3, 5)])
def test_schedules_have_the_textbook_bubble_and_memory(schedule, stages, micro_batches):
    table = ticks(schedule, stages, micro_batches)
    _check_table(table, stages, micro_batches)
    assert len(table) == 2 * (micro_batches + stages - 1)
    np.testing.assert_allclose(bubble_fraction(table, stages),
                               (stages - 1) / (micro_batches + stages - 1))
    held = in_flight(table, stages)
    if schedule == "gpipe":
        assert held == [micro_batches] * stages
    else:   # 1F1B: stage s keeps at most stages - s micro-batches' activations
        assert held == [min(stages - s, micro_batches) for s in range(stages)]
