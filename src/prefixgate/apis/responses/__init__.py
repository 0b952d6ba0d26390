"""The OpenAI Responses API: its request to Chat (``request.py``), the answer and the
stream from Chat (``response.py``, ``stream.py``), compaction (``compaction.py``), its
segments as received (``segments.py``), its rules (``api.py``), its steps (``steps.py``)
and endpoints (``endpoint.py``)."""
