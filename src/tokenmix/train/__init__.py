"""A draccus-configured training launch on tokenmix's loader: a tiny JAX transformer trained on the mixture's sharded
batches, evaluated per source, checkpointed and resumed exactly (``python -m tokenmix.train`` or ``tokenmix train``).

Needs ``pip install 'tokenmix[train]'`` (optax, matplotlib). Nothing else in tokenmix imports this package."""
