"""Image models in the shape of google/flax's examples (mnist, imagenet, vae, the nnx
examples), imported as written and checked against Flax and optax (tests/flax_examples.py)."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn
from flax import nnx

from flax_examples import Example, check_example


def _images(batch, size=12, channels=1, seed=0):
    return np.random.default_rng(seed).uniform(0, 1, (batch, size, size, channels)).astype(
        np.float32)


def _labels(batch, classes=10, seed=1):
    return np.random.default_rng(seed).integers(0, classes, batch).astype(np.int32)


class MnistCNN(nn.Module):
    """examples/mnist: two convolutions with average pooling, two dense layers."""

    @nn.compact
    def __call__(self, x):
        x = nn.Conv(features=8, kernel_size=(3, 3))(x)
        x = nn.avg_pool(nn.relu(x), window_shape=(2, 2), strides=(2, 2))
        x = nn.Conv(features=16, kernel_size=(3, 3))(x)
        x = nn.avg_pool(nn.relu(x), window_shape=(2, 2), strides=(2, 2))
        x = x.reshape((x.shape[0], -1))
        x = nn.relu(nn.Dense(features=32)(x))
        return nn.Dense(features=10)(x)


def mnist_loss(model, images, labels):
    logits = model(images)
    one_hot = jax.nn.one_hot(labels, 10)
    return jnp.mean(optax.softmax_cross_entropy(logits=logits, labels=one_hot))


def mnist():
    model, images = MnistCNN(), _images(4)
    variables = jax.jit(model.init)(jax.random.key(0), images)
    return Example(model, variables, (images,), (_labels(4),), mnist_loss,
                   lambda batch: (_images(batch, seed=batch),), learning_rate=1e-2)


class NnxCNN(nnx.Module):
    """examples/nnx mnist: convolutions with BatchNorm and Dropout. (No bias before a
    BatchNorm: its gradient is rounding noise, which Adam's steps would amplify.)"""

    def __init__(self, rngs):
        self.conv1 = nnx.Conv(1, 8, kernel_size=(3, 3), use_bias=False, rngs=rngs)
        self.bn1 = nnx.BatchNorm(8, rngs=rngs)
        self.dropout1 = nnx.Dropout(0.1, rngs=rngs)
        self.conv2 = nnx.Conv(8, 16, kernel_size=(3, 3), use_bias=False, rngs=rngs)
        self.bn2 = nnx.BatchNorm(16, rngs=rngs)
        self.linear1 = nnx.Linear(3 * 3 * 16, 32, rngs=rngs)
        self.dropout2 = nnx.Dropout(0.1, rngs=rngs)
        self.linear2 = nnx.Linear(32, 10, rngs=rngs)

    def __call__(self, x):
        x = nnx.avg_pool(nnx.relu(self.bn1(self.dropout1(self.conv1(x)))), (2, 2), (2, 2))
        x = nnx.avg_pool(nnx.relu(self.bn2(self.conv2(x))), (2, 2), (2, 2))
        x = x.reshape(x.shape[0], -1)
        x = self.dropout2(nnx.relu(self.linear1(x)))
        return self.linear2(x)


def nnx_loss(model, images, labels):
    logits = model(images)
    return optax.softmax_cross_entropy_with_integer_labels(logits=logits, labels=labels).mean()


def nnx_mnist():
    return Example(NnxCNN(nnx.Rngs(0)), None, (_images(4),), (_labels(4),), nnx_loss,
                   lambda batch: (_images(batch, seed=batch),), eval_kwargs=True,
                   learning_rate=1e-2)


EXAMPLES = {"mnist": mnist, "nnx_mnist": nnx_mnist}


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_imports_trains_and_exports_as_flax_runs_it(name, tmp_path):
    check_example(EXAMPLES[name](), tmp_path)
