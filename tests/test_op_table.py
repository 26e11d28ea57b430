"""Table-driven checks over every sample of every registered op.

Forward values against the NumPy reference; inferred shapes and dtypes
against the actual results (with known and with unknown batch dims);
serialize -> parse -> identical bytes; and the registered gradient
composition against `jax.vjp` of the forward rule (float32) and against
central finite differences (float64). An op with sub-blocks is built through
its builder (`Sample.build`); its gradient reference is `jax.vjp` of the
lowered forward program (lax.cond / lax.scan / ...), so of the equivalent
hand-written JAX program.

Ops run at the "highest" precision policy, so that float32 products are float32
on every backend (not TF32 or bfloat16 passes). The references (`jax.vjp` and
the finite differences) are computed on the CPU, where JAX computes every op in
the precision of its dtype (on GPUs, the float64 derivative of max pooling is
computed at reduced precision, which finite differences magnify into noise).

CI (`-m "not slow"`) runs the costly checks (gradients, unknown-batch shapes) on each
op's first sample only (`ci_samples`); `make test-all` runs every check on every sample.
"""
import contextlib

import jax
import numpy as np
import pytest

import progdesc as pd
from lowering import dtypes, registry
from lowering.lower import lower_block
from op_table import all_invalid, all_samples
from progdesc.backward import emit_grad_ops
from progdesc.feeding import with_feed_fetch

SAMPLES = all_samples()
INVALID = all_invalid()
# ops users often misuse: each has Invalid cases (wrong rank, dtype or mismatched dims)
COMMON_MISTAKES = {"add", "sub", "mul", "div", "matmul", "conv2d", "pool2d", "concat", "reshape",
                   "softmax_with_cross_entropy", "lookup_table", "batch_norm", "layer_norm",
                   "where", "stack", "sigmoid_cross_entropy_with_logits",
                   "scaled_dot_product_attention"}
# feed and fetch are inserted by the Executor into every run: every test here exercises them.
EXECUTOR_OPS = {"feed", "fetch"}


def ci_samples(samples, eligible=lambda s: True):
    """The ids of the samples on which a costly check runs in CI: each op's first `eligible`
    one (`make test-all` runs it on every sample).

    Measured on 2 cores, the gradient checks (jax.vjp ~0.7 s a case, finite differences
    ~0.6 s) were 60% of this file's time and the unknown-batch shape check (a fresh compile
    with a symbolic dim) 10%. So CI (`-m "not slow"`) runs each of them on every op, once;
    the cheaper checks (forward values, known-batch shapes, serialization) on every sample.
    """
    first = {}
    for s in samples:
        if eligible(s):
            first.setdefault(s.op, s.id)
    return set(first.values())


def ci_first(samples):
    """`samples` as pytest parameters of a costly check: those of `ci_samples` as is, the
    others marked slow."""
    ci = ci_samples(samples)
    return [s if s.id in ci else pytest.param(s, marks=pytest.mark.slow) for s in samples]


def _as_list(v):
    return list(v) if isinstance(v, (list, tuple)) else [v]


def build(sample, unknown_batch=False, dtype_map=None):
    """(program, op, feed, results): a program holding one op of `sample` and its data vars.

    `results` names the Variables a built sample's builder returned (None for
    an op appended from arrays).
    """
    main = pd.Program()
    feed, bound, variables = {}, {}, {}
    block = main.global_block()
    top_rank = max((np.ndim(a) for v in sample.inputs.values() for a in _as_list(v)), default=0)
    for slot, value in sample.inputs.items():
        names, made = [], []
        for i, arr in enumerate(_as_list(value)):
            arr = np.asarray(arr)
            if dtype_map and arr.dtype.kind == "f":
                arr = arr.astype(dtype_map)
            name = f"in_{slot}_{i}"
            shape = list(arr.shape)
            if unknown_batch and shape and len(shape) == top_rank:
                shape[0] = -1
            made.append(block.create_var(name, shape, arr.dtype, need_check_feed=True))
            feed[name] = arr
            names.append(name)
        many = isinstance(value, (list, tuple))
        bound[slot] = names if many else names[0]
        variables[slot] = made if many else made[0]
    if sample.build is None:
        return main, block.append_op(sample.op, inputs=bound, attrs=sample.attrs), feed, None
    with pd.program_guard(main, pd.Program()):
        out = sample.build(**variables)
    built = [op for op in block.ops if op.type == sample.op]
    assert len(built) == 1, f"the builder made {len(built)} '{sample.op}' ops in the global block"
    return main, built[0], feed, [v.name for v in (out if isinstance(out, tuple) else (out,))]


@contextlib.contextmanager
def reference():
    """Where references are computed: on the CPU, float32 products in float32."""
    with jax.default_device(jax.devices("cpu")[0]), jax.default_matmul_precision("highest"):
        yield


def run_op(sample, unknown_batch=False):
    """(program, op, {output slot: [values]}, [values of a built sample's results] or None)."""
    main, op, feed, results = build(sample, unknown_batch)
    out_names = list(dict.fromkeys([n for names in op.outputs.values() for n in names]
                                   + (results or [])))
    values = pd.Executor(precision="highest").run(main, feed=feed, fetch_list=out_names,
                                                   scope=pd.Scope())
    got = dict(zip(out_names, values))
    outputs = {slot: [got[n] for n in names] for slot, names in op.outputs.items()}
    return main, op, outputs, None if results is None else [got[n] for n in results]


_KNOWN_BATCH_RUNS = {}


def run_op_once(sample):
    """`run_op(sample)` at its known batch, run once per sample in a process: the forward
    check and the known-batch shape check read the same run (one compile instead of two)."""
    if sample.id not in _KNOWN_BATCH_RUNS:
        _KNOWN_BATCH_RUNS[sample.id] = run_op(sample)
    return _KNOWN_BATCH_RUNS[sample.id]


def test_every_registered_op_has_samples():
    covered = {s.op for s in SAMPLES} | EXECUTOR_OPS
    missing = sorted(o.type for o in registry.all_ops() if o.type not in covered)
    assert not missing, f"ops without samples: {missing}"


def test_every_registered_op_has_a_python_function():
    import inspect
    for opdef in registry.all_ops():
        if opdef.type in EXECUTOR_OPS:
            continue
        fn = getattr(pd.ops, opdef.type)   # 'while' too, though Python cannot write pd.ops.while
        names = list(inspect.signature(fn).parameters)
        assert names[:len(opdef.inputs)] == [s.name.lower() for s in opdef.inputs], opdef.type


def test_a_required_input_after_an_optional_one_must_be_given():
    with pd.program_guard(pd.Program(), pd.Program()):
        q = pd.data("q", [2, 4, 3, 8])
        with pytest.raises(TypeError, match="missing required argument 'outgrad'"):
            pd.ops.scaled_dot_product_attention_grad(q, q, q)
        out = pd.ops.scaled_dot_product_attention_grad(q, q, q, outgrad=q)
    assert len(out) == 3


def test_every_sample_names_a_registered_op():
    unknown = sorted({s.op for s in SAMPLES if not registry.is_registered(s.op)})
    assert not unknown


def test_common_mistakes_have_invalid_cases():
    assert not COMMON_MISTAKES - {c.op for c in INVALID}


@pytest.mark.parametrize("case", INVALID, ids=lambda c: c.id)
def test_invalid_inputs_are_refused_in_the_ops_terms(case):
    main = pd.Program()
    block = main.global_block()
    bound = {}
    for slot, value in case.inputs.items():
        names = [block.create_var(f"in_{slot}_{i}", dims, dtype).name
                 for i, (dims, dtype) in enumerate(value if isinstance(value, list) else [value])]
        bound[slot] = names if isinstance(value, list) else names[0]
    before = main.to_bytes()
    with pytest.raises(case.error) as info:
        block.append_op(case.op, inputs=bound, attrs=case.attrs)
    message = str(info.value)
    assert message.startswith(f"op #0 '{case.op}', created at test_op_table.py:"), message
    assert "rejected:" not in message, f"JAX's words, not the op's: {message}"
    for fragment in case.expect:
        assert fragment in message, message
    if bound:   # the variable at fault is named
        assert info.value.var in {n for v in bound.values() for n in _as_list(v)}, message
    assert main.to_bytes() == before


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda s: s.id)
def test_forward_matches_reference(sample):
    main, op, outputs, results = run_op_once(sample)
    opdef = registry.get(sample.op)
    if sample.check is not None:
        sample.check(outputs, sample.inputs)
        return
    if results is not None:
        expected = sample.ref(**sample.inputs)
        expected = expected if isinstance(expected, tuple) else (expected,)
        assert len(expected) == len(results), "reference must give one entry per result"
        for k, (got, want) in enumerate(zip(results, expected)):
            _assert_matches(got, want, sample, f"result {k}")
        return
    expected = sample.ref(**sample.inputs, **sample.attrs)
    expected = expected if isinstance(expected, tuple) else (expected,)
    assert len(expected) == len(opdef.outputs), "reference must give one entry per output slot"
    for slot, want in zip(opdef.outputs, expected):
        if want is None:
            continue
        got = outputs[slot.name]
        want = _as_list(want) if slot.many else [want]
        assert len(got) == len(want), slot.name
        for g, w in zip(got, want):
            _assert_matches(g, w, sample, slot.name)


def _assert_matches(got, want, sample, what):
    want = np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} vs reference {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} vs reference {want.dtype}"
    np.testing.assert_allclose(got, want, rtol=sample.rtol, atol=sample.atol, err_msg=what)


def _shape_cases():
    """(sample, unknown_batch) for every sample, known and unknown batch; the unknown-batch
    case is slow but for each op's first symbolic sample (`ci_samples`)."""
    ci = ci_samples(SAMPLES, eligible=lambda s: s.symbolic)
    cases = []
    for s in SAMPLES:
        cases.append(pytest.param(s, False, id=f"{s.id}-known"))
        cases.append(pytest.param(s, True, id=f"{s.id}-unknown_batch",
                                  marks=() if s.id in ci else pytest.mark.slow))
    return cases


@pytest.mark.parametrize("sample, unknown_batch", _shape_cases())
def test_inferred_shape_and_dtype(sample, unknown_batch):
    if unknown_batch and not sample.symbolic:
        pytest.skip("sample is not meant for symbolic dims")
    main, op, outputs, _ = run_op(sample, True) if unknown_batch else run_op_once(sample)
    for slot, names in op.outputs.items():
        for name, value in zip(names, outputs[slot]):
            var = main.global_block().var(name)
            assert var.dtype == dtypes.name_of(value.dtype), name
            assert len(var.shape) == value.ndim, name
            for inferred, actual in zip(var.shape, value.shape):
                assert inferred in (-1, actual), f"{name}: {var.shape} vs {value.shape}"
                if not unknown_batch:
                    assert inferred == actual, f"{name}: {var.shape} vs {value.shape}"


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda s: s.id)
def test_serialization_round_trip(sample):
    main, _, _, _ = build(sample)
    data = main.to_bytes()
    again = pd.Program.from_bytes(data)
    assert again.to_bytes() == data
    assert pd.Program.from_text(main.to_text()).to_bytes() == data


# --- gradients ---

def _grad_slots(sample):
    if sample.build is not None:   # the builder's inputs, not the op's slots
        slots = sample.grad_slots or tuple(sample.inputs)
    else:
        slots = sample.grad_slots or registry.get(sample.op).differentiable_inputs
    return [s for s in slots if s in sample.inputs and all(
        np.asarray(a).dtype.kind == "f" for a in _as_list(sample.inputs[s]))]


GRAD_SAMPLES = [s for s in SAMPLES
                if s.grad and registry.get(s.op).differentiable and _grad_slots(s)]


def test_every_differentiable_op_has_a_gradient_maker():
    missing = sorted({s.op for s in GRAD_SAMPLES if registry.get(s.op).grad is None})
    assert not missing, f"differentiable ops without gradient makers: {missing}"


def _float_outputs(op, main):
    return [(slot, i, n) for slot, names in op.outputs.items() for i, n in enumerate(names)
            if dtypes.kind_of(main.global_block().var(n).dtype) == "float"]


def registered_grads(sample, dtype):
    """Run the op's gradient ops on fixed cotangents.

    Returns ({(input slot, position): gradient}, {(output slot or result name, position):
    cotangent}, feed, program, a built sample's result names or None).
    """
    main, op, feed, results = build(sample, dtype_map=dtype)
    if results is not None:
        return _built_grads(sample, main, feed, results) + (main, results)
    block = main.global_block()
    rng = np.random.default_rng(1)
    out_grads, cotangents = {}, {}
    with pd.program_guard(main):
        for slot, i, name in _float_outputs(op, main):
            var = block.var(name)
            cot = rng.standard_normal(var.shape).astype(var.dtype)
            block.create_var(name + "@COT", var.shape, var.dtype, need_check_feed=True)
            feed[name + "@COT"] = cot
            out_grads[name] = name + "@COT"
            cotangents[(slot, i)] = cot
        targets = {}
        for slot in _grad_slots(sample):
            for i, _ in enumerate(op.input(slot)):
                targets[(slot, i)] = f"d_{slot}_{i}"
        emit_grad_ops(block, op.desc, 0, targets, out_grads)
    names = list(targets.values())
    got = pd.Executor(precision="highest").run(main, feed=feed, fetch_list=names,
                                                scope=pd.Scope())
    return dict(zip(targets, got)), cotangents, feed, main, None


def _built_grads(sample, main, feed, results):
    """The gradient ops `pd.gradients` appends for a built sample's float results, run on
    fixed cotangents: (grads, cotangents, feed)."""
    block = main.global_block()
    rng = np.random.default_rng(1)
    targets, seeds, cotangents = [], [], {}
    with pd.program_guard(main):
        for name in results:
            var = block.var(name)
            if dtypes.kind_of(var.dtype) != "float":
                continue
            cot = rng.standard_normal(var.shape).astype(var.dtype)
            seeds.append(block.create_var(name + "@COT", var.shape, var.dtype,
                                          need_check_feed=True))
            feed[name + "@COT"] = cot
            targets.append(var)
            cotangents[(name, 0)] = cot
        wrt = [(slot, i) for slot in _grad_slots(sample)
               for i in range(len(_as_list(sample.inputs[slot])))]
        grads = pd.gradients(targets, [block.var(f"in_{s}_{i}") for s, i in wrt], seeds)
    fetched = [g for g in grads if g is not None]
    values = iter(pd.Executor(precision="highest").run(main, feed=feed, fetch_list=fetched,
                                                       scope=pd.Scope()))
    got = {key: (np.zeros_like(feed[f"in_{key[0]}_{key[1]}"]) if g is None else next(values))
           for key, g in zip(wrt, grads)}
    return got, cotangents, feed


def _built_forward_fn(main, feed, wrt, results):
    """The built program's forward lowering (lax.cond / lax.scan / ...) as a function of the
    `wrt` inputs, returning the results."""
    data = [n for n in feed if not n.endswith("@COT")]
    lowered = lower_block(with_feed_fetch(main, data, results), 0, precision="highest")
    assert not lowered.reads, f"a sample's program reads persistables: {lowered.reads}"

    def fn(*values):
        given = dict(zip((f"in_{s}_{i}" for s, i in wrt), values))
        fetches, _ = lowered.fn([given.get(n, feed[n]) for n in data], {}, {})
        return tuple(fetches)
    return jax.jit(fn)   # traced once: finite differences call it many times


def _cotangent_tree(sample, outs, cots, results):
    """Cotangents shaped like `outs`, the forward function's outputs (zeros where none
    was drawn; float0 for an integer output)."""
    def one(key, out):
        if np.asarray(out).dtype.kind != "f":
            return np.zeros(np.shape(out), jax.dtypes.float0)
        return cots.get(key, np.zeros_like(out))
    if results is not None:
        return tuple(one((name, 0), out) for name, out in zip(results, outs))
    tree = []
    for k, slot in enumerate(registry.get(sample.op).outputs):
        if slot.many:
            tree.append([one((slot.name, i), o) for i, o in enumerate(outs[k])])
        else:
            tree.append(None if outs[k] is None else one((slot.name, 0), outs[k]))
    return tuple(tree)


def _forward_fn(sample, main, feed, wrt):
    """The op's own lowering rule as a function of the `wrt` inputs."""
    opdef = registry.get(sample.op)
    attrs = {a.name: main.global_block().ops[0].attrs[a.name] for a in opdef.attrs}
    attrs = {k: (dtypes.to_numpy(v) if opdef.attr(k).type == "dtype" else v)
             for k, v in attrs.items()}
    args = {s.name: [] if s.many else None for s in opdef.inputs}  # absent optional slots
    args.update({slot: ([feed[f"in_{slot}_{i}"] for i in range(len(v))]
                        if isinstance(v, (list, tuple)) else feed[f"in_{slot}_0"])
                 for slot, v in sample.inputs.items()})
    if opdef.random:
        args["key"] = jax.random.fold_in(jax.random.PRNGKey(main.random_seed), 1)

    def fn(*values):
        full = dict(args)
        for (slot, i), v in zip(wrt, values):
            if isinstance(full[slot], list):
                full[slot] = list(full[slot])
                full[slot][i] = v
            else:
                full[slot] = v
        out = opdef.lower(**full, **attrs)
        return out if len(opdef.outputs) > 1 else (out,)
    return fn


@pytest.mark.parametrize("sample", ci_first(GRAD_SAMPLES), ids=lambda s: s.id)
def test_gradient_matches_jax_vjp(sample):
    grads, cots, feed, main, results = registered_grads(sample, np.float32)
    wrt = list(grads)
    fn = (_forward_fn(sample, main, feed, wrt) if results is None
          else _built_forward_fn(main, feed, wrt, results))
    primals = [feed[f"in_{s}_{i}"] for s, i in wrt]
    with jax.enable_x64(True), reference():
        outs, vjp = jax.vjp(fn, *primals)
        expected = vjp(_cotangent_tree(sample, outs, cots, results))
    for key, want in zip(wrt, expected):
        np.testing.assert_allclose(grads[key], np.asarray(want), rtol=sample.grad_rtol,
                                   atol=sample.grad_atol, err_msg=f"d{key}")


@pytest.mark.parametrize("sample", ci_first(GRAD_SAMPLES), ids=lambda s: s.id)
def test_gradient_matches_finite_differences(sample):
    grads, cots, feed, main, results = registered_grads(sample, np.float64)
    wrt = list(grads)
    fn = (_forward_fn(sample, main, feed, wrt) if results is None
          else _built_forward_fn(main, feed, wrt, results))
    primals = [np.array(feed[f"in_{s}_{i}"], dtype=np.float64) for s, i in wrt]
    opdef = registry.get(sample.op)

    def objective(values):
        with jax.enable_x64(True), reference():
            outs = fn(*values)
        if results is None:
            pairs = [((slot.name, i), o) for slot, out in zip(opdef.outputs, outs)
                     for i, o in enumerate(out if slot.many else [out])]
        else:
            pairs = [((name, 0), o) for name, o in zip(results, outs)]
        return sum(float(np.sum(np.asarray(o, np.float64) * cots[key]))
                   for key, o in pairs if key in cots)

    eps = 1e-6
    for j, key in enumerate(wrt):
        flat = primals[j].reshape(-1)
        numeric = np.zeros_like(flat)
        for e in range(flat.size):
            old = flat[e]
            flat[e] = old + eps
            plus = objective(primals)
            flat[e] = old - eps
            minus = objective(primals)
            flat[e] = old
            numeric[e] = (plus - minus) / (2 * eps)
        np.testing.assert_allclose(grads[key].reshape(-1), numeric, rtol=1e-5, atol=1e-6,
                                   err_msg=f"d{key}")
