"""What ``prefixgate serve`` tells its operator, through a real process: the start block
(where it listens, the dashboard, where records go, the upstream checked), one-line errors
for a port in use or a bad config, a clean stop on SIGTERM/SIGINT, the access log."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys

import httpx
import pytest

from tests.serve.served import Served, free_port

IMPLS = ["prefixgate", "uvicorn"]
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def channel(url: str) -> dict:
    return {"embedded_upstream": False, "channels": [{"name": "main", "base_url": url}]}


def serve_until_exit(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "prefixgate.cli", "serve", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_start_block_says_where_it_listens_records_and_what_the_upstream_serves(
    upstream, tmp_path
):
    upstream.model_ids = ["qwen3-8b", "llama-3.1-8b"]
    config = {**channel(upstream.url), "store": {"dsn": "postgresql://gw:s3cret@127.0.0.1:1/x"}}
    with Served(tmp_path, config) as gw:
        pass
    out = gw.output
    assert f"prefixgate listening on {gw.url}  (own HTTP server, 1 worker)" in out
    assert f"dashboard  {gw.url}/dashboard" in out
    assert "records    postgresql://…@127.0.0.1:1/x" in out and "s3cret" not in out
    assert f"main: {upstream.url}: /models answered: qwen3-8b, llama-3.1-8b" in out
    assert "open files" in out and "connections" in out and "WARNING: /models" not in out
    assert "Traceback" not in out and gw.returncode == 0


def test_a_dead_upstream_is_a_warning_at_start_not_a_silent_start(tmp_path):
    dead = f"http://127.0.0.1:{free_port()}/v1"
    with Served(tmp_path, channel(dead)) as gw:
        pass
    assert f"main: {dead}: WARNING: /models did not answer (cannot reach upstream" in gw.output


def test_an_upstream_url_without_v1_gets_a_hint_naming_the_right_one(upstream, tmp_path):
    upstream.model_ids = ["m"]
    base = upstream.url.removesuffix("/v1")
    with Served(tmp_path, channel(base)) as gw:
        pass
    assert f"main: {base}: WARNING: /models did not answer" in gw.output
    assert f"hint       {base} has no /v1" in gw.output
    assert f"use {base}/v1" in gw.output


@pytest.mark.parametrize("impl", IMPLS)
def test_a_port_in_use_is_one_line_without_traceback(tmp_path, impl):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = serve_until_exit("--port", str(port), "--http", impl, cwd=tmp_path)
    assert r.returncode == 1
    errors = [line for line in r.stderr.splitlines() if line.startswith("Error:")]
    assert errors == [
        f"Error: cannot listen on 127.0.0.1:{port}: the port is already in use "
        "(another prefixgate?); choose another with --port"
    ]
    assert "Traceback" not in r.stderr


def test_a_key_variable_not_set_is_one_line_without_traceback(tmp_path):
    cfg = tmp_path / "gw.yaml"
    cfg.write_text(
        "channels:\n  - name: a\n    base_url: http://127.0.0.1:1/v1\n"
        "keys:\n  - name: k\n    key_env: PREFIXGATE_TEST_UNSET_KEY\n"
    )
    r = serve_until_exit("--config", str(cfg), cwd=tmp_path)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "Error: key 'k': environment variable PREFIXGATE_TEST_UNSET_KEY is not set" in r.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("impl", IMPLS)
def test_a_signal_stops_it_cleanly_without_traceback(tmp_path, impl, sig):
    with Served(tmp_path, None, "--http", impl) as gw:
        r = httpx.post(gw.url + "/v1/chat/completions", json=CHAT, timeout=30)
        assert r.status_code == 200
        assert gw.stop(sig) == 0
    assert "Traceback" not in gw.output and "CancelledError" not in gw.output


@pytest.mark.parametrize("impl", IMPLS)
def test_the_access_log_is_one_line_per_request_when_asked(tmp_path, impl):
    with Served(tmp_path, None, "--http", impl, "--access-log") as gw:
        httpx.post(gw.url + "/v1/chat/completions?key=hidden", json=CHAT, timeout=30)
        httpx.get(gw.url + "/nowhere", timeout=30)
    lines = [line for line in gw.output.splitlines() if "prefixgate.access" in line]
    assert any('"POST /v1/chat/completions HTTP/1.1" 200' in line for line in lines), lines
    assert any('"GET /nowhere HTTP/1.1" 404' in line for line in lines), lines
    assert "hidden" not in gw.output  # never the query string
    assert "access log on" in gw.output


def test_the_access_log_is_off_by_default(tmp_path):
    with Served(tmp_path) as gw:
        httpx.post(gw.url + "/v1/chat/completions", json=CHAT, timeout=30)
    assert "prefixgate.access" not in gw.output and "access log off" in gw.output
