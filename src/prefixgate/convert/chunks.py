"""The walk over an OpenAI Chat Completions stream chunk that every stream converter shares.

:class:`ChunkWalk.feed` reads one decoded chunk the same way for every target protocol:
its ``usage`` (kept, in OpenAI's semantics), then each choice's delta in order: the
reasoning text (``reasoning_content``, else ``reasoning``), the content text, each tool-call
fragment, and the ``finish_reason`` (with vLLM's ``stop_reason``, the stop string or token
that matched). A converter says what each piece becomes in its protocol's events through
two hooks, :meth:`~ChunkWalk._piece` and :meth:`~ChunkWalk._tool_delta`; what is not of
the expected type (a choice that is not an object, a text that is not a string, a tool
call that is not an object) is skipped.

The walk runs once per chunk of every converted stream: it allocates nothing beyond the
list the converter's events are gathered in. Most chunks need not even be decoded: once a
chunk that was one piece of text and nothing else has been walked, :meth:`ChunkWalk.learn`
keeps its bytes around the piece (``template.py``), and a relay that finds a read is that
chunk with another piece has its events from :meth:`ChunkWalk.one`, from its bytes.
"""

from __future__ import annotations

import msgspec

from prefixgate.convert.template import Template, cut
from prefixgate.usage import Usage

__all__ = ["ChunkWalk", "fold_tool_delta", "sole_piece"]

_decode = msgspec.json.decode
_PROBE = "#"

_NO_DELTA: dict = {}  # a choice without a delta (never written to)


def fold_tool_delta(calls: dict, delta: dict, make) -> tuple:
    """One chat ``tool_calls`` delta folded into its pending call (``make()`` when its
    index is new; the call has ``id`` and ``name``, each kept from the first delta that
    gives it): ``(call, index, arguments fragment)``."""
    idx = delta.get("index", 0)
    if not isinstance(idx, int):
        idx = 0
    call = calls.get(idx)
    if call is None:
        call = calls[idx] = make()
    fn = delta.get("function") or {}
    if delta.get("id") and call.id is None:
        call.id = delta["id"]
    if fn.get("name") and call.name is None:
        call.name = fn["name"]
    return call, idx, fn.get("arguments") or ""


def matched_stop(choice: dict) -> object:
    """The stop string or token a choice ended at: vLLM's ``stop_reason``, SGLang's
    ``matched_stop`` (None when neither says)."""
    got = choice.get("stop_reason")
    return choice.get("matched_stop") if got is None else got


def sole_piece(chunk: dict) -> tuple[str, str] | None:
    """(kind, delta key) of the one piece of text a chunk is, when it is nothing else (no
    usage, one choice, no tool call, no finish): what :meth:`ChunkWalk.feed` reads of it
    is that piece alone."""
    if isinstance(chunk.get("usage"), dict):
        return None
    choices = chunk.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        return None
    choice = choices[0]
    delta = choice.get("delta")
    if choice.get("finish_reason") or not isinstance(delta, dict) or delta.get("tool_calls"):
        return None
    first, text = delta.get("reasoning_content"), delta.get("content")
    reasoning = first or delta.get("reasoning")
    if reasoning:
        if text or not isinstance(reasoning, str):
            return None
        return "reasoning", "reasoning_content" if first else "reasoning"
    return ("text", "content") if text and isinstance(text, str) else None


class ChunkWalk:
    """Base of the stream converters: :meth:`feed` and what it keeps (``usage``,
    ``finish_reason``, ``matched_stop``); a subclass defines the hooks. ``templates``:
    the chunks learned (one per kind of piece); ``learning``: how many more one-piece
    chunks that matched none may be tried."""

    # Slots (each subclass's too): a relay at a thousand streams touches its converter on
    # every read, and each object it touches has left the CPU's caches since.
    __slots__ = ("templates", "learning", "usage", "finish_reason", "matched_stop")

    def __init__(self) -> None:
        self.templates: tuple[Template, ...] = ()
        self.learning = 3
        self.usage = Usage()
        self.finish_reason: str | None = None
        self.matched_stop: object = None

    def one(self, kind: str, piece: str) -> bytes:
        """The events of a chunk that is one non-empty piece of ``kind`` and nothing else
        (what :meth:`feed` makes of it; a converter may make them more directly): how a
        relay converts a read that matched a learned template (``apis/chat/steps.py``, ``pipeline/relays.py``)."""
        out: list[bytes] = []
        self._piece(out, kind, piece)
        return b"".join(out)

    def lane(self, kind: str) -> tuple[bytes, bytes] | None:
        """What :meth:`one` of a piece of ``kind`` makes around the piece's JSON string,
        as it stands, when making it changes nothing here (None: it is not so)."""
        return None

    def learn(self, data: bytes, chunk: dict) -> None:
        """After :meth:`feed` of ``chunk`` (``data``, its JSON): when it was one piece of
        a kind not learned yet, its template. The cut is checked: the same bytes with
        another string in its place decode to that string as the same piece."""
        sole = sole_piece(chunk)
        if sole is None:
            return
        self.learning -= 1
        if any(t.kind == sole[0] for t in self.templates):
            return
        key = b'"%b":' % sole[1].encode()
        ends = cut(data, key)
        if ends is None:
            return
        head, tail = ends
        try:
            probe = _decode(b'%b"%b"%b' % (head[6:], _PROBE.encode(), tail[:-2]))
        except msgspec.DecodeError:
            return
        if not isinstance(probe, dict) or sole_piece(probe) != sole:
            return
        if probe["choices"][0]["delta"][sole[1]] != _PROBE:
            return
        self.templates = (*self.templates, Template(head, tail, sole[0], key))

    def feed(self, chunk: dict) -> bytes:
        """The events one chunk becomes (``b""`` when none)."""
        out: list[bytes] = []
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage = Usage.from_openai(usage)
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta") or _NO_DELTA
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if reasoning and isinstance(reasoning, str):
                self._piece(out, "reasoning", reasoning)
            text = delta.get("content")
            if text and isinstance(text, str):
                self._piece(out, "text", text)
            for call in delta.get("tool_calls") or ():
                if isinstance(call, dict):
                    self._tool_delta(out, call)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
                self.matched_stop = matched_stop(choice)
        return b"".join(out)

    def _piece(self, out: list[bytes], kind: str, piece: str) -> None:
        """A non-empty piece of ``kind`` ``"reasoning"`` or ``"text"``: its events onto
        ``out``."""
        raise NotImplementedError

    def _tool_delta(self, out: list[bytes], delta: dict) -> None:
        """One ``tool_calls`` fragment (an object): its events onto ``out``."""
        raise NotImplementedError
