"""Coding-agent CLIs driven through the gateway, and the gateway stacks they talk to.

A stack is: upstream (the simulated vLLM in-process, or a real vLLM behind a forwarding
app) wrapped in a :class:`~tests.fakes.RecordingUpstream` that keeps every body the gateway
sent → the gateway (``create_app``, a SQLite store, segment texts captured). Each CLI runs
offline in a throw-away HOME and work folder, so it talks to nothing but the gateway.

Shared by the tests in this folder and by ``benchmarks/clients.py`` (the hit-rate table
of ``docs/clients.md``).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from starlette.requests import Request
from starlette.responses import StreamingResponse

from prefixgate.config import parse_config
from prefixgate.lab.events.publisher import PublisherSettings
from prefixgate.lab.traffic.template_sessions import until_rendering_learned
from prefixgate.lab.upstream_sim import SimSettings, create_upstream_app
from prefixgate.serve.app import create_app
from prefixgate.serve.process import ServerThread
from prefixgate.store import open_store
from tests.conftest import settled
from tests.fakes import RecordingUpstream
from tests.real import harness

SIM_MODEL = "sim-model"
CLI_TIMEOUT = 600


@dataclass
class Stack:
    url: str  # the gateway
    dsn: str  # its store (complete once the stack exits)
    upstream: RecordingUpstream  # what the gateway sent upstream
    model: str  # the model name the clients ask for
    app: object = None  # the gateway's ASGI app
    received: RecordingUpstream | None = None  # what the gateway received

    def records(self, endpoint: str) -> list:
        with open_store(self.dsn) as store:
            return [r for r in store.iter_records(with_texts=True) if r.endpoint == endpoint]

    def ledgers(self, records: list) -> list:
        """The miss ledgers of ``records`` (call :meth:`wait_stored` before the stack exits)."""
        with open_store(self.dsn) as store:
            return [store.get_ledger(r.request_id) for r in records]

    def replay(self, entries: list[dict]) -> None:
        """Send the requests ``entries`` (another stack's ``received``) to this gateway, one
        at a time, with their headers, and read each answer to its end."""
        with httpx.Client(timeout=CLI_TIMEOUT) as http:
            for e in entries:
                headers = [(k, v) for k, v in e["headers"] if k not in (b"host", b"content-length")]
                http.post(self.url + e["path"], content=e["raw"], headers=headers)

    def until_learned(self, limit: float = 300.0) -> None:
        """Until the gateway has learned its upstream's rendering from ``/tokenize`` (a real
        engine's tokenizer answers slowly on a loaded machine, and the first requests wait
        only 2 s for it)."""
        until_rendering_learned(self.url, limit)

    def wait_stored(self, limit: float = 300.0) -> None:
        """Until every request the gateway took is in the store, each with its ledger when
        it has one (a prompt figure from a replica): read back from the store. A ledger
        from KV events waits for the engine's ``/tokenize`` of the prompt, seconds on a
        loaded machine, after the CLI has its answer (and the gateway's shutdown gives the
        ledgers still queued only 2 s)."""
        gateway = self.app.state.gateway
        settled(gateway)
        writer = gateway.recorder
        deadline = time.monotonic() + limit
        while (st := writer.stats()).written + st.dropped + st.rejected < st.submitted:
            assert time.monotonic() < deadline, f"records not stored: {st}"
            time.sleep(0.05)
        with open_store(self.dsn) as store:
            records = list(store.iter_records())
        waiting = [r.request_id for r in records if r.prompt_tokens and r.replica and r.channel]
        ledger = self.app.state.ledger
        while waiting:
            with open_store(self.dsn) as store:
                waiting = [rid for rid in waiting if store.get_ledger(rid) is None]
            assert not ledger.failed, f"{ledger.failed} ledgers failed (the log says why)"
            assert time.monotonic() < deadline, f"no ledger stored for {waiting}"
            time.sleep(0.05)


def forwarding_app(base: str):
    """An ASGI app that forwards every request to ``base`` (a real upstream) and streams
    the answer back, so that a :class:`RecordingUpstream` can sit in front of it. A client
    per request: closed with it, on the server thread's loop."""

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        request = Request(scope, receive)
        async with httpx.AsyncClient(
            # a real engine on a loaded machine may accept late (10 s passed with SGLang
            # at a load average of 30, and the gateway answered that turn with an error)
            base_url=base,
            timeout=httpx.Timeout(600, connect=60),
        ) as client:
            up = client.build_request(
                request.method,
                scope["path"],
                params=request.query_params,
                content=await request.body(),
                headers={"content-type": request.headers.get("content-type", "application/json")},
            )
            resp = await client.send(up, stream=True)
            try:
                headers = {"content-type": resp.headers.get("content-type", "application/json")}
                answer = StreamingResponse(resp.aiter_raw(), resp.status_code, headers)
                await answer(scope, receive, send)
            finally:
                await resp.aclose()

    return app


@contextlib.contextmanager
def stack(
    tmp_path: Path,
    *,
    vllm_url: str | None = None,
    model: str = SIM_MODEL,
    channel: dict | None = None,
    events: bool = False,
    **sim,
) -> Iterator[Stack]:
    """The gateway over the simulated vLLM (``sim`` are its settings), or over the real
    vLLM at ``vllm_url`` (its root URL); ``channel``: more settings of the gateway's
    channel; ``events``: the simulated vLLM publishes its KV events, which the gateway
    reads (its ledger's source)."""
    if events:
        sim["kv_events"] = PublisherSettings("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", "kv", "map")
    if vllm_url is None:
        inner = create_upstream_app(SimSettings(block_size=32, **sim))
        upstream = RecordingUpstream(inner)
    else:
        upstream = RecordingUpstream(forwarding_app(vllm_url))
    dsn = f"sqlite:///{tmp_path / 'store.db'}"
    with ServerThread(upstream) as up:
        ch = {
            "name": "sim" if vllm_url is None else "real-vllm",
            "base_url": up.url + "/v1",
            "capture_text": True,
            "timeouts": {"first_byte": 300, "idle": 300},
            **(channel or {}),
        }
        if events:
            pub = inner.state.sim.events
            ch["kv_events"] = {
                "replicas": [
                    {
                        "endpoint": "tcp://*:" + pub.endpoint.rsplit(":", 1)[1],
                        "replay_endpoint": "tcp://*:" + pub.replay_endpoint.rsplit(":", 1)[1],
                    }
                ],
                "topic": "kv",
                "block_size": 32,
            }
        config = parse_config(
            {
                "channels": [ch],
                "store": {"dsn": dsn, "journal_path": str(tmp_path / "journal")},
                # a CLI's turn refused as overloaded on a busy test machine tells nothing
                "server": {"shed_loop_lag": None},
            }
        )
        app = create_app(config)
        received = RecordingUpstream(app)
        with ServerThread(received) as gw:
            if events:
                assert pub.wait_for_subscribers(1, 30), "the gateway never subscribed"
            elif "kv_events" in ch:  # a real engine's publisher connects to the hub
                deadline = time.monotonic() + 120
                while not app.state.events.listening():
                    assert time.monotonic() < deadline, app.state.events.statuses()
                    time.sleep(0.05)
            yield Stack(gw.url, dsn, upstream, model, app, received)


def engine_settings(server, events: dict | None = None, **channel) -> dict:
    """The settings of :func:`stack` for a real engine (a ``VllmServer``, vLLM or SGLang);
    with ``events`` (its ``--kv-events-config``) the gateway reads its KV events (the
    channel's ``kv_events`` names the engine's addresses)."""
    if events is not None:
        channel["kv_events"] = harness.kv_events_channel(server, events)["kv_events"]
    return {"vllm_url": server.url, "model": server.served_model, "channel": channel}


class _Cli:
    """A CLI in its own HOME and work folder, offline, with only the variables given."""

    def __init__(self, exe: Path, tmp_path: Path, name: str) -> None:
        self.exe = exe
        self.home = tmp_path / f"{name}-home"
        self.work = tmp_path / f"{name}-work"
        self.home.mkdir()
        self.work.mkdir()
        self.env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.home)}

    def _run(self, args: list[str]) -> str:
        proc = subprocess.run(
            [str(self.exe), *args],
            cwd=self.work,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT,
            stdin=subprocess.DEVNULL,
        )
        assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        return proc.stdout


class Claude(_Cli):
    """``claude -p`` (Anthropic Messages); ``--continue`` for a later turn."""

    endpoint = "messages"

    def __init__(self, exe: Path, stack: Stack, tmp_path: Path, **env: str) -> None:
        super().__init__(exe, tmp_path, "claude")
        self.model = stack.model
        self.env |= env | {
            "ANTHROPIC_BASE_URL": stack.url,
            "ANTHROPIC_API_KEY": "test-key",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        }
        # a window it cannot know for a custom model name (the sim's: any)
        self.env.setdefault("CLAUDE_CODE_MAX_CONTEXT_TOKENS", "200000")

    def run(self, prompt: str, *, resume: bool = False) -> dict:
        args = ["-p", prompt, "--output-format", "json", "--model", self.model]
        result = json.loads(self._run([*args, "--continue"] if resume else args))
        assert result["is_error"] is False and result["subtype"] == "success", result
        assert isinstance(result["result"], str)
        return result


class Codex(_Cli):
    """``codex exec`` with a custom provider (``wire_api = "responses"``) at the gateway;
    ``codex exec resume --last`` for a later turn. :meth:`run` returns the events of
    ``--json`` (the answer in an ``agent_message`` item, usage in ``turn.completed``)."""

    endpoint = "responses"

    def __init__(
        self, exe: Path, stack: Stack, tmp_path: Path, *, name: str = "prefixgate", top: str = ""
    ) -> None:
        """``name``: the provider's name (Codex compacts through the provider's own API
        for one it takes for Azure's, ``azure``, else by a summary turn of its own);
        ``top``: more top-level settings (TOML lines)."""
        super().__init__(exe, tmp_path, "codex")
        self.env |= {"PREFIXGATE_API_KEY": "test-key", "CODEX_HOME": str(self.home / ".codex")}
        (self.home / ".codex").mkdir()
        (self.home / ".codex" / "config.toml").write_text(
            top + f'model = "{stack.model}"\n'
            'model_provider = "prefixgate"\n'
            "[model_providers.prefixgate]\n"
            f'name = "{name}"\n'
            f'base_url = "{stack.url}/v1"\n'
            'env_key = "PREFIXGATE_API_KEY"\n'
            'wire_api = "responses"\n'
            "request_max_retries = 0\n"
            "stream_max_retries = 0\n"
        )

    def run(self, prompt: str, *, resume: bool = False) -> list[dict]:
        head = ["exec", "--skip-git-repo-check", "--json"]
        out = self._run([*head, "resume", "--last", prompt] if resume else [*head, prompt])
        events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        kinds = [e["type"] for e in events]
        assert "turn.completed" in kinds and "turn.failed" not in kinds, out
        return events

    @staticmethod
    def answer(events: list[dict]) -> str:
        items = [e["item"] for e in events if e["type"] == "item.completed"]
        return "".join(i["text"] for i in items if i["type"] == "agent_message")

    @staticmethod
    def usage(events: list[dict]) -> dict:
        """The thread's usage so far (Codex adds up its turns)."""
        return next(e["usage"] for e in events if e["type"] == "turn.completed")


class Opencode(_Cli):
    """``opencode run`` with an OpenAI-compatible provider at the gateway (Chat
    Completions); ``--continue`` for a later turn. Its title request goes beside the
    first turn's (same endpoint, no tools)."""

    endpoint = "chat"

    def __init__(self, exe: Path, stack: Stack, tmp_path: Path) -> None:
        super().__init__(exe, tmp_path, "opencode")
        self.env |= {"OPENCODE_DISABLE_AUTOUPDATE": "1", "OPENCODE_DISABLE_MODELS_FETCH": "1"}
        config = {
            "$schema": "https://opencode.ai/config.json",
            "provider": {
                "prefixgate": {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "prefixgate",
                    "options": {"baseURL": stack.url + "/v1", "apiKey": "test-key"},
                    "models": {stack.model: {"name": stack.model}},
                }
            },
            "model": f"prefixgate/{stack.model}",
            "autoupdate": False,
            "share": "disabled",
        }
        folder = self.home / ".config" / "opencode"
        folder.mkdir(parents=True)
        (folder / "opencode.json").write_text(json.dumps(config, indent=2))

    def run(self, prompt: str, *, resume: bool = False) -> list[dict]:
        """The events of ``--format json`` (text parts; usage in ``step_finish``)."""
        args = ["run", "--format", "json", *(["--continue"] if resume else []), prompt]
        out = self._run(args)
        events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        assert any(e["type"] == "step_finish" for e in events), out
        return events

    @staticmethod
    def answer(events: list[dict]) -> str:
        return "".join(e["part"]["text"] for e in events if e["type"] == "text")

    @staticmethod
    def usage(events: list[dict]) -> dict:
        """The last step's tokens: ``input`` is the uncached part, ``cache.read`` the rest."""
        return [e["part"]["tokens"] for e in events if e["type"] == "step_finish"][-1]


@dataclass
class TwoTurns:
    """A conversation of two turns: what each CLI run said, the gateway's records of the
    two conversation requests, and the bodies the upstream received for them."""

    first: object
    second: object
    records: list
    bodies: list[dict]
    raws: list[bytes] = field(default_factory=list)  # the bodies' bytes
    seen: list[tuple] = field(default_factory=list)  # every request the upstream saw

    @property
    def hit_rate(self) -> float:
        """Turn 2's share of the prompt served from the upstream's prefix cache."""
        rec = self.records[1]
        return (rec.cached_tokens or 0) / rec.prompt_tokens


def converse(make_cli, tmp_path: Path, vllm=None, *, first="say hi", second="and once more"):
    """Two turns of the CLI ``make_cli(stack)`` (the second continues the first's session)
    through a gateway over the simulated vLLM, or over ``vllm`` (a ``VllmServer``); then
    the gateway's records of the conversation requests and the upstream's bodies for them
    (those with tools: not opencode's title requests)."""
    where = {} if vllm is None else {"vllm_url": vllm.url, "model": vllm.served_model}
    with stack(tmp_path, **where) as s:
        cli = make_cli(s)
        turns = TwoTurns(cli.run(first), cli.run(second, resume=True), [], [])
    recs = s.records(cli.endpoint)  # complete now that the stack is down
    turns.records = [r for r in recs if r.status == 200 and _has_tools(r)]
    sent = [e for e in s.upstream.chats() if e["status"] == 200 and e["body"].get("tools")]
    turns.bodies = [e["body"] for e in sent]
    turns.raws = [e["raw"] for e in sent]
    # what the upstream saw, for a failure's message: path, status, messages, tools
    turns.seen = [
        (
            e["path"],
            e.get("status"),
            len((e["body"] or {}).get("messages", ())),
            bool((e["body"] or {}).get("tools")),
        )
        for e in s.upstream.seen
    ]
    return turns


def converse_again(make_cli, tmp_path: Path, engine, say, *, tries: int = 8) -> TwoTurns:
    """:func:`converse` (``make_cli(stack, folder)``), again in a fresh folder while the
    CLI sent other than two conversation requests: the tiny agent model samples its
    answers, and after some (one token, an empty text) the CLI asks once more within the
    turn, which says nothing of the gateway; every other check stays the caller's. A try
    fails so about one time in four (two turns, a sixteenth of the vocabulary ends an
    answer) and costs only when it does: three tries all failed once in CI (a one in 64
    chance), eight all fail about once in 65,000 runs."""
    for n in range(tries):
        where = tmp_path / f"try-{n}"
        where.mkdir()
        turns = converse(lambda s, w=where: make_cli(s, w), where, engine)
        if len(turns.records) == 2:
            return turns
        say(f"the CLI sent {len(turns.records)} conversation requests {turns.seen}; again")
    return turns


def _has_tools(rec) -> bool:
    return any(s.name == "tools" for s in rec.segments_in or ())


def check_stable_prefix(turns: TwoTurns, *, volatile: tuple[str, ...], block: int, slack: int):
    """What the upstream received: two conversation requests, the same tools, turn 1's
    messages unchanged at the head of turn 2, none of the per-session or per-request
    strings in ``volatile`` in the prompt (request fields such as ``user`` are no tokens); and turn 2 served from the cache for all of turn 1's full
    blocks but ``slack`` of them (0 on the simulated vLLM, whose tokens are exact)."""
    assert len(turns.records) == 2, [(r.status, r.prompt_tokens) for r in turns.records]
    assert len(turns.bodies) == 2, turns.seen
    b1, b2 = turns.bodies
    assert b2["tools"] == b1["tools"]
    assert b2["messages"][: len(b1["messages"])] == b1["messages"]
    # byte for byte: turn 2's body starts with turn 1's up to its last message's end
    raw1, raw2 = (raw.decode() for raw in turns.raws)
    assert raw2.startswith(_through_messages(raw1))
    for body in turns.bodies:
        sent = json.dumps([body["messages"], body["tools"]])  # the prompt the engine caches
        for text in volatile:
            assert text not in sent, text
    p1, c2 = turns.records[0].prompt_tokens, turns.records[1].cached_tokens or 0
    assert c2 % block == 0
    assert c2 >= ((p1 - 1) // block - slack) * block, (p1, c2)


def _through_messages(text: str) -> str:
    """A JSON body's text from its start to the end of its last message (the ``messages``
    array without its closing bracket)."""
    key = '"messages":'
    start = text.index(key) + len(key)
    start += len(text[start:]) - len(text[start:].lstrip())
    _, end = json.JSONDecoder().raw_decode(text, start)
    return text[: end - 1]
