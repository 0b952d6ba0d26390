"""Row 3 of the security review (issue 29): a keyless loopback gateway cannot be driven
by a web page (a CORS-simple POST from another origin) nor read through DNS rebinding (a
foreign Host), and clients that are not browsers work as before."""

from __future__ import annotations

import hashlib
import socket

import anthropic
import httpx
import openai
import pytest

from prefixgate.store import open_store

CHAT = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'


@pytest.fixture
def keyless(gateway, tmp_path):
    dsn = str(tmp_path / "records.db")
    with open_store(dsn) as store:
        store.migrate()
    return gateway(store={"dsn": dsn})


def raw_request(url: str, head: bytes, body: bytes = b"") -> bytes:
    """One request's exact bytes on a socket, and the status line of the answer."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(head + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
        got = b""
        while chunk := s.recv(65536):
            got += chunk
    return got.split(b"\r\n", 1)[0]


def test_a_cross_origin_simple_post_runs_nothing(keyless):
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: text/plain\r\nOrigin: http://evil.example\r\n"
    )
    assert raw_request(keyless.url, head, CHAT) == b"HTTP/1.1 403 Forbidden"
    for origin in ("null", "https://evil.example", "http://127.0.0.1.evil.example"):
        r = httpx.post(keyless.url + "/v1/messages", content=CHAT, headers={"origin": origin})
        assert r.status_code == 403 and r.json()["type"] == "error"  # Anthropic's shape
    assert keyless.upstream.requests == []


def test_a_rebinding_page_cannot_read_the_records(keyless):
    port = keyless.url.rsplit(":", 1)[1].encode()
    for path in (b"/dashboard/api/requests", b"/v1/models", b"/metrics"):
        head = b"GET " + path + b" HTTP/1.1\r\nHost: evil.example:" + port + b"\r\n"
        assert raw_request(keyless.url, head) == b"HTTP/1.1 403 Forbidden"
    # the same page, same-origin as far as the browser knows: still its Host
    r = httpx.get(
        keyless.url + "/dashboard/api/requests",
        headers={"host": "evil.example:" + port.decode(), "origin": "http://evil.example"},
    )
    assert r.status_code == 403


def test_clients_that_are_not_browsers_pass(keyless):
    url = keyless.url
    chat = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    assert chat.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    msgs = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0)
    assert msgs.messages.create(
        model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
    )
    port = url.rsplit(":", 1)[1]
    # curl without a content type, with a form's (curl -d), by name and by address
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "localhost"):
        for kind in ((), ("application/x-www-form-urlencoded",)):
            headers = {"host": host, **({"content-type": kind[0]} if kind else {})}
            r = httpx.post(url + "/v1/chat/completions", content=CHAT, headers=headers)
            assert r.status_code == 200, (host, kind, r.text)
    # the dashboard's own pages post with their own origin
    own = httpx.get(url + "/dashboard/api/meta", headers={"origin": url})
    assert own.status_code == 200


def test_a_gateway_with_keys_does_not_need_the_rules(gateway):
    gw = gateway(keys=[{"name": "a", "key_sha256": hashlib.sha256(b"k").hexdigest()}])
    r = httpx.post(
        gw.url + "/v1/chat/completions",
        content=CHAT,
        headers={"authorization": "Bearer k", "origin": "https://an.app.example"},
    )
    assert r.status_code == 200
