"""Image models in the shape of google/flax's examples (mnist, imagenet, vae, the nnx
examples), imported as written and checked against Flax and optax (tests/flax_examples.py)."""
from functools import partial
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn
from flax import nnx

from flax_examples import Example, cases, check_example


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


class ResNetBlock(nn.Module):
    """examples/imagenet: the ResNet block, a projection where the shape changes."""
    filters: int
    conv: Any
    norm: Any
    act: Callable
    strides: tuple = (1, 1)

    @nn.compact
    def __call__(self, x):
        residual = x
        y = self.conv(self.filters, (3, 3), self.strides)(x)
        y = self.act(self.norm()(y))
        y = self.conv(self.filters, (3, 3))(y)
        # The example starts this scale at zeros (`scale_init=zeros_init()`); the loss is
        # then exactly invariant to the biases of the first stage (whose positive output
        # reaches the next stage only through `conv_proj` and its BatchNorm), their
        # gradients are rounding noise (~1e-8), and Adam's first step, g / (|g| + eps),
        # makes them steps of +-lr in either direction: here it starts at ones.
        y = self.norm()(y)
        if residual.shape != y.shape:
            residual = self.conv(self.filters, (1, 1), self.strides, name="conv_proj")(residual)
            residual = self.norm(name="norm_proj")(residual)
        return self.act(residual + y)


class ResNet(nn.Module):
    """examples/imagenet: ResNet V1.5 (convolutions without bias, each before a BatchNorm
    that uses its running averages when not training). The example's BatchNorm takes
    `axis_name='batch'` for its `pmap`; on one device, as here, it has none."""
    stage_sizes: Sequence[int]
    block_cls: Any
    num_classes: int
    num_filters: int = 64
    dtype: Any = jnp.float32
    act: Callable = nn.relu

    @nn.compact
    def __call__(self, x, train: bool = True):
        conv = partial(nn.Conv, use_bias=False, dtype=self.dtype)
        norm = partial(nn.BatchNorm, use_running_average=not train, momentum=0.9,
                       epsilon=1e-5, dtype=self.dtype)
        x = conv(self.num_filters, (7, 7), (2, 2), padding=[(3, 3), (3, 3)],
                 name="conv_init")(x)
        x = nn.relu(norm(name="bn_init")(x))
        x = nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
        for i, block_size in enumerate(self.stage_sizes):
            for j in range(block_size):
                strides = (2, 2) if i > 0 and j == 0 else (1, 1)
                x = self.block_cls(self.num_filters * 2 ** i, strides=strides, conv=conv,
                                   norm=norm, act=self.act)(x)
        x = jnp.mean(x, axis=(1, 2))
        x = nn.Dense(self.num_classes, dtype=self.dtype)(x)
        return jnp.asarray(x, self.dtype)


ResNet18 = partial(ResNet, stage_sizes=[2, 2, 2, 2], block_cls=ResNetBlock)


def imagenet_loss(model, images, labels, train=True):
    """examples/imagenet's train_step loss: cross entropy plus an L2 weight penalty."""
    logits = model(images, train=train)
    one_hot = jax.nn.one_hot(labels, 10)
    loss = jnp.mean(optax.softmax_cross_entropy(logits=logits, labels=one_hot))
    weight_l2 = sum(jnp.sum(x ** 2) for x in jax.tree_util.tree_leaves(model.variables["params"])
                    if x.ndim > 1)
    return loss + 1e-4 * 0.5 * weight_l2


def imagenet():
    # 64x64 images: the last stage's BatchNorm normalizes 2x2 pixels of each example (at
    # 1x1, over a batch of 4, 30 Adam steps are chaotic: Flax with and without jit part).
    model, images = ResNet18(num_classes=10, num_filters=4), _images(4, 64, 3)
    variables = jax.jit(model.init)({"params": jax.random.key(0)}, images)
    return Example(model, variables, (images,), (_labels(4),), imagenet_loss,
                   lambda batch: (_images(batch, 64, 3, seed=batch),),
                   train_kwargs={"train": True}, eval_kwargs={"train": False})


class Encoder(nn.Module):
    """examples/vae: the encoder, the mean and log-variance of the latents."""
    latents: int

    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Dense(12, name="fc1")(x))
        return nn.Dense(self.latents, name="fc2_mean")(x), nn.Dense(self.latents,
                                                                   name="fc2_logvar")(x)


class Decoder(nn.Module):
    """examples/vae: the decoder, the logits of the pixels."""

    @nn.compact
    def __call__(self, z):
        z = nn.relu(nn.Dense(12, name="fc1")(z))
        return nn.Dense(16, name="fc2")(z)


def reparameterize(rng, mean, logvar):
    std = jnp.exp(0.5 * logvar)
    eps = jax.random.normal(rng, logvar.shape)
    return mean + eps * std


class VAE(nn.Module):
    """examples/vae: the sampling key is an input of the call."""
    latents: int = 3

    def setup(self):
        self.encoder = Encoder(self.latents)
        self.decoder = Decoder()

    def __call__(self, x, z_rng):
        mean, logvar = self.encoder(x)
        z = reparameterize(z_rng, mean, logvar)
        return self.decoder(z), mean, logvar

    def generate(self, z):
        return nn.sigmoid(self.decoder(z))


@jax.vmap
def kl_divergence(mean, logvar):
    return -0.5 * jnp.sum(1 + logvar - jnp.square(mean) - jnp.exp(logvar))


@jax.vmap
def binary_cross_entropy_with_logits(logits, labels):
    logits = nn.log_sigmoid(logits)
    return -jnp.sum(labels * logits + (1.0 - labels) * jnp.log(-jnp.expm1(logits)))


def vae_loss(model, batch, z_rng):
    """examples/vae's train_step loss: the batch is its own target."""
    recon_x, mean, logvar = model(batch, z_rng)
    bce_loss = binary_cross_entropy_with_logits(recon_x, batch).mean()
    kld_loss = kl_divergence(mean, logvar).mean()
    return bce_loss + kld_loss


def _binary(batch, seed=0):
    return (np.random.default_rng(seed).uniform(0, 1, (batch, 16)) > 0.5).astype(np.float32)


def vae():
    model, batch = VAE(latents=3), _binary(4)
    variables = jax.jit(model.init)(jax.random.key(0), batch, jax.random.key(1))
    return Example(model, variables, (batch, jax.random.key(2)), (), vae_loss,
                   lambda n: (_binary(n, seed=n), jax.random.key(n)), learning_rate=1e-2)


class Loss(nnx.Variable):
    pass


class NnxEncoder(nnx.Module):
    """examples/nnx_toy_examples/05_vae: the KL loss kept as a variable, the noise drawn
    from the module's own `rngs.noise()` stream."""

    def __init__(self, din, dmid, dout, *, rngs):
        self.linear1 = nnx.Linear(din, dmid, rngs=rngs)
        self.linear_mean = nnx.Linear(dmid, dout, rngs=rngs)
        self.linear_std = nnx.Linear(dmid, dout, rngs=rngs)
        self.rngs = rngs

    def __call__(self, x):
        x = jax.nn.relu(self.linear1(x.reshape((x.shape[0], -1))))
        mean = self.linear_mean(x)
        std = jnp.exp(self.linear_std(x))
        self.kl_loss = Loss(jnp.mean(
            0.5 * jnp.mean(-jnp.log(std ** 2) - 1.0 + std ** 2 + mean ** 2, axis=-1)))
        key = self.rngs.noise()
        return mean + std * jax.random.normal(key, mean.shape)


class NnxDecoder(nnx.Module):
    def __init__(self, din, dmid, dout, *, rngs):
        self.linear1 = nnx.Linear(din, dmid, rngs=rngs)
        self.linear2 = nnx.Linear(dmid, dout, rngs=rngs)

    def __call__(self, z):
        return self.linear2(jax.nn.relu(self.linear1(z)))


class NnxVAE(nnx.Module):
    def __init__(self, din, hidden_size, latent_size, output_shape, *, rngs):
        self.output_shape = output_shape
        self.encoder = NnxEncoder(din, hidden_size, latent_size, rngs=rngs)
        self.decoder = NnxDecoder(latent_size, hidden_size, int(np.prod(output_shape)),
                                  rngs=rngs)

    def __call__(self, x):
        logits = self.decoder(self.encoder(x))
        return jnp.reshape(logits, (-1, *self.output_shape))

    def generate(self, z):
        return nnx.sigmoid(jnp.reshape(self.decoder(z), (-1, *self.output_shape)))


def nnx_vae_loss(model, x):
    """The example's train_step loss: the KL loss popped from the module."""
    logits = model(x)
    losses = nnx.pop(model, Loss)
    kl_loss = sum(jax.tree_util.tree_leaves(losses), 0.0)
    reconstruction_loss = jnp.mean(optax.sigmoid_binary_cross_entropy(logits, x))
    return reconstruction_loss + 0.1 * kl_loss


def _binary_images(batch, seed=0):
    return _binary(batch, seed).reshape(batch, 4, 4)


def nnx_vae():
    model = NnxVAE(16, 12, 3, (4, 4), rngs=nnx.Rngs(0, noise=1))
    return Example(model, None, (_binary_images(4),), (), nnx_vae_loss,
                   lambda n: (_binary_images(n, seed=n),), learning_rate=1e-2)


EXAMPLES = {"mnist": mnist, "nnx_mnist": nnx_mnist, "imagenet": imagenet, "vae": vae,
            "nnx_vae": nnx_vae}


@pytest.mark.parametrize("name", cases(EXAMPLES, slow={"imagenet", "nnx_mnist"}))
def test_example_imports_trains_and_exports_as_flax_runs_it(name, tmp_path):
    check_example(EXAMPLES[name](), tmp_path)
