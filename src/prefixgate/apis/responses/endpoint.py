"""The OpenAI Responses API's endpoints, each one ordered tuple of steps: the shared steps
(``pipeline.inference``) around this API's own (``steps.py``). ``docs/architecture.md``
lists them as :func:`prefixgate.pipeline.describe` prints them (a test keeps the two
equal)."""

from __future__ import annotations

from prefixgate.apis.messages.request import plain
from prefixgate.apis.responses.steps import (
    convert_responses,
    decode_compact,
    decode_responses,
    relay_compact,
    relay_responses,
    upstream_chat_of_responses,
)
from prefixgate.pipeline import Endpoint, Exchange, inference
from prefixgate.protocol import openai as openai_proto

STEPS = inference(decode_responses, (convert_responses,), relay_responses)

# A compaction (``POST /v1/responses/compact``): the conversation summarised by the engine.
COMPACT_STEPS = inference(decode_compact, (convert_responses,), relay_compact, diagnosed=False)


def _prompt(x: Exchange, ch) -> dict:
    # the conversation as Chat, also for a passthrough channel: the same prompt either way
    return plain(upstream_chat_of_responses(x, ch))


ENDPOINT = Endpoint(
    name="responses",
    error_bytes=openai_proto.error_bytes,
    request_id_header="x-request-id",  # OpenAI's name
    kinds=("openai",),
    prompt=_prompt,
    steps=STEPS,
)

COMPACT = Endpoint(
    name="responses",  # recorded, captured and compared as a Responses request
    error_bytes=openai_proto.error_bytes,
    request_id_header="x-request-id",
    kinds=("openai",),
    prompt=_prompt,
    steps=COMPACT_STEPS,
)
