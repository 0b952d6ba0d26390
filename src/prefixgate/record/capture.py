"""The capture step: a request's segments, as received and as sent upstream, onto its
record. Hashes and sizes always (cheap, no content); redacted full texts only when the
channel or the key opts in, each distinct text sent to the store once."""

from __future__ import annotations

from collections import OrderedDict

from prefixgate.config import ChannelConfig
from prefixgate.record.model import Record
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
    def __init__(self) -> None:
        self._seen = _SeenHashes()

    def __call__(
        self, rec: Record, body_in: dict, body_out: dict, channel: ChannelConfig, principal
    ) -> None:
        texts: dict[str, str] | None = (
            {} if (channel.capture_text or getattr(principal, "capture_text", False)) else None
        )
        known = self._seen
        if rec.endpoint == "chat":
            rec.segments_in = segments_openai(body_in, texts=texts, known=known)
        else:
            rec.segments_in = segments_anthropic(body_in, texts=texts, known=known)
        tools_first = channel.render_order == "tools_first"
        if (
            rec.endpoint == "chat"
            and channel.kind == "openai"
            and tools_first
            and body_out.get("messages") is body_in.get("messages")
            and body_out.get("tools") is body_in.get("tools")
        ):
            # A chat request passed through: the very same messages and tools, in the same
            # order, so the same segments (computing them again would double the cost).
            rec.segments_out = list(rec.segments_in)
        elif channel.kind == "openai":
            rec.segments_out = segments_openai(
                body_out,
                tools_first=tools_first,
                texts=texts,
                known=known,
            )
        else:
            rec.segments_out = segments_anthropic(body_out, texts=texts, known=known)
        if texts:
            rec.texts = texts
            known.add_all(texts)
