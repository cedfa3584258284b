"""Records to token ids and loss-mask spans: the formats (``text``, ``supervised``, ``chat``, ``preference_chat``, ``fim``, ``prebuilt``, ``ul2r``),
the tokenizer's description, and the encoder the cache builder's workers run.

Importing the package registers every format on ``LmDatasetFormatBase``, so ``format: {type: ...}`` in
YAML can name any of them.
"""

from typing import TYPE_CHECKING

from tokenmix._lazy import lazy_exports
from tokenmix.formats import chat, fim, prebuilt, preference, supervised, text, ul2r  # noqa: F401  (registration)

if TYPE_CHECKING:
    from tokenmix.formats.base import FILTER_REASONS, BadRecordError, FormatContext, LmDatasetFormatBase, Rendered
    from tokenmix.formats.chat import ChatLmDatasetFormat
    from tokenmix.formats.encoder import DocumentEncoder, EncodedChunk
    from tokenmix.formats.encoder_spec import EncoderSpec
    from tokenmix.formats.fim import FimLmDatasetFormat
    from tokenmix.formats.prebuilt import PrebuiltLmDatasetFormat
    from tokenmix.formats.preference import PreferenceChatLmDatasetFormat
    from tokenmix.formats.supervised import SupervisedLmDatasetFormat
    from tokenmix.formats.text import TextLmDatasetFormat
    from tokenmix.formats.tokenizer import TokenizerInfo, TokenizerLoadError, describe_tokenizer, load_tokenizer
    from tokenmix.formats.ul2r import Ul2rLmDatasetFormat

__all__ = [
    "FILTER_REASONS",
    "BadRecordError",
    "ChatLmDatasetFormat",
    "DocumentEncoder",
    "EncodedChunk",
    "EncoderSpec",
    "FimLmDatasetFormat",
    "FormatContext",
    "LmDatasetFormatBase",
    "PrebuiltLmDatasetFormat",
    "PreferenceChatLmDatasetFormat",
    "Rendered",
    "SupervisedLmDatasetFormat",
    "TextLmDatasetFormat",
    "TokenizerInfo",
    "TokenizerLoadError",
    "Ul2rLmDatasetFormat",
    "describe_tokenizer",
    "load_tokenizer",
]
_exports, __getattr__, __dir__ = lazy_exports(__name__, __file__)
