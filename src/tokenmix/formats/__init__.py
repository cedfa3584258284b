"""Records to token ids and loss-mask spans. Importing the package registers every format on
``LmDatasetFormatBase``, so ``format: {type: ...}`` in YAML can name any of them."""

from tokenmix.formats import chat, fim, supervised, text  # noqa: F401
