"""The steps of ``POST /v1/chat/completions`` that are the OpenAI Chat API's own (their
order is in ``endpoint.py``): decode, convert (the model mapped and the channel's Chat
hygiene: the request otherwise goes as it came), relay (the chunks passed through, decoded
only where they carry usage or an error).
"""

from __future__ import annotations

import msgspec
from starlette.responses import Response

from prefixgate import hygiene as hygiene_steps
from prefixgate.convert.template import KEYS, Template, cut
from prefixgate.diagnostics.request import chat_ask
from prefixgate.diagnostics.verdict import EXTENSION
from prefixgate.engine.channel import bearer, secret_of, stream_error
from prefixgate.errors import GatewayError, UpstreamError
from prefixgate.identify import session_of_chat
from prefixgate.pipeline.diagnose import extension_tail, look_up
from prefixgate.pipeline.exchange import Exchange
from prefixgate.pipeline.relays import Answer, Lane, Relay, Stream, json_object, settle_once
from prefixgate.pipeline.steps import set_decoded
from prefixgate.protocol import openai as openai_proto
from prefixgate.sse import single
from prefixgate.usage import Usage

_decode = msgspec.json.decode
_encode = msgspec.json.encode
_DONE_EVENT = b"data: [DONE]\n\n"
_LOOKED_FOR = frozenset(("usage", "error", "model"))  # each a 7-byte JSON string
_QUOTE = 34  # ord('"')


async def decode_chat(x: Exchange) -> None:
    """An OpenAI chat request: decoded but for ``messages`` and ``tools``, then checked."""
    limits = x.live.config.limits
    body = openai_proto.decode_chat_body(x.raw, limits)
    openai_proto.check_chat_request(body, limits)
    set_decoded(x, body, session_of_chat)
    x.ask = chat_ask(x.request.headers)
    look_up(x)


async def convert_chat(x: Exchange) -> None:
    """OpenAI in: passed through with the model mapped and the channel's Chat hygiene; a
    stream always asks for usage (hidden again from a client that did not ask for it)."""
    ch, body = x.channel, x.body
    out = {**body, "model": ch.upstream_model(body["model"])}
    moved = hygiene_steps.apply_chat(body["messages"], ch, x.gateway.render_orders)
    if moved is not None:  # later system messages delivered in the turns (docs/rendering.md)
        out["messages"] = moved
    if x.record.stream:
        out["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    x.out = out
    x.url, x.headers = x.target.base_url + "/chat/completions", bearer(ch)
    x.data = _encode(out)


async def relay_chat(x: Exchange) -> Response | Stream:
    """OpenAI out: the chat answer passed through, the public model name restored."""
    if x.record.stream:
        return chat_stream(x)
    await settle_once(x)
    return chat_once(x)


def chat_once(x: Exchange) -> Response:
    obj, rec = x.first, x.record
    err = stream_error(obj, secret_of(x.channel))
    if err is not None:
        return x.fail(err)
    if "model" in obj:
        obj["model"] = x.body["model"]
    usage = Usage.from_openai(obj.get("usage"))
    if x.verdict is not None:
        obj[EXTENSION] = extension_tail(x, usage)
    rec.status = 200
    return Answer(_encode(obj), x, usage)


def chat_stream(x: Exchange) -> Stream:
    return Stream(ChatRelay(x))


class ChatRelay(Relay):
    """OpenAI chat chunks passed through. An event that holds no ``"usage"`` or
    ``"error"`` key and names the upstream's model as the upstream writes it (compact
    JSON) goes out as it came, the model's name swapped in its bytes; only the others
    are decoded: the usage kept for the record (and its chunk dropped when the client did
    not ask for it), an error raised, an unusual model field rewritten. A read that is a
    chunk seen before with another piece of text (``convert/template.py``) is not even
    searched: its ends, as the client gets them, are known (``templates``: each with the
    ends as sent)."""

    __slots__ = (
        "head",
        "tail",
        "sent",
        "templates",
        "public",
        "want_usage",
        "_usage",
        "theirs",
        "ours",
        "kinds",
        "learning",
    )

    def __init__(self, x: Exchange) -> None:
        super().__init__(x)
        self.public = public = x.body["model"]
        self.want_usage = bool((x.body.get("stream_options") or {}).get("include_usage"))
        self._usage = Usage()
        theirs, ours = b'"model":' + _encode(x.out["model"]), b'"model":' + _encode(public)
        self.theirs, self.ours = theirs, ours
        # Each template's ends (Template.ends) and the ends as sent; the kinds learned.
        self.templates: tuple[tuple[bytes, int, bytes, int, tuple[bytes, bytes] | None], ...] = ()
        # The template a read matched last, in this object: the one a read is tried with
        # first (b"" while none is learned).
        self.head = self.tail = b""
        self.sent: tuple[bytes, bytes] | None = None
        self.kinds: tuple[str, ...] = ()
        self.learning = 3  # plain one-event reads that may yet be cut into a template

    @property
    def usage(self) -> Usage:
        return self._usage

    def lane(self) -> Lane | None:
        if not self.quiet or self.timing or self.done or not self.head:
            return None
        sent = self.sent
        if sent is None:  # the read as it came
            return Lane(self.head, self.tail, 2, _LOOKED_FOR, None, b"", False)
        return Lane(self.head, self.tail, 2, _LOOKED_FOR, sent[0], sent[1], False)

    def feed(self, chunk: bytes) -> bytes:
        if self.quiet:
            # Template.piece inline (most reads of a stream come this way): the last
            # template matched first, then the others.
            head, tail = self.head, self.tail
            if head and chunk.startswith(head) and chunk.endswith(tail):
                tok = chunk[len(head) : -len(tail)]
                if len(tok) >= 2 and tok[0] == _QUOTE and tok[-1] == _QUOTE:
                    try:
                        piece = _decode(tok)
                    except msgspec.DecodeError:
                        piece = None
                    # (a piece that is one of the keys looked for would be found by a search)
                    if piece is not None and (len(tok) != 7 or piece not in _LOOKED_FOR):
                        if self.timing:
                            self._first_byte()
                        sent = self.sent
                        return chunk if sent is None else b"".join((sent[0], tok, sent[1]))
            for head, h, tail, t, sent in self.templates:
                if chunk[:h] == head and chunk[t:] == tail and head is not self.head:
                    tok = chunk[h:t]
                    if len(tok) < 2 or tok[0] != _QUOTE or tok[-1] != _QUOTE:
                        continue
                    try:
                        piece = _decode(tok)
                    except msgspec.DecodeError:
                        continue
                    # (a piece that is one of the keys looked for would be found by a search)
                    if len(tok) != 7 or piece not in _LOOKED_FOR:
                        if self.timing:
                            self._first_byte()
                        self.head, self.tail, self.sent = head, tail, sent
                        return chunk if sent is None else b"".join((sent[0], tok, sent[1]))
            if single(chunk) and chunk != _DONE_EVENT:
                # One event in this read: out as it came, not even re-framed (the framing
                # holds none of the keys looked for).
                plain = self._plain(chunk)
                if plain is not None:
                    self._first_byte()
                    if self.learning > 0:
                        self._learn(chunk)
                    return plain
        self.quiet = False
        held = self.held
        for _, data in self.dec.feed(chunk):
            if data == b"[DONE]":
                self.done = True
                break
            out = self._plain(data)
            if out is not None:
                self._first_byte()
            else:
                out = self._decoded(data)
                if out is None:
                    continue
            held += (b"data: ", out, b"\n\n")
        out = self._take()
        self.quiet = not self.dec.buf
        return out

    def _learn(self, chunk: bytes) -> None:
        """A plain one-event read cut into a template, if it is one piece's chunk: its
        ends as sent are the read's with the model's name swapped (the name cannot reach
        into the piece: it begins with ``"model":`` and the cut with ``"<key>":``)."""
        self.learning -= 1
        data, theirs, ours = chunk[6:-2], self.theirs, self.ours
        for kind, keys in KEYS.items():
            if kind in self.kinds:
                continue
            for key in keys:
                ends = cut(data, key)
                if ends is not None:
                    t = Template(*ends, kind, key)
                    # The ends as sent (None: as they came).
                    sent = None
                    if theirs != ours:
                        sent = (t.head.replace(theirs, ours), t.tail.replace(theirs, ours))
                    self.templates = (*self.templates, (*t.ends, sent))
                    self.kinds = (*self.kinds, kind)
                    return

    def _plain(self, data: bytes) -> bytes | None:
        """``data`` as the client gets it when it need not be decoded (no usage, no error,
        the model named as the upstream writes it, or not at all), else None."""
        if data.find(b'"usage"') >= 0 or data.find(b'"error"') >= 0:
            return None
        if data.find(self.theirs) >= 0:
            return data if self.theirs == self.ours else data.replace(self.theirs, self.ours)
        return data if data.find(b'"model"') < 0 else None

    def _decoded(self, data: bytes) -> bytes | None:
        obj = json_object(data)
        err = stream_error(obj, self.secret)
        if err is not None:
            raise err
        if "usage" in obj:
            if isinstance(obj["usage"], dict):
                self._usage = Usage.from_openai(obj["usage"])
            if not self.want_usage:
                if not obj.get("choices"):
                    return None  # the usage-only chunk the client did not ask for
                del obj["usage"]
        if obj.get("model") not in (None, self.public):
            obj["model"] = self.public
        if obj.get("choices"):
            self._first_byte()
        return _encode(obj)

    def end(self) -> bytes:
        if not self.done:
            raise UpstreamError("upstream stream ended before it finished")
        x = self.x
        if x.verdict is not None:  # the client asked (x-prefixgate-diagnostics): one more chunk
            chunk = {
                "id": "chatcmpl-" + self.rec.request_id,
                "object": "chat.completion.chunk",
                "created": int(self.rec.received_at),
                "model": self.public,
                "choices": [],
                EXTENSION: extension_tail(x, self._usage),
            }
            self.held += (b"data: ", _encode(chunk), b"\n\n")
        self.rec.status = 200
        x.finish(self._usage)
        return self._take() + b"data: [DONE]\n\n"

    def error_bytes(self, err: GatewayError) -> bytes:
        return openai_proto.error_chunk(err)
