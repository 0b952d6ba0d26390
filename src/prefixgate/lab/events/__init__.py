"""The engines' side of the KV-event wire, for the simulated upstream and the tests: a
publisher with the engines' sockets (:mod:`.publisher`), and a cache model's stores and
evictions as the events an engine sends (:mod:`.emitter`). The gateway's side, the
subscriber and the index, is :mod:`prefixgate.events`."""
