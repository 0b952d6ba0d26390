"""Start vLLM's OpenAI-compatible server WITHOUT its Claude Code billing-header strip.

vLLM 0.32 drops a leading ``x-anthropic-billing-header`` line from system messages by
itself (``vllm.renderers.chat_utils._strip_claude_code_billing_header``). Older vLLM,
SGLang and llama.cpp do not, and that is the upstream on which the header breaks the prefix
cache. This launcher turns the strip into a pass-through in the API server process (where
chat templates are rendered), then runs the usual entry point with the same arguments.

Run with the vLLM environment's interpreter: ``python vllm_without_header_strip.py ARGS``.
"""

from vllm.entrypoints.launchers.api_server.entry import main
from vllm.renderers import chat_utils


def _keep(parts):
    return list(parts)


if __name__ == "__main__":
    chat_utils._strip_claude_code_billing_header = _keep
    main()
