"""pd.from_jax: JAX functions become programs whose outputs and compile-time gradients
equal the function's own (run by JAX) and `jax.grad` of it; feeds, parameters and
constants are named and placed as documented; unsupported primitives are reported
together with the lines that made them."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax import lax

import progdesc as pd
from source_lines import line_of


def _rand(*shape, seed=0, low=-1.0, high=1.0):
    return np.random.default_rng(seed).uniform(low, high, size=shape).astype(np.float32)


def elementwise(x, y):
    z = jnp.exp(x) * jnp.log(jnp.abs(y) + 1.0) - jnp.sqrt(jnp.abs(x) + 1.0) / (y ** 2 + 1.0)
    z = z + jnp.maximum(x, y) + jnp.minimum(x, 0.5) + lax.rsqrt(y * y + 1.0) + x ** 3
    return z + jnp.tanh(x) + jax.nn.sigmoid(y) + lax.erf(x) + lax.erfc(y) + jnp.clip(x, -0.5, 0.4)


def products(a, b, c):
    return jnp.einsum("bij,bjk->bik", a, b).sum(0) @ c, jnp.tensordot(a, b, ((1, 2), (2, 1)))


def shapes(x):
    parts = jnp.split(x, [1, 3], axis=1)
    y = jnp.concatenate([parts[2], parts[0] * 2.0], axis=1)
    return (y.T.reshape(-1)[None, 1:7:2], jnp.squeeze(x[:, :1]), jnp.broadcast_to(x[0], (2, 4)),
            jnp.expand_dims(x, 1).sum(axis=(0, 2)))


def selection(x, y):
    m = jnp.where(x > y, x, y * 2.0) + jnp.where(x <= 0.0, 1.0, x)
    i = jnp.argmax(x, axis=1)
    window = lax.dynamic_slice(y, (i[0], 0), (2, 3))
    updated = lax.dynamic_update_slice(x, window * 3.0, (1, i[1]))
    return (m + jnp.arange(4, dtype=jnp.float32), jnp.cumsum(x, axis=1), updated, i,
            *lax.top_k(x * y, 2))


def indexing(table, ids):
    rows = jnp.take(table, ids, axis=0)
    return (rows.sum(1) + table[ids[:, 0]], jnp.pad(table, ((1, 0), (2, 1)), constant_values=0.5),
            jnp.flip(table, 1), jnp.argmin(table, axis=0), table.at[ids[:, 1]].add(rows[:, 0]))


def convolution(x, w):
    y = lax.conv_general_dilated(x, w, (1, 1), ((1, 1), (0, 1)),
                                 dimension_numbers=("NHWC", "HWIO", "NHWC"))
    pooled = lax.reduce_window(y, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
    return lax.reduce_window(pooled, 0.0, lax.add, (1, 2, 1, 1), (1, 1, 1, 1), "SAME")


def calls(x):
    @jax.custom_vjp
    def double(v):
        return v * 2.0
    double.defvjp(lambda v: (v * 2.0, None), lambda _, g: (g * 2.0,))
    inner = jax.jit(lambda v: v * v)
    return (jax.checkpoint(inner)(x) + double(x) + jax.nn.relu(x) + jax.nn.gelu(x)
            + jax.nn.gelu(x, approximate=False) + jax.nn.log_softmax(x) + jax.nn.softmax(x)
            + jax.nn.silu(x))


def control_flow(x, k):
    y = lax.cond(x.sum() > 0, lambda v: v * 2.0, lambda v: jnp.sin(v), x)
    carry, ys = lax.scan(lambda c, a: (c * a + y[0], jnp.tanh(c) * a), jnp.ones(3), x)
    z = lax.switch(k, [lambda v: v, lambda v: v + 1.0, lambda v: v * v], ys)
    return carry, lax.fori_loop(0, 3, lambda i, v: v * 0.5 + z, z), z


def losses(logits, labels):
    xent = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    return (xent.mean() + jax.nn.logsumexp(logits, axis=0) + logits % 0.3,
            jnp.all(logits > -0.9, axis=1), jnp.floor(logits * 3.0))


def integers(x, n):
    return x * n.astype(jnp.float32), (n * 3 + 1) ** 2, n > 2


ZOO = {
    "elementwise": (elementwise, (_rand(3, 4), _rand(3, 4, seed=1))),
    "products": (products, (_rand(2, 3, 4), _rand(2, 4, 3, seed=1), _rand(3, 2, seed=2))),
    "shapes": (shapes, (_rand(3, 4),)),
    "selection": (selection, (_rand(3, 4), _rand(3, 4, seed=1))),
    "indexing": (indexing, (_rand(5, 3), np.array([[0, 4], [2, 2], [1, 3]], np.int32))),
    "convolution": (convolution, (_rand(2, 5, 6, 2), _rand(3, 2, 2, 3, seed=1))),
    "calls": (calls, (_rand(3, 4, low=-2, high=2),)),
    "control_flow": (control_flow, (_rand(4, 3), np.int32(2))),
    "losses": (losses, (_rand(3, 4), np.array([0, 3, 1], np.int32))),
    "integers": (integers, (_rand(2, 3), np.arange(6, dtype=np.int32).reshape(2, 3))),
}


# functions whose shapes need a fixed batch size (their leading dims differ, or a size of
# theirs is not one the ops can compute from the batch dim): imported at the example's
FIXED = {"products", "shapes", "selection", "indexing", "convolution"}


def _run(program, feeds, fetches, args, scope):
    return pd.Executor().run(program, feed=dict(zip(feeds, args)), fetch_list=fetches,
                             scope=scope)


def check_outputs(fn, args, polymorphic=True):
    """`fn(*args)` imported (polymorphic or not) gives what `jax.jit(fn)` gives."""
    scope = pd.Scope()
    program, feeds, fetches = pd.from_jax(fn, *args, scope=scope, batch_polymorphic=polymorphic)
    want = jax.tree_util.tree_leaves(jax.jit(fn)(*args))
    got = _run(program, feeds, fetches, args, scope)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def check_gradients(fn, args, polymorphic=True):
    """The gradients of the imported `fn`'s float outputs' sum w.r.t. its float arguments
    equal `jax.grad`'s."""
    scope = pd.Scope()
    program, feeds, fetches = pd.from_jax(fn, *args, scope=scope, batch_polymorphic=polymorphic)
    floats = [i for i, a in enumerate(args) if a.dtype.kind == "f"]
    targets = [f for f in fetches if f.dtype.startswith("float")]
    block = program.global_block()
    with pd.program_guard(program):
        total = pd.ops.sum([pd.ops.reduce_sum(t) for t in targets])
        grads = pd.gradients(total, [block.var(feeds[i]) for i in floats])

    def total_of(*float_args):
        full = list(args)
        for i, a in zip(floats, float_args):
            full[i] = a
        return sum(jnp.sum(o) for o in jax.tree_util.tree_leaves(fn(*full))
                   if jnp.issubdtype(o.dtype, jnp.floating))

    want = jax.jit(jax.grad(total_of, argnums=tuple(range(len(floats)))))(
        *[args[i] for i in floats])
    got = _run(program, feeds, grads, args, scope)
    assert len(got) == len(floats)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("case", ZOO)
def test_outputs_equal_the_function(case):
    check_outputs(*ZOO[case], polymorphic=case not in FIXED)


@pytest.mark.parametrize("case", ZOO)
def test_gradients_equal_jax_grad(case):
    check_gradients(*ZOO[case], polymorphic=case not in FIXED)


def test_a_while_loop_becomes_a_while_op():
    def fn(x, limit):
        return lax.while_loop(lambda v: v.sum() < limit, lambda v: v * 2.0 + 0.5, x)
    x = _rand(3, low=0.1, high=1.0)
    program, feeds, fetches = pd.from_jax(fn, x, np.float32(40.0), scope=pd.Scope())
    assert [op.type for op in program.global_block().ops] == ["while"]
    got, = _run(program, feeds, fetches, (x, np.float32(40.0)), pd.Scope())
    np.testing.assert_allclose(got, fn(x, 40.0), rtol=1e-6)


def test_feeds_are_named_after_parameters_and_pytree_paths():
    def fn(batch, scale):
        return batch["image"].sum() * scale + batch["label"].astype(jnp.float32).sum()
    batch = {"image": _rand(2, 3), "label": np.array([1, 2], np.int32)}
    program, feeds, (out,) = pd.from_jax(fn, batch, np.float32(2.0), scope=pd.Scope())
    assert feeds == ["batch.image", "batch.label", "scale"]
    block = program.global_block()
    assert block.var("batch.label").dtype == "int32" and block.var("scale").shape == ()
    assert out.shape == ()


def test_params_become_trainable_parameters_in_the_scope():
    params = {"layer": {"w": _rand(4, 2), "b": _rand(2, seed=1)}}
    x = _rand(5, 4, seed=2)
    scope = pd.Scope()
    program, feeds, (out,) = pd.from_jax(lambda p, x: x @ p["layer"]["w"] + p["layer"]["b"],
                                         x, params=params, scope=scope)
    assert feeds == ["x"]
    assert {p.name for p in program.all_parameters()} == {"layer.w", "layer.b"}
    np.testing.assert_array_equal(scope.get("layer.w"), params["layer"]["w"])
    startup = pd.Program()
    with pd.program_guard(program, startup):
        loss = pd.ops.mean(pd.ops.square(out))
        pd.optimizer.SGD(0.1).minimize(loss)
    exe = pd.Executor()
    exe.run(startup, scope=scope)
    exe.run(program, feed={"x": x}, fetch_list=[loss], scope=scope)
    grad_w = jax.grad(lambda w: jnp.mean(jnp.square(x @ w + params["layer"]["b"])))(
        params["layer"]["w"])
    np.testing.assert_allclose(scope.get("layer.w"), params["layer"]["w"] - 0.1 * grad_w,
                               rtol=1e-5, atol=1e-6)


def test_a_parameter_and_an_argument_of_one_name_are_refused():
    with pytest.raises(pd.ProgramError, match="two inputs would share the variable name 'w'"):
        pd.from_jax(lambda p, w: w * p["w"], _rand(3), params={"w": _rand(3)})


def test_constants_fill_assign_or_persist_by_their_values_and_size():
    table = np.arange(65 * 64, dtype=np.float32).reshape(65, 64)   # > LARGE_CONSTANT elements
    row = np.arange(64, dtype=np.float32) / 7
    ones = np.ones((65, 64), np.float32)
    scope = pd.Scope()
    program, feeds, (out,) = pd.from_jax(lambda x: x * table + ones + row + 0.1,
                                         _rand(65, 64), scope=scope, batch_polymorphic=False)
    block = program.global_block()
    persisted = [v for v in block.vars.values() if v.persistable]
    assert len(persisted) == 1 and persisted[0].stop_gradient
    assert persisted[0].name.startswith("const_")
    assert not program.all_parameters()
    np.testing.assert_array_equal(scope.get(persisted[0].name), table)
    other, _, _ = pd.from_jax(lambda x: x * (table + 1.0), _rand(65, 64), scope=scope,
                              batch_polymorphic=False)
    (other_const,) = [v for v in other.global_block().vars.values() if v.persistable]
    assert other_const.name != persisted[0].name   # one Scope holds both programs' constants
    np.testing.assert_array_equal(scope.get(persisted[0].name), table)
    fills = [op for op in block.ops if op.type == "fill_constant"]
    assert sorted((list(op.attr("shape")), op.attr("value")) for op in fills) == [
        ([], pytest.approx(0.1)), ([65, 64], 1.0)]
    (small,) = [op for op in block.ops if op.type == "assign_value"]   # in the program
    assert list(small.attr("shape")) == [64] and small.attr("dtype") == "float32"
    np.testing.assert_array_equal(np.float32(small.attr("values")), row)
    x = _rand(65, 64, seed=3)
    (got,) = _run(program, feeds, [out], [x], scope)
    np.testing.assert_allclose(got, x * table + ones + row + np.float32(0.1), rtol=1e-6)


def test_ops_record_the_users_line():
    program, _, _ = pd.from_jax(lambda x: jnp.tanh(x) * 2.0, _rand(3), scope=pd.Scope())
    tanh = next(op for op in program.global_block().ops if op.type == "tanh")
    assert tanh.desc.callsite == line_of(__file__, "lambda x: jnp.tanh(x) * 2.0")


def test_relu_keeps_its_gradient_at_zero_and_stop_gradient_stops():
    def fn(x):
        return jax.nn.relu(x) + x * lax.stop_gradient(x)
    x = np.array([-1.0, 0.0, 2.0], np.float32)
    program, feeds, (out,) = pd.from_jax(fn, x, scope=pd.Scope())
    with pd.program_guard(program):
        (grad,) = pd.gradients(pd.ops.reduce_sum(out), [program.global_block().var("x")])
    got, = pd.Executor().run(program, feed={"x": x}, fetch_list=[grad], scope=pd.Scope())
    np.testing.assert_array_equal(got, jax.grad(lambda v: fn(v).sum())(x))


def test_a_custom_vjp_differentiates_as_its_primal():
    @jax.custom_vjp
    def clipped(v):
        return jnp.sin(v)
    clipped.defvjp(lambda v: (jnp.sin(v), None), lambda _, g: (jnp.zeros_like(g),))
    x = _rand(4)
    program, _, (out,) = pd.from_jax(clipped, x, scope=pd.Scope())
    with pd.program_guard(program):
        (grad,) = pd.gradients(pd.ops.reduce_sum(out), [program.global_block().var("v")])
    got, = pd.Executor().run(program, feed={"v": x}, fetch_list=[grad], scope=pd.Scope())
    np.testing.assert_allclose(got, np.cos(x), rtol=1e-6)


def test_unsupported_primitives_are_listed_together_with_their_lines():
    def fn(x):
        s = lax.cumlogsumexp(x, axis=0)
        c = lax.igamma(x * x + 1.0, x * x + 2.0)
        q = lax.reshape(x.reshape(5, 1), (5,), dimensions=(1, 0))
        return (s + c).sum() + jnp.tanh(x).sum(), q
    x = _rand(5)
    with pytest.raises(pd.UnsupportedPrimitiveError) as info:
        pd.from_jax(fn, x)
    message = str(info.value)
    assert "cannot translate 3 JAX primitive(s)" in message, message
    assert f"'cumlogsumexp' at {line_of(__file__, 's = lax.cumlogsumexp(x')}" in message
    assert f"'igamma' at {line_of(__file__, 'c = lax.igamma(x')}" in message
    assert (f"'reshape' at {line_of(__file__, 'q = lax.reshape(x.reshape(5, 1)')} (a reshape "
            "that transposes") in message
    assert [name for name, _, _ in info.value.unsupported] == ["cumlogsumexp", "igamma",
                                                                "reshape"]
    assert isinstance(info.value, pd.ProgramError)


def test_an_unsupported_primitive_inside_a_jit_is_found_and_nothing_is_stored():
    scope = pd.Scope()

    @jax.jit
    def inner(v):
        return lax.cumlogsumexp(v, axis=0)
    with pytest.raises(pd.UnsupportedPrimitiveError,
                       match="'cumlogsumexp' at test_from_jax.py:"):
        pd.from_jax(lambda p, x: inner(x * p["w"]), _rand(3), params={"w": _rand(3)},
                    scope=scope, batch_polymorphic=False)
    assert "w" not in scope


def check_other_batch_sizes(fn, args):
    """`fn` imported polymorphic declares its feeds' batch dim -1 and gives what
    `jax.jit(fn)` gives at batch sizes 1 and 7."""
    scope = pd.Scope()
    program, feeds, fetches = pd.from_jax(fn, *args, scope=scope)
    assert all(program.global_block().var(f).shape[0] == -1 for f, a in zip(feeds, args)
               if np.ndim(a))
    for batch in (1, 7):
        bigger = [np.resize(a, (batch, *a.shape[1:])) if np.ndim(a) else a for a in args]
        want = jax.tree_util.tree_leaves(jax.jit(fn)(*bigger))
        for g, w in zip(_run(program, feeds, fetches, bigger, scope), want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", sorted(set(ZOO) - FIXED))
def test_a_polymorphic_import_runs_at_other_batch_sizes(case):
    check_other_batch_sizes(*ZOO[case])


def test_a_function_of_a_fixed_batch_size_names_the_primitive_and_line():
    table = _rand(3, 4)
    with pytest.raises(pd.BatchPolymorphismError) as info:
        pd.from_jax(lambda x: x * table, _rand(3, 4))
    where = line_of(__file__, "pd.from_jax(lambda x: x * table, _rand(3, 4))")
    assert f"'mul' at {where} cannot be traced with a symbolic batch dim" in str(info.value)
    assert "pass batch_polymorphic=False" in str(info.value)
    program, feeds, fetches = pd.from_jax(lambda x: x * table, _rand(3, 4),
                                          batch_polymorphic=False, scope=pd.Scope())
    assert program.global_block().var("x").shape == (3, 4)


def test_feeds_whose_leading_dims_differ_are_not_one_batch_dim():
    with pytest.raises(pd.BatchPolymorphismError,
                       match=r"leading dims differ \({'x': 2, 'w': 3}\)"):
        pd.from_jax(lambda x, w: x @ w, _rand(2, 3), _rand(3, 4))
    program, feeds, _ = pd.from_jax(lambda x, w: x @ w, _rand(2, 3), _rand(3, 4),
                                    batch_polymorphic=False, scope=pd.Scope())
    assert [program.global_block().var(f).shape for f in feeds] == [(2, 3), (3, 4)]


def test_a_size_no_op_computes_from_the_batch_dim_is_reported_with_its_line():
    def fn(x):   # (a slice to x.shape[0] - 1 counts from the end: test_from_jax_prims)
        return lax.slice_in_dim(x, 0, x.shape[0] // 2) * 2.0
    with pytest.raises(pd.BatchPolymorphismError) as info:
        pd.from_jax(fn, _rand(3, 4))
    assert [(n, w) for n, w, _ in info.value.unsupported] == [
        ("slice", line_of(__file__, "return lax.slice_in_dim(x, 0"))]
    assert "depends on the batch size" in str(info.value)


def test_unsupported_primitives_in_branches_are_reported_with_the_rest():
    def fn(x):
        return lax.cond(x.sum() > 0,
                        lambda v: lax.cumlogsumexp(v, axis=0),
                        lambda v: lax.igamma(v * v + 1.0, v * v + 2.0), x) + x.sum()
    with pytest.raises(pd.UnsupportedPrimitiveError) as info:
        pd.from_jax(fn, _rand(4), batch_polymorphic=False)
    assert not isinstance(info.value, pd.BatchPolymorphismError)
    assert sorted((n, w) for n, w, _ in info.value.unsupported) == [   # jaxpr's order
        ("cumlogsumexp", line_of(__file__, "lambda v: lax.cumlogsumexp(v, axis=0),")),
        ("igamma", line_of(__file__, "lambda v: lax.igamma(v * v + 1.0, v * v + 2.0), x)"))]


def test_equations_nobody_uses_are_not_translated():
    def initialize_carry(x):   # sst2's LSTM: a key made, then only zeros used
        key = jax.random.key(0)
        unused = jax.random.fold_in(key, 1)
        del unused
        carry = jnp.zeros((x.shape[0], 3), x.dtype)
        jnp.sort(x)   # untranslatable too, and dead
        return jnp.tanh(x[:, :3] + carry) * 2.0
    x = _rand(4, 5)
    scope = pd.Scope()
    program, feeds, fetches = pd.from_jax(initialize_carry, x, scope=scope)
    for batch in (4, 2):
        xb = _rand(batch, 5, seed=batch)
        (got,) = _run(program, feeds, fetches, [xb], scope)
        np.testing.assert_allclose(got, np.tanh(xb[:, :3]) * 2.0, rtol=1e-6)


def shift_right(x, axis=1):   # lm1b's: pad one step in front, drop the last
    pad_widths = [(0, 0)] * x.ndim
    pad_widths[axis] = (1, 0)
    padded = jnp.pad(x, pad_widths, constant_values=x.dtype.type(0))
    return lax.dynamic_slice_in_dim(padded, 0, padded.shape[axis] - 1, axis)


def test_slices_pads_and_dynamic_slices_keeping_the_batch_dim_whole_stay_polymorphic():
    def fn(x, y):
        z = shift_right(x * 2.0) + x[:, 1:].sum() + lax.dynamic_slice(x, (0, 1), (x.shape[0], 2)
                                                                      ).sum()
        return lax.dynamic_update_slice(z, y, (0, 2)), jnp.pad(x, ((0, 0), (2, 1)))
    scope = pd.Scope()
    program, feeds, fetches = pd.from_jax(fn, _rand(3, 5), _rand(3, 2, seed=1), scope=scope)
    block = program.global_block()
    assert [block.var(f).shape for f in feeds] == [(-1, 5), (-1, 2)]
    with pd.program_guard(program):
        total = pd.ops.sum([pd.ops.reduce_sum(pd.ops.square(t)) for t in fetches])
        grads = pd.gradients(total, [block.var(f) for f in feeds])

    def total_of(x, y):
        return sum(jnp.sum(o ** 2) for o in fn(x, y))
    for batch in (4, 1):
        args = [_rand(batch, 5, seed=batch), _rand(batch, 2, seed=batch + 1)]
        got = _run(program, feeds, [*fetches, *grads], args, scope)
        want = [*fn(*args), *jax.grad(total_of, argnums=(0, 1))(*args)]
        assert len(got) == len(want) == 4
        for g, w in zip(got, want):
            assert g.shape == w.shape
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_a_dynamic_slice_of_part_of_the_batch_dim_is_refused():
    with pytest.raises(pd.BatchPolymorphismError, match="not the operand's whole dim"):
        pd.from_jax(lambda x: lax.dynamic_slice_in_dim(x, 0, x.shape[0] - 1, 0), _rand(3, 4),
                    scope=pd.Scope())


def message_passing(nodes, edges, senders, receivers):   # a graph network's step, jraph-style
    messages = nodes[senders] * edges
    incoming = jax.ops.segment_sum(messages, receivers, num_segments=nodes.shape[0])
    return jnp.tanh(incoming + nodes), messages.mean(0) + jnp.zeros_like(nodes).sum()


def _graph(n_node, n_edge, seed):
    rng = np.random.default_rng(seed)
    return [_rand(n_node, 3, seed=seed), _rand(n_edge, 3, seed=seed + 1),
            rng.integers(0, n_node, n_edge).astype(np.int32),
            rng.integers(0, n_node, n_edge).astype(np.int32)]


def test_each_input_can_have_its_own_symbolic_leading_dim():
    dims = {"nodes": "nodes", "edges": "edges", "senders": "edges", "receivers": "edges"}
    scope = pd.Scope()
    program, feeds, fetches = pd.from_jax(message_passing, *_graph(4, 6, 0), scope=scope,
                                          batch_polymorphic=dims)
    block = program.global_block()
    assert [block.var(f).shape for f in feeds] == [(-1, 3), (-1, 3), (-1,), (-1,)]
    with pd.program_guard(program):
        total = pd.ops.sum([pd.ops.reduce_sum(pd.ops.square(t)) for t in fetches])
        grads = pd.gradients(total, [block.var("nodes"), block.var("edges")])

    def total_of(nodes, edges, senders, receivers):
        return sum(jnp.sum(o ** 2) for o in message_passing(nodes, edges, senders, receivers))
    for n_node, n_edge in ((5, 9), (3, 2)):
        graph = _graph(n_node, n_edge, n_node)
        got = _run(program, feeds, [*fetches, *grads], graph, scope)
        want = [*message_passing(*graph), *jax.grad(total_of, argnums=(0, 1))(*graph)]
        for g, w in zip(got, want):
            assert g.shape == w.shape
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_an_import_with_dims_of_its_own_exports_with_them(tmp_path):
    from progdesc.export import export_compiled, load_compiled

    def rolled(nodes, edges, senders, receivers):   # jnp.roll cuts at mod(-1, n)
        out, mean = message_passing(nodes, edges, senders, receivers)
        return jnp.roll(out, 1, axis=0), lax.slice_in_dim(edges, 1, edges.shape[0]), mean
    dims = {"nodes": "nodes", "edges": "edges", "senders": "edges", "receivers": "edges"}
    scope = pd.Scope()
    program, feeds, fetches = pd.from_jax(rolled, *_graph(4, 6, 0), scope=scope,
                                          batch_polymorphic=dims)
    header = export_compiled(str(tmp_path / "graph.pdx"), program, feeds, fetches, scope,
                             batch_polymorphic=dims)
    assert [f["shape"][0] for f in header["feeds"]] == ["nodes", "edges", "edges", "edges"]
    served = load_compiled(str(tmp_path / "graph.pdx"))
    for n_node, n_edge in ((5, 9), (1, 2)):
        graph = _graph(n_node, n_edge, n_node)
        for g, w in zip(served(*graph), rolled(*graph)):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_an_input_can_keep_a_fixed_leading_dim_while_the_others_are_polymorphic():
    scope = pd.Scope()
    program, feeds, fetches = pd.from_jax(lambda x, w: x @ w, _rand(2, 3), _rand(3, 4),
                                          batch_polymorphic={"w": False}, scope=scope)
    assert [program.global_block().var(f).shape for f in feeds] == [(-1, 3), (3, 4)]
    x, w = _rand(5, 3, seed=1), _rand(3, 4, seed=2)
    (got,) = _run(program, feeds, fetches, [x, w], scope)
    np.testing.assert_allclose(got, x @ w, rtol=1e-5)
    with pytest.raises(pd.ProgramError, match="names 'ww', which is no input.*did you mean 'w'"):
        pd.from_jax(lambda x, w: x @ w, _rand(2, 3), _rand(3, 4),
                    batch_polymorphic={"ww": False}, scope=pd.Scope())
    with pytest.raises(pd.BatchPolymorphismError, match="batch_polymorphic={'w': False}"):
        pd.from_jax(lambda x, w: x @ w, _rand(2, 3), _rand(3, 4), scope=pd.Scope())


def _with_label(program, out):
    with pd.program_guard(program):
        label = pd.data("label", [None, 16, 1])
        return pd.ops.reduce_mean(pd.ops.square(pd.ops.sub(out, label)))


def test_an_import_meets_data_declared_by_hand():
    w = _rand(3, 1)
    x, y = _rand(8, 16, 3, seed=1), _rand(8, 16, 1, seed=2)
    scope = pd.Scope()
    program, feeds, (out,) = pd.from_jax(lambda p, x: x @ p["w"], x, params={"w": w},
                                         scope=scope)
    loss = _with_label(program, out)
    (grad,) = pd.gradients(loss, [program.global_block().var("w")])
    for batch in (8, 3):
        got_loss, got_grad = pd.Executor().run(
            program, feed={"x": x[:batch], "label": y[:batch]}, fetch_list=[loss, grad],
            scope=scope)
        want_loss, want_grad = jax.value_and_grad(
            lambda w: jnp.mean((x[:batch] @ w - y[:batch]) ** 2))(w)
        np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5)
        np.testing.assert_allclose(got_grad, want_grad, rtol=1e-4, atol=1e-6)


def test_a_fixed_batch_import_meeting_an_unknown_batch_says_what_to_do():
    program, _, (out,) = pd.from_jax(lambda p, x: x @ p["w"], _rand(8, 16, 3),
                                     params={"w": _rand(3, 1)}, scope=pd.Scope(),
                                     batch_polymorphic=False)
    with pytest.raises(pd.ShapeError, match=r"dim 0 of X is 8 and dim 0 of Y is -1.*"
                                            r"import it with batch_polymorphic=True"):
        _with_label(program, out)
