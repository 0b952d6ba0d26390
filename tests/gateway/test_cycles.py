"""No request leaves reference cycles behind: with the cyclic collector's threshold as high
as the server sets it (serve/process.py), every cycle is garbage that waits for a
collection, and a collection pauses every open stream at once. Each kind of answer is
sent many times over keep-alive connections, and the collector must find (next to)
nothing afterwards."""

from __future__ import annotations

import collections
import gc
import http.client
import json

import pytest

from tests.fakes import Reply

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
KINDS = {
    "chat stream": ("/v1/chat/completions", {**CHAT, "stream": True}),
    "chat json": ("/v1/chat/completions", CHAT),
    "messages stream": ("/v1/messages", {**CHAT, "max_tokens": 5, "stream": True}),
    "messages json": ("/v1/messages", {**CHAT, "max_tokens": 5}),
    "responses stream": ("/v1/responses", {"model": "m", "input": "hi", "stream": True}),
}
N = 40


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_request_leaves_no_reference_cycles(gateway, upstream, kind):
    # No load shedding: what is counted here is garbage, and a busy machine made the loop
    # run late enough to refuse a request of the count (a 503 that says nothing of cycles).
    gw = gateway(server={"shed_loop_lag": None})
    upstream.script = lambda b: Reply(text="a b c d e f g h")
    path, body = KINDS[kind]
    host, port = gw.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    data = json.dumps(body).encode()

    def send() -> None:
        conn.request("POST", path, body=data, headers={"content-type": "application/json"})
        r = conn.getresponse()
        answer = r.read()
        assert r.status == 200, answer[:300]

    for _ in range(10):  # connections, pools and caches made once
        send()
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for _ in range(N):
            send()
        assert len(gw.records) == N + 10
        found = gc.collect()
        kinds = collections.Counter(type(o).__name__ for o in gc.garbage).most_common(8)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        conn.close()
    assert found < N // 10, f"{found} objects in cycles after {N} requests: {kinds}"
