"""The Anthropic Messages API: its request to Chat (``request.py``), the answer and the
stream from Chat (``response.py``, ``stream.py``), its rules (``api.py``), its steps
(``steps.py``, ``count.py``) and endpoints (``endpoint.py``)."""
