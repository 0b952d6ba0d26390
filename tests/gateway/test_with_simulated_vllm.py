"""The gateway in front of the simulated vLLM upstream: the cache story end to end."""

from __future__ import annotations

import subprocess
import sys
import time

import anthropic
import httpx
import pytest

from prefixgate.config import parse_config
from prefixgate.lab.upstream_sim import SimSettings, create_upstream_app
from prefixgate.serve.app import create_app
from prefixgate.serve.process import ServerThread
from tests.conftest import load_fixture
from tests.gateway.test_recording import _free_port


def _stack(strip: bool):
    up = ServerThread(create_upstream_app(SimSettings(block_size=64))).start()
    config = parse_config(
        {
            "channels": [
                {"name": "sim", "base_url": up.url + "/v1", "strip_anthropic_billing_header": strip}
            ],
            "store": None,
        }
    )
    gw = ServerThread(create_app(config)).start()
    return up, gw


def _turns(client: anthropic.Anthropic, fx: dict, n: int, vary_header: bool) -> list:
    body = fx["body"]
    system = [dict(b) for b in body["system"]]
    messages = list(body["messages"])
    usages = []
    for i in range(n):
        if vary_header:
            system[0] = {
                "type": "text",
                "text": system[0]["text"].split(" cch=")[0] + f" cch={i:05x};",
            }
        with client.messages.stream(
            model="m", max_tokens=64, system=system, tools=body["tools"], messages=messages
        ) as s:
            msg = s.get_final_message()
        usages.append(msg.usage)
        messages = messages + [
            {"role": "assistant", "content": [{"type": "text", "text": msg.content[-1].text}]},
            {"role": "user", "content": f"next step {i}"},
        ]
    return usages


def test_second_turn_hits_through_the_gateway():
    fx = load_fixture("01_v2.1.332_print_turn1.json")
    up, gw = _stack(strip=True)
    try:
        with anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0) as client:
            usages = _turns(client, fx, 3, vary_header=True)
    finally:
        gw.stop()
        up.stop()
    assert usages[0].cache_read_input_tokens == 0
    for prev, cur in zip(usages, usages[1:], strict=False):
        prev_total = prev.input_tokens + prev.cache_read_input_tokens
        # Everything of the previous prompt but its last partial block is a hit.
        assert cur.cache_read_input_tokens >= prev_total - 64
        assert cur.cache_read_input_tokens % 64 == 0
        assert cur.input_tokens < 200


def test_volatile_header_collapses_hits_without_the_protection():
    fx = load_fixture("01_v2.1.332_print_turn1.json")
    up, gw = _stack(strip=False)
    try:
        with anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0) as client:
            usages = _turns(client, fx, 3, vary_header=True)
    finally:
        gw.stop()
        up.stop()
    # Tools render before the system prompt: only the tools' whole blocks ever hit.
    hits = {u.cache_read_input_tokens for u in usages[1:]}
    assert len(hits) == 1
    pinned = hits.pop()
    assert 0 < pinned < usages[1].input_tokens + pinned
    total = usages[2].input_tokens + usages[2].cache_read_input_tokens
    assert pinned / total < 0.9


@pytest.mark.parametrize("http", ["prefixgate", "uvicorn"])
def test_serve_without_arguments_uses_the_embedded_upstream(tmp_path, http):
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "prefixgate.cli",
            "serve",
            "--port",
            str(port),
            "--store",
            f"sqlite:///{tmp_path}/r.db",
            "--http",
            http,
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                httpx.get(url + "/healthz", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        with anthropic.Anthropic(base_url=url, api_key="anything", max_retries=0) as client:
            msg = client.messages.create(
                model="any-model", max_tokens=20, messages=[{"role": "user", "content": "hi"}]
            )
        assert msg.content[0].type == "text" and msg.content[0].text
        assert msg.usage.output_tokens > 0
    finally:
        proc.terminate()
        out = proc.communicate(timeout=30)[0].decode()
    assert proc.returncode == 0, out
    assert "accepting any key" in out
