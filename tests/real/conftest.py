"""Fixtures for the tests against real peers (see ``harness.py``).

Skipped only when ``PREFIXGATE_SKIP_REAL=1``; otherwise a failed install or start fails
the tests. Progress goes straight to the terminal so that a CI log shows they ran.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from prefixgate.cache.render import template_file
from tests.real import harness, harness_sglang


def _say_factory(config: pytest.Config):
    capman = config.pluginmanager.getplugin("capturemanager")
    t0 = time.monotonic()

    def say(msg: str) -> None:
        line = f"[real +{time.monotonic() - t0:5.0f}s] {msg}"
        if capman is not None:
            with capman.global_and_fixture_disabled():
                print(line, flush=True)
        else:
            print(line, flush=True)

    return say


@pytest.fixture(scope="session")
def say(pytestconfig: pytest.Config):
    return _say_factory(pytestconfig)


def _skip_if_asked() -> None:
    if harness.skip_requested():
        pytest.skip("PREFIXGATE_SKIP_REAL=1: tests against real vLLM and agent CLIs skipped")


@pytest.fixture(scope="session")
def vllm_python(say) -> harness.Path:
    _skip_if_asked()
    return harness.ensure_vllm(say)


@pytest.fixture(scope="session")
def tiny_model(vllm_python, say) -> harness.Path:
    return harness.ensure_model(vllm_python, say)


def _log(name: str) -> harness.Path:
    return harness.cache_dir() / "logs" / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.log"


def _running(server, say, name: str) -> Iterator:
    server.start(say)
    try:
        yield server
    finally:
        say(f"stopping {name} on port {server.port}")
        server.stop()


def _serve(
    python, model, say, name: str, kind=harness.VllmServer, **kw
) -> Iterator[harness.VllmServer]:
    yield from _running(kind(python, model, log=_log(name), **kw), say, name)


@pytest.fixture(scope="session")
def vllm(vllm_python, tiny_model, say) -> Iterator[harness.VllmServer]:
    """vLLM 0.32 as released (it drops Claude Code's billing header line itself)."""
    yield from _serve(vllm_python, tiny_model, say, "vllm")


@pytest.fixture(scope="session")
def vllm_no_strip(vllm_python, tiny_model, say) -> Iterator[harness.VllmServer]:
    """The same vLLM with its billing-header strip turned off (older vLLM, SGLang)."""
    yield from _serve(vllm_python, tiny_model, say, "vllm-no-strip", strip_billing_header=False)


@pytest.fixture(scope="session")
def vllm_kv_events(vllm_python, tiny_model, say) -> Iterator[tuple[harness.VllmServer, dict]]:
    """vLLM publishing its KV-cache events, with a KV cache of only ``KV_EVENTS_BLOCKS``
    blocks (so a few sessions evict each other); yields the server and the event settings
    it was given (its ``--kv-events-config``)."""
    events = harness.kv_events_config()
    extra = harness.kv_events_args(events, harness.KV_EVENTS_BLOCKS)
    for server in _serve(vllm_python, tiny_model, say, "vllm-kv-events", extra_args=extra):
        yield server, events


@pytest.fixture(scope="session")
def agent_model(vllm_python, say) -> harness.Path:
    return harness.ensure_agent_model(vllm_python, say)


@pytest.fixture(scope="session")
def vllm_agent(vllm_python, agent_model, say) -> Iterator[harness.VllmServer]:
    """vLLM serving the agent model: a 64k window, answers that end by themselves."""
    yield from _serve(
        vllm_python, agent_model, say, "vllm-agent", max_model_len=harness.AGENT_MAX_MODEL_LEN
    )


@pytest.fixture(scope="module")
def vllm_agent_small(vllm_python, agent_model, say) -> Iterator[harness.VllmServer]:
    """vLLM serving the agent model with a window of ``SMALL_WINDOW`` tokens, which a
    coding agent's conversation fills in two or three turns (``test_compaction.py``)."""
    yield from _serve(
        vllm_python, agent_model, say, "vllm-agent-small", max_model_len=harness.SMALL_WINDOW
    )


@pytest.fixture(scope="session")
def vllm_agent_hoisting(vllm_python, agent_model, say) -> Iterator[tuple[harness.VllmServer, dict]]:
    """vLLM serving the agent model with the project's DeepSeek-like template (every system
    message gathered at the head: ``--chat-template``), publishing its KV events (a KV
    cache far larger than the tests' sessions); yields the server and its event settings."""
    events = harness.kv_events_config()
    extra = ("--chat-template", str(template_file("hoisting")), "--kv-events-config")
    yield from (
        (server, events)
        for server in _serve(
            vllm_python,
            agent_model,
            say,
            "vllm-agent-hoisting",
            max_model_len=harness.AGENT_MAX_MODEL_LEN,
            extra_args=(*extra, json.dumps(events)),
        )
    )


@pytest.fixture(scope="session")
def vllm_kv_events_b(vllm_python, tiny_model, say) -> Iterator[tuple[harness.VllmServer, dict]]:
    """A second vLLM like ``vllm_kv_events`` (its own event addresses, the same small KV
    cache): two replicas of one channel."""
    events = harness.kv_events_config()
    extra = harness.kv_events_args(events, harness.KV_EVENTS_BLOCKS)
    for server in _serve(vllm_python, tiny_model, say, "vllm-kv-events-b", extra_args=extra):
        yield server, events


# -- SGLang: each server takes ~2 GB and ~40 s to start, so they are shared: the general
# one by the whole session, the others by the one module that needs them ----------------


@pytest.fixture(scope="session")
def sglang_python(say) -> harness.Path:
    _skip_if_asked()
    return harness_sglang.ensure_sglang(say)


def _serve_sglang(sglang_python, model, say, name: str, **kw):
    yield from _serve(sglang_python, model, say, name, harness_sglang.SglangServer, **kw)


@pytest.fixture(scope="session")
def sglang(sglang_python, tiny_model, say) -> Iterator[harness_sglang.SglangServer]:
    """SGLang 0.5.23 serving the tiny model, with ``--enable-cache-report`` (every test
    starts its prompts with a fresh nonce, so tests share its cache safely)."""
    yield from _serve_sglang(sglang_python, tiny_model, say, "sglang")


@pytest.fixture(scope="module")
def sglang_reasoning(sglang_python, tiny_model, say) -> Iterator[harness_sglang.SglangServer]:
    """SGLang in a second configuration: a reasoning parser (``deepseek-r1``: the answer
    is reasoning until ``</think>``, which random weights never write) and no
    ``--enable-cache-report`` (its responses carry no cached tokens)."""
    yield from _serve_sglang(
        sglang_python,
        tiny_model,
        say,
        "sglang-reasoning",
        cache_report=False,
        extra_args=("--reasoning-parser", "deepseek-r1"),
    )


def _sglang_with_events(sglang_python, tiny_model, say, name: str, *, bind: bool):
    events = harness_sglang.sglang_kv_events_config(bind=bind)
    for server in _serve_sglang(
        sglang_python,
        tiny_model,
        say,
        name,
        extra_args=("--kv-events-config", json.dumps(events)),
        max_total_tokens=harness_sglang.SGLANG_KV_TOKENS,
    ):
        yield server, events


@pytest.fixture(scope="module")
def sglang_events(sglang_python, tiny_model, say):
    """SGLang publishing its KV events, its PUB socket *bound* (the gateway connects), with
    a KV cache of ``SGLANG_KV_TOKENS`` tokens so that a few sessions evict each other;
    yields the server and its ``--kv-events-config``."""
    yield from _sglang_with_events(sglang_python, tiny_model, say, "sglang-events", bind=True)


@pytest.fixture(scope="module")
def sglang_events_b(sglang_python, tiny_model, say):
    """A second one whose publisher *connects* to an address the gateway binds."""
    yield from _sglang_with_events(sglang_python, tiny_model, say, "sglang-events-b", bind=False)


@pytest.fixture(scope="module")
def sglang_agent(sglang_python, agent_model, say) -> Iterator[harness_sglang.SglangServer]:
    """SGLang serving the agent model (a 64k window, answers that end by themselves)."""
    yield from _serve_sglang(
        sglang_python,
        agent_model,
        say,
        "sglang-agent",
        max_model_len=harness.AGENT_MAX_MODEL_LEN,
    )


@pytest.fixture(scope="module")
def sglang_hoisting(
    sglang_python, agent_model, say
) -> Iterator[tuple[harness_sglang.SglangServer, dict]]:
    """SGLang serving the agent model with the project's hoisting template, publishing its
    KV events (``harness_sglang.hoisting_server``; for ``test_sglang_rendering.py``); yields
    the server and its event settings."""
    name = "sglang-agent-hoisting"
    server, events = harness_sglang.hoisting_server(sglang_python, agent_model, log=_log(name))
    for running in _running(server, say, name):
        yield running, events


@pytest.fixture(scope="session")
def claude_exe(say) -> harness.Path:
    _skip_if_asked()
    return harness.ensure_claude_code(say)


@pytest.fixture(scope="session")
def codex_exe(say) -> harness.Path:
    _skip_if_asked()
    return harness.ensure_codex(say)


@pytest.fixture(scope="session")
def opencode_exe(say) -> harness.Path:
    _skip_if_asked()
    return harness.ensure_opencode(say)


def pytest_terminal_summary(terminalreporter) -> None:
    steps = harness.TIMINGS.steps
    if not steps:
        return
    terminalreporter.section("real vLLM and agent CLIs: setup")
    for name, secs in steps.items():
        terminalreporter.write_line(f"{name}: {secs:.1f} s")
