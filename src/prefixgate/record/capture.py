"""The capture step: a request's segments, as received and as sent upstream, onto its
record. Hashes and sizes always (cheap, no content); redacted full texts only when the
channel or the key opts in, each distinct text sent to the store once."""

from __future__ import annotations

from collections import OrderedDict

import msgspec

from prefixgate.apis import API_OF, MESSAGES
from prefixgate.apis.messages.request import plain
from prefixgate.apis.responses.segments import segments_responses
from prefixgate.config import ChannelConfig
from prefixgate.engine.order import RenderOrders
from prefixgate.protocol.messages_body import MessagesBody
from prefixgate.protocol.openai import materialize
from prefixgate.protocol.responses import ResponsesBody
from prefixgate.record.changes import DEFAULT_BUDGET, ChangeTracker
from prefixgate.record.compacted import summary_request
from prefixgate.record.cut import cut_from_bytes, cut_of_chat
from prefixgate.record.record import Record
from prefixgate.record.rendered import rendered_segments
from prefixgate.record.segments import segments_anthropic, segments_openai


class _SeenHashes:
    """A bounded set of text hashes already handed to the store."""

    def __init__(self, limit: int = 200_000) -> None:
        self._d: OrderedDict[str, None] = OrderedDict()
        self._limit = limit

    def __contains__(self, h: object) -> bool:
        return h in self._d

    def add_all(self, hashes) -> None:
        for h in hashes:
            self._d[h] = None
        while len(self._d) > self._limit:
            self._d.popitem(last=False)


class Capturer:
    """The capture step's state: text hashes already stored, and the sessions' latest
    requests (:class:`~prefixgate.record.changes.ChangeTracker`, ``change_budget``
    bytes) that each request is compared with."""

    def __init__(self, change_budget: int = DEFAULT_BUDGET) -> None:
        self._seen = _SeenHashes()
        self.changes = ChangeTracker(change_budget)

    def __call__(
        self,
        rec: Record,
        body_in: dict,
        body_out: dict,
        channel: ChannelConfig,
        principal,
        raw_in: bytes | None = None,
        raw_out: bytes | None = None,
        *,
        orders: RenderOrders,
    ) -> None:
        """``orders``: the gateway's, how the channel's template renders (the segments'
        order). ``raw_in`` / ``raw_out``: the JSON bytes of the request as received and as
        sent, when at hand: the segments are then computed from them (pieces seen before
        are looked up, not hashed again). A chat body may hold raw fields (``msgspec.Raw``);
        they are decoded when the object way is taken."""
        texts: dict[str, str] | None = (
            {} if (channel.capture_text or getattr(principal, "capture_text", False)) else None
        )
        known = self._seen
        api = API_OF.get(rec.endpoint, MESSAGES)
        rendering = orders.rendering_of(channel)
        tools_first = rendering.tools == "tools_first"
        objects: list[dict] | None = None

        def decoded() -> list[dict]:
            nonlocal objects
            if objects is None:
                if isinstance(body_in, MessagesBody | ResponsesBody):  # typed, raw texts
                    objects = [body_in.plain(), plain(body_out)]
                else:
                    objects = materialize(body_in, body_out)
            return objects

        tracking = rec.session_id is not None and self.changes.budget > 0
        segs = pieces_in = pieces_out = lent = None
        prev = (
            self.changes.latest(channel.name, body_out.get("model"), rec.session_id)
            if tracking
            else None
        )
        go_on = prev is not None and self.changes.go_on
        if texts is None and raw_in is not None:
            # one cut gives the segments and their bytes (for the change memory); the
            # session's previous request lends what it sent the same way
            cut = api.cut(
                raw_in, body_in, None if prev is None else prev.into if go_on else list(prev.into)
            )
            if cut is not None:
                segs, pieces_in = cut
        if segs is None:
            segs = api.segments(decoded()[0], texts=texts, known=known)
        rec.segments_in = segs
        if api.passed_through(channel, body_in, body_out, tools_first):
            # A request passed through: the same segments (computing them again would
            # double the cost).
            rec.segments_out = rendered_segments(
                list(rec.segments_in), rendering, body_out.get("messages"), texts=texts, known=known
            )
            passthrough = True
        else:
            passthrough = False
            api_out = api.sent(channel)
            first = tools_first if api_out != "anthropic" else False
            segs = None
            if api_out == "responses":
                segs = list(rec.segments_in) if texts is None else None  # sent as it came
            elif (
                texts is None
                and isinstance(body_in, MessagesBody | ResponsesBody)
                and api_out == "openai"
            ):
                # built here from the typed request: its pieces are encoded alone, and what
                # the conversion lent from the previous turn lends its pieces too
                previous = None if prev is None else prev.lent
                if previous is not None and not go_on:
                    previous = previous._replace(segs=None)
                segs, pieces_out, lent = cut_of_chat(body_out, tools_first=first, previous=previous)
            elif texts is None and raw_out is not None:
                cut = cut_from_bytes(raw_out, api_out, tools_first=first)
                if cut is not None:
                    segs, pieces_out = cut
            if segs is None:
                if api_out == "responses":
                    segs = segments_responses(decoded()[1], texts=texts, known=known)
                elif api_out == "openai":
                    segs = segments_openai(
                        decoded()[1], tools_first=first, texts=texts, known=known
                    )
                else:
                    segs = segments_anthropic(decoded()[1], texts=texts, known=known)
            if api_out == "openai":  # in the order the engine's template renders them
                segs = rendered_segments(
                    segs, rendering, body_out.get("messages"), texts=texts, known=known
                )
            rec.segments_out = segs
        if texts:
            rec.texts = texts
            known.add_all(texts)
        if tracking:
            self.changes.observe(
                rec,
                channel.name,
                body_out.get("model"),
                raw_in if raw_in is not None else _raw(body_in),
                None if passthrough else (raw_out if raw_out is not None else _raw(body_out)),
                by_bytes=channel.kind == "openai",
                pieces_in=pieces_in,
                pieces_out=None if passthrough else pieces_out,
                lent=lent,
                summary=summary_request(_client_metadata(body_in)),
            )


def _raw(body) -> bytes:
    """A request's JSON bytes when the caller did not hand them over."""
    if isinstance(body, MessagesBody):
        return bytes(body.raw)
    return msgspec.json.encode(body)


def _client_metadata(body_in) -> object:
    """A Responses request's ``client_metadata`` (None on the other protocols)."""
    if isinstance(body_in, ResponsesBody):
        return body_in.typed.client_metadata
    return body_in.get("client_metadata") if isinstance(body_in, dict) else None
