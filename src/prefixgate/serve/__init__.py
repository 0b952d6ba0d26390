"""The network edge: the ASGI app (:mod:`.app`), the project's own HTTP/1.1 server
(:mod:`.httpserver`), the bounds of both servers (:mod:`.edge`, :mod:`.uvicorn_edge`),
running it — binding, workers, the loop (:mod:`.process`) — and what it tells the
operator (:mod:`.startup_report`)."""
