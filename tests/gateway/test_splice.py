"""Streams relayed inside the I/O callbacks (pipeline/splice.py): through the gateway's own
server and its own upstream client on loopback, the client gets what the task-pumped
relay gives (tests/pipeline/test_relays.py) however the upstream's bytes are cut into
reads, and a client that stops reading stops the upstream instead of filling the
gateway's memory."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from tests.fakes import Reply

CHAT = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
MSG = {**CHAT, "max_tokens": 10}


def _events(up_model: str, n: int = 6) -> bytes:
    """A chat stream as vLLM writes it (compact JSON), usage chunk and [DONE] included."""
    base = '{"id":"c","object":"chat.completion.chunk","created":1,"model":"' + up_model + '",'
    out = [base + '"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}']
    for i in range(n):
        out.append(base + '"choices":[{"index":0,"delta":{"content":"w' + str(i) + ' \\u00e9 "}}]}')
    out.append(base + '"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}')
    out.append(
        base + '"choices":[],"usage":{"prompt_tokens":40,"completion_tokens":' + str(n) + ","
        '"prompt_tokens_details":{"cached_tokens":32}}}'
    )
    out.append("[DONE]")
    return b"".join(b"data: " + e.encode() + b"\n\n" for e in out)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
def test_a_spliced_stream_is_the_same_however_the_upstream_cuts_it(gateway, upstream, path):
    gw = gateway()
    whole = _events("m")
    answers = []
    for size in (len(whole), 1, 5, 64):
        pieces = [whole[i : i + size] for i in range(0, len(whole), size)]
        upstream.script = lambda b, p=pieces: Reply(raw_stream=p, chunk_delay=0.0005)
        r = httpx.post(gw.url + path, json=CHAT if path.endswith("completions") else MSG)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [e for e in r.content.split(b"\n\n") if e and b"message_start" not in e]
        answers.append(events)
    assert all(a == answers[0] for a in answers[1:])
    text = b"".join(answers[0]).decode()
    assert all(f"w{i} \\u00e9" in text or f"w{i} é" in text for i in range(6))
    recs = gw.records
    assert len(recs) == 4
    assert {(r.status, r.prompt_tokens, r.cached_tokens, r.completion_tokens) for r in recs} == {
        (200, 40, 32, 6)
    }


def test_chat_chunks_reach_the_client_byte_for_byte(gateway, upstream):
    """Chat chunks without usage pass through unparsed: the client's bytes are the
    upstream's (the model name swapped), the usage-only chunk it did not ask for dropped."""
    gw = gateway({"model_map": {"public-name": "m"}})
    whole = _events("m")
    upstream.script = lambda b: Reply(raw_stream=[whole])
    r = httpx.post(gw.url + "/v1/chat/completions", json={**CHAT, "model": "public-name"})
    up = [e for e in whole.split(b"\n\n") if e]
    got = [e for e in r.content.split(b"\n\n") if e]
    assert got == [e.replace(b'"model":"m"', b'"model":"public-name"') for e in up[:-2]] + [
        b"data: [DONE]"
    ]
    assert gw.records[-1].prompt_tokens == 40


class Counted:
    """An endless-enough stream of big chunks that counts how many the upstream wrote."""

    def __init__(self, n: int, size: int) -> None:
        self.n, self.taken = n, 0
        pad = "x" * size
        self.chunk = (
            b'data: {"model":"m","choices":[{"index":0,"delta":{"content":"%s"}}]}\n\n'
            % pad.encode()
        )

    def __iter__(self):
        for _ in range(self.n):
            self.taken += 1
            yield self.chunk
        yield b'data: {"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
        yield b"data: [DONE]\n\n"


def _settle(read, still: float = 0.5, limit: float = 60.0) -> int:
    """``read()`` once it has not changed for ``still`` seconds."""
    last, since, t0 = read(), time.monotonic(), time.monotonic()
    while time.monotonic() - t0 < limit:
        time.sleep(0.05)
        now = read()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= still:
            break
    return last


def test_a_client_that_stops_reading_stops_the_upstream(gateway, upstream):
    """Back-pressure across the splice: with the client not reading, the gateway stops
    reading the upstream once the buffers on the way are full (a few MiB of a 64 MiB
    answer), and relays the rest, whole, once the client reads again. The time the
    upstream is not read for the client's sake is not the upstream's idling: a short idle
    timeout does not cut the stream: the client is still for twice that timeout, and the
    timeout is long enough that a busy machine's upstream (a thread here) is never that
    slow between two chunks once the client reads again."""
    gw = gateway({"timeouts": {"idle": 1.0}})
    stream = Counted(1024, 64 * 1024)
    upstream.script = lambda b: Reply(raw_stream=stream)
    host, port = gw.url.removeprefix("http://").split(":")
    body = json.dumps(CHAT).encode()
    with socket.create_connection((host, int(port))) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        s.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n%b" % (len(body), body)
        )
        held = _settle(lambda: stream.taken, still=2.0)
        assert held < 256, f"the upstream wrote {held} of 1024 chunks to a client not reading"
        got = bytearray()
        while chunk := s.recv(1 << 20):
            got += chunk
    assert stream.taken == 1024
    assert got.count(b'"content":"xxxx') == 1024 and got.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")
    rec = gw.records[-1]
    assert rec.status == 200
