"""Triangular masks of the last two axes (causal attention masks)."""
import jax.numpy as jnp

from lowering.registry import In, Out, op


@op("tril", inputs=[In("X")], outputs=[Out("Out")], attrs={"diagonal": 0})
def tril(X, *, diagonal):
    """X with the elements above the `diagonal`-th diagonal of the last two axes zeroed."""
    return jnp.tril(X, diagonal)


@op("triu", inputs=[In("X")], outputs=[Out("Out")], attrs={"diagonal": 0})
def triu(X, *, diagonal):
    """X with the elements below the `diagonal`-th diagonal of the last two axes zeroed."""
    return jnp.triu(X, diagonal)


@tril.gradient
def _(g):
    g.call("tril", g.out_grad("Out"), diagonal=g.attr("diagonal"), out=g.in_grad("X"))


@triu.gradient
def _(g):
    g.call("triu", g.out_grad("Out"), diagonal=g.attr("diagonal"), out=g.in_grad("X"))
