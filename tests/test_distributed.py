"""progdesc.distributed on one device: sharding annotations in the description, the
data-parallel pass, the c_allreduce op outside a mesh, Mesh and Executor(mesh=) arguments.
What needs four devices is in test_distributed_devices.py."""
import numpy as np
import pytest

import progdesc as pd
from lowering import progdesc_pb2 as pb
from progdesc import ParamAttr, layers, ops
from progdesc.distributed import Mesh, data_parallel, shard, sharding_of
from progdesc.optimizer import Adam


def _mlp(w_attr=None, b_attr=None, dp=False, optimizer=True):
    main, startup = pd.Program(random_seed=1), pd.Program(random_seed=1)
    with pd.program_guard(main, startup):
        x = pd.data("x", [-1, 8])
        label = pd.data("label", [-1, 1], "int64")
        h = layers.fc(x, 16, act="relu", param_attr=w_attr, bias_attr=b_attr)
        loss = ops.mean(layers.softmax_with_cross_entropy(layers.fc(h, 4), label))
        if optimizer:
            Adam(1e-2).minimize(loss, data_parallel=dp)
        else:
            pd.append_backward(loss)
    return main, startup, x, label, loss


# --- annotations in the description ---

def test_param_attr_sharding_is_in_both_programs_and_optimizer_state_follows():
    main, startup, *_ = _mlp(ParamAttr(sharding=("data", None)), ParamAttr(sharding=()))
    for program in (main, startup):
        assert sharding_of(program.global_block().var("fc_0.w_0").desc) == ("data", None)
        assert sharding_of(program.global_block().var("fc_0.b_0").desc) == ()   # replicated
        assert sharding_of(program.global_block().var("fc_1.w_0").desc) is None  # unset
    for suffix in ("moment1", "moment2"):
        for program in (main, startup):
            var = program.global_block().var(f"fc_0.w_0.{suffix}")
            assert sharding_of(var.desc) == ("data", None)
    text = str(main)
    assert "param fc_0.w_0: float32[8, 16] sharding=[data, -]" in text
    assert "param fc_0.b_0: float32[16] sharding=replicated" in text
    assert "state fc_0.w_0.moment1: float32[8, 16] sharding=[data, -]" in text
    assert "param fc_1.w_0: float32[16, 4]\n" in text


def test_annotations_survive_bytes_and_files(tmp_path):
    main, *_ = _mlp(ParamAttr(sharding=(None, "model")))
    again = pd.Program.from_bytes(main.to_bytes())
    assert sharding_of(again.global_block().var("fc_0.w_0").desc) == (None, "model")
    path = str(tmp_path / "prog.pb")
    pd.io.save_program(main, path)
    loaded = pd.io.load_program(path)
    assert sharding_of(loaded.global_block().var("fc_0.w_0").desc) == (None, "model")
    assert sharding_of(loaded.global_block().var("fc_0.b_0").desc) is None


def test_descriptions_from_before_the_field_read_as_unset():
    # a VarDesc as the schema without `sharding` wrote it: name, kind, dtype, dims, persistable
    old = b'\n\x01w\x10\x01\x18\t"\x02\x08\x10(\x01'
    desc = pb.VarDesc.FromString(old)
    assert list(desc.dims) == [8, 16] and desc.persistable
    assert sharding_of(desc) is None
    # and an unannotated variable still writes exactly those bytes
    assert pb.VarDesc(name="w", kind=pb.DENSE_TENSOR, dtype=pb.FLOAT32, dims=[8, 16],
                      persistable=True).SerializeToString() == old


def test_a_spec_that_does_not_fit_the_rank_is_refused_before_anything_is_added():
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [-1, 8])
        before = main.to_bytes(), startup.to_bytes()
        with pytest.raises(pd.ProgramError, match="has 1 entries, the variable has 2 dims") as e:
            layers.fc(x, 4, param_attr=ParamAttr(name="w", sharding=("data",)))
    assert e.value.var == "w"
    assert (main.to_bytes(), startup.to_bytes()) == before
    with pytest.raises(pd.ProgramError, match="mesh axis names or None"):
        shard(x, (3, None))


def test_shard_annotates_a_variable_in_main_and_startup():
    main, startup, *_ = _mlp()
    with pd.program_guard(main, startup):
        shard(main.global_block().var("fc_1.w_0"), (None, "model"))
    for program in (main, startup):
        assert sharding_of(program.global_block().var("fc_1.w_0").desc) == (None, "model")
    with pd.program_guard(main, startup):
        shard(main.global_block().var("fc_1.w_0"), None)
    assert sharding_of(main.global_block().var("fc_1.w_0").desc) is None


# --- the data-parallel pass ---

def _ops(program):
    return [(op.type, str(op.inputs), str(op.outputs), str(sorted(op.attrs.items())), op.role)
            for op in program.global_block().desc.ops]


def test_minimize_data_parallel_all_reduces_each_gradient_between_backward_and_updates():
    main, *_ = _mlp(dp=True)
    ops_ = main.global_block().desc.ops
    reduced = [i for i, op in enumerate(ops_) if op.type == "c_allreduce"]
    params = [p.name for p in main.all_parameters()]
    assert sorted(ops_[i].inputs[0].arguments[0] for i in reduced) == sorted(
        f"{p}@GRAD" for p in params)
    for i in reduced:   # in place, averaging over the data axis
        op = ops_[i]
        assert op.inputs[0].arguments == op.outputs[0].arguments
        assert (op.attrs["reduce_type"].s, op.attrs["axis_name"].s) == ("mean", "data")
    last_backward = max(i for i, op in enumerate(ops_)
                        if op.role == pb.BACKWARD and op.type != "c_allreduce")
    first_update = min(i for i, op in enumerate(ops_) if op.role == pb.OPTIMIZE)
    assert reduced == list(range(last_backward + 1, first_update))
    assert "= c_allreduce(X=fc_0.w_0@GRAD)" in str(main)


def test_the_pass_on_its_own_does_what_minimize_does():
    want, *_ = _mlp(dp=True)
    main, *_ = _mlp()
    assert data_parallel(main) == [f"{p.name}@GRAD" for p in main.all_parameters()]
    assert _ops(main) == _ops(want)
    with pytest.raises(pd.ProgramError, match="already all-reduced"):
        data_parallel(main)
    assert _ops(main) == _ops(want)
    only_backward, *_ = _mlp(optimizer=False)
    data_parallel(only_backward, axis_name="batch")
    assert {op.attrs["axis_name"].s for op in only_backward.global_block().desc.ops
            if op.type == "c_allreduce"} == {"batch"}


def test_the_pass_needs_gradients():
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        layers.fc(pd.data("x", [-1, 8]), 4)
    with pytest.raises(pd.ProgramError, match="computes no parameter gradient"):
        data_parallel(main)


def _train(program, startup, x, label, loss, mesh=None, steps=3):
    rng = np.random.default_rng(0)
    bx, by = rng.normal(size=(8, 8)).astype("float32"), rng.integers(0, 4, (8, 1))
    exe, scope = pd.Executor(mesh=mesh), pd.Scope()
    exe.run(startup, scope=scope)
    losses = [exe.run(program, feed={x: bx, label: by}, fetch_list=[loss], scope=scope)[0]
              for _ in range(steps)]
    return losses, {p.name: np.asarray(scope.get(p.name)) for p in program.all_parameters()}


def test_a_data_parallel_program_runs_unchanged_on_one_device():
    want_losses, want = _train(*_mlp())
    losses, got = _train(*_mlp(dp=True))   # no mesh: each c_allreduce is the identity
    np.testing.assert_array_equal(losses, want_losses)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


def test_a_one_device_mesh_gives_the_one_device_results():
    want_losses, want = _train(*_mlp())
    losses, got = _train(*_mlp(dp=True), mesh=Mesh({"data": 1}))
    np.testing.assert_allclose(losses, want_losses, rtol=1e-6)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-7)


# --- the op and the mesh ---

def test_c_allreduce_max_has_no_gradient():
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        w = pd.create_parameter([2, 3], attr="w")
        y = main.global_block().append_op("c_allreduce", {"X": w}, None,
                                          {"reduce_type": "max"}).output("Out")[0]
        with pytest.raises(pd.BackwardError, match="reduce_type 'max' has no gradient"):
            pd.append_backward(ops.mean(main.global_block().var(y)))


def test_c_allreduce_refuses_an_unknown_reduction():
    main = pd.Program()
    x = main.global_block().create_var("x", [3])
    with pytest.raises(pd.AttributeValueError,
                       match="reduce_type='prod' must be one of 'sum', 'mean', 'max', 'min'"):
        main.global_block().append_op("c_allreduce", {"X": x}, attrs={"reduce_type": "prod"})


def test_mesh_and_executor_arguments():
    mesh = Mesh({"data": 1})
    assert (mesh.size, mesh.data_size, mesh.axes) == (1, 1, {"data": 1})
    assert Mesh({"model": 1}).data_size == 1
    with pytest.raises(ValueError, match="xla_force_host_platform_device_count=1024"):
        Mesh({"data": 1024})
    with pytest.raises(ValueError, match="positive int size"):
        Mesh({"data": 0})
    with pytest.raises(pd.DistributedError, match="a device or a mesh, not both"):
        pd.Executor(device="cpu", mesh=mesh)
    with pytest.raises(pd.DistributedError, match="check_numerics runs op by op on one device"):
        pd.Executor(mesh=mesh, check_numerics=True)


def test_batch_norm_layer_sets_sync_axis():
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        layers.batch_norm(pd.data("x", [-1, 3, 4, 4]), sync_axis="data")
        layers.batch_norm(pd.data("y", [-1, 3, 4, 4]))
    first, second = [op for op in main.global_block().ops if op.type == "batch_norm"]
    assert first.attr("sync_axis") == "data" and second.attr("sync_axis") == ""
    assert "sync_axis='data'" in str(main)
