"""OpenAI Chat Completions SSE chunks → Anthropic Messages SSE events.

A state machine: at most one content block is open at a time; a change of kind (thinking,
text, a tool call) closes the open block and opens the next, so reasoning, text and tool
calls may interleave in any order and the client still reads the exact Anthropic sequence:

    message_start, ping, (content_block_start, content_block_delta*, content_block_stop)*,
    message_delta (stop_reason, usage), message_stop

``message_start`` carries zero usage; the real figures (Anthropic semantics) go in
``message_delta``. Feeding is pure (no I/O): each call returns the bytes to send. The
chunk is read by :class:`~.chunks.ChunkWalk` (the walk the Responses stream shares); this
module says what each piece becomes.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable

import msgspec

from prefixgate.apis.messages.response import new_message_id, stop_reason
from prefixgate.convert.chunks import ChunkWalk, fold_tool_delta
from prefixgate.errors import GatewayError
from prefixgate.protocol.anthropic import error_event
from prefixgate.usage import Usage, message_start_usage

log = logging.getLogger(__name__)
_encode = msgspec.json.encode


_HEADS: dict[str, bytes] = {}  # "event: NAME\ndata: " of each event name, built once


def sse(event: str, data: dict) -> bytes:
    head = _HEADS.get(event)
    if head is None:
        head = _HEADS[event] = b"event: " + event.encode() + b"\ndata: "
    return b"".join((head, _encode(data), b"\n\n"))


# A text or thinking delta, the bulk of a stream, written around its one encoded string:
# the same bytes as ``sse("content_block_delta", {...})`` of the whole event.
_DELTA_HEAD = b'event: content_block_delta\ndata: {"type":"content_block_delta","index":'
_DELTA_KINDS = {  # by the open block's kind
    "text": b',"delta":{"type":"text_delta","text":',
    "reasoning": b',"delta":{"type":"thinking_delta","thinking":',
    "tool": b',"delta":{"type":"input_json_delta","partial_json":',
}
_DELTA_TAIL = b"}}\n\n"
_DELTA_HEADS: dict[tuple[int, str], bytes] = {}  # (index, kind) → the bytes before a delta


def _delta_head(index: int, kind: str) -> bytes:
    head = _DELTA_HEADS.get((index, kind))
    if head is None:
        head = b"".join((_DELTA_HEAD, b"%d" % index, _DELTA_KINDS[kind]))
        if index < 64:  # (the blocks of most answers: a bounded table)
            _DELTA_HEADS[index, kind] = head
    return head


# The content_block of a text or thinking block's start (only ever encoded).
_BLOCKS = {
    "text": {"type": "text", "text": ""},
    "reasoning": {"type": "thinking", "thinking": "", "signature": ""},
}


class _PendingTool:
    __slots__ = ("id", "name", "args", "block")

    def __init__(self) -> None:
        self.id: str | None = None
        self.name: str | None = None
        self.args: list[str] = []
        self.block: int | None = None  # Anthropic block index once opened


class AnthropicStream(ChunkWalk):
    __slots__ = (
        "_open",  # (what a delta of the open block reads first)
        "_delta_head",
        "saw_content",
        "_index",
        "_open_tool",
        "_tools",
        "model",
        "stop_sequences",
        "exclude_cache",
        "message_id",
        "head",
        "tail",
        "finished",
    )

    def __init__(
        self,
        *,
        model: str,
        stop_sequences: list[str] | None = None,
        exclude_cache: bool = True,
    ) -> None:
        super().__init__()
        self.model = model
        self.stop_sequences = stop_sequences
        self.exclude_cache = exclude_cache
        self.message_id = new_message_id()
        self.head: dict | None = None  # more fields of message_start's message
        self.tail: Callable[[Usage], dict] | None = None  # more fields of message_delta
        self.saw_content = False
        self._index = -1  # index of the last opened block
        self._open: str | None = None  # "text" | "reasoning" (thinking) | "tool" | None
        self._delta_head = b""  # the bytes before the value of the open block's deltas
        self._open_tool: int | None = None  # OpenAI tool-call index of the open tool block
        self._tools: dict[int, _PendingTool] = {}
        self.finished = False

    # -- the three phases -------------------------------------------------------------
    def start(self) -> bytes:
        message = {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": message_start_usage(),
        }
        if self.head:
            message.update(self.head)
        return sse("message_start", {"type": "message_start", "message": message}) + sse(
            "ping", {"type": "ping"}
        )

    def finish(self) -> bytes:
        out: list[bytes] = []
        # Tool calls that never got a name are opened now, so nothing the model said is lost.
        for idx, tool in sorted(self._tools.items()):
            if tool.block is None:
                self._open_tool_block(out, idx, tool)
        self._close(out)
        reason, seq = stop_reason(self.finish_reason, self.matched_stop, self.stop_sequences)
        if self._tools and reason == "end_turn":
            reason = "tool_use"
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": seq},
            "usage": self.usage.to_anthropic(self.exclude_cache),
        }
        if self.tail is not None:
            delta.update(self.tail(self.usage))
        out.append(sse("message_delta", delta))
        out.append(sse("message_stop", {"type": "message_stop"}))
        self.finished = True
        return b"".join(out)

    def error(self, err: GatewayError) -> bytes:
        """Failure after the stream started: close the open block, then an ``error`` event."""
        out: list[bytes] = []
        self._close(out)
        out.append(error_event(err))
        self.finished = True
        return b"".join(out)

    # -- blocks -------------------------------------------------------------------------
    def one(self, kind: str, piece: str) -> bytes:
        if self._open == kind:  # the bulk of a stream: one more delta of the open block
            self.saw_content = True
            return b"".join((self._delta_head, _encode(piece), _DELTA_TAIL))
        return super().one(kind, piece)

    def lane(self, kind: str) -> tuple[bytes, bytes] | None:
        if self._open == kind and self.saw_content:  # (what ``one`` makes, and only that)
            return self._delta_head, _DELTA_TAIL
        return None

    def _piece(self, out: list[bytes], kind: str, piece: str) -> None:
        if self._open != kind:
            self._switch(out, kind, _BLOCKS[kind])
        out.append(self._delta(kind, piece))

    def _delta(self, kind: str, value: str) -> bytes:
        """A ``content_block_delta`` of the open block (of ``kind``) carrying ``value``."""
        self.saw_content = True
        return b"".join((self._delta_head, _encode(value), _DELTA_TAIL))

    def _switch(self, out: list[bytes], kind: str, block: dict) -> None:
        """Close the open block, open the next (of ``kind``, starting as ``block``)."""
        self._close(out)
        self._index += 1
        self._open = kind
        # Every delta of this block begins the same: made once (and shared by every
        # stream: one object fewer for a relay to fetch a delta at a thousand streams).
        self._delta_head = _delta_head(self._index, kind)
        out.append(
            sse(
                "content_block_start",
                {"type": "content_block_start", "index": self._index, "content_block": block},
            )
        )

    def _close(self, out: list[bytes]) -> None:
        if self._open is None:
            return
        out.append(sse("content_block_stop", {"type": "content_block_stop", "index": self._index}))
        self._open = None
        self._open_tool = None

    def _tool_delta(self, out: list[bytes], call: dict) -> None:
        tool, idx, args = fold_tool_delta(self._tools, call, _PendingTool)
        if tool.block is None:
            if args:
                tool.args.append(args)
            if tool.name is not None:
                self._open_tool_block(out, idx, tool)
            return
        if not args:
            return
        if self._open == "tool" and self._open_tool == idx:
            out.append(self._delta("tool", args))
        else:
            # Anthropic blocks cannot reopen; a late fragment of a closed tool call is lost.
            log.warning("dropped %d chars of arguments for closed tool call %d", len(args), idx)

    def _open_tool_block(self, out: list[bytes], idx: int, tool: _PendingTool) -> None:
        self._switch(
            out,
            "tool",
            {
                "type": "tool_use",
                "id": tool.id or "toolu_" + secrets.token_hex(12),
                "name": tool.name or "",
                "input": {},
            },
        )
        tool.block = self._index
        self._open_tool = idx
        if tool.args:
            out.append(self._delta("tool", "".join(tool.args)))
            tool.args.clear()
