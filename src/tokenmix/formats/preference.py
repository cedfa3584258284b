"""``preference_chat``: a preferred and a rejected conversation per record, for DPO-style training (Levanter's meaning).

Levanter's (marin's ``lib/levanter``) ``PreferenceChatLmDatasetFormat``: the ``chosen`` and ``rejected`` fields each hold
a conversation (a list of ``{role, content}`` messages), rendered exactly as the ``chat`` format renders one (the chat
template, ``system_prompt``, ``chat_template_kwargs``, assistant turns as the loss targets when ``mask_user_turns``).
A record becomes two documents of the cache, the chosen one first; a record whose chosen or rejected conversation is
missing or empty is skipped and counted as ``empty_preference_pair`` (Levanter skips it with a warning), so the cache
always holds whole pairs.

A pair is read as one example of ``2 x seq_len`` tokens (``datasets/preference_pairs.py``): the chosen conversation
padded to ``seq_len``, then the rejected one, as Levanter's ``DpoExample(chosen, rejected)`` holds two padded sequences.
Levanter packs no pairs and raises on a conversation longer than ``seq_len`` (``pack: false``, ``slice_strategy:
raise``, the only values its DPO data config takes); so does tokenmix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from tokenmix.formats.base import BadRecordError, FormatContext, LmDatasetFormatBase, RecordRenderer, Rendered
from tokenmix.formats.chat import ChatLmDatasetFormat


@LmDatasetFormatBase.register_subclass("preference_chat")
@dataclass(frozen=True)
class PreferenceChatLmDatasetFormat(LmDatasetFormatBase):
    """A chosen and a rejected conversation per record; loss only on what the template marks as generated."""

    chosen_field: str = "chosen"
    """Field holding the preferred conversation."""
    rejected_field: str = "rejected"
    """Field holding the rejected conversation."""
    chat_template: str | None = None
    """Jinja chat template; None uses the config's ``chat_template``, else the tokenizer's."""
    system_prompt: str | None = None
    """Field holding a system prompt put first in both conversations (unset: none)."""
    chat_template_kwargs: str | None = "chat_template_kwargs"
    """Field holding extra template variables (a mapping); null reads none."""
    pack: bool = False
    """Levanter's switch; its DPO training takes only false (one pair per example)."""
    mask_user_turns: bool = True
    """Train only on the assistant turns; false trains on every token."""
    slice_strategy: Literal["left", "right", "raise", "drop"] = "raise"
    """What a conversation longer than ``seq_len`` does; Levanter's DPO training takes only ``raise``."""

    dataset_options = ("pack", "slice_strategy")
    default_pack = False
    adds_special_tokens = False  # the chat template places its own

    def __post_init__(self) -> None:
        if self.pack:
            raise ValueError(f"format preference_chat: pack: {self.pack!r} is not supported (Levanter's DPO data config refuses "
                             "packed preference_chat datasets too); remove pack or set it to false")
        if self.slice_strategy != "raise":
            raise ValueError(f"format preference_chat: slice_strategy: {self.slice_strategy!r} is not supported (Levanter's DPO "
                             "data config takes only raise); remove slice_strategy or set it to raise")

    @property
    def masks_loss(self) -> bool:
        return self.mask_user_turns

    def conversation_format(self, field_name: str) -> ChatLmDatasetFormat:
        """The ``chat`` format that renders one side of the pair, read from ``field_name``."""
        return ChatLmDatasetFormat(messages_field=field_name, chat_template=self.chat_template, mask_user_turns=self.mask_user_turns,
                                   system_prompt=self.system_prompt, chat_template_kwargs=self.chat_template_kwargs)

    def bind(self, context: FormatContext) -> RecordRenderer:
        sides = [(name, self.conversation_format(name).bind(context)) for name in (self.chosen_field, self.rejected_field)]

        def render_record(record: dict[str, Any]) -> list[Rendered]:
            for name, _ in sides:
                if not record.get(name):
                    raise BadRecordError("empty_preference_pair", f"{name!r} is missing or empty: a preference pair needs both conversations")
            return [render(record) for _, render in sides]

        return render_record
