"""The OpenAI Chat Completions API: passed through, so only its rules (``api.py``)."""
