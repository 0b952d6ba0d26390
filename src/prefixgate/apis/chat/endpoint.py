"""The OpenAI Chat Completions API's endpoint: one ordered tuple of steps, the shared steps
(``pipeline.inference``) around this API's own (``steps.py``). ``docs/architecture.md``
lists it as :func:`prefixgate.pipeline.describe` prints it (a test keeps the two equal)."""

from __future__ import annotations

from prefixgate import hygiene
from prefixgate.apis.chat.steps import convert_chat, decode_chat, relay_chat
from prefixgate.pipeline import Endpoint, Exchange, inference
from prefixgate.protocol import openai as openai_proto

STEPS = inference(decode_chat, (convert_chat,), relay_chat)


def _prompt(x: Exchange, ch) -> dict:
    body = openai_proto.materialize(x.body)[0]
    moved = hygiene.apply_chat(body["messages"], ch, x.gateway.render_orders)  # as sent
    return body if moved is None else {**body, "messages": moved}


ENDPOINT = Endpoint(
    name="chat",
    error_bytes=openai_proto.error_bytes,
    request_id_header="x-request-id",  # OpenAI's name
    kinds=("openai",),
    prompt=_prompt,
    steps=STEPS,
)
