"""The engine's tokens of a request (events/tokens.py) against a REAL vLLM: the ids the
gateway computes locally from the model's chat template and tokenizer, per session, equal
vLLM's own ``/tokenize`` of the same chat request and its ``prompt_tokens``, turn after
turn, with tools, tool calls (arguments as JSON strings) and tool results in parts."""

from __future__ import annotations

import asyncio
import json
import secrets

import httpx

from prefixgate.config import parse_config
from prefixgate.events.tokens import EngineTokens
from prefixgate.upstream import Upstream
from tests.real import harness
from tests.real.test_vllm import SENTENCES, TOOLS


def conversation(nonce: str, turns: int):
    messages = [{"role": "system", "content": f"Session {nonce}. " + " ".join(SENTENCES * 8)}]
    for t in range(turns):
        messages.append({"role": "user", "content": f"Turn {t}: what does helper_{t} return?"})
        yield list(messages)
        call = {"id": f"call_{t}", "type": "function"}
        call["function"] = {"name": "read_file", "arguments": json.dumps({"path": f"m{t}.py"})}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        parts = [{"type": "text", "text": f"def helper_{t}():"}, {"type": "text", "text": "  1"}]
        messages.append({"role": "tool", "tool_call_id": f"call_{t}", "content": parts})


def test_local_tokens_equal_vllms(vllm: harness.VllmServer, tiny_model, say) -> None:
    channel = {
        "name": "vllm",
        "base_url": vllm.base_url,
        "chat_template": str(tiny_model / "tokenizer_config.json"),
        "tokenizer": f"hf:{tiny_model}",
    }
    config = parse_config({"channels": [channel], "store": None})
    ch = config.channels[0]
    tokens = EngineTokens(config.channels)

    async def run() -> list[tuple[int, int, int]]:
        upstream, rows = Upstream(), []
        try:
            async with httpx.AsyncClient(timeout=120) as client:
                for messages in conversation(secrets.token_hex(4), 4):
                    body = {"model": vllm.served_model, "messages": messages, "tools": TOOLS}
                    local = tokens.token_ids(ch, body, session="s")
                    remote = await tokens.remote_token_ids(ch, body, vllm.base_url, upstream)
                    assert list(local.ids) == remote
                    r = await client.post(
                        vllm.base_url + "/chat/completions", json={**body, "max_tokens": 1}
                    )
                    rows.append((len(local), r.json()["usage"]["prompt_tokens"], local.reused))
        finally:
            await upstream.aclose()
        return rows

    rows = asyncio.run(run())
    say(f"engine tokens vs vLLM (local, prompt_tokens, reused): {rows}")
    assert all(n == prompt for n, prompt, _ in rows)
    assert any(reused > 0 for _, _, reused in rows[1:])
