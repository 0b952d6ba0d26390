"""The OpenAI Chat Completions API: passed through, so only its rules (``api.py``), its
steps (``steps.py``) and its endpoint (``endpoint.py``)."""
