"""Anthropic ⇄ OpenAI conversion of requests, responses and SSE streams. No I/O here."""
