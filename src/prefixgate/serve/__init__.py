"""The network edge: the ASGI app (:mod:`.app`), the project's own HTTP/1.1 server
(:mod:`.httpserver`), and running it — binding, workers, the loop (:mod:`.process`)."""
