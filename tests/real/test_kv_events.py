"""The engine's own KV-cache events, read by ``events/``, against a REAL vLLM 0.32.

vLLM runs with ``--kv-events-config`` (its PUB socket connects to the gateway's bound SUB,
its replay ROUTER bound) and a KV cache of 48 blocks of 32 tokens, so that three agent
sessions sharing a team prompt evict each other's blocks. Before each request the test
asks vLLM's ``/tokenize`` for the exact prompt tokens, predicts the hit from the index
(``min(longest cached prefix, floor((L-1)/B)) * B``), sends the request, and compares the
prediction with the ``cached_tokens`` vLLM reports. Between requests it waits until the
index holds every full block of the previous prompt: the events of a step arrive after its
response, and the next prediction must see them (a wait on the index's state, not on time).
"""

from __future__ import annotations

import asyncio
import secrets

import httpx

from prefixgate.config import parse_config
from prefixgate.events import EngineEvents, content_keys
from tests.real import harness

B = harness.BLOCK_SIZE
TEAM = (
    "You are the team's coding agent. Read the code before changing it, keep changes "
    "small, run the tests, and say what you did and why in two sentences. "
)


def session_prompt(nonce: str, session: int) -> str:
    """The team's prompt (shared by every session), then this session's own context."""
    files = " ".join(f"src/module_{session}/part_{i}.py" for i in range(24))
    return f"{TEAM}Run {nonce}. Session {session} owns these files: {files}."


def turn(session: int, n: int) -> list[dict]:
    ask = f"Step {n} of session {session}: read part_{n}.py and name the next function. "
    answer = f"In part_{n}.py of module {session} the next one is helper_{session}_{n}. "
    return [{"role": "user", "content": ask * 2}, {"role": "assistant", "content": answer * 2}]


async def _run(server: harness.VllmServer, events: dict, say) -> list[dict]:
    channel = harness.kv_events_channel(server, events)
    hub = EngineEvents.from_config(parse_config({"channels": [channel]}))
    replica = server.base_url
    nonce = secrets.token_hex(4)
    histories = {s: [{"role": "system", "content": session_prompt(nonce, s)}] for s in range(3)}
    rows: list[dict] = []
    await hub.start()
    try:
        # The engine's publisher connects to the socket the hub just bound, retrying on its
        # own schedule; what it publishes before it is connected is lost (ZeroMQ's late
        # join). Wait for the connection itself (its handshake) before the first request.
        await hub.wait_publishers(timeout=120)
        index = hub.channels["real"].index
        async with httpx.AsyncClient(timeout=120) as http:
            for n in range(5):
                for s in range(3):
                    messages = [*histories[s], turn(s, n)[0]]
                    tok = await http.post(
                        server.url + "/tokenize",
                        json={"model": server.served_model, "messages": messages},
                    )
                    assert tok.status_code == 200, tok.text
                    tokens = tok.json()["tokens"]
                    keys = content_keys(tokens, B)
                    held = index.longest_prefix(replica, keys).gpu
                    predicted = min(held, (len(tokens) - 1) // B) * B
                    resp = await http.post(
                        server.base_url + "/chat/completions",
                        json={"model": server.served_model, "messages": messages, "max_tokens": 1},
                    )
                    assert resp.status_code == 200, resp.text
                    usage = resp.json()["usage"]
                    details = usage.get("prompt_tokens_details") or {}
                    rows.append(
                        {
                            "session": s,
                            "turn": n,
                            "prompt_tokens": usage["prompt_tokens"],
                            "tokenized": len(tokens),
                            "cached_tokens": int(details.get("cached_tokens") or 0),
                            "predicted": predicted,
                            "removed_so_far": index.replica(replica).counters.removed_blocks,
                        }
                    )
                    await _until_held(hub, index, replica, keys)
                    histories[s] += turn(s, n)
        st = hub.status("real", replica)
        rows.append({"status": st.as_dict(0.0), "counters": index.replica(replica).counters})
    finally:
        await hub.aclose()
    return rows


async def _until_held(hub, index, replica: str, keys: list[bytes], limit: float = 60.0) -> None:
    """Until the index holds every full block of the prompt just served (its events)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while index.longest_prefix(replica, keys, touch=False).gpu < len(keys):
        if loop.time() > deadline:
            raise AssertionError(f"the engine's events never showed the prompt: {hub.statuses()}")
        await asyncio.sleep(0.005)


def test_the_index_predicts_real_cached_tokens(vllm_kv_events, say) -> None:
    server, events = vllm_kv_events
    *rows, final = asyncio.run(_run(server, events, say))
    for r in rows:
        say(
            f"session {r['session']} turn {r['turn']}: prompt {r['prompt_tokens']}, "
            f"cached {r['cached_tokens']}, predicted {r['predicted']}, "
            f"blocks removed so far {r['removed_so_far']}"
        )
    assert all(r["tokenized"] == r["prompt_tokens"] for r in rows)  # /tokenize is exact
    agree = sum(r["predicted"] == r["cached_tokens"] for r in rows)
    assert agree >= 0.99 * len(rows), [r for r in rows if r["predicted"] != r["cached_tokens"]]
    assert any(r["cached_tokens"] > 0 for r in rows)
    counters, status = final["counters"], final["status"]
    assert counters.removed_blocks > 0  # the small cache did evict: the index followed
    assert counters.orphan_blocks == counters.unknown_removals == 0
    assert status["complete"] and status["lost_batches"] == 0 and status["malformed"] == 0
    # a session that lost blocks to the others' evictions: predicted too, not only full hits
    full = {(r["session"], r["turn"]): r["prompt_tokens"] // B * B for r in rows}
    evicted = [
        r
        for r in rows
        if r["turn"] > 0 and r["cached_tokens"] < full[(r["session"], r["turn"] - 1)] - B
    ]
    assert evicted, rows
