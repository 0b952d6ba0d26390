"""Two agent sessions whose prefix hit depends on the engine's chat template, not on the
requests: the bench of docs/rendering.md and of its tests.

- :func:`reminder_session`: Claude Code with its ``<total_tokens>`` reminder on: after
  every user prompt a new ``role: system`` message with the tokens left, the earlier ones
  unchanged. On a template that keeps system messages in place the prompt only grows; on
  one that gathers them at the head, every turn's head changes.
- :func:`thinking_loop_session`: an agent's tool loop with thinking (three tool results of
  ~2.5k tokens each), then a new user turn. On a template that renders reasoning only
  after the last user query, the new turn re-renders the loop without its reasoning.

Each is a list of Anthropic Messages requests, sent in order by :func:`play`, which
returns each request's ``(prompt tokens, cached tokens)`` as the gateway reported them.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from .claude_code import billing_header
from .prompts import IDENTITY_LINE, claude_code_system_prompt
from .tools import claude_code_tools

__all__ = [
    "TOTAL_TOKENS",
    "Played",
    "play",
    "reminder_session",
    "thinking_loop_session",
    "through_gateway",
    "until_rendering_learned",
    "wait_stored",
]

VERSION = "2.1.332"
TOTAL_TOKENS = "<total_tokens>{n} tokens left</total_tokens>"
Body = dict[str, Any]


def _words(rng: random.Random, n: int) -> str:
    vocab = ("alpha", "delta", "kernel", "buffer", "branch", "commit", "parser", "index")
    return " ".join(rng.choice(vocab) + str(rng.randrange(100)) for _ in range(n))


def _head(model: str, tools_kb: float) -> Body:
    return {
        "model": model,
        "max_tokens": 64,
        "system": [
            {"type": "text", "text": billing_header(VERSION, "0b8", "sdk-cli")},
            {"type": "text", "text": IDENTITY_LINE},
            {"type": "text", "text": claude_code_system_prompt(VERSION, 6.0)},
        ],
        "tools": claude_code_tools(VERSION, tools_kb),
    }


def reminder_session(
    model: str, turns: int = 4, *, reminder: bool = True, tools_kb: float = 30.0, seed: int = 0
) -> Iterator[Body]:
    """Claude Code's requests of ``turns`` user prompts, each followed by the
    ``<total_tokens>`` reminder (when ``reminder``); the assistant's answers are the
    session's own (fixed text, so that every run sends the same bytes)."""
    rng = random.Random(seed)
    left = 1_000_000
    messages: list[dict] = []
    for t in range(turns):
        if t:
            messages.append(
                {"role": "assistant", "content": [{"type": "text", "text": _words(rng, 60)}]}
            )
        messages.append({"role": "user", "content": f"Task {t + 1}: " + _words(rng, 120)})
        if reminder:
            left -= 20_000
            messages.append({"role": "system", "content": TOTAL_TOKENS.format(n=left)})
        yield {**_head(model, tools_kb), "messages": list(messages)}


def thinking_loop_session(
    model: str,
    *,
    steps: int = 3,
    result_words: int = 1250,
    thought_words: int = 150,
    tools_kb: float = 10.0,
    seed: int = 0,
) -> Iterator[Body]:
    """A user turn, a tool loop of ``steps`` calls (each an assistant turn with thinking
    and a ``Read`` call, then its result: ~2 tokens a word), the loop's end, and a new
    user turn: one request per model call, the last one the new user turn's."""
    rng = random.Random(seed)
    messages: list[dict] = [{"role": "user", "content": "Fix the failing test. " + _words(rng, 40)}]
    yield {
        **_head(model, tools_kb),
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "messages": list(messages),
    }
    for j in range(steps):
        call = f"toolu_{seed}_{j}"
        messages.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": _words(rng, thought_words), "signature": "s"},
                    {
                        "type": "tool_use",
                        "id": call,
                        "name": "Read",
                        "input": {"file_path": f"src/file{j}.py"},
                    },
                ],
            }
        )
        messages.append(
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": call,
                        "content": _words(rng, result_words),
                    }
                ],
            }
        )
        yield {
            **_head(model, tools_kb),
            "thinking": {"type": "enabled", "budget_tokens": 1024},
            "messages": list(messages),
        }
    messages.append(
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": _words(rng, thought_words), "signature": "s"},
                {"type": "text", "text": "The test passes now."},
            ],
        }
    )
    messages.append({"role": "user", "content": "Now run the linter. " + _words(rng, 20)})
    yield {
        **_head(model, tools_kb),
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "messages": list(messages),
    }


def play(
    url: str,
    bodies: Iterator[Body],
    *,
    session: str = "session-0",
    post: Callable[..., httpx.Response] | None = None,
) -> list[tuple[int, int]]:
    """Send each request to the gateway at ``url`` (``/v1/messages``, one session) and
    return each one's ``(prompt tokens, cached tokens)`` from its usage (Anthropic's
    semantics: the prompt is ``input_tokens`` plus the cache's parts)."""
    send = post or httpx.post
    out = []
    for body in bodies:
        body = {**body, "metadata": {"user_id": session}}
        r = send(
            url + "/v1/messages",
            json=body,
            headers={"anthropic-version": "2023-06-01", "x-api-key": "k"},
            timeout=120,
        )
        r.raise_for_status()
        usage = r.json()["usage"]
        cached = usage.get("cache_read_input_tokens") or 0
        prompt = usage["input_tokens"] + cached + (usage.get("cache_creation_input_tokens") or 0)
        out.append((prompt, cached))
    return out


@dataclass
class Played:
    """What one run through the gateway gave: each request's usage and its ledger (from
    the store), and the doctor's diagnosis of the run."""

    usage: list[tuple[int, int]]
    ledgers: list[Any]
    diagnosis: Any

    def hit_rate(self, start: int = 1, end: int | None = None) -> float:
        """The token-weighted hit of requests ``[start, end)`` (turns after the first)."""
        part = self.usage[start:end]
        prompt = sum(p for p, _ in part)
        return sum(c for _, c in part) / prompt if prompt else 0.0


def through_gateway(
    bodies: Iterator[Body],
    folder: Path,
    *,
    template: str | None,
    events: bool = False,
    block_size: int = 32,
    base_url: str | None = None,
    **channel: Any,
) -> Played:
    """Play ``bodies`` through a gateway (a SQLite store in ``folder``) over the simulated
    vLLM serving ``template`` (one of the project's own by name, or a file) with unlimited
    KV cache, or over the upstream at ``base_url`` (its ``/v1`` URL: a real engine, once the
    gateway has learned its template and, when ``channel`` names ``kv_events``, listens to
    its events); with ``events`` the simulated engine publishes its KV events and the
    gateway reads them. ``channel``: the channel's settings beyond its name and URL."""
    from prefixgate.config import parse_config
    from prefixgate.doctor import diagnose
    from prefixgate.lab.events.publisher import PublisherSettings
    from prefixgate.lab.upstream_sim import SimSettings, running_upstreams
    from prefixgate.serve.app import create_app
    from prefixgate.serve.process import ServerThread
    from prefixgate.store import open_store

    folder.mkdir(parents=True, exist_ok=True)
    dsn = f"sqlite:///{folder / 'store.db'}"
    kv = PublisherSettings("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", "kv", "map")
    sim = SimSettings(
        block_size=block_size,
        chat_template=template,
        max_model_len=1_000_000,
        kv_events=kv if events else None,
    )
    real = base_url is not None
    with contextlib.ExitStack() as stack:
        if base_url is None:
            [up] = stack.enter_context(running_upstreams(sim, replicas=1))
            base_url = up.base_url
        ch = {"name": "engine", "base_url": base_url, **channel}
        if events:
            pub = up.app.state.sim.events
            ch["kv_events"] = {
                "replicas": [
                    {
                        "endpoint": "tcp://*:" + pub.endpoint.rsplit(":", 1)[1],
                        "replay_endpoint": "tcp://*:" + pub.replay_endpoint.rsplit(":", 1)[1],
                    }
                ],
                "topic": "kv",
                "block_size": block_size,
            }
        store = {"dsn": dsn, "journal_path": str(folder / "journal")}
        # no load shedding: a bench on a shared machine measures hits, not the loop's pace
        server = {"shed_loop_lag": None}
        app = create_app(parse_config({"channels": [ch], "store": store, "server": server}))
        gw = stack.enter_context(ServerThread(app))
        if events:
            deadline = time.monotonic() + 30
            while not pub.wait_for_subscribers(1, 0.1):
                if time.monotonic() > deadline:
                    raise RuntimeError("the gateway never subscribed to the engine's events")
        if real:  # the claim is about the gateway once it knows the engine's template
            until_rendering_learned(gw.url)
            deadline = time.monotonic() + 120
            while "kv_events" in ch and not app.state.events.listening():
                if time.monotonic() > deadline:
                    raise RuntimeError("the engine's KV events never reached the gateway")
                time.sleep(0.05)
        usage = []
        for body in bodies:
            usage += play(gw.url, iter([body]))
            if events:  # the gateway applied what the engine published for it
                _applied(app, up)
        wait_stored(app, len(usage))
    with open_store(dsn) as st:
        recs = [r for r in st.iter_records() if r.endpoint == "messages"]
        ledgers = [st.get_ledger(r.request_id) for r in recs]
    return Played(usage, ledgers, diagnose(dsn))


def until_rendering_learned(url: str, limit: float = 300.0) -> None:
    """Until the gateway at ``url`` has learned each channel's rendering from its upstream's
    ``/tokenize`` (``/healthz?details=1``): a real engine's tokenizer answers slowly on a
    loaded machine, and the first requests wait only 2 s for it."""
    deadline = time.monotonic() + limit
    while True:
        details = httpx.get(url + "/healthz?details=1", timeout=30).json()["details"]
        if all(r["source"] == "tokenize" for r in details["rendering"]):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the upstream's rendering was not learned: {details['rendering']}")
        time.sleep(0.5)


def _applied(app, up, limit: float = 30.0) -> None:
    hub = app.state.events
    pub = up.app.state.sim.events
    deadline = time.monotonic() + limit
    while True:
        st = hub.status("engine", up.base_url)
        if (-1 if st.last_seq is None else st.last_seq) == pub.next_seq - 1:
            return
        if time.monotonic() > deadline:
            raise RuntimeError("the engine's events were not applied")
        time.sleep(0.005)


def wait_stored(app, n: int, limit: float = 60.0) -> None:
    """Until the store has ``n`` records and their ledgers."""
    ledger, writer = app.state.ledger, app.state.gateway.recorder
    deadline = time.monotonic() + limit
    while ledger.written < n or writer.stats().written < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"records or ledgers not stored ({ledger.written} of {n})")
        time.sleep(0.01)
