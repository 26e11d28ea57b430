"""Real programs for the viewer's browser tests and its bench: each builder returns
(program, facts), facts being what the test knows from building it (variables, shapes)."""
import progdesc as pd
from progdesc import control_flow as cf
from progdesc import layers, ops
from progdesc.optimizer import SGD, Adam


def demo_cnn():
    """progdesc's demo CNN (progdesc/demo.py) with its backward pass and Adam."""
    from progdesc import demo
    main, _, _, image, label, loss, _ = demo.build()
    return main, {"loss": loss.name}


def mlp():
    """A 2-layer MLP over [None, 784] with its backward pass and SGD."""
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, 784])
        label = pd.data("label", [None, 1], "int64")
        hidden = layers.fc(x, 128, act="relu")
        logits = layers.fc(hidden, 10)
        loss = ops.mean(layers.softmax_with_cross_entropy(logits, label))
        SGD(0.1).minimize(loss)
    return main, {"hidden": hidden.name, "logits": logits.name, "loss": loss.name}


def transformer(n_layers=1, d_model=64, heads=4, ffn=128, seq=16, optimizer=True):
    """`n_layers` progdesc transformer encoder layers over [None, seq, d_model] with a
    mean-square loss, their backward pass and (when `optimizer`) Adam."""
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [None, seq, d_model])
        h = x
        outs = []
        for _ in range(n_layers):
            h = layers.transformer_encoder_layer(h, heads, ffn, dropout_rate=0.0)
            outs.append(h.name)
        loss = ops.mean(ops.square(h))
        if optimizer:
            Adam(1e-3).minimize(loss)
        else:
            pd.append_backward(loss)
    return main, {"layer_outputs": outs, "loss": loss.name}


def bert_base():
    """A BERT-base sized encoder (12 layers, d_model 768, 12 heads, ffn 3072, seq 128)
    with its backward pass and Adam."""
    return transformer(12, 768, 12, 3072, 128)


def control_flow():
    """A cond and a while loop: y = cond(p, tanh(x*w)*2, x*x+w); then double y while its
    sum is below 100."""
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        x = pd.data("x", [-1, 3])
        w = pd.data("w", [3])
        p = pd.data("p", [], "bool")
        y = cf.cond(p, lambda: ops.tanh(x * w) * 2.0, lambda: x * x + w)
        hundred = ops.fill_constant(shape=[], dtype="float32", value=100.0)
        (z,) = cf.while_loop(lambda v: ops.less_than(ops.reduce_sum(v), hundred),
                             lambda v: (v * 2.0,), [y], max_iters=50)
    return main, {"y": y.name, "z": z.name}


def chain(n_ops):
    """bench/build_scaling's chain of fc(8, tanh) layers, with its backward pass: about
    `n_ops` ops in all (a third forward)."""
    main, startup = pd.Program(), pd.Program()
    with pd.program_guard(main, startup):
        h = pd.data("x", [None, 8])
        for _ in range(max(1, n_ops // 9)):
            h = layers.fc(h, 8, act="tanh")
        loss = ops.mean(h)
        pd.append_backward(loss)
    return main, {"loss": loss.name}
