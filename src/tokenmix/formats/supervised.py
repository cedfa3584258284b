"""``supervised``: prompt/completion pairs trained only on the completion (and its EOS).

Levanter's ``SupervisedLmDatasetFormat`` field names (``input_field``, ``output_field``,
``separate_with``, ``mask_inputs``, ``pack``) with Cerebras' Summarization semantics: the document is
``[BOS] prompt [separator] completion [EOS]``, the prompt and the separator are never trained on, the
completion and its EOS are, and with ``max_seq_length`` / ``min_sequence_len`` an example with too
many or too few tokens is skipped and counted (``too_long``, ``too_short``), never truncated. Cerebras' text repairs
(``use_ftfy``, ``ftfy_normalizer``, ``wikitext_detokenize``) apply to prompt and completion alike, before tokenizing.

Prompt, separator and completion are tokenized each on its own and their ids concatenated (as
Cerebras does), so the boundary between prompt and completion is exact: a BPE merge can never straddle
it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenmix.formats.base import BadRecordError, FormatContext, LmDatasetFormatBase, Pack, RecordRenderer, Rendered, record_field, text_size
from tokenmix.formats.text_fixes import normal_form, text_fixer, without_unused_repairs


@LmDatasetFormatBase.register_subclass("supervised")
@dataclass(frozen=True)
class SupervisedLmDatasetFormat(LmDatasetFormatBase):
    """A prompt and a completion per record; loss only on the completion and its EOS."""

    input_field: str = "prompt"
    """Field holding the prompt (Levanter's canonical name)."""
    output_field: str = "response"
    """Field holding the completion."""
    separate_with: bool | int | str | None = None
    """Put between prompt and completion, counted as prompt: a text (tokenized on its own) or a token id. A boolean is
    refused: YAML's ``false`` would otherwise be read as token id 0 and ``true`` as id 1 (draccus reads a boolean as the
    int it is), a token put into every example where the user meant none."""
    mask_inputs: bool = True
    """Train only on the completion and its EOS; false trains on every token."""
    max_seq_length: int | None = None
    """Skip (and count as ``too_long``) examples of more tokens than this, BOS, separator and EOS included."""
    min_sequence_len: int | None = None
    """Skip (and count as ``too_short``) examples of fewer tokens than this."""
    pack: Pack = True
    """Levanter's switch: pack several examples into each sequence (true, or at most this many), or one a sequence
    (false or ``pad``)."""
    use_ftfy: bool = False
    """Cerebras: repair prompt and completion with ftfy (mojibake, HTML entities, control characters) before tokenizing."""
    ftfy_normalizer: str | None = "NFC"
    """Cerebras: the Unicode normal form ftfy leaves the text in (NFC, NFKC, NFD, NFKD; None: none). Only with ``use_ftfy``."""
    wikitext_detokenize: bool = False
    """Cerebras: undo wikitext-103's tokenization in prompt and completion, after ftfy."""

    dataset_options = ("pack",)
    default_pack = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "ftfy_normalizer", normal_form(self.ftfy_normalizer, "format supervised: ftfy_normalizer"))
        if isinstance(self.separate_with, bool):
            raise ValueError(f"format supervised: separate_with is {str(self.separate_with).lower()}, not a separator; leave it "
                             "out (or null) for none, or give a separator text or a token id")
        for name in ("max_seq_length", "min_sequence_len"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"format supervised: {name} must be a positive number of tokens, got {value}")
        if self.max_seq_length is not None and self.min_sequence_len is not None and self.min_sequence_len > self.max_seq_length:
            raise ValueError(f"format supervised: min_sequence_len {self.min_sequence_len} is above max_seq_length {self.max_seq_length}")

    @property
    def masks_loss(self) -> bool:
        return self.mask_inputs

    def length_limits(self) -> tuple[int | None, int | None]:
        return self.min_sequence_len, self.max_seq_length

    def identity(self) -> dict[str, Any]:
        """The base identity with the text repairs only when they are on, so supervised caches made before the options
        existed keep theirs."""
        return without_unused_repairs(super().identity(), self.use_ftfy, self.wikitext_detokenize)

    def bind(self, context: FormatContext) -> RecordRenderer:
        separator: list[str | list[int]] = []
        if isinstance(self.separate_with, int):
            if not 0 <= self.separate_with < context.vocab_size:
                raise ValueError(
                    f"format supervised: separate_with {self.separate_with} is not a token id of this tokenizer "
                    f"(vocabulary of {context.vocab_size}); give a token id below that or a separator text"
                )
            separator = [[self.separate_with]]
        elif self.separate_with:
            separator = [self.separate_with]
        targets = [False] * (1 + len(separator)) + [True] if self.mask_inputs else None
        fix = text_fixer(self.use_ftfy, self.ftfy_normalizer, self.wikitext_detokenize)

        def render(record: dict[str, Any]) -> Rendered:
            prompt = self._text(record, self.input_field, "input_field")
            completion = self._text(record, self.output_field, "output_field")
            size = text_size(prompt, completion)
            if fix is not None:
                prompt, completion = fix(prompt), fix(completion)
                for key, value in ((self.input_field, prompt), (self.output_field, completion)):
                    if not value:
                        raise BadRecordError("empty_document", f"{key!r} is empty once use_ftfy/wikitext_detokenize repaired it")
            return Rendered([prompt, *separator, completion], targets, None, *size)

        return render

    @staticmethod
    def _text(record: dict[str, Any], key: str, option: str) -> str:
        value = record_field(record, key, option)
        if not isinstance(value, str):
            raise BadRecordError("wrong_type", f"{key!r} is {type(value).__name__}, not a string")
        if not value:
            raise BadRecordError("empty_document", f"{key!r} is empty")
        return value
