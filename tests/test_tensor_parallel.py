"""Tensor-parallel layers on one device: the program they build, its errors, and that
without a mesh it is the plain model (the collectives are the identity). On a 2x2 mesh:
tests/test_tensor_parallel_devices.py."""
import numpy as np
import pytest

import progdesc as pd
from bench import workloads as W
from progdesc import ParamAttr, io, layers, ops
from progdesc.distributed import sharding_of

SPEC = W.Spec("transformer", 8, (6, 16), extra=dict(layers=1, heads=4, ffn=32))


def _train(tensor_parallel, steps=2):
    main, startup, x, label, loss = W.build_progdesc(SPEC, tensor_parallel=tensor_parallel)
    exe, scope = pd.Executor(), pd.Scope()
    exe.run(startup, scope=scope)
    losses = [float(exe.run(main, feed={x: bx, label: by}, fetch_list=[loss], scope=scope)[0])
              for bx, by in W.make_batches(SPEC, steps, batch=8)]
    return losses, {p.name: np.asarray(scope.get(p.name)) for p in main.all_parameters()}


@pytest.mark.slow   # in CI: the forward of every split layer, below
def test_without_a_mesh_the_tensor_parallel_transformer_is_the_plain_one():
    # the plain bench transformer is checked against Flax + optax in test_training.py
    plain_losses, plain = _train(False)
    losses, params = _train(True)
    assert params.keys() == plain.keys()
    np.testing.assert_allclose(losses, plain_losses, rtol=1e-6)
    for name in plain:
        # a key bias's exact gradient is zero (softmax cancels it): Adam scales the rounding
        # noise in its place, which differs between two compilations, to steps of up to lr
        atol = 3 * W.ADAM_LR if ".attn.key.b_0" in name else 1e-6
        np.testing.assert_allclose(params[name], plain[name], atol=atol, err_msg=name)


def _every_split_layer(tensor_parallel):
    """A forward of every tensor-parallel layer, split or not (same names, same seeds)."""
    main, startup = pd.Program(random_seed=3), pd.Program(random_seed=3)
    with pd.program_guard(main, startup):
        ids = pd.data("ids", [-1, 4], "int64")
        h = layers.embedding(ids, [10, 8], tensor_parallel="vocab" if tensor_parallel else None)
        h = layers.multi_head_attention(h, num_heads=2, tensor_parallel=tensor_parallel)
        h = layers.fc(h, 6, num_flatten_dims=2, act="relu",
                      tensor_parallel="column" if tensor_parallel else None)
        h = layers.fc(h, 8, num_flatten_dims=2, tensor_parallel="row" if tensor_parallel else None)
        h = ops.add(h, layers.embedding(ids, [10, 8],
                                        tensor_parallel="hidden" if tensor_parallel else None))
    return main, startup, h


def test_without_a_mesh_every_split_layer_computes_the_plain_one():
    ids = np.random.default_rng(0).integers(0, 10, (3, 4))
    outs = []
    for tensor_parallel in (False, True):
        main, startup, h = _every_split_layer(tensor_parallel)
        exe, scope = pd.Executor(), pd.Scope()
        exe.run(startup, scope=scope)
        outs.append(exe.run(main, feed={"ids": ids}, fetch_list=[h], scope=scope)[0])
    assert np.abs(outs[0]).max() > 0.1
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-6, atol=1e-6)


def _ops(program):
    return [op.type for op in program.global_block().desc.ops]


def test_the_layers_record_their_split_and_collectives_in_the_program():
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        ids = pd.data("ids", [-1, 4], "int64")
        h = layers.embedding(ids, [10, 8], tensor_parallel="vocab")
        h = layers.multi_head_attention(h, num_heads=2, tensor_parallel=True)
        h = layers.fc(h, 6, num_flatten_dims=2, tensor_parallel="column")
        h = layers.fc(h, 8, num_flatten_dims=2, tensor_parallel="row")
        layers.embedding(ids, [10, 8], tensor_parallel="hidden")
    assert _ops(main) == [
        "c_embedding", "mp_allreduce_sum",                            # vocab-split lookup
        "c_identity",                                                 # q, k, v: one entry
        "matmul", "add", "reshape", "matmul", "add", "reshape", "matmul", "add", "reshape",
        "scaled_dot_product_attention", "reshape",
        "matmul", "mp_allreduce_sum", "add",                          # output projection
        "c_identity", "matmul", "add",                                # column fc
        "matmul", "mp_allreduce_sum", "add",                          # row fc
        "lookup_table", "c_concat"]                                   # hidden-split lookup
    specs = {p.name: sharding_of(p.desc) for p in main.all_parameters()}
    assert specs == {
        "embedding_0.w_0": ("model", None),
        **{f"multi_head_attention_0.{t}.w_0": (None, "model") for t in ("query", "key", "value")},
        **{f"multi_head_attention_0.{t}.b_0": ("model",) for t in ("query", "key", "value")},
        "multi_head_attention_0.output.w_0": ("model", None),
        "multi_head_attention_0.output.b_0": None,
        "fc_0.w_0": (None, "model"), "fc_0.b_0": ("model",),
        "fc_1.w_0": ("model", None), "fc_1.b_0": None,
        "embedding_1.w_0": (None, "model")}
    # the startup program lays the parameters out alike
    assert sharding_of(startup.global_block().var("fc_0.w_0").desc) == (None, "model")
    assert "= c_identity(" in str(main) and "sharding=[model, -]" in str(main)


def test_the_collectives_are_ops_of_the_saved_program(tmp_path):
    # the transformer of tests/test_tensor_parallel_devices.py: 2 layers
    main = W.build_progdesc(W.Spec("transformer", 8, (6, 16), extra=dict(layers=2, heads=4,
                                                                          ffn=32)),
                            tensor_parallel=True, data_parallel=True)[0]
    types = [op.type for op in main.global_block().desc.ops]
    # per layer: attention enters once (q, k, v share it), ffn1 once, and the row layers sum
    # twice; each one's gradient is the other, but for the fed x, which needs none
    assert types.count("c_identity") == 2 * 2 * 2
    assert types.count("mp_allreduce_sum") == 2 * 2 * 2 - 1
    # and one data-parallel mean per parameter gradient
    assert types.count("c_allreduce") == len(main.all_parameters())
    printed = str(main)
    assert "c_identity(" in printed and "mp_allreduce_sum(" in printed
    assert "sharding=[-, model]" in printed and "sharding=[model, -]" in printed
    path = str(tmp_path / "main.pdmodel")
    io.save_program(main, path)
    loaded = io.load_program(path)
    assert [op.type for op in loaded.global_block().desc.ops] == types
    assert [(op.type, op.attrs["axis_name"].s) for op in loaded.global_block().desc.ops
            if "axis_name" in op.attrs] == \
        [(op.type, op.attrs["axis_name"].s) for op in main.global_block().desc.ops
         if "axis_name" in op.attrs]
    assert {v.name: sharding_of(v.desc) for v in loaded.list_vars()} == \
        {v.name: sharding_of(v.desc) for v in main.list_vars()}


@pytest.mark.parametrize("build, match", [
    (lambda x, ids: layers.fc(x, 4, tensor_parallel="col"),
     "fc's tensor_parallel must be one of 'column', 'row' or None, got 'col'"),
    (lambda x, ids: layers.embedding(ids, [10, 4], tensor_parallel="column"),
     "embedding's tensor_parallel must be one of 'vocab', 'hidden' or None"),
    (lambda x, ids: layers.multi_head_attention(x, num_heads=2, tensor_parallel="column"),
     "multi_head_attention's tensor_parallel is True or False, got 'column'"),
    (lambda x, ids: layers.fc(x, 4, num_flatten_dims=1, tensor_parallel="row"),
     "a row-parallel fc takes the split features of a column-parallel one in its last dim"),
    (lambda x, ids: layers.fc(x, 4, num_flatten_dims=2, act="softmax", tensor_parallel="column"),
     "a column-parallel fc holds a slice of its output features on each device, but "
     "act='softmax' works across the features"),
    (lambda x, ids: layers.embedding(ids, [10, 4], padding_idx=0, tensor_parallel="vocab"),
     "a vocab-parallel embedding takes no padding_idx"),
    (lambda x, ids: layers.fc(x, 4, param_attr=ParamAttr(sharding=("model", None)),
                              tensor_parallel="column"),
     r"tensor_parallel lays the parameter out as \(None, 'model'\), but its ParamAttr asks "
     r"for sharding \('model', None\)"),
])
def test_a_bad_tensor_parallel_argument_is_an_error_naming_it(build, match):
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [-1, 3, 4])
        ids = pd.data("ids", [-1, 4], "int64")
        before = _ops(main)
        with pytest.raises(pd.ProgramError, match=match) as info:
            build(x, ids)
        assert info.value.callsite and "test_tensor_parallel.py" in info.value.callsite
        assert _ops(main) == before and not main.all_parameters()
