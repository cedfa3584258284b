"""``chat``: conversations rendered with a chat template, trained only on the assistant's turns.

Levanter's ``ChatLmDatasetFormat`` semantics: the ``messages`` field (a list of ``{role, content}``
objects, OpenAI style) is rendered with the chat template given in the config or, failing that, the
tokenizer's own, exactly as Hugging Face's ``apply_chat_template`` renders it. The template marks what
the model must learn to produce with ``{% generation %} ... {% endgeneration %}``; the tokens overlapping
those characters are the loss targets (all assistant turns of a multi-turn conversation), everything
else (system and user turns, role headers) is masked. The template places its own BOS/EOS, so
``enforce_bos``/``enforce_eos`` do not apply.

A template that cannot mark assistant turns is refused when the config is resolved (before any
record); a conversation in which it marks nothing (no assistant turn) is a bad record,
``no_assistant_span``.

Newer Levanter's per-record fields are read too: ``system_prompt`` names a field holding a system prompt (a string, or
a message mapping with ``content``) put before the messages as a ``system`` message, and ``chat_template_kwargs`` (by
default the field ``chat_template_kwargs``, when a record has it) a mapping of extra variables for the template (a
``chat_template`` among them replaces the template for that record; ``add_generation_prompt`` is ignored).

``single_turn: true`` is Levanter's other reading: the first user message and the first assistant message
become a prompt and a completion, with no template, exactly as the ``supervised`` format would take them
(BOS/EOS as configured, ``mask_user_turns`` masking the prompt); later turns are left out.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

from tokenmix.formats.base import BadRecordError, FormatContext, LmDatasetFormatBase, Pack, RecordRenderer, Rendered, record_field, text_size
from tokenmix.formats.supervised import SupervisedLmDatasetFormat
from tokenmix.formats.tokenizer import import_transformers

logger = logging.getLogger(__name__)

_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")
_PROBE = [{"role": "user", "content": "Hello?"}, {"role": "assistant", "content": "Hi."}]
_DOCS = "https://levanter.readthedocs.io/en/latest/reference/Data-Formats.html#chat-templates"


@LmDatasetFormatBase.register_subclass("chat")
@dataclass(frozen=True)
class ChatLmDatasetFormat(LmDatasetFormatBase):
    """A conversation per record; loss only on what the template marks as generated (the assistant turns)."""

    messages_field: str = "messages"
    """Field holding the list of messages."""
    chat_template: str | None = None
    """Jinja chat template; None uses the tokenizer's."""
    mask_user_turns: bool = True
    """Train only on the assistant turns; false trains on every token (and needs no generation marks)."""
    pack: Pack = True
    """Levanter's switch: pack several conversations into each sequence (true or null, or at most this many), or one a
    sequence (false or ``pad``)."""
    single_turn: bool = False
    """Levanter's switch: the first user and assistant messages as a prompt and a completion, no template."""
    system_prompt: str | None = None
    """Newer Levanter: the field holding a record's system prompt, put first as a ``system`` message (unset: none)."""
    chat_template_kwargs: str | None = "chat_template_kwargs"
    """Newer Levanter: the field holding a record's extra template variables (a mapping); null reads none."""

    dataset_options = ("pack",)
    default_pack = True

    @property
    def adds_special_tokens(self) -> bool:  # type: ignore[override]
        """A template places its own BOS/EOS; a single turn is a prompt and a completion, which get them."""
        return self.single_turn

    @property
    def masks_loss(self) -> bool:
        return self.mask_user_turns

    def identity(self) -> dict[str, Any]:
        """The base identity, without ``single_turn`` and ``system_prompt`` when they are off: caches made before the
        options existed keep theirs, but for ``chat_template_kwargs``, which changes what records carrying it render."""
        identity = super().identity()
        for option in ("single_turn", "system_prompt"):
            if not getattr(self, option):
                del identity[option]
        return identity

    def bind(self, context: FormatContext) -> RecordRenderer:
        if self.single_turn:
            return self._bind_single_turn(context)
        template = self.chat_template or context.chat_template
        if not template:
            raise ValueError(
                "format chat: the tokenizer has no chat template; give one as format.chat_template "
                f"(with {{% generation %}} ... {{% endgeneration %}} around what the assistant says, see {_DOCS})"
            )
        if self.mask_user_turns and not _GENERATION_TAG.search(template):
            raise ValueError(
                "format chat: the chat template cannot mark assistant turns: it has no {% generation %} block, so the "
                "user turns could not be masked. Wrap what the assistant says in {% generation %} ... {% endgeneration %} "
                f"(see {_DOCS}), or set format.mask_user_turns: false to train on every token"
            )
        render_template = _renderer()
        special = dict(context.special_tokens)

        def render(messages: list[dict[str, Any]], extra: dict[str, Any] | None = None) -> tuple[str, list[tuple[int, int]]]:
            variables = {"tools": None, **special, **(extra or {})}
            rendered, spans = render_template(conversations=[messages], chat_template=variables.pop("chat_template", template),
                                              return_assistant_tokens_mask=self.mask_user_turns, **variables)
            return rendered[0], [tuple(s) for s in spans[0]] if self.mask_user_turns else []

        self._check_template(render)

        def render_record(record: dict[str, Any]) -> Rendered:
            messages = self._system(record) + self._messages(record)
            extra = self._template_variables(record)
            try:
                text, spans = render(messages, extra)
            except Exception as e:  # noqa: BLE001 - any failure inside a user's template is this record's problem
                raise BadRecordError("template_error", f"the chat template failed on this conversation: {type(e).__name__}: {e}") from None
            size = text_size(*(m["content"] for m in messages))
            if not self.mask_user_turns:
                return Rendered([text], None, None, *size)
            spans = [(a, b) for a, b in spans if b > a]
            if not spans:
                raise BadRecordError("no_assistant_span", "the chat template marked no assistant text in this conversation (no assistant turn?)")
            return Rendered([text], None, spans, *size)

        return render_record

    def _bind_single_turn(self, context: FormatContext) -> RecordRenderer:
        if self.chat_template is not None:
            raise ValueError("format chat: single_turn takes no chat_template (as in Levanter: the first user and assistant "
                             "messages are a prompt and a completion); remove chat_template or set single_turn: false")
        as_supervised = SupervisedLmDatasetFormat(input_field="prompt", output_field="response", mask_inputs=self.mask_user_turns)
        render = as_supervised.bind(context)

        def render_record(record: dict[str, Any]) -> Rendered:
            messages = self._messages(record)
            turns = {}
            for role in ("user", "assistant"):
                turns[role] = next((m["content"] for m in messages if m["role"] == role), None)
                if turns[role] is None:
                    raise BadRecordError("missing_field", f"{self.messages_field!r} has no {role} message (single_turn needs one of each)")
            return render({"prompt": turns["user"], "response": turns["assistant"]})

        return render_record

    def _check_template(self, render: Any) -> None:
        """Render a one-exchange conversation: a template that fails to compile, or marks nothing in it, is refused."""
        from jinja2 import TemplateSyntaxError

        try:
            _, spans = render(_PROBE)
        except TemplateSyntaxError as e:
            raise ValueError(f"format chat: the chat template does not compile: line {e.lineno}: {e.message}") from None
        except Exception as e:  # noqa: BLE001 - a template may insist on its own conventions (a system turn first...)
            logger.info("format chat: could not check the template on a plain user/assistant exchange (%s); checking per record", e)
            return
        if self.mask_user_turns and not any(b > a for a, b in spans):
            raise ValueError(
                "format chat: the chat template's {% generation %} block marks nothing in a plain user/assistant exchange, "
                f"so assistant turns could not be trained on. Put it around the assistant's content (see {_DOCS})"
            )

    def _system(self, record: dict[str, Any]) -> list[dict[str, Any]]:
        """The record's system prompt as a message list (empty without one), as Levanter reads ``system_prompt``."""
        if self.system_prompt is None or record.get(self.system_prompt) is None:
            return []
        value = record[self.system_prompt]
        if isinstance(value, dict):
            if not isinstance(value.get("content"), str):
                raise BadRecordError("missing_field", f"{self.system_prompt!r} is a mapping without a string 'content'")
            return [{**value, "role": "system"}]
        if not isinstance(value, str):
            raise BadRecordError("wrong_type", f"{self.system_prompt!r} is {type(value).__name__}, not a string or a message")
        return [{"role": "system", "content": value}]

    def _template_variables(self, record: dict[str, Any]) -> dict[str, Any]:
        """The record's extra template variables (``chat_template_kwargs``), checked as Levanter checks them."""
        if self.chat_template_kwargs is None or record.get(self.chat_template_kwargs) is None:
            return {}
        value = record[self.chat_template_kwargs]
        if not isinstance(value, dict):
            raise BadRecordError("wrong_type", f"{self.chat_template_kwargs!r} must be a mapping of template variables, not "
                                               f"{type(value).__name__}")
        for forbidden in ("tokenize", "return_assistant_tokens_mask", "return_dict", "return_message_spans"):
            if forbidden in value:
                raise BadRecordError("wrong_type", f"{self.chat_template_kwargs!r} may not set {forbidden!r}")
        return {k: v for k, v in value.items() if k != "add_generation_prompt"}

    def _messages(self, record: dict[str, Any]) -> list[dict[str, Any]]:
        messages = record_field(record, self.messages_field, "messages_field")
        if not isinstance(messages, list):
            raise BadRecordError("wrong_type", f"{self.messages_field!r} is {type(messages).__name__}, not a list of messages")
        if not messages:
            raise BadRecordError("empty_document", f"{self.messages_field!r} is an empty list")
        for i, message in enumerate(messages):
            if not isinstance(message, dict):
                raise BadRecordError("wrong_type", f"{self.messages_field}[{i}] is {type(message).__name__}, not an object")
            for key in ("role", "content"):
                if key not in message:
                    raise BadRecordError("missing_field", f"{self.messages_field}[{i}] has no {key!r}")
                if not isinstance(message[key], str):
                    raise BadRecordError("wrong_type", f"{self.messages_field}[{i}].{key} is {type(message[key]).__name__}, not a string")
        return messages


def _renderer() -> Any:
    """Hugging Face's own chat-template renderer (the one ``apply_chat_template`` uses), imported when needed."""
    import_transformers()
    try:
        from transformers.utils.chat_template_utils import render_jinja_template
    except ImportError as e:
        raise ValueError(
            f"format chat needs jinja2 (>= 3.1.6) and a transformers release with render_jinja_template (>= 4.52): {e}"
        ) from None
    return render_jinja_template
