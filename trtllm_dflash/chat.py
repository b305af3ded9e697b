"""Chat templating shared by the OpenAI-compatible server and offline `generate --chat`.

Both sides turn messages into the prompt text with the target tokenizer's own chat template
and then encode that text the same way (no added special tokens), so a served chat request and
an offline one decode exactly the same prompt tokens.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from trtllm_dflash.errors import DFlashError


class NoChatTemplateError(DFlashError):
    """The target's tokenizer has no chat template (chat needs one; completions do not)."""


def has_chat_template(tokenizer: Any) -> bool:
    """Whether the tokenizer carries a chat template (tokenizer_config.json or chat_template.jinja)."""
    return bool(getattr(tokenizer, "chat_template", None))


def message_text(content: Any) -> str:
    """A message's content as text: a string, or the text parts of an OpenAI content list."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind != "text":
            raise DFlashError(f"message content part of type {kind!r} is not supported", "send text content only")
        parts.append(str(part.get("text", "")))
    return "".join(parts)


def apply_chat_template(
    tokenizer: Any, messages: Iterable[Mapping[str, Any]] | str, template_kwargs: Mapping[str, Any] | None = None
) -> str:
    """The prompt text for `messages` (a string is one user message), generation prompt added.

    `template_kwargs` go to the template as variables (e.g. enable_thinking=False).
    """
    if tokenizer is None:
        raise NoChatTemplateError("this target has no tokenizer, so chat messages cannot be templated", "save the tokenizer next to the target")
    if not has_chat_template(tokenizer):
        raise NoChatTemplateError(
            "the target's tokenizer has no chat template",
            "use plain completions, or add a chat_template (tokenizer_config.json or chat_template.jinja) to the target",
        )
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    rows = [{**dict(m), "content": message_text(m.get("content"))} for m in messages]
    if not rows:
        raise DFlashError("no messages given", "send at least one message")
    try:
        return tokenizer.apply_chat_template(rows, tokenize=False, add_generation_prompt=True, **dict(template_kwargs or {}))
    except Exception as exc:  # noqa: BLE001 - a template that fails on these messages is bad input
        raise DFlashError(f"the chat template failed on these messages ({type(exc).__name__}: {exc})", "check the messages' roles and contents") from None
