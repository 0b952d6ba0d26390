"""uvicorn (``serve --http uvicorn``, and the simulated upstreams) with the same bounded
edge as the gateway's own server (``edge.py``).

uvicorn's httptools protocol, as of 0.54, has no bound on a request head: a header line
that never ends is buffered by the parser until memory runs out (its
``h11_max_incomplete_event_size`` applies to the h11 protocol only), and no deadline on a
request head or body still arriving (its keep-alive timer runs only between requests).
This subclass adds them: the bytes of a head are counted as they arrive (431 past
``max_head_bytes``), the edge sweep gives heads and bodies their deadlines, a request
without ``Host`` or with two gets 400, and connections past the cap get the refusal app.
"""

from __future__ import annotations

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from prefixgate.serve.edge import ANSWERING, BODY, HEAD, IDLE, Edge, host_error, plain


class EdgeHttpToolsProtocol(HttpToolsProtocol):
    edge_watch = None  # the edge sweep's notes

    def __init__(self, *args, edge: Edge, max_head_bytes: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.edge = edge
        self.max_head_bytes = max_head_bytes
        self.edge_requests = 0
        self.edge_received = 0
        self._in_head = False
        self._head_read = 0
        self._refusal: tuple[int, str] | None = None  # instead of uvicorn's own 400

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        verdict = self.edge.admit()
        if verdict == 1:
            self.app = self.edge.refusal
        elif verdict == 2:
            transport.close()

    def data_received(self, data: bytes) -> None:
        if self.transport.is_closing():
            return
        self.edge_received += len(data)
        super().data_received(data)
        if self._in_head and not self.transport.is_closing():
            self._head_read += len(data)
            if self._head_read > self.max_head_bytes:
                self._refusal = (431, "request headers are too large")
                self.send_400_response("")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.edge_requests += 1
        self._in_head = True
        self._head_read = 0

    def on_headers_complete(self) -> None:
        self._in_head = False
        hosts = 0
        for name, _ in self.headers:
            if name == b"host":
                hosts += 1
        problem = host_error(hosts, self.parser.get_http_version())
        if problem is not None:
            self._refusal = (400, problem)
            raise httptools.HttpParserCallbackError(problem)
        super().on_headers_complete()

    def send_400_response(self, msg: str) -> None:
        status, text = self._refusal or (400, msg)
        self._refusal = None
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            self.transport.write(plain(status, text))
        self.transport.close()

    # -- the edge sweep ------------------------------------------------------------------
    def edge_state(self) -> tuple[int, int, int]:
        n = self.edge_requests
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            if cycle.more_body and not cycle.response_started and not self.flow.read_paused:
                return BODY, n, self.edge_received
            return ANSWERING, n, 0
        if self.pipeline:
            return ANSWERING, n, 0
        if self._in_head:
            return HEAD, n, 0
        return IDLE, n, 0

    def edge_expire(self, status: int | None, text: str) -> None:
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if status is not None and (cycle is None or not cycle.response_started):
            self.transport.write(plain(status, text))
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # the app's receive() says so; its send() is dropped
            cycle.message_event.set()
        self.transport.close()
