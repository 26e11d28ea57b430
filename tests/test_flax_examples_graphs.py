"""A graph network in the shape of google/flax's examples/ogbg_molpcba (a jraph GraphNet
in linen over padded batches of molecules), imported as written and checked against Flax
and optax (tests/flax_examples.py)."""
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from flax_examples import Example, cases, check_example

jraph = pytest.importorskip("jraph")


def add_graphs_tuples(graphs, other_graphs):
    """The node, edge and global features of two GraphsTuples added."""
    return graphs._replace(nodes=graphs.nodes + other_graphs.nodes,
                           edges=graphs.edges + other_graphs.edges,
                           globals=graphs.globals + other_graphs.globals)


class MLP(nn.Module):
    feature_sizes: Sequence[int]
    dropout_rate: float = 0
    deterministic: bool = True
    activation: Callable = nn.relu

    @nn.compact
    def __call__(self, inputs):
        x = inputs
        for size in self.feature_sizes:
            x = self.activation(nn.Dense(features=size)(x))
            x = nn.Dropout(rate=self.dropout_rate, deterministic=self.deterministic)(x)
        return x


class GraphNet(nn.Module):
    """examples/ogbg_molpcba: embed, message passing rounds of a jraph GraphNetwork
    (with skip connections and LayerNorm), decode the globals into logits."""
    latent_size: int
    num_mlp_layers: int
    message_passing_steps: int
    output_globals_size: int
    dropout_rate: float = 0
    skip_connections: bool = True
    use_edge_model: bool = True
    layer_norm: bool = True
    deterministic: bool = True

    @nn.compact
    def __call__(self, graphs):
        embedder = jraph.GraphMapFeatures(embed_node_fn=nn.Dense(self.latent_size),
                                          embed_edge_fn=nn.Dense(self.latent_size),
                                          embed_global_fn=nn.Dense(self.latent_size))
        processed_graphs = embedder(graphs)
        sizes = [self.latent_size] * self.num_mlp_layers

        def mlp():
            return jraph.concatenated_args(MLP(sizes, dropout_rate=self.dropout_rate,
                                               deterministic=self.deterministic))

        for _ in range(self.message_passing_steps):
            graph_net = jraph.GraphNetwork(
                update_node_fn=mlp(), update_edge_fn=mlp() if self.use_edge_model else None,
                update_global_fn=mlp())
            if self.skip_connections:
                processed_graphs = add_graphs_tuples(graph_net(processed_graphs),
                                                     processed_graphs)
            else:
                processed_graphs = graph_net(processed_graphs)
            if self.layer_norm:
                processed_graphs = processed_graphs._replace(
                    nodes=nn.LayerNorm()(processed_graphs.nodes),
                    edges=nn.LayerNorm()(processed_graphs.edges),
                    globals=nn.LayerNorm()(processed_graphs.globals))
        decoder = jraph.GraphMapFeatures(embed_global_fn=nn.Dense(self.output_globals_size))
        return decoder(processed_graphs)


def binary_cross_entropy_with_mask(*, logits, labels, mask):
    labels = jnp.where(mask, labels, -1)   # no NaN labels reach the gradient
    positive_logits = logits >= 0
    relu_logits = jnp.where(positive_logits, logits, 0)
    abs_logits = jnp.where(positive_logits, logits, -logits)
    return relu_logits - (logits * labels) + (jnp.log(1 + jnp.exp(-abs_logits)))


def replace_globals(graphs):
    """A constant global feature for each graph."""
    return graphs._replace(globals=jnp.ones([graphs.n_node.shape[0], 1]))


def get_valid_mask(labels, graphs):
    """The labels that are there (not NaN), of graphs that are no padding."""
    labels_mask = ~jnp.isnan(labels)
    graph_mask = jraph.get_graph_padding_mask(graphs)
    return labels_mask & graph_mask[:, None]


def ogbg_loss(model, graphs, labels):
    """The example's train step's loss (its batches carry the labels as their globals,
    which it replaces before calling the model: here they come apart)."""
    graphs = replace_globals(graphs)
    logits = model(graphs).globals
    mask = get_valid_mask(labels, graphs)
    loss = binary_cross_entropy_with_mask(logits=logits, labels=labels, mask=mask)
    return jnp.sum(jnp.where(mask, loss, 0)) / jnp.sum(mask)


NODE_FEATURES, EDGE_FEATURES, CLASSES = 5, 3, 4


def molecules(n_graphs, seed=0):
    """(`n_graphs` random graphs padded by jraph to one more node, edge and graph, as the
    example's input pipeline pads a batch, with a constant global feature; their labels,
    NaN where a graph has none, zeros for the padding graph)."""
    rng = np.random.default_rng(seed)
    n_node = rng.integers(2, 5, n_graphs).astype(np.int32)
    n_edge = rng.integers(1, 6, n_graphs).astype(np.int32)
    offsets = np.concatenate([[0], np.cumsum(n_node)[:-1]])
    senders = np.concatenate([o + rng.integers(0, n, e)
                              for o, n, e in zip(offsets, n_node, n_edge)]).astype(np.int32)
    receivers = np.concatenate([o + rng.integers(0, n, e)
                                for o, n, e in zip(offsets, n_node, n_edge)]).astype(np.int32)
    labels = rng.integers(0, 2, (n_graphs, CLASSES)).astype(np.float32)
    labels[rng.uniform(size=labels.shape) < 0.2] = np.nan
    graphs = jraph.GraphsTuple(
        nodes=rng.normal(size=(n_node.sum(), NODE_FEATURES)).astype(np.float32),
        edges=rng.normal(size=(n_edge.sum(), EDGE_FEATURES)).astype(np.float32),
        senders=senders, receivers=receivers, n_node=n_node, n_edge=n_edge, globals=labels)
    padded = jraph.pad_with_graphs(graphs, int(n_node.sum()) + 1, int(n_edge.sum()) + 1,
                                   n_graphs + 1)
    padded = jax.tree_util.tree_map(np.asarray, padded)
    return padded._replace(globals=np.ones((n_graphs + 1, 1), np.float32)), padded.globals


# Nodes and edges: each a leading dim of its own; the rest (n_node, n_edge, globals):
# the graphs, the batch dim.
GRAPH_DIMS = {"graphs.nodes": "nodes", "graphs.edges": "edges", "graphs.senders": "edges",
              "graphs.receivers": "edges"}


def ogbg_molpcba():
    model = GraphNet(latent_size=8, num_mlp_layers=1, message_passing_steps=1,
                     output_globals_size=CLASSES, dropout_rate=0.1, deterministic=False)
    graphs, labels = molecules(3)
    variables = jax.jit(model.init)({"params": jax.random.key(0),
                                     "dropout": jax.random.key(1)}, graphs)
    return Example(model, variables, (graphs,), (labels,), ogbg_loss,
                   lambda batch: molecules(batch, seed=batch)[:1],
                   train_kwargs={"rngs": {"dropout": jax.random.key(2)}},
                   import_kwargs={"batch_polymorphic": GRAPH_DIMS}, learning_rate=1e-2)


EXAMPLES = {"ogbg_molpcba": ogbg_molpcba}


@pytest.mark.parametrize("name", cases(EXAMPLES, slow={"ogbg_molpcba"}))
def test_example_imports_trains_and_exports_as_flax_runs_it(name, tmp_path):
    check_example(EXAMPLES[name](), tmp_path)
