"""The lab: what measures, reproduces and simulates the gateway's world, apart from the
gateway itself.

- :mod:`.bench`: ``prefixgate bench``, serving configurations side by side;
- :mod:`.simulate`: ``prefixgate simulate``, what-if replay through KV tiers;
- :mod:`.upstream_sim`: ``prefixgate upstream-sim``, an OpenAI-compatible server whose
  prefix cache is the cache model (also the embedded upstream of a config-less ``serve``);
- :mod:`.traffic`: synthetic agent traffic, seeded;
- :mod:`.incident` and :mod:`.demo`: ``prefixgate demo``, the incident reproduced and fixed;
- :mod:`.events`: the engines' side of the KV-event wire, for the simulated upstream.

Its own dependencies come with the ``lab`` extra (``pip install 'prefixgate[lab]'``). The
gateway never imports it, but for the CLI's command table and the embedded upstream of a
config-less ``serve`` (both lazily; ``tests/lab/test_apart.py`` keeps it so).
"""
