"""The request path, in one place: each inference endpoint is one ordered tuple of steps.

An :class:`~.exchange.Exchange` (and with it the request's record) is opened when the
request arrives; the steps below run in this order on it; the relay's answer goes out;
then :meth:`~.exchange.Exchange.finish` closes the record, once, by the steps of
:data:`FINISH_STEPS` (the way out, :mod:`.finish`). Any step may refuse the
request by raising an error, answered in the client's protocol. ``docs/architecture.md``
lists these tuples, both ways, as :func:`describe` prints them (a test keeps the two equal).

The steps live in :mod:`.steps` and :mod:`.relays`; the hygiene steps are
:data:`prefixgate.hygiene.STEPS`.
"""

from __future__ import annotations

from prefixgate import hygiene as _hygiene
from prefixgate.apis.messages.request import plain
from prefixgate.pipeline.count import count_tokens, decode_count_tokens
from prefixgate.pipeline.diagnose import diagnose
from prefixgate.pipeline.exchange import Endpoint, Exchange, error_response, handler, run
from prefixgate.pipeline.finish import FINISH_STEPS, close
from prefixgate.pipeline.relays import relay_chat, relay_messages
from prefixgate.pipeline.responses import (
    convert_responses,
    decode_compact,
    decode_responses,
    relay_compact,
    relay_responses,
    upstream_chat_of_responses,
)
from prefixgate.pipeline.steps import (
    Failover,
    admit,
    authenticate,
    budget,
    capture,
    convert_chat,
    convert_messages,
    decode_chat,
    decode_messages,
    hygiene,
    plan,
    queue,
    read,
    send,
    upstream_chat_request,
)
from prefixgate.protocol import anthropic as anthropic_proto
from prefixgate.protocol import openai as openai_proto

MESSAGES_STEPS = (
    authenticate,
    read,
    decode_messages,
    admit,
    queue,
    budget,
    plan,
    Failover(hygiene, convert_messages, capture, send, diagnose),
    relay_messages,
)

CHAT_STEPS = (
    authenticate,
    read,
    decode_chat,
    admit,
    queue,
    budget,
    plan,
    Failover(convert_chat, capture, send, diagnose),
    relay_chat,
)

RESPONSES_STEPS = (
    authenticate,
    read,
    decode_responses,
    admit,
    queue,
    budget,
    plan,
    Failover(convert_responses, capture, send, diagnose),
    relay_responses,
)

# A compaction (``POST /v1/responses/compact``): the conversation summarised by the engine.
COMPACT_STEPS = (
    authenticate,
    read,
    decode_compact,
    admit,
    queue,
    budget,
    plan,
    Failover(convert_responses, capture, send),
    relay_compact,
)

COUNT_TOKENS_STEPS = (
    authenticate,
    read,
    decode_count_tokens,
    admit,
    queue,
    budget,
    count_tokens,
)


def _messages_prompt(x: Exchange, ch) -> dict:
    return plain(upstream_chat_request(x, ch))


def _chat_prompt(x: Exchange, ch) -> dict:
    body = openai_proto.materialize(x.body)[0]
    moved = _hygiene.apply_chat(body["messages"], ch, x.gateway.render_orders)  # as sent
    return body if moved is None else {**body, "messages": moved}


def _responses_prompt(x: Exchange, ch) -> dict:
    # the conversation as Chat, also for a passthrough channel: the same prompt either way
    return plain(upstream_chat_of_responses(x, ch))


MESSAGES = Endpoint(
    name="messages",
    error_bytes=anthropic_proto.error_bytes,
    request_id_header="request-id",  # Anthropic's name
    kinds=("openai", "anthropic"),
    prompt=_messages_prompt,
    steps=MESSAGES_STEPS,
    overloaded_status=529,  # Anthropic's overloaded_error
)

CHAT = Endpoint(
    name="chat",
    error_bytes=openai_proto.error_bytes,
    request_id_header="x-request-id",  # OpenAI's name
    kinds=("openai",),
    prompt=_chat_prompt,
    steps=CHAT_STEPS,
)

COUNT_TOKENS = Endpoint(
    name="count_tokens",
    error_bytes=anthropic_proto.error_bytes,
    request_id_header="request-id",  # Anthropic's name
    kinds=("openai", "anthropic"),
    prompt=_messages_prompt,
    steps=COUNT_TOKENS_STEPS,
    overloaded_status=529,
)

RESPONSES = Endpoint(
    name="responses",
    error_bytes=openai_proto.error_bytes,
    request_id_header="x-request-id",  # OpenAI's name
    kinds=("openai",),
    prompt=_responses_prompt,
    steps=RESPONSES_STEPS,
)

COMPACT = Endpoint(
    name="responses",  # recorded, captured and compared as a Responses request
    error_bytes=openai_proto.error_bytes,
    request_id_header="x-request-id",
    kinds=("openai",),
    prompt=_responses_prompt,
    steps=COMPACT_STEPS,
)


def describe(steps: tuple) -> str:
    """The steps as one line: ``authenticate → read → … → relay_messages → finish``; a
    failover loop's own steps in brackets, hygiene with its transforms. The way out,
    :data:`FINISH_STEPS`, as ``close → charge → … → ledger``."""
    if steps is FINISH_STEPS:
        return " → ".join(step.__name__ for step in (close, *steps))
    names = []
    for step in steps:
        if isinstance(step, Failover):
            names.append("failover[" + describe(step.steps).removesuffix(" → finish") + "]")
        elif step is hygiene:
            names.append("hygiene(" + ", ".join(s.name for s in _hygiene.STEPS) + ")")
        else:
            names.append(step.__name__)
    return " → ".join([*names, "finish"])


__all__ = [
    "CHAT",
    "COMPACT",
    "COUNT_TOKENS",
    "FINISH_STEPS",
    "MESSAGES",
    "RESPONSES",
    "Endpoint",
    "Exchange",
    "describe",
    "error_response",
    "handler",
    "run",
]
