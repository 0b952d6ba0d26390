"""Request → the engine's tokens: the local ids of a channel's request equal what the
engine computes (the simulated upstream's ``prompt_tokens`` and ``/tokenize`` over
loopback, with its own format and with a real Hugging Face tokenizer and chat template),
and the per-session reuse gives the same ids as tokenizing the whole prompt."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import openai
import pytest

from prefixgate.cache import HFTokenizer, hash_blocks
from prefixgate.cache.render import vllm_messages
from prefixgate.config import ConfigError, parse_config
from prefixgate.events.tokens import EngineTokens, EngineTokensError
from prefixgate.lab.upstream_sim import SimSettings, running_upstreams
from prefixgate.upstream import Upstream
from tests.real.build_tiny_model import CHAT_TEMPLATE, train_tokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file of the project and return its text. " * 8,
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory) -> Path:
    """A byte-level BPE with ChatML's special tokens, and its chat template."""
    out = tmp_path_factory.mktemp("hf")
    train_tokenizer(1500, 12).save(str(out / "tokenizer.json"))
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return out


def agent_session(s: int, turns: int):
    """Requests of one agent session: a long system prompt and tools, tool calls whose
    arguments are JSON strings, tool results as lists of text parts, some non-ASCII."""
    messages: list[dict] = [
        {"role": "system", "content": f"You are agent {s}. Édite le code avec soin. " * 30}
    ]
    for t in range(turns):
        messages.append({"role": "user", "content": f"Turn {t}: fix the bug in mod_{s}.py ✓"})
        yield {"messages": [dict(m) for m in messages], "tools": TOOLS}
        call = {"id": f"c{s}{t}", "type": "function"}
        call["function"] = {"name": "read_file", "arguments": json.dumps({"path": f"m{t}.py"})}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        result = [{"type": "text", "text": f"def f{t}():\n    return {t}\n"}] * 2
        messages.append({"role": "tool", "tool_call_id": f"c{s}{t}", "content": result})


def channel_config(base_url: str, **extra) -> dict:
    return {"name": "sim", "base_url": base_url, **extra}


@pytest.mark.parametrize("model", ["approx", "hf"])
async def test_local_ids_equal_the_engines_prompt_tokens(model, hf_model) -> None:
    extra, settings = {}, SimSettings(block_size=16)
    if model == "hf":
        template, tokenizer = str(hf_model / "chat_template.jinja"), f"hf:{hf_model}"
        extra = {"chat_template": template, "tokenizer": tokenizer}
        settings = SimSettings(block_size=16, chat_template=template, tokenizer=tokenizer)
    with running_upstreams(settings, replicas=1) as ups:
        config = parse_config({"channels": [channel_config(ups[0].base_url, **extra)]})
        ch = config.channels[0]
        tokens = EngineTokens(config.channels)
        upstream = Upstream()
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_callback(upstream.aclose)
            client = await stack.enter_async_context(
                openai.AsyncOpenAI(base_url=ups[0].base_url, api_key="none")
            )
            reused = 0
            for s in range(2):
                for request in agent_session(s, 4):
                    local = tokens.token_ids(ch, request, session=f"s{s}")
                    remote = await tokens.remote_token_ids(ch, request, ch.base_url, upstream)
                    resp = await client.chat.completions.create(
                        model="sim-model", max_tokens=4, **request
                    )
                    assert list(local.ids) == remote
                    assert len(local) == resp.usage.prompt_tokens
                    reused += local.reused
    if model == "hf":  # later turns tokenized only their tail
        assert reused > 0 and tokens.reused_tokens == reused


def test_a_sessions_reuse_gives_the_ids_of_a_whole_tokenization(hf_model) -> None:
    template = str(hf_model / "chat_template.jinja")
    config = parse_config(
        {
            "channels": [
                channel_config("http://x/v1", chat_template=template, tokenizer=f"hf:{hf_model}")
            ]
        }  # fmt: skip
    )
    ch = config.channels[0]
    tok = HFTokenizer.from_file(hf_model)
    tokens = EngineTokens(config.channels)
    requests = list(agent_session(0, 6))
    edited = json.loads(json.dumps(requests[4]))
    edited["messages"][0]["content"] += " (one more rule)"  # the prefix changed
    compacted = {"messages": [requests[5]["messages"][0], {"role": "user", "content": "Go on"}]}
    for request in [*requests[:5], edited, requests[5], compacted, requests[5]]:
        cold = EngineTokens(config.channels).token_ids(ch, request).ids
        warm = tokens.token_ids(ch, request, session="one")
        assert list(warm.ids) == list(cold)
        text = (
            tokens._channels["sim"]
            .renderer()
            .render(vllm_messages(request["messages"]), request.get("tools"))
        )
        assert list(cold) == tok.encode(text)
        _, keys = tokens.content_keys(ch, request, 16, session="one")
        assert keys == hash_blocks(cold, 16)
    assert tokens.reused_tokens > 0


def test_content_keys_reuse_the_sessions_blocks() -> None:
    config = parse_config({"channels": [channel_config("http://x/v1")]})
    tokens = EngineTokens(config.channels)
    prev = None
    for request in agent_session(1, 5):
        ids, keys = tokens.content_keys("sim", request, 16, session="s")
        assert keys == hash_blocks(ids.ids, 16)
        if prev is not None:
            assert keys[: len(prev) - 2] == prev[: len(prev) - 2]
        prev = keys


def test_memory_is_bounded() -> None:
    config = parse_config({"channels": [channel_config("http://x/v1")]})
    tokens = EngineTokens(config.channels, max_bytes=200_000)
    for s in range(50):
        for request in agent_session(s, 2):
            tokens.content_keys("sim", request, 16, session=f"s{s}")
    assert 0 < tokens._bytes <= 200_000
    assert len(tokens._sessions) < 50


def test_errors_are_clear(tmp_path) -> None:
    bad = tmp_path / "bad.jinja"
    bad.write_text("{{ raise_exception('no tools here') }}")
    config = parse_config({"channels": [channel_config("http://x/v1", chat_template=str(bad))]})
    tokens = EngineTokens(config.channels)
    with pytest.raises(EngineTokensError, match="no tools here"):
        tokens.token_ids("sim", {"messages": [{"role": "user", "content": "hi"}]})
    with pytest.raises(EngineTokensError, match="no channel"):
        tokens.token_ids("other", {"messages": []})
    for wrong in ({"tokenizer": "sentencepiece:x"}, {"tokenizer": f"hf:{tmp_path}/none.json"},
                  {"chat_template": str(tmp_path / "missing.jinja")}):  # fmt: skip
        with pytest.raises(ConfigError, match="tokenizer|chat_template"):
            parse_config({"channels": [channel_config("http://x/v1", **wrong)]})


async def test_an_upstream_that_cannot_tokenize_is_an_error() -> None:
    with running_upstreams(SimSettings(accept_any_model=False), replicas=1) as ups:
        config = parse_config({"channels": [channel_config(ups[0].base_url)]})
        tokens, upstream = EngineTokens(config.channels), Upstream()
        try:
            request = {"model": "not-served", "messages": [{"role": "user", "content": "hi"}]}
            with pytest.raises(EngineTokensError, match="/tokenize"):
                await tokens.remote_token_ids(
                    config.channels[0], request, ups[0].base_url, upstream
                )
            with pytest.raises(EngineTokensError, match="/tokenize"):
                await tokens.remote_token_ids(
                    config.channels[0], request, "http://127.0.0.1:9/v1", upstream
                )
        finally:
            await upstream.aclose()


def test_requests_without_a_session_reuse_a_prompt_that_began_alike(hf_model) -> None:
    template = str(hf_model / "chat_template.jinja")
    config = parse_config(
        {
            "channels": [
                channel_config("http://x/v1", chat_template=template, tokenizer=f"hf:{hf_model}")
            ]
        }  # fmt: skip
    )
    tokens = EngineTokens(config.channels)
    requests = [r for s in (1, 2) for r in agent_session(s, 3)]  # two openings, interleaved
    for request in requests:
        warm, keys = tokens.content_keys("sim", request, 16)
        cold = EngineTokens(config.channels).token_ids("sim", request).ids
        assert list(warm.ids) == list(cold) and keys == hash_blocks(cold, 16)
    assert tokens.reused_tokens > 0


def test_tool_calls_keep_vllms_key_order() -> None:
    """vLLM validates a request into OpenAI's typed dicts, whose order a template's
    ``tojson`` shows (seen on vLLM 0.32: ``{"arguments": …, "name": …}``)."""
    call = {"type": "function", "function": {"name": "f", "arguments": '{"b": 1, "a": 2}'}}
    msg = {"role": "assistant", "content": None, "tool_calls": [{**call, "id": "c1"}]}
    (out,) = vllm_messages([msg])
    (got,) = out["tool_calls"]
    assert list(got) == ["id", "function", "type"]
    assert list(got["function"]) == ["arguments", "name"]
    assert list(got["function"]["arguments"]) == ["b", "a"]


def test_a_request_without_a_session_reuses_the_keys_of_one_that_began_alike(
    monkeypatch,
) -> None:
    import prefixgate.events.tokens as mod

    hashed: list[int] = []

    def counting(ids, size, parent=None):
        hashed.append(len(ids))
        return hash_blocks(ids, size, parent=parent)

    monkeypatch.setattr(mod, "hash_blocks", counting)
    config = parse_config({"channels": [{"name": "c", "base_url": "http://u/v1"}]})
    tokens = EngineTokens(config.channels)
    request = {"messages": [{"role": "system", "content": "shared " * 400}]}
    request["messages"].append({"role": "user", "content": "hello"})
    _, first = tokens.content_keys("c", request, 16)
    _, again = tokens.content_keys("c", request, 16)
    assert again == first and hashed[0] >= 16 * len(first) and hashed[1] < 16


def _counting_renders(tokens: EngineTokens, channel: str) -> list[int]:
    """Count the renders of the channel's Jinja template (one entry per render)."""
    renderer = tokens._channels[channel].renderer()
    renders: list[int] = []
    render = renderer.render

    def counted(*args, **kwargs):
        renders.append(1)
        return render(*args, **kwargs)

    renderer.render = counted
    return renders


def test_a_template_renders_again_only_when_its_inputs_changed(hf_model) -> None:
    """The same request again (routing's decision, then the ledger; a retry) reuses the
    session's text and ids; any change (a turn appended, an edit in the middle, the tools,
    the template's arguments, the generation prompt) renders it again. The ids always
    equal a whole render's."""
    template = str(hf_model / "chat_template.jinja")
    channel = channel_config("http://x/v1", chat_template=template, tokenizer=f"hf:{hf_model}")
    config = parse_config({"channels": [channel]})
    tokens = EngineTokens(config.channels)
    renders = _counting_renders(tokens, "sim")
    turns = list(agent_session(3, 4))
    middle = json.loads(json.dumps(turns[3]))
    middle["messages"][3]["content"][0]["text"] = "def changed():\n    pass\n"
    more_tools = {**turns[3], "tools": [*TOOLS, {**TOOLS[0], "function": {"name": "ls"}}]}
    kwargs = {**turns[3], "chat_template_kwargs": {"enable_thinking": False}}
    no_prompt = {**turns[3], "add_generation_prompt": False}
    sequence = [  # (request, rendered again)
        (turns[0], True), (turns[0], False), (turns[1], True), (turns[2], True),
        (turns[2], False), (middle, True), (turns[3], True), (turns[3], False),
        (more_tools, True), (more_tools, False), (turns[3], True), (kwargs, True),
        (kwargs, False), (no_prompt, True), (turns[3], True),
    ]  # fmt: skip
    for request, again in sequence:
        before = len(renders)
        cold = EngineTokens(config.channels).token_ids(ch := config.channels[0], request).ids
        warm, keys = tokens.content_keys(ch, json.loads(json.dumps(request)), 16, session="s")
        assert list(warm.ids) == list(cold) and keys == hash_blocks(cold, 16)
        assert len(renders) - before == (1 if again else 0), request
        if not again:
            assert warm.reused == len(warm.ids)


def test_a_tool_list_edited_in_place_is_rendered_again(hf_model) -> None:
    template = str(hf_model / "chat_template.jinja")
    channel = channel_config("http://x/v1", chat_template=template, tokenizer=f"hf:{hf_model}")
    config = parse_config({"channels": [channel]})
    tokens = EngineTokens(config.channels)
    request = json.loads(json.dumps(next(agent_session(4, 1))))
    first = list(tokens.token_ids("sim", request, session="s").ids)
    request["tools"][0]["function"]["name"] = "open_file"  # the caller's own object
    second = list(tokens.token_ids("sim", request, session="s").ids)
    assert second != first
    assert second == list(EngineTokens(config.channels).token_ids("sim", request).ids)


def test_a_template_that_reads_the_clock_is_always_rendered(tmp_path) -> None:
    dated = tmp_path / "dated.jinja"
    dated.write_text(
        "{{ strftime_now('%Y-%m-%d') }}{% for m in messages %}{{ m.content }}{% endfor %}"
    )
    config = parse_config({"channels": [channel_config("http://x/v1", chat_template=str(dated))]})
    tokens = EngineTokens(config.channels)
    renders = _counting_renders(tokens, "sim")
    request = {"messages": [{"role": "user", "content": "what day is it? " * 50}]}
    for _ in range(3):
        tokens.token_ids("sim", request, session="s")
    assert len(renders) == 3
