"""Chat rendering: the simple role-marker renderer and Hugging Face Jinja templates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prefixgate.cache.render import (
    ChatRenderer,
    JinjaChatTemplate,
    RenderError,
    canonical_json,
    render_tokens,
)
from prefixgate.cache.tokenizer import ApproxTokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file — UTF-8",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]
SYSTEM = {"role": "system", "content": "You are helpful.\nBe brief."}
USER = {"role": "user", "content": "hi"}


def test_canonical_json_is_compact_and_keeps_order() -> None:
    assert canonical_json({"b": 1, "a": "é"}) == '{"b":1,"a":"é"}'


def test_tools_first_puts_tools_before_system() -> None:
    text = ChatRenderer("tools_first").render([SYSTEM, USER], TOOLS)
    assert text.startswith("<|tools|>" + canonical_json(TOOLS))
    assert text.index("<|tools|>") < text.index("<|system|>") < text.index("<|user|>")
    assert text.endswith("<|assistant|>\n")


def test_system_first_puts_tools_after_leading_system_messages() -> None:
    dev = {"role": "developer", "content": "rules"}
    text = ChatRenderer("system_first").render([SYSTEM, dev, USER], TOOLS)
    assert text.startswith("<|system|>\n")
    assert text.index("<|developer|>") < text.index("<|tools|>") < text.index("<|user|>")


def test_system_change_keeps_tools_prefix_only_with_tools_first() -> None:
    other = {"role": "system", "content": "x-billing: 123\nYou are helpful.\nBe brief."}
    for order, shared_tools in (("tools_first", True), ("system_first", False)):
        r = ChatRenderer(order)  # type: ignore[arg-type]
        a, b = r.render([SYSTEM, USER], TOOLS), r.render([other, USER], TOOLS)
        common = len(_common_prefix(a, b))
        tools_end = a.index("<|end|>", a.index("<|tools|>")) + len("<|end|>\n")
        assert (common >= tools_end) is shared_tools


def _common_prefix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def test_identical_tools_give_identical_text() -> None:
    copy = json.loads(json.dumps(TOOLS))
    r = ChatRenderer()
    assert r.render([USER], TOOLS) == r.render([USER], copy)
    assert "<|tools|>" not in r.render([USER], None)
    assert "<|tools|>" not in r.render([USER], [])


def test_mid_conversation_system_message_stays_in_place() -> None:
    msgs = [
        SYSTEM,
        USER,
        {"role": "assistant", "content": "ok"},
        {"role": "system", "content": "late"},
    ]
    text = ChatRenderer("system_first").render(msgs, TOOLS)
    assert text.index("<|tools|>") < text.index("<|user|>")
    assert text.index("<|assistant|>\nok") < text.index("<|system|>\nlate")


def test_message_rendering_details() -> None:
    msgs = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look: "},
                {"type": "image_url", "image_url": {"url": "http://x/cat.png"}},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "think hard",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "result"},
    ]
    text = ChatRenderer().render(msgs, add_generation_prompt=False)
    assert "<|user|>\nlook: <|image:" in text
    assert '<|assistant|>\n<think>think hard</think><|tool_calls|>[{"id":"c1"' in text
    assert "<|tool|>\n<|call:c1|>result<|end|>\n" in text
    assert not text.endswith("<|assistant|>\n")
    dropped = ChatRenderer(keep_reasoning=False).render(msgs)
    assert "think hard" not in dropped


def test_image_marker_names_the_image() -> None:
    def one(url: str) -> str:
        part = {"type": "image_url", "image_url": {"url": url}}
        return ChatRenderer().render([{"role": "user", "content": [part]}])

    assert one("a") == one("a")
    assert one("a") != one("b")


def test_bad_order() -> None:
    with pytest.raises(ValueError):
        ChatRenderer("tools_last")  # type: ignore[arg-type]


def test_render_tokens_uses_renderer_and_tokenizer() -> None:
    r, tok = ChatRenderer(), ApproxTokenizer()
    assert render_tokens(r, tok, [USER], TOOLS) == tok.encode(r.render([USER], TOOLS))


# -- Jinja templates ---------------------------------------------------------------------

CHATML = """{{ bos_token }}{% if tools %}
<|im_start|>system
# Tools
{% for tool in tools %}
{{ tool | tojson }}
{% endfor %}
<|im_end|>
{% endif %}
{% for message in messages %}
    {% if message.role not in ['system', 'user', 'assistant', 'tool'] %}
        {{ raise_exception('unknown role ' + message.role) }}
    {% endif %}
<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endfor %}
{% if add_generation_prompt %}
<|im_start|>assistant
{% endif %}"""


def test_jinja_chatml_template() -> None:
    t = JinjaChatTemplate(CHATML, bos_token="<s>")
    text = t.render([SYSTEM, USER], TOOLS)
    assert text.startswith("<s><|im_start|>system\n# Tools\n")
    assert json.dumps(TOOLS[0], ensure_ascii=False) in text  # tojson keeps non-ASCII
    assert "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n" in text
    assert "    " not in text  # lstrip_blocks removed the indentation of block tags
    assert not t.render([USER], add_generation_prompt=False).endswith("assistant\n")


def test_jinja_raise_exception_is_render_error() -> None:
    with pytest.raises(RenderError, match="unknown role"):
        JinjaChatTemplate(CHATML).render([{"role": "wizard", "content": "x"}])


def test_jinja_is_sandboxed_and_immutable() -> None:
    t = JinjaChatTemplate("{% set _ = messages.append(1) %}{{ messages | length }}")
    with pytest.raises(RenderError):
        t.render([USER])
    with pytest.raises(RenderError):
        JinjaChatTemplate("{{ ''.__class__.__mro__ }}").render([USER])


def test_jinja_syntax_error() -> None:
    with pytest.raises(RenderError):
        JinjaChatTemplate("{% for %}")


def test_jinja_from_files(tmp_path: Path) -> None:
    jinja = tmp_path / "chat.jinja"
    jinja.write_text(CHATML)
    assert JinjaChatTemplate.from_file(jinja).render([USER]).startswith("<|im_start|>user")

    config = tmp_path / "tokenizer_config.json"
    config.write_text(
        json.dumps(
            {
                "chat_template": [
                    {"name": "tool_use", "template": "TOOLS"},
                    {"name": "default", "template": CHATML},
                ],
                "bos_token": {"content": "<s>", "lstrip": False},
                "eos_token": "</s>",
            }
        )
    )
    t = JinjaChatTemplate.from_file(config)
    assert (t.bos_token, t.eos_token) == ("<s>", "</s>")
    assert t.render([USER]).startswith("<s><|im_start|>user")

    bad = tmp_path / "empty_config.json"
    bad.write_text("{}")
    with pytest.raises(RenderError):
        JinjaChatTemplate.from_file(bad)
    with pytest.raises(RenderError):
        JinjaChatTemplate.from_file(tmp_path / "missing.jinja")
