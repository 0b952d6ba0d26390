"""The Anthropic Messages API's endpoints, each one ordered tuple of steps: the shared
steps (``pipeline.inference``) around this API's own (``steps.py``, ``count.py``).
``docs/architecture.md`` lists the tuples as :func:`prefixgate.pipeline.describe` prints
them (a test keeps the two equal); ``serve/app.py``'s ``INFERENCE`` routes to them."""

from __future__ import annotations

from prefixgate.apis.messages.count import count_tokens, decode_count_tokens
from prefixgate.apis.messages.request import plain
from prefixgate.apis.messages.steps import (
    convert_messages,
    decode_messages,
    hygiene,
    relay_messages,
    upstream_chat_request,
)
from prefixgate.pipeline import Endpoint, Exchange, answered_here, inference
from prefixgate.protocol import anthropic as anthropic_proto

STEPS = inference(decode_messages, (hygiene, convert_messages), relay_messages)

COUNT_TOKENS_STEPS = answered_here(decode_count_tokens, count_tokens)


def _prompt(x: Exchange, ch) -> dict:
    return plain(upstream_chat_request(x, ch))


ENDPOINT = Endpoint(
    name="messages",
    error_bytes=anthropic_proto.error_bytes,
    request_id_header="request-id",  # Anthropic's name
    kinds=("openai", "anthropic"),
    prompt=_prompt,
    steps=STEPS,
    overloaded_status=529,  # Anthropic's overloaded_error
)

COUNT_TOKENS = Endpoint(
    name="count_tokens",
    error_bytes=anthropic_proto.error_bytes,
    request_id_header="request-id",
    kinds=("openai", "anthropic"),
    prompt=_prompt,
    steps=COUNT_TOKENS_STEPS,
    overloaded_status=529,
)
