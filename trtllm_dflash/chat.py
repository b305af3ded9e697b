"""Chat templating shared by the OpenAI-compatible server and offline `generate --chat`.

Both sides turn messages into the prompt text with the target tokenizer's own chat template
and then encode that text the same way (no added special tokens), so a served chat request and
an offline one decode exactly the same prompt tokens.
"""

from __future__ import annotations

import functools
import inspect
import re
import sys
import threading
import time
from typing import Any, Callable, Iterable, Mapping

from trtllm_dflash.errors import DFlashError

# Rendering is bounded whoever wrote the template: a template is a program (loops, string
# arithmetic), and a served one runs on request data in a front-end worker thread.
RENDER_SECONDS = 2.0
RENDER_CHARS = 4 * 1024 * 1024  # the front end passes its own: what its largest prompt could be


class NoChatTemplateError(DFlashError):
    """The target's tokenizer has no chat template (chat needs one; completions do not)."""


class TemplateKwargError(DFlashError):
    """A chat_template_kwargs key that is not a plain template variable (`key` names it)."""

    def __init__(self, key: str, problem: str, fix: str) -> None:
        super().__init__(problem, fix)
        self.key = key


class RenderLimitError(DFlashError):
    """Rendering the template went over its time or output bound (`limit` names which)."""

    def __init__(self, limit: str, problem: str, fix: str) -> None:
        super().__init__(problem, fix)
        self.limit = limit


def check_template_kwargs(tokenizer: Any, kwargs: Mapping[str, Any] | None, allow_template: bool = False) -> None:
    """Refuse what a request may not pass to the template: a template of its own (`chat_template`,
    unless the operator allows request templates) and every key that changes how the template is
    chosen or rendered rather than what it reads (apply_chat_template's own parameters of the
    installed transformers, e.g. tokenize, add_generation_prompt, tools; the conversation; the
    tokenizer's special tokens). Variables templates read (enable_thinking, ...) pass."""
    if not kwargs:
        return
    rendering = _rendering_keys(type(tokenizer))
    special = set(getattr(tokenizer, "special_tokens_map", {}) or {})
    for key in kwargs:
        if key == "chat_template":
            if allow_template:
                continue
            raise TemplateKwargError(
                key,
                "chat_template_kwargs.chat_template would replace the server's chat template, "
                "and this server does not run templates sent by clients",
                "leave it out (the operator can allow request templates with `serve --allow-request-chat-template`)",
            )
        if not isinstance(key, str) or not key.isidentifier() or key.startswith("_"):
            raise TemplateKwargError(
                str(key), f"chat_template_kwargs key {key!r} is not a template variable name", "use identifiers such as enable_thinking"
            )
        if key in rendering:
            raise TemplateKwargError(
                key,
                f"chat_template_kwargs.{key} is not a template variable: it changes how the server chooses or renders its template",
                "leave it out (variables the template reads, such as enable_thinking, are passed)",
            )
        if key in special:
            raise TemplateKwargError(key, f"chat_template_kwargs.{key} would replace the tokenizer's {key}", "leave it out")


@functools.lru_cache(maxsize=None)
def _rendering_keys(tokenizer_class: type) -> frozenset[str]:
    """apply_chat_template's named parameters (of the installed transformers) and the template's
    own conversation variables: none of them is a plain template variable."""
    try:
        names = set(inspect.signature(tokenizer_class.apply_chat_template).parameters)
    except (AttributeError, TypeError, ValueError):
        names = set()
    names -= {"self", "kwargs", "chat_template"}
    return frozenset(
        names
        | {
            "messages",
            "conversation",
            "conversations",
            "tools",
            "documents",
            "add_generation_prompt",
            "continue_final_message",
            "tokenize",
            "return_dict",
            "tokenizer_kwargs",
        }
    )


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
    tokenizer: Any,
    messages: Iterable[Mapping[str, Any]] | str,
    template_kwargs: Mapping[str, Any] | None = None,
    max_seconds: float = RENDER_SECONDS,
    max_chars: int = RENDER_CHARS,
) -> str:
    """The prompt text for `messages` (a string is one user message), generation prompt added.

    `template_kwargs` go to the template as variables (e.g. enable_thinking=False); a request's
    are checked by `check_template_kwargs` first. Rendering is bounded: RenderLimitError past
    `max_seconds` of template code or `max_chars` of output (or of a string built on the way).
    """
    if tokenizer is None:
        raise NoChatTemplateError(
            "this target has no tokenizer, so chat messages cannot be templated", "save the tokenizer next to the target"
        )
    if not has_chat_template(tokenizer) and not (template_kwargs or {}).get("chat_template"):
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
        with _bounds(max_seconds, max_chars):
            text = tokenizer.apply_chat_template(rows, tokenize=False, add_generation_prompt=True, **dict(template_kwargs or {}))
    except RenderLimitError:
        raise
    except Exception as exc:  # noqa: BLE001 - a template that fails on these messages is bad input
        raise DFlashError(
            f"the chat template failed on these messages ({type(exc).__name__}: {exc})", "check the messages' roles and contents"
        ) from None
    if len(text) > max_chars:  # where the bounded environment could not be installed
        raise _too_long(max_chars)
    return text


# ---------------------------------------------------------------------- bounded rendering
#
# transformers compiles a template once (in its sandboxed Jinja environment) and renders it;
# hf_compat.route_chat_template_compilation, the one place that knows where, sends the compile
# through `_bounded_template` within `_bounds`: the same template compiled in an environment whose string-building
# operations check sizes first (`*`, `+`, `%`, `**`, calls, filters) and whose output is counted
# as it is produced; other threads and callers get transformers' own. Time is bounded by a trace
# function on the template's own code (every line of it, so loops with empty bodies too).

_local = threading.local()
_TEMPLATE_FILE = "<template>"


class _Bounds:
    def __init__(self, seconds: float, chars: int) -> None:
        self.deadline, self.seconds, self.chars = time.monotonic() + seconds, seconds, chars


def _too_long(chars: int) -> RenderLimitError:
    return RenderLimitError(
        "max_chars",
        f"the chat template's output went over its limit of {chars} characters",
        "send shorter messages, or a template that does not build such long text",
    )


def _too_slow(seconds: float) -> RenderLimitError:
    return RenderLimitError(
        "max_seconds", f"the chat template ran over its time limit of {seconds:g} s", "use a template without long loops"
    )


class _bounds:
    """Bound the renders of this thread (a context manager)."""

    def __init__(self, seconds: float, chars: int) -> None:
        self.bounds = _Bounds(seconds, chars)

    def __enter__(self) -> None:
        _install()
        self.previous, _local.bounds = getattr(_local, "bounds", None), self.bounds
        self.trace = sys.gettrace()
        bounds = self.bounds

        def line(frame, event, arg):
            if time.monotonic() > bounds.deadline:
                raise _too_slow(bounds.seconds)
            return line

        def call(frame, event, arg):
            if time.monotonic() > bounds.deadline:
                raise _too_slow(bounds.seconds)
            return line if frame.f_code.co_filename == _TEMPLATE_FILE else None

        sys.settrace(call)

    def __exit__(self, *exc) -> None:
        sys.settrace(self.trace)
        _local.bounds = self.previous


def _current() -> _Bounds | None:
    return getattr(_local, "bounds", None)


_installed = False
_install_lock = threading.Lock()


def _install() -> None:
    """Route transformers' template compilation through `_bounded_template` while a render is
    bounded (once; where transformers compiles elsewhere, only the time bound and the final length
    check remain)."""
    global _installed
    with _install_lock:
        if _installed:
            return
        _installed = True
        from trtllm_dflash import hf_compat  # imports transformers: only once a template is rendered

        hf_compat.route_chat_template_compilation(_bounded_template, lambda: _current() is not None)


@functools.lru_cache(maxsize=64)
def _bounded_template(template: str):
    """`template` compiled in a fresh copy of transformers' sandboxed environment whose
    string-building operations are bounded."""
    from trtllm_dflash import hf_compat

    environment = hf_compat.chat_template_environment()
    _bound_environment(environment)
    compiled = environment.from_string(template)  # intercepted operators are compile-time
    names = compiled.root_render_func.__globals__  # the template module's: `~` is str_join / markup_join there
    for name in ("str_join", "markup_join"):
        if callable(names.get(name)):
            names[name] = _bounded_join(names[name])
    return compiled


_DIGITS = re.compile(r"\d+")


def _check_size(value: Any) -> Any:
    bounds = _current()
    if bounds is not None and isinstance(value, (str, list, tuple)) and len(value) > bounds.chars:
        raise _too_long(bounds.chars)
    return value


def _check_args(args: Iterable[Any]) -> None:
    """An integer argument or a width in a format string larger than the output bound (a padding,
    a repetition) would build that much text: refused before it runs."""
    bounds = _current()
    if bounds is None:
        return
    for value in args:
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > bounds.chars:
            raise _too_long(bounds.chars)


def _check_format(text: Any) -> None:
    """A format string (`%` or str.format) whose width or precision exceeds the output bound."""
    bounds = _current()
    if bounds is not None and isinstance(text, str) and any(len(d) > 9 or int(d) > bounds.chars for d in _DIGITS.findall(text)):
        raise _too_long(bounds.chars)


def _size(value: Any) -> int:
    return len(value) if isinstance(value, (str, list, tuple)) else 0


def _bounded_join(join: Callable) -> Callable:
    """`a ~ b`: the joined length checked before joining."""

    @functools.wraps(join)
    def bounded(parts):
        parts = list(parts)
        bounds = _current()
        if bounds is not None and sum(len(str(p)) if isinstance(p, str) else 0 for p in parts) > bounds.chars:
            raise _too_long(bounds.chars)
        return join(parts)

    return bounded


def _bound_environment(environment: Any) -> None:
    """Size checks on the environment's string-building operations (instance attributes: the
    compiled code calls environment.call_binop / environment.call / its filters / concat)."""
    environment.intercepted_binops = frozenset({"*", "**", "+", "%"})
    binop, call = environment.call_binop, environment.call

    def call_binop(context, operator, left, right):
        bounds = _current()
        if bounds is not None:
            if operator == "*" and isinstance(left, int) != isinstance(right, int):
                count = left if isinstance(left, int) else right
                if max(_size(left), _size(right)) * max(count, 0) > bounds.chars:
                    raise _too_long(bounds.chars)
            elif operator == "+" and _size(left) + _size(right) > bounds.chars:
                raise _too_long(bounds.chars)
            elif (
                operator == "**"
                and isinstance(left, int)
                and isinstance(right, int)
                and abs(left) > 1
                and right * abs(left).bit_length() > 8 * bounds.chars
            ):
                raise _too_long(bounds.chars)
            elif operator == "%" and isinstance(left, str):
                _check_format(left)
                _check_args(right if isinstance(right, tuple) else [right])
        return _check_size(binop(context, operator, left, right))

    def bounded_call(context, obj, *args, **kwargs):
        bounds = _current()
        if bounds is not None and obj is not environment.globals.get("range"):  # the sandbox's range is bounded already
            _check_args([*args, *kwargs.values()])
            owner, method = getattr(obj, "__self__", None), getattr(obj, "__name__", "")
            if isinstance(owner, str):  # the str methods that multiply text
                if method in ("format", "format_map"):
                    _check_format(owner)
                elif method == "join" and args and _size(args[0]) * len(owner) > bounds.chars:
                    raise _too_long(bounds.chars)
                elif method == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
                    if (owner.count(args[0]) if args[0] else len(owner) + 1) * len(args[1]) > bounds.chars:
                        raise _too_long(bounds.chars)
        return _check_size(call(context, obj, *args, **kwargs))

    def wrap(name: str, function: Callable) -> Callable:
        @functools.wraps(function)  # keeps jinja's pass_context / pass_eval_context marks
        def bounded_filter(*args, **kwargs):
            bounds = _current()
            if bounds is not None:
                values = [a for a in args if not type(a).__module__.startswith("jinja2")]
                _check_args([*values[1:], *kwargs.values()])
                if name == "join" and values:
                    items = values[0] if isinstance(values[0], (list, tuple, str)) else None
                    separator = values[1] if len(values) > 1 else kwargs.get("d", "")
                    if items is not None and len(items) * _size(separator) > bounds.chars:
                        raise _too_long(bounds.chars)
                if name == "replace" and len(values) >= 3 and isinstance(values[0], str):
                    old, new = str(values[1]), str(values[2])
                    if (values[0].count(old) if old else len(values[0]) + 1) * len(new) > bounds.chars:
                        raise _too_long(bounds.chars)
            return _check_size(function(*args, **kwargs))

        return bounded_filter

    environment.filters = {name: wrap(name, function) for name, function in environment.filters.items()}
    concat = environment.concat

    def bounded_concat(chunks):
        bounds = _current()
        if bounds is None:
            return concat(chunks)
        parts, total = [], 0
        for chunk in chunks:
            total += len(chunk)
            if total > bounds.chars:
                raise _too_long(bounds.chars)
            parts.append(chunk)
        return concat(parts)

    environment.call_binop, environment.call, environment.concat = call_binop, bounded_call, bounded_concat
