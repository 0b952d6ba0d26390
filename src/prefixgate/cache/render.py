"""Chat rendering: how an upstream turns an OpenAI chat request into one prompt string.

The prefix cache sees tokens, not messages, so where each part of a request lands in the
prompt decides what stays cacheable. Two renderers share the :class:`Renderer` protocol:

- :class:`ChatRenderer`: a simple, typical role-marker format with the tools either before
  the system prompt (``tools_first``, like the DeepSeek template) or after the leading
  system message(s) (``system_first``).
- :class:`JinjaChatTemplate`: a real Hugging Face chat template, rendered the way
  ``transformers`` does (sandboxed, ``trim_blocks``, ``lstrip_blocks``, ``tojson``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, Protocol

from .tokenizer import Tokenizer

__all__ = [
    "ChatRenderer",
    "JinjaChatTemplate",
    "RenderError",
    "Renderer",
    "canonical_json",
    "content_text",
    "render_tokens",
    "template_file",
    "vllm_messages",
]

Message = dict[str, Any]
_LEADING_ROLES = ("system", "developer")


class RenderError(Exception):
    """A chat template could not be loaded or rendered."""


# The project's own chat templates (``data/templates``), by name: each shows one way real
# templates place things (docs/rendering.md). The simulated upstream and a real vLLM
# (``--chat-template``) serve them in the tests and benchmarks.
TEMPLATES = ("hoisting", "in_place", "reasoning_last_query")


def template_file(name: str) -> Path:
    """The file of one of the project's own templates (:data:`TEMPLATES`)."""
    if name not in TEMPLATES:
        raise RenderError(f"no built-in chat template {name!r} (one of {', '.join(TEMPLATES)})")
    return Path(__file__).parents[1] / "data" / "templates" / f"{name}.jinja"


class Renderer(Protocol):
    def render(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> str: ...


def canonical_json(value: Any) -> str:
    """Compact JSON that keeps key order: equal inputs give equal text."""
    return json.dumps(value, sort_keys=False, ensure_ascii=False, separators=(",", ":"))


def _image_marker(part: dict[str, Any]) -> str:
    """A placeholder that names the image, so equal images give equal text (vLLM keys
    multimodal blocks by the item's hash)."""
    image = part.get("image_url")
    url = image.get("url", "") if isinstance(image, dict) else str(image or "")
    if not isinstance(url, str):  # a malformed part (count_tokens renders unchecked input)
        url = canonical_json(url)
    digest = hashlib.blake2b(url.encode("utf-8"), digest_size=8).hexdigest()
    return f"<|image:{digest}|>"


def content_text(content: Any) -> str:
    """The text of a message ``content``: a string, a list of parts, or ``None``."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out: list[str] = []
        for part in content:
            if isinstance(part, str):
                out.append(part)
            elif isinstance(part, dict):
                kind = part.get("type")
                if kind == "text":
                    out.append(str(part.get("text", "")))
                elif kind == "image_url":
                    out.append(_image_marker(part))
                else:
                    out.append(canonical_json(part))
        return "".join(out)
    return canonical_json(content)


class ChatRenderer:
    """A typical chat-template layout with role markers::

        <|tools|>[...]<|end|>            (tools_first: before everything)
        <|system|>\\n...<|end|>\\n
        <|tools|>[...]<|end|>            (system_first: after the leading system messages)
        <|user|>\\n...<|end|>\\n
        <|assistant|>\\n<think>...</think>...<|tool_calls|>[...]<|end|>\\n
        <|tool|>\\n<|call:ID|>...<|end|>\\n
        <|assistant|>\\n                 (generation prompt)

    Mid-conversation system messages are rendered where they are. ``keep_reasoning=False``
    drops ``reasoning_content`` of assistant turns (as Qwen3/DeepSeek-R1 templates do for
    past turns, which changes the prefix of the next request).
    """

    def __init__(
        self,
        order: Literal["tools_first", "system_first"] = "tools_first",
        *,
        keep_reasoning: bool = True,
    ) -> None:
        if order not in ("tools_first", "system_first"):
            raise ValueError(f"order must be 'tools_first' or 'system_first', not {order!r}")
        self.order = order
        self.keep_reasoning = keep_reasoning

    def render(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> str:
        texts = [self._message(m) for m in messages]
        return self.assemble(self.tools_text(tools), messages, texts, add_generation_prompt)

    def tools_text(self, tools: Sequence[dict[str, Any]] | None) -> str:
        """The tools' part of the prompt."""
        return f"<|tools|>{canonical_json(list(tools))}<|end|>\n" if tools else ""

    def message_text(self, msg: Message) -> str:
        """One message's part of the prompt (the same wherever the message stands)."""
        return self._message(msg)

    def assemble(
        self,
        tools_text: str,
        messages: Sequence[Message],
        texts: Sequence[str],
        add_generation_prompt: bool = True,
    ) -> str:
        """The prompt from its parts: :meth:`tools_text` and each message's
        :meth:`message_text`, in the renderer's order (callers that keep the parts of a
        previous request render only what changed)."""
        n_lead = 0
        while n_lead < len(messages) and messages[n_lead].get("role") in _LEADING_ROLES:
            n_lead += 1
        parts: list[str] = []
        if self.order == "tools_first":
            parts.append(tools_text)
        parts.extend(texts[:n_lead])
        if self.order == "system_first":
            parts.append(tools_text)
        parts.extend(texts[n_lead:])
        if add_generation_prompt:
            parts.append("<|assistant|>\n")
        return "".join(parts)

    def _message(self, msg: Message) -> str:
        role = str(msg.get("role", "user"))
        body = content_text(msg.get("content"))
        if role == "assistant":
            reasoning = msg.get("reasoning_content")
            if reasoning and self.keep_reasoning:
                body = f"<think>{reasoning}</think>{body}"
            calls = msg.get("tool_calls")
            if calls:
                body += f"<|tool_calls|>{canonical_json(calls)}"
        elif role == "tool":
            call_id = msg.get("tool_call_id")
            if call_id:
                body = f"<|call:{call_id}|>{body}"
        return f"<|{role}|>\n{body}<|end|>\n"

    def __repr__(self) -> str:
        return f"ChatRenderer(order={self.order!r}, keep_reasoning={self.keep_reasoning!r})"


def _raise_exception(message: str) -> None:
    from jinja2.exceptions import TemplateError

    raise TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _token_text(value: Any) -> str:
    """``bos_token`` in tokenizer_config.json is a string or ``{"content": ...}``."""
    if isinstance(value, dict):
        return str(value.get("content", ""))
    return "" if value is None else str(value)


class JinjaChatTemplate:
    """A Hugging Face chat template rendered like ``transformers`` renders it."""

    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = "") -> None:
        from jinja2 import TemplateError
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(source)
        except TemplateError as exc:
            raise RenderError(f"invalid chat template: {exc}") from exc
        self.source = source
        # whether equal inputs render equal text (not when the template reads the clock)
        self.deterministic = "strftime_now" not in source
        self.bos_token = bos_token
        self.eos_token = eos_token

    @classmethod
    def from_file(cls, path: str | Path) -> JinjaChatTemplate:
        """Load a ``.jinja`` file, or the ``chat_template`` of a ``tokenizer_config.json``
        (with its ``bos_token``/``eos_token``; a list of named templates picks ``default``)."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise RenderError(f"cannot read chat template {path}: {exc}") from exc
        if path.suffix != ".json":
            return cls(text)
        try:
            config = json.loads(text)
        except ValueError as exc:
            raise RenderError(f"{path} is not valid JSON") from exc
        source = config.get("chat_template") if isinstance(config, dict) else None
        if isinstance(source, list):
            named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
            source = named.get("default")
        if not isinstance(source, str):
            raise RenderError(f"{path} has no chat_template string")
        return cls(
            source,
            bos_token=_token_text(config.get("bos_token")),
            eos_token=_token_text(config.get("eos_token")),
        )

    def render(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **extra: Any,
    ) -> str:
        from jinja2 import TemplateError

        try:
            return self._template.render(
                messages=list(messages),
                tools=list(tools) if tools else None,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                **extra,
            )
        except TemplateError as exc:
            raise RenderError(f"chat template failed: {exc}") from exc

    def __repr__(self) -> str:
        return f"JinjaChatTemplate({len(self.source)} chars)"


def vllm_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as vLLM hands them to a chat template ("string" content format): text
    parts joined by newlines, ``reasoning`` (or ``reasoning_content``) under both names, and tool-call
    arguments decoded from their JSON string (an object; ``{}`` when not one)."""
    out = []
    for m in messages:
        if not isinstance(m, dict):
            continue
        content = m.get("content")
        if isinstance(content, list):
            content = "\n".join(
                str(p.get("text", "")) if isinstance(p, dict) else str(p)
                for p in content
                if isinstance(p, str) or (isinstance(p, dict) and p.get("type") == "text")
            )
        elif content is None:
            content = ""
        msg: dict[str, Any] = {"role": m.get("role"), "content": content}
        calls = m.get("tool_calls")
        if m.get("role") == "assistant" and isinstance(calls, list) and calls:
            msg["tool_calls"] = [_call(c) for c in calls]
        # vLLM takes an assistant's ``reasoning`` or, from older clients and gateways,
        # ``reasoning_content``, and hands the template both names
        reasoning = m.get("reasoning")
        if reasoning is None:
            reasoning = m.get("reasoning_content")
        if m.get("role") == "assistant" and reasoning is not None:
            msg["reasoning"] = msg["reasoning_content"] = reasoning
        for key in ("tool_call_id", "name"):
            if isinstance(m.get(key), str):
                msg[key] = m[key]
        out.append(msg)
    return out


def _call(call: Any) -> Any:
    """A tool call as vLLM's request model leaves it: its keys in the order of OpenAI's
    typed dicts (``id, function, type``; ``arguments, name``: a template's ``tojson``
    shows that order), the arguments decoded."""
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        return call
    args = call["function"].get("arguments")
    if isinstance(args, str) and args:
        try:
            args = json.loads(args)
        except ValueError:
            args = None
    fn = _in_order(call["function"], ("arguments", "name"))
    fn["arguments"] = args if isinstance(args, dict) else {}
    return {**_in_order(call, ("id", "function", "type")), "function": fn}


def _in_order(d: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    out = {k: d[k] for k in keys if k in d}
    out.update((k, v) for k, v in d.items() if k not in out)
    return out


def render_tokens(
    renderer: Renderer,
    tokenizer: Tokenizer,
    messages: Sequence[Message],
    tools: Sequence[dict[str, Any]] | None = None,
) -> list[int]:
    """The prompt token ids of a chat request (generation prompt included)."""
    return tokenizer.encode(renderer.render(messages, tools, add_generation_prompt=True))
