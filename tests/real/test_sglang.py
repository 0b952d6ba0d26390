"""The gateway against a REAL SGLang 0.5.23 (CPU, the tiny model; ``harness_sglang.py``).

What only the real SGLang can tell: its ``cached_tokens`` (with ``--enable-cache-report``)
in whole pages, its top-level ``reasoning_tokens``, its ``reasoning_content`` chunks and
``matched_stop``, mapped into each client's semantics through the three client APIs,
streamed and not; its errors answered in the client's protocol and never held against the
replica; the render order learned from its ``/tokenize``; its health endpoint; and the
doctor's "cache report off" for an SGLang started without ``--enable-cache-report``.

Every test starts its prompts with a fresh nonce, so tests share the server's cache safely.
"""

from __future__ import annotations

import contextlib
import re
import secrets
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from prefixgate.config import parse_config
from prefixgate.doctor import cache_report, diagnose, render_text
from prefixgate.routing.health import HealthChecker
from prefixgate.serve.app import create_app
from prefixgate.serve.process import ServerThread
from prefixgate.store import open_store
from tests.conftest import settled
from tests.real import harness_sglang
from tests.real.engine_gateway import check_render_order
from tests.real.test_vllm import CacheModel, system_prompt

PAGE = harness_sglang.SGLANG_PAGE_SIZE


def whole_pages(prompt_tokens: int) -> int:
    """What SGLang's radix cache serves of a prompt held whole: its whole pages, short of
    the last token (which is always computed)."""
    return (prompt_tokens - 1) // PAGE * PAGE


def direct(server, messages: list[dict], **extra) -> dict:
    body = {"model": server.served_model, "messages": messages, "max_tokens": 1, **extra}
    resp = httpx.post(server.base_url + "/chat/completions", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    return resp.json()


def tokenize(server, messages: list[dict]) -> list[int]:
    resp = httpx.post(
        server.base_url + "/tokenize",
        json={"model": server.served_model, "messages": messages},
        timeout=60,
    )
    assert resp.status_code == 200, resp.text
    return resp.json()["tokens"]


@contextlib.contextmanager
def gateway(server, tmp_path: Path, **channel) -> Iterator[tuple[str, str, object]]:
    """The gateway (``create_app``, a SQLite store) in front of ``server``; yields
    ``(url, dsn, app)``. The store is complete once the block exits. No load shedding:
    on the shared two cores, a 70k-token body can make the loop run late enough to shed
    the next request, and these tests are about SGLang's answers."""
    dsn = f"sqlite:///{tmp_path / 'store.db'}"
    config = parse_config(
        {
            "server": {"shed_loop_lag": None},
            "channels": [
                {
                    "name": "real-sglang",
                    "base_url": server.base_url,
                    "timeouts": {"first_byte": 120, "idle": 120},
                    **channel,
                }
            ],
            "store": {"dsn": dsn, "journal_path": str(tmp_path / "journal")},
        }
    )
    app = create_app(config)
    with ServerThread(app) as srv:
        yield srv.url, dsn, app


# -- 1. SGLang itself ------------------------------------------------------------------


def test_sglang_serves_the_tiny_model_with_its_cache_report(sglang, tiny_model):
    """The smoke test: SGLang answers, counts the prompt as the model's own template and
    tokenizer do, and reports a repeat's whole pages as cached."""
    models = httpx.get(sglang.base_url + "/models", timeout=30).json()
    assert [(m["id"], m["owned_by"]) for m in models["data"]] == [("tiny", "sglang")]
    messages = [
        {"role": "system", "content": system_prompt(secrets.token_hex(4))},
        {"role": "user", "content": "What does zip do?"},
    ]
    expected = CacheModel(tiny_model).tokens(messages)
    assert tokenize(sglang, messages) == expected
    first, again = direct(sglang, messages)["usage"], direct(sglang, messages)["usage"]
    assert first["prompt_tokens"] == again["prompt_tokens"] == len(expected)
    assert first["prompt_tokens_details"]["cached_tokens"] <= PAGE  # the template's start
    assert again["prompt_tokens_details"]["cached_tokens"] == whole_pages(len(expected))
    assert again["reasoning_tokens"] == 0  # SGLang's own, top-level figure


# -- 2. the three client APIs through the gateway -----------------------------------------


def _ask(api: str, url: str, system: str, stream: bool, **extra) -> dict:
    """One request through the gateway in ``api``'s protocol with its official SDK; the
    usage the client saw, in a common shape: ``total`` prompt tokens, ``cached``, ``output``,
    ``reasoning`` (None where the protocol has no such figure)."""
    question = "What does zip do?"
    if api == "anthropic":
        with anthropic.Anthropic(base_url=url, api_key="k", max_retries=0, timeout=120) as c:
            body = {
                "model": "tiny",
                "max_tokens": 8,
                "system": system,
                "messages": [{"role": "user", "content": question}],
                **extra,
            }
            if stream:
                with c.messages.stream(**body) as s:
                    msg = s.get_final_message()
            else:
                msg = c.messages.create(**body)
        u = msg.usage
        assert (u.cache_creation_input_tokens or 0) == 0
        return {
            "total": u.input_tokens + u.cache_read_input_tokens,
            "cached": u.cache_read_input_tokens,
            "output": u.output_tokens,
            "reasoning": None,
            "message": msg,
        }
    with openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0, timeout=120) as c:
        if api == "chat":
            body = {
                "model": "tiny",
                "max_tokens": 8,
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": question},
                ],
                **extra,
            }
            if stream:
                chunks = list(
                    c.chat.completions.create(
                        **body, stream=True, stream_options={"include_usage": True}
                    )
                )
                usage = chunks[-1].usage
                assert usage is not None and chunks[-1].choices == []
            else:
                usage = c.chat.completions.create(**body).usage
            details, prompt = usage.completion_tokens_details, usage.prompt_tokens_details
            return {
                "total": usage.prompt_tokens,
                "cached": prompt.cached_tokens if prompt else None,
                "output": usage.completion_tokens,
                "reasoning": details.reasoning_tokens if details else None,
            }
        body = {
            "model": "tiny",
            "max_output_tokens": 8,
            "instructions": system,
            "input": question,
            **extra,
        }
        if stream:
            events = list(c.responses.create(**body, stream=True))
            assert events[-1].type in ("response.completed", "response.incomplete")
            resp = events[-1].response
        else:
            resp = c.responses.create(**body)
        u = resp.usage
        return {
            "total": u.input_tokens,
            "cached": u.input_tokens_details.cached_tokens,
            "output": u.output_tokens,
            "reasoning": u.output_tokens_details.reasoning_tokens,
            "response": resp,
        }


@pytest.mark.parametrize("stream", [False, True], ids=["once", "stream"])
@pytest.mark.parametrize("api", ["anthropic", "chat", "responses"])
def test_sglangs_usage_in_each_clients_semantics(sglang, tmp_path, api, stream):
    """A prompt sent twice: the repeat's cached tokens are SGLang's (its whole pages), in
    each protocol's terms (Anthropic: ``input_tokens`` excludes the cache reads; OpenAI's
    two: the prompt includes them), and the record keeps SGLang's figures."""
    system = system_prompt(secrets.token_hex(4))
    with gateway(sglang, tmp_path) as (url, dsn, app):
        first = _ask(api, url, system, stream)
        again = _ask(api, url, system, stream)
        settled(app.state.gateway)
    assert first["total"] == again["total"] > 20 * PAGE
    assert first["cached"] <= PAGE
    assert again["cached"] == whole_pages(again["total"])
    assert again["output"] >= 1
    if again["reasoning"] is not None:
        assert again["reasoning"] == 0  # no reasoning parser: SGLang says 0


@pytest.mark.parametrize("stream", [False, True], ids=["once", "stream"])
def test_sglangs_matched_stop_is_anthropics_stop_sequence(sglang, tmp_path, stream):
    """SGLang names the stop string it ended at ``matched_stop`` (vLLM: ``stop_reason``):
    an Anthropic client gets ``stop_reason: "stop_sequence"`` and the string."""
    question = f"{secrets.token_hex(4)} Name three modules."
    body = {
        "model": "tiny",
        "max_tokens": 200,
        "stop_sequences": ["e"],  # the tiny model's random text has one soon
        "messages": [{"role": "user", "content": question}],
    }
    ended = direct(sglang, body["messages"], max_tokens=200, stop=["e"])["choices"][0]
    assert (ended["finish_reason"], ended["matched_stop"]) == ("stop", "e")
    with gateway(sglang, tmp_path) as (url, _dsn, _app):
        with anthropic.Anthropic(base_url=url, api_key="k", max_retries=0, timeout=120) as c:
            if stream:
                with c.messages.stream(**body) as s:
                    msg = s.get_final_message()
            else:
                msg = c.messages.create(**body)
    assert (msg.stop_reason, msg.stop_sequence) == ("stop_sequence", "e")


# -- 3. errors: the client's, in its protocol, never the replica's -----------------------


def test_sglangs_errors_are_the_clients_and_never_the_replicas(sglang, tmp_path):
    """A prompt over the window, a bad parameter, a model the channel does not serve: each
    answered in the client's protocol with a 4xx (Claude Code compacts on Anthropic's
    ``prompt is too long: N tokens > M maximum``), not retried, and the replica stays
    healthy. SGLang itself answers any model name as its own, so the channel lists its
    ``models`` and the gateway answers the unknown one."""
    long_text = " ".join(f"word{i}" for i in range(20000))
    assert direct(sglang, [{"role": "user", "content": "hi"}], model="mistyped")["choices"]
    channel = {"health": {"interval": 3600}, "models": ["tiny"]}
    with gateway(sglang, tmp_path, **channel) as (url, dsn, app):
        gw = app.state.gateway
        with anthropic.Anthropic(base_url=url, api_key="k", max_retries=0, timeout=120) as c:
            with pytest.raises(anthropic.BadRequestError) as too_long:
                c.messages.create(
                    model="tiny", max_tokens=8, messages=[{"role": "user", "content": long_text}]
                )
            with pytest.raises(anthropic.NotFoundError) as no_model:
                c.messages.create(
                    model="mistyped", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
                )
            with pytest.raises(anthropic.BadRequestError) as bad_param:
                c.messages.create(
                    model="tiny",
                    max_tokens=8,
                    messages=[{"role": "user", "content": "hi"}],
                    extra_body={"temperature": -1.0},
                )
        with openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0, timeout=120) as c:
            with pytest.raises(openai.BadRequestError) as chat_too_long:
                c.chat.completions.create(
                    model="tiny", max_tokens=8, messages=[{"role": "user", "content": long_text}]
                )
            with pytest.raises(openai.BadRequestError) as responses_bad:
                c.responses.create(model="tiny", input="hi", temperature=-1.0)
        settled(gw)
        assert gw.router.healthy(sglang.base_url)
    with open_store(dsn) as store:
        records = list(store.iter_records())
    assert sorted(r.status for r in records) == [400, 400, 400, 400, 404]
    assert all(r.retries == 0 for r in records)
    err = too_long.value.body["error"]
    assert err["type"] == "invalid_request_error"
    m = re.fullmatch(r"prompt is too long: (\d+) tokens > 16384 maximum", err["message"])
    assert m and int(m.group(1)) > 20000, err
    assert no_model.value.body["error"]["type"] == "not_found_error"
    assert bad_param.value.body["error"]["type"] == "invalid_request_error"
    assert "temperature" in bad_param.value.body["error"]["message"]
    assert "context length" in str(chat_too_long.value) or "too long" in str(chat_too_long.value)
    assert "temperature" in str(responses_bad.value)


# -- 4. the render order, the health probe ------------------------------------------------


def test_the_render_order_is_learned_from_sglangs_tokenize(sglang, tiny_model):
    """The gateway asks SGLang's ``/tokenize`` (it takes messages and tools, as vLLM's
    does) where the model's template puts the tools; the answer agrees with the template.
    SGLang's /health at the root, beside /v1: up; a closed port: down."""
    health = {}

    async def probe(config, transport) -> None:
        checker = HealthChecker(config.channels, lambda *_: None, transport=transport)
        channel = config.channels[0]
        health["up"] = await checker.probe(channel, sglang.base_url)
        health["down"] = await checker.probe(channel, "http://127.0.0.1:9/v1")

    check_render_order(sglang.base_url, tiny_model, probe)
    assert health == {"up": True, "down": False}


# -- 5. a second configuration: reasoning parser on, cache report off ---------------------


def test_sglangs_reasoning_reaches_each_client(sglang_reasoning, tmp_path):
    """With ``--reasoning-parser`` SGLang streams ``reasoning_content`` and counts
    ``reasoning_tokens``: Anthropic clients get thinking blocks, Responses clients a
    reasoning item and ``output_tokens_details.reasoning_tokens``, Chat clients SGLang's
    own chunks."""
    system = system_prompt(secrets.token_hex(4))
    with gateway(sglang_reasoning, tmp_path) as (url, _dsn, app):
        for stream in (False, True):
            msg = _ask("anthropic", url, system, stream)["message"]
            assert [b.type for b in msg.content][:1] == ["thinking"], msg.content
            assert msg.content[0].thinking
            got = _ask("responses", url, system, stream)
            assert got["reasoning"] == got["output"] > 0
            assert got["response"].output[0].type == "reasoning"
            chat = _ask("chat", url, system, stream)
            assert chat["reasoning"] == chat["output"]
        settled(app.state.gateway)


def test_the_doctor_says_sglangs_cache_report_is_off(sglang_reasoning, tmp_path, say):
    """SGLang without ``--enable-cache-report`` answers without ``prompt_tokens_details``:
    the doctor tells that from "nothing hit" by the records (sessions that re-sent their
    whole predecessor) and by its probe, and names SGLang's flag."""
    nonce = secrets.token_hex(4)
    with gateway(sglang_reasoning, tmp_path) as (url, dsn, app):
        with httpx.Client(base_url=url, timeout=120) as client:
            for s in range(2):
                messages = [{"role": "system", "content": system_prompt(f"{nonce}-{s}")}]
                for t in range(4):
                    messages.append({"role": "user", "content": f"step {t} of {s}"})
                    resp = client.post(
                        "/v1/chat/completions",
                        json={"model": "tiny", "messages": messages, "max_tokens": 4},
                        headers={"x-session-id": f"{nonce}-{s}"},
                    )
                    assert resp.status_code == 200, resp.text
                    assert resp.json()["usage"].get("prompt_tokens_details") is None
                    messages.append({"role": "assistant", "content": "ok"})
        settled(app.state.gateway)
        channels = app.state.gateway.config.channels
    probes = cache_report.probe_all(channels)
    assert probes["real-sglang"].verdict == cache_report.OFF, probes
    for evidence in ({}, probes):
        d = diagnose(dsn, probes=evidence or None)
        (f,) = [f for f in d.findings if f.kind == "cache_report_off"]
        say(render_text(d))
        assert "SGLang: start the server with `--enable-cache-report`" in f.fix
        facts = f.facts["channels"]["real-sglang"]
        assert facts["verdict"] == cache_report.OFF
        assert facts["evidence"] == ("probe" if evidence else "records")
