"""The gateway and the cache model against a REAL vLLM (CPU, tiny random-weight model).

What only a real upstream can tell: that vLLM's ``cached_tokens`` are what the cache model
predicts, token for token; that the gateway's usage conversion holds on vLLM's real
figures, streaming and not; what vLLM 0.32 does with Claude Code's billing header itself;
and that the doctor names the cause on a store of real traffic.

Every test starts its prompts with a fresh nonce, so tests share the server's cache safely.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import pytest

from prefixgate.apis.messages.request import ConvertOptions, anthropic_to_openai
from prefixgate.cache import HFTokenizer, JinjaChatTemplate, PrefixCache
from prefixgate.doctor import diagnose, render_text
from tests.real import harness
from tests.real.engine_gateway import check_render_order
from tests.real.engine_gateway import gateway as engine_gateway

BLOCK = harness.BLOCK_SIZE
DOC = Path(__file__).resolve().parents[2] / "docs" / "real-vllm.md"

SENTENCES = (
    "You are a careful assistant that reads Python code and answers briefly.",
    "Prefer the standard library; explain what a function returns and why.",
    "When a file is needed, call the read_file tool with its path.",
    "Never invent module names; say so when something is not known.",
)


def system_prompt(nonce: str, sentences: int = 40) -> str:
    body = " ".join(SENTENCES[i % len(SENTENCES)] for i in range(sentences))
    return f"Session {nonce}. {body}"


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file of the project and return its text.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string", "description": "relative path"}},
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "grep",
            "description": "Search the project for a regular expression.",
            "parameters": {
                "type": "object",
                "properties": {"pattern": {"type": "string"}, "glob": {"type": "string"}},
                "required": ["pattern"],
            },
        },
    },
]


class CacheModel:
    """prefixgate's model of one vLLM: its chat template, its tokenizer, its prefix cache."""

    def __init__(self, model_dir: Path) -> None:
        self.tokenizer = HFTokenizer.from_file(model_dir)
        self.template = JinjaChatTemplate.from_file(model_dir / "tokenizer_config.json")
        self.cache = PrefixCache(block_size=BLOCK)

    def tokens(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        return self.tokenizer.encode(self.template.render(messages, tools))

    def process(self, messages: list[dict], tools: list[dict] | None = None):
        return self.cache.process(self.tokens(messages, tools))


def cached_of(usage: dict) -> int:
    """vLLM omits ``prompt_tokens_details`` (or its ``cached_tokens``) when nothing hit."""
    return int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


def chat(server: harness.VllmServer, messages: list[dict], tools=None, **extra) -> dict:
    body = {"model": server.served_model, "messages": messages, "max_tokens": 1, **extra}
    if tools:
        body["tools"] = tools
    resp = httpx.post(server.base_url + "/chat/completions", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    return resp.json()["usage"]


@contextlib.contextmanager
def gateway(server: harness.VllmServer, tmp_path: Path, *, strip: bool = True) -> Iterator[tuple]:
    """The real engines' gateway (``engine_gateway.gateway``: a SQLite store, no shedding
    on the loop's lag) in front of ``server``; yields ``(url, dsn)``. The store is
    complete once the block exits (the writer drains)."""
    channel = {
        "name": "real-vllm",
        "base_url": server.base_url,
        "strip_anthropic_billing_header": strip,
        "timeouts": {"first_byte": 120, "idle": 120},
    }
    with engine_gateway(tmp_path, channel, "store") as gw:
        yield gw.url, gw.dsn


def sdk(url: str, **headers: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=url, api_key="test", max_retries=0, timeout=120, default_headers=headers
    )


def upstream_messages(body: dict) -> tuple[list[dict], list[dict] | None]:
    """What the gateway sends vLLM for an Anthropic body (billing header already gone)."""
    out = anthropic_to_openai(body, ConvertOptions("tiny"))
    return out["messages"], out.get("tools")


# -- 1. agreement: the cache model vs real vLLM ------------------------------------------


def _pad_to_block_multiple(model: CacheModel, messages: list[dict]) -> list[dict]:
    """Lengthen the last user message until the prompt is a whole number of blocks."""
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"]
    for i in range(400):
        if len(model.tokens(messages)) % BLOCK == 0:
            return messages
        last = dict(messages[-1])
        last["content"] = last["content"] + " " + words[i % len(words)]
        messages = [*messages[:-1], last]
    raise AssertionError("could not reach a block multiple")


def agreement_rows(model: CacheModel, nonce: str) -> list[tuple[str, list[dict], list | None]]:
    sys_a = system_prompt(nonce)
    half = len(sys_a) // 2
    mid = sys_a.index(" ", half)
    sys_mid = sys_a[:mid] + " NOTE" + sys_a[mid:]
    sys_zero = "X" + sys_a[1:]
    base = [{"role": "system", "content": sys_a}, {"role": "user", "content": "What does zip do?"}]
    turn2 = [
        *base,
        {"role": "assistant", "content": "It pairs the items of several iterables."},
        {"role": "user", "content": "And itertools.zip_longest?"},
    ]
    turn3 = [
        *turn2,
        {"role": "assistant", "content": "It pads the shorter ones with a fill value."},
        {"role": "user", "content": "Show me an example with three lists."},
    ]
    parts = [
        {"role": "system", "content": [{"type": "text", "text": sys_a}]},
        {"role": "user", "content": [{"type": "text", "text": "What does zip do?"}]},
    ]
    aligned = _pad_to_block_multiple(
        model, [{"role": "system", "content": sys_a}, {"role": "user", "content": "Pad me"}]
    )
    return [
        ("first request (cold)", base, None),
        ("identical", base, None),
        ("extended: second turn", turn2, None),
        ("extended: third turn", turn3, None),
        (
            "edited in the middle of the system prompt",
            [{**base[0], "content": sys_mid}, base[1]],
            None,
        ),
        ("edited at token 0", [{**base[0], "content": sys_zero}, base[1]], None),
        ("content as a list of text parts", parts, None),
        ("with tools (rendered after the system prompt)", base, TOOLS),
        ("with tools, identical", base, TOOLS),
        ("prompt a whole number of blocks", aligned, None),
        ("prompt a whole number of blocks, identical (last block recomputed)", aligned, None),
    ]


def test_cache_model_predicts_real_vllm_exactly(vllm, tiny_model, say):
    model = CacheModel(tiny_model)
    rows = []
    for name, messages, tools in agreement_rows(model, secrets.token_hex(4)):
        predicted = model.process(messages, tools)
        usage = chat(vllm, messages, tools)
        rows.append(
            (
                name,
                usage["prompt_tokens"],
                predicted.prompt_tokens,
                cached_of(usage),
                predicted.cached_tokens,
            )
        )
    table = _markdown(rows)
    say("cache model vs real vLLM:\n" + table)
    if os.environ.get("PREFIXGATE_REAL_WRITE_DOC") == "1":
        _write_doc(table)
    for name, real_prompt, model_prompt, real_cached, model_cached in rows:
        assert (real_prompt, real_cached) == (model_prompt, model_cached), name
    cached = [r[3] for r in rows]
    assert cached[0] == 0 and all(c % BLOCK == 0 for c in cached)
    assert cached[1] > 0 and cached[5] == 0  # identical hits, token 0 edited misses
    assert 0 < cached[4] < cached[1]  # a middle edit keeps the blocks before it
    assert cached[-1] == rows[-1][1] - BLOCK  # the last token's block is always recomputed


def _markdown(rows) -> str:
    lines = [
        "| request | vLLM prompt_tokens | model prompt tokens | vLLM cached_tokens | model cached_tokens | agree |",
        "| --- | ---: | ---: | ---: | ---: | :---: |",
    ]
    for name, rp, mp, rc, mc in rows:
        ok = "yes" if (rp, rc) == (mp, mc) else "**NO**"
        lines.append(f"| {name} | {rp} | {mp} | {rc} | {mc} | {ok} |")
    return "\n".join(lines)


def _write_doc(table: str) -> None:
    text = DOC.read_text() if DOC.exists() else ""
    begin, end = "<!-- agreement:begin -->", "<!-- agreement:end -->"
    block = f"{begin}\n{table}\n{end}"
    if begin in text and end in text:
        text = re.sub(re.escape(begin) + ".*?" + re.escape(end), block, text, flags=re.S)
    else:
        text += ("\n" if text else "") + block + "\n"
    DOC.write_text(text)


# -- 2. the Anthropic SDK through the gateway ---------------------------------------------


def _conversation(nonce: str) -> tuple[list[dict], list[str]]:
    system = [
        {"type": "text", "text": "You are a coding assistant."},
        {"type": "text", "text": system_prompt(nonce), "cache_control": {"type": "ephemeral"}},
    ]
    return system, ["What does zip do?", "And itertools.zip_longest?", "An example, please."]


@pytest.mark.parametrize("stream", [False, True], ids=["once", "stream"])
def test_anthropic_sdk_usage_through_the_gateway(vllm, tiny_model, tmp_path, stream):
    model = CacheModel(tiny_model)
    system, questions = _conversation(secrets.token_hex(4))
    messages: list[dict] = []
    seen = []
    with gateway(vllm, tmp_path) as (url, _dsn), sdk(url) as client:
        for q in questions:
            messages.append({"role": "user", "content": q})
            body = {"model": "tiny", "max_tokens": 8, "system": system, "messages": messages}
            predicted = model.process(*upstream_messages(body))
            if stream:
                with client.messages.stream(**body) as s:
                    start_usage = None
                    for event in s:
                        if event.type == "message_start":
                            start_usage = event.message.usage
                    msg = s.get_final_message()
                # message_start must not claim more input than the whole prompt
                assert start_usage is not None
                assert start_usage.input_tokens <= predicted.prompt_tokens
            else:
                msg = client.messages.create(**body)
            u = msg.usage
            seen.append(u)
            # Anthropic semantics: cache reads are vLLM's cached_tokens, input the rest
            assert u.cache_read_input_tokens == predicted.cached_tokens
            assert u.input_tokens + u.cache_read_input_tokens == predicted.prompt_tokens
            assert (u.cache_creation_input_tokens or 0) == 0
            text = "".join(b.text for b in msg.content if b.type == "text") or "ok"
            messages.append({"role": "assistant", "content": text})
    assert seen[0].cache_read_input_tokens == 0
    for prev, cur in zip(seen, seen[1:], strict=False):
        # the next turn hits at least every full block of the previous prompt's system
        assert cur.cache_read_input_tokens > 0 and cur.cache_read_input_tokens % BLOCK == 0
        prev_total = prev.input_tokens + prev.cache_read_input_tokens
        assert cur.cache_read_input_tokens >= prev_total // BLOCK * BLOCK - BLOCK


def test_context_overflow_becomes_the_anthropic_error(vllm, tmp_path):
    """Claude Code compacts on ``prompt is too long: N tokens > M maximum``; N is the whole
    prompt as vLLM's /tokenize counts it, not the bound vLLM's message stops at."""
    long_text = " ".join(f"word{i}" for i in range(20000))
    with gateway(vllm, tmp_path) as (url, _dsn):
        resp = httpx.post(
            url + "/v1/messages",
            headers={"anthropic-version": "2023-06-01", "x-api-key": "test"},
            json={
                "model": "tiny",
                "max_tokens": 8,
                "messages": [{"role": "user", "content": long_text}],
            },
            timeout=120,
        )
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["type"] == "invalid_request_error"
    m = re.fullmatch(r"prompt is too long: (\d+) tokens > 16384 maximum", err["message"])
    assert m, err
    assert int(m.group(1)) > 20000  # 20,000 words: more than the 16,385 vLLM stops at


def test_claude_code_max_tokens_fits_the_window(vllm, tmp_path):
    """Claude Code asks for max_tokens 32000 with a custom model; the window is 16384."""
    with gateway(vllm, tmp_path) as (url, _dsn), sdk(url) as client:
        msg = client.messages.create(
            model="tiny",
            max_tokens=32000,
            stop_sequences=["e"],  # the tiny model's random text ends at once
            messages=[{"role": "user", "content": f"{secrets.token_hex(4)} say hi"}],
        )
    assert msg.usage.output_tokens >= 1


# -- 3. hygiene on a real cache ------------------------------------------------------------


def test_volatile_first_line_collapses_real_hits(vllm, tiny_model):
    """A per-request line at token 0 (one vLLM does not know) makes every request cold."""
    model = CacheModel(tiny_model)
    nonce = secrets.token_hex(4)
    sys_p = system_prompt(nonce)
    volatile, stable = [], []
    for i in range(3):
        rid = secrets.token_hex(8)
        messages = [
            {"role": "system", "content": f"request-id: {rid}\n{sys_p}"},
            {"role": "user", "content": f"question {i}"},
        ]
        predicted = model.process(messages)
        usage = chat(vllm, messages)
        assert (usage["prompt_tokens"], cached_of(usage)) == (
            predicted.prompt_tokens,
            predicted.cached_tokens,
        )
        volatile.append(cached_of(usage))
        messages[0]["content"] = f"request-id: fixed\n{sys_p}"
        stable.append(cached_of(chat(vllm, messages)))
    assert volatile == [0, 0, 0]
    assert stable[1] > 0 and stable[2] == stable[1]


def billing_header(cch: str | None = None, suffix: str = "0b8") -> str:
    line = f"x-anthropic-billing-header: cc_version=2.1.332.{suffix}; cc_entrypoint=sdk-cli;"
    return line + (f" cch={cch};" if cch else "")


def test_vllm_0_32_drops_the_billing_header_line_itself(vllm, tiny_model):
    """Observed: vLLM 0.32 removes a leading billing-header line from system messages
    before rendering (so the header costs nothing on chat completions there)."""
    model = CacheModel(tiny_model)
    sys_p = system_prompt(secrets.token_hex(4))
    cached = []
    for i in range(3):
        with_header = [
            {"role": "system", "content": billing_header(secrets.token_hex(3)[:5]) + "\n" + sys_p},
            {"role": "user", "content": f"question {i}"},
        ]
        without = [{"role": "system", "content": sys_p}, with_header[1]]
        usage = chat(vllm, with_header)
        assert usage["prompt_tokens"] == len(model.tokens(without))
        assert usage["prompt_tokens"] < len(model.tokens(with_header))
        cached.append(cached_of(usage))
    assert cached[0] == 0 and cached[1] > 0 and cached[2] == cached[1]


def claude_like_body(nonce: str, session: str, turn_messages: list[dict], cch: str) -> dict:
    return {
        "model": "tiny",
        "max_tokens": 8,
        "system": [
            {"type": "text", "text": billing_header(cch)},
            {
                "type": "text",
                "text": "You are Claude Code, a CLI for coding.",
                "cache_control": {"type": "ephemeral"},
            },
            {"type": "text", "text": system_prompt(nonce), "cache_control": {"type": "ephemeral"}},
        ],
        "tools": [
            {
                "name": t["function"]["name"],
                "description": t["function"]["description"],
                "input_schema": t["function"]["parameters"],
            }
            for t in TOOLS
        ],
        "messages": turn_messages,
        "metadata": {"user_id": json.dumps({"device_id": "d", "session_id": session})},
    }


CLAUDE_HEADERS = {"user-agent": "claude-cli/2.1.332 (external, sdk-cli)", "x-app": "cli"}


def run_claude_like_sessions(url: str, nonce: str, sessions: int, turns: int) -> list[list]:
    """Claude-Code-shaped traffic: a per-request ``cch=`` in system[0]; returns usages."""
    out = []
    with sdk(url, **CLAUDE_HEADERS) as client:
        for s in range(sessions):
            session = f"{nonce}-{s}"
            messages: list[dict] = []
            usages = []
            for t in range(turns):
                messages.append({"role": "user", "content": f"step {t} of task {s}"})
                body = claude_like_body(nonce, session, messages, secrets.token_hex(3)[:5])
                msg = client.messages.create(
                    **body, extra_headers={"x-claude-code-session-id": session}
                )
                usages.append(msg.usage)
                text = "".join(b.text for b in msg.content if b.type == "text") or "ok"
                messages.append({"role": "assistant", "content": text})
            out.append(usages)
    return out


@pytest.mark.parametrize(
    ("upstream", "strip", "collapses"),
    [
        ("vllm_no_strip", False, True),  # older vLLM / SGLang, no protection: the incident
        ("vllm_no_strip", True, False),  # the gateway's protection
        ("vllm", False, False),  # vLLM 0.32 drops the header itself
    ],
    ids=["no-strip-upstream,unprotected", "no-strip-upstream,protected", "vllm-0.32,unprotected"],
)
def test_billing_header_through_the_gateway(request, tmp_path, upstream, strip, collapses):
    server = request.getfixturevalue(upstream)
    with gateway(server, tmp_path, strip=strip) as (url, _dsn):
        [usages] = run_claude_like_sessions(url, secrets.token_hex(4), 1, 3)
    later = [u.cache_read_input_tokens for u in usages[1:]]
    prompt = [u.input_tokens + u.cache_read_input_tokens for u in usages]
    assert min(prompt) > 20 * BLOCK
    if collapses:
        # only the header's own stable start ("…cc_entrypoint=sdk-cli; cch=") ever hits
        assert later[0] == later[1] <= BLOCK
    else:
        assert all(c >= p // BLOCK * BLOCK - BLOCK for c, p in zip(later, prompt, strict=False))


# -- 4. the doctor on a store of real traffic ----------------------------------------------


def test_doctor_names_the_billing_header_on_real_traffic(vllm_no_strip, tmp_path, say):
    nonce = secrets.token_hex(4)
    with gateway(vllm_no_strip, tmp_path, strip=False) as (url, dsn):
        claude = run_claude_like_sessions(url, nonce, sessions=4, turns=4)
        # the control group: the same upstream through /v1/chat/completions, stable prefix
        with httpx.Client(base_url=url, timeout=120) as client:
            for s in range(3):
                messages = [{"role": "system", "content": system_prompt(nonce + "-chat")}]
                for t in range(5):
                    messages.append({"role": "user", "content": f"chat step {t} of {s}"})
                    resp = client.post(
                        "/v1/chat/completions",
                        json={"model": "tiny", "messages": messages, "max_tokens": 8},
                        headers={"x-session-id": f"{nonce}-chat-{s}", "authorization": "Bearer t"},
                    )
                    assert resp.status_code == 200, resp.text
                    text = resp.json()["choices"][0]["message"]["content"] or "ok"
                    messages.append({"role": "assistant", "content": text})
    assert all(u.cache_read_input_tokens <= BLOCK for s in claude for u in s)
    d = diagnose(dsn)
    say("doctor on real traffic:\n" + render_text(d))
    found = [f for f in d.findings if f.kind == "prefix_broken"]
    assert len(found) == 1, [f.title for f in d.findings]
    f = found[0]
    assert f.facts["segments"]["cause"] == "billing_header"
    assert f.facts["segments"]["in_segment"] == "system[0]"
    assert f.facts["slice"]["slice"] == "endpoint=messages"
    assert f.facts["control"]["slice"] == "endpoint=chat"
    assert any("strip_anthropic_billing_header" in x for x in f.fix)


def test_the_render_order_is_learned_from_vllms_tokenize(vllm, tiny_model):
    """The gateway asks vLLM's /tokenize (messages and tools) where the model's template
    puts the tools; the answer agrees with the template rendered here."""
    check_render_order(vllm.base_url, tiny_model)
