"""A tiny decoder-only transformer in JAX and equinox: enough to show that the loader's batches train a model.

Attention is causal and stays inside a document: a position attends to earlier positions of the same segment only
(``segment_ids``), and learned position embeddings count from each document's start (``positions``), so a packed or
concatenated window trains each document as if it were alone. Parameters are laid out for a ``(data, model)`` mesh:
attention heads and the MLP's hidden units are split over ``model``, everything else is replicated; XLA places the
rest of the computation from there.
"""

from __future__ import annotations

from dataclasses import dataclass

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P


@dataclass(frozen=True)
class ModelConfig:
    """The model's size (``model:`` in a training config)."""

    hidden_dim: int = 128
    num_layers: int = 2
    num_heads: int = 4
    mlp_ratio: int = 4
    max_position: int = 4096
    """Position embeddings (positions count from each document's start); a training config's examples must fit in them."""
    init_scale: float = 0.02

    def __post_init__(self) -> None:
        if self.hidden_dim % self.num_heads:
            raise ValueError(f"model.hidden_dim {self.hidden_dim} must be a multiple of model.num_heads {self.num_heads}")


class Block(eqx.Module):
    ln1: jax.Array
    qkv: jax.Array
    """(hidden, 3, heads, head_dim)"""
    out: jax.Array
    """(heads, head_dim, hidden)"""
    ln2: jax.Array
    up: jax.Array
    down: jax.Array


class TinyLM(eqx.Module):
    """Token and position embeddings, pre-norm blocks, and the output tied to the token embedding."""

    embed: jax.Array
    position: jax.Array
    blocks: list[Block]
    ln_f: jax.Array

    @staticmethod
    def init(config: ModelConfig, vocab_size: int, key: jax.Array) -> TinyLM:
        d, h = config.hidden_dim, config.num_heads
        f = d * config.mlp_ratio
        keys = jax.random.split(key, 2 + 4 * config.num_layers)

        def normal(k: jax.Array, *shape: int) -> jax.Array:
            return config.init_scale * jax.random.normal(k, shape, jnp.float32)

        blocks = [
            Block(jnp.ones(d), normal(keys[2 + 4 * i], d, 3, h, d // h), normal(keys[3 + 4 * i], h, d // h, d), jnp.ones(d),
                  normal(keys[4 + 4 * i], d, f), normal(keys[5 + 4 * i], f, d))
            for i in range(config.num_layers)
        ]
        return TinyLM(normal(keys[0], vocab_size, d), normal(keys[1], config.max_position, d), blocks, jnp.ones(d))

    def __call__(self, tokens: jax.Array, segment_ids: jax.Array, positions: jax.Array) -> jax.Array:
        """Logits ``(batch, length, vocab)`` for ``tokens (batch, length)``."""
        x = self.embed[tokens] + self.position[jnp.minimum(positions, self.position.shape[0] - 1)]
        length = tokens.shape[1]
        causal = jnp.tril(jnp.ones((length, length), bool))
        mask = causal[None] & (segment_ids[:, :, None] == segment_ids[:, None, :])  # (batch, query, key)
        for block in self.blocks:
            q, k, v = jnp.einsum("bld,dthe->tbhle", _norm(x, block.ln1), block.qkv)
            scores = jnp.einsum("bhqe,bhke->bhqk", q, k) / jnp.sqrt(q.shape[-1]).astype(q.dtype)
            scores = jnp.where(mask[:, None], scores, jnp.finfo(scores.dtype).min)
            attended = jnp.einsum("bhqk,bhke->bhqe", jax.nn.softmax(scores, axis=-1), v)
            x = x + jnp.einsum("bhle,hed->bld", attended, block.out)
            x = x + jax.nn.gelu(_norm(x, block.ln2) @ block.up) @ block.down
        return _norm(x, self.ln_f) @ self.embed.T


def _norm(x: jax.Array, scale: jax.Array) -> jax.Array:
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale


def shard_params(model: TinyLM, mesh: Mesh, model_axis: str = "model") -> TinyLM:
    """The parameters placed on ``mesh``: heads and MLP units split over ``model_axis``, the rest replicated."""
    replicated = NamedSharding(mesh, P())

    def place(spec: P):
        return lambda a: jax.device_put(a, NamedSharding(mesh, spec))

    blocks = [
        Block(jax.device_put(b.ln1, replicated), place(P(None, None, model_axis, None))(b.qkv), place(P(model_axis, None, None))(b.out),
              jax.device_put(b.ln2, replicated), place(P(None, model_axis))(b.up), place(P(model_axis, None))(b.down))
        for b in model.blocks
    ]
    return TinyLM(jax.device_put(model.embed, replicated), jax.device_put(model.position, replicated), blocks,
                  jax.device_put(model.ln_f, replicated))


def loss_and_count(model: TinyLM, tokens: jax.Array, loss_mask: jax.Array, segment_ids: jax.Array, positions: jax.Array,
                   ) -> tuple[jax.Array, jax.Array]:
    """Summed next-token cross-entropy over the positions ``loss_mask`` trains, and how many those are."""
    row_loss, row_count = row_losses(model, tokens, loss_mask, segment_ids, positions)
    return jnp.sum(row_loss), jnp.sum(row_count)


def row_losses(model: TinyLM, tokens: jax.Array, loss_mask: jax.Array, segment_ids: jax.Array, positions: jax.Array,
               ) -> tuple[jax.Array, jax.Array]:
    """Per row of the batch: summed next-token cross-entropy over the positions ``loss_mask`` trains, and their number."""
    logits = model(tokens, segment_ids, positions).astype(jnp.float32)
    targets = jnp.roll(tokens, -1, axis=1)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    weight = loss_mask.astype(jnp.float32)
    return jnp.sum(nll * weight, axis=1), jnp.sum(weight, axis=1)


def per_source(row_values: jax.Array, source_ids: jax.Array, num_sources: int) -> jax.Array:
    """``row_values`` summed per source (``num_sources`` sums, in source id order): over the whole batch, however it is
    sharded (XLA adds the reduction over the mesh)."""
    return jax.ops.segment_sum(row_values, source_ids, num_segments=num_sources)
