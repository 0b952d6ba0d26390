"""OpenAI Chat Completions SSE chunks → OpenAI Responses SSE events.

A state machine in the manner of ``stream.py``: at most one text or reasoning item is open
at a time; a change of kind closes it and opens the next, so reasoning, text and tool
calls may come in any order and the client still reads the Responses sequence:

    response.created, response.in_progress,
    per item: response.output_item.added,
      message:   response.content_part.added, response.output_text.delta*,
                 response.output_text.done, response.content_part.done
      reasoning: response.content_part.added, response.reasoning_text.delta*,
                 response.reasoning_text.done, response.content_part.done
      function:  response.function_call_arguments.delta*, …arguments.done
      custom:    response.custom_tool_call_input.delta, …input.done
    response.output_item.done,
    response.completed (or response.incomplete when the output hit its limit)

A compaction (the request ended with a ``compaction_trigger``) is one item: the text is
kept, not sent, and at the end goes out as a ``compaction`` item (added, then done) before
``response.completed``; reasoning and tool calls are dropped (``apis/responses/compaction.py``).

Tool calls stay open until the answer ends or text follows them (a chat stream may send a
call's arguments in pieces between other calls' pieces). A failure after the start is a
``response.failed`` event, whose ``error.code`` says what went wrong. Every event carries
its ``sequence_number``. Feeding is pure (no I/O): each call returns the bytes to send.
The chunk is read by :class:`~.chunks.ChunkWalk`, as in ``stream.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import msgspec

from prefixgate.apis.responses.compaction import compaction_item
from prefixgate.apis.responses.response import (
    ToolMap,
    call_item,
    message_item,
    new_id,
    reasoning_item,
    status_of,
    text_part,
)
from prefixgate.convert.chunks import ChunkWalk, fold_tool_delta
from prefixgate.errors import GatewayError
from prefixgate.protocol.openai import error_body
from prefixgate.usage import Usage

log = logging.getLogger(__name__)
_encode = msgspec.json.encode


class _Call:
    __slots__ = ("id", "name", "args", "item", "index", "custom", "done")

    def __init__(self) -> None:
        self.id: str | None = None  # the chat tool call's id: the item's call_id
        self.name: str | None = None
        self.args: list[str] = []
        self.item = ""  # the output item's id
        self.index: int | None = None  # output index once opened
        self.custom = False
        self.done = False


class _Text:
    __slots__ = ("kind", "index", "id", "pieces")

    def __init__(self, kind: str, index: int, item_id: str) -> None:
        self.kind = kind  # "text" | "reasoning"
        self.index = index
        self.id = item_id
        self.pieces: list[str] = []


class ResponsesStream(ChunkWalk):
    __slots__ = (
        "_open",
        "seq",
        "base",
        "tools",
        "summary",
        "output",
        "_calls",
        "_open_calls",
        "finished",
        "tail",
    )

    def __init__(self, base: dict, tools: ToolMap, *, compacting: bool = False) -> None:
        super().__init__()
        self.base = base  # response_base(): ids, model, the request's echoed fields
        self.tools = tools
        self.summary: list[str] | None = [] if compacting else None  # a compaction's text
        self.output: list[dict] = []  # the items so far (each in its final form once done)
        self.seq = 0
        self._open: _Text | None = None
        self._calls: dict[int, _Call] = {}  # by the chat tool call's index
        self._open_calls: list[_Call] = []
        self.finished = False
        self.tail: Callable[[Usage], dict] | None = None  # more fields of the last response

    def _event(self, out: list[bytes], kind: str, data: dict) -> None:
        data["sequence_number"] = self.seq
        self.seq += 1
        out.append(b"event: " + kind.encode() + b"\ndata: " + _encode(data) + b"\n\n")

    # -- the three phases -------------------------------------------------------------
    def start(self) -> bytes:
        out: list[bytes] = []
        self._event(out, "response.created", {"type": "response.created", "response": self.base})
        self._event(
            out, "response.in_progress", {"type": "response.in_progress", "response": self.base}
        )
        return b"".join(out)

    def finish(self) -> bytes:
        out: list[bytes] = []
        for _, call in sorted(self._calls.items()):
            if call.index is None:  # never named: opened now, so nothing said is lost
                self._open_call(out, call)
        status, incomplete = status_of(self.finish_reason)
        self._close_text(out, status)
        self._close_calls(out)
        if self.summary is not None:
            # a summary cut at max_output_tokens is still the compaction asked for
            status, incomplete = "completed", None
            self._compaction(out, "".join(self.summary))
        response = {
            **self.base,
            "status": status,
            "incomplete_details": incomplete,
            "output": self.output,
            "usage": self.usage.to_responses(),
        }
        if self.tail is not None:
            response.update(self.tail(self.usage))
        kind = "response.completed" if status == "completed" else "response.incomplete"
        self._event(out, kind, {"type": kind, "response": response})
        self.finished = True
        return b"".join(out)

    def error(self, err: GatewayError) -> bytes:
        """Failure after the stream started: ``response.failed`` with what went wrong."""
        out: list[bytes] = []
        body = error_body(err)["error"]
        response = {
            **self.base,
            "status": "failed",
            "error": {"code": body["code"] or body["type"], "message": body["message"]},
            "output": self.output,
            "usage": self.usage.to_responses(),
        }
        self._event(out, "response.failed", {"type": "response.failed", "response": response})
        self.finished = True
        return b"".join(out)

    def _compaction(self, out: list[bytes], summary: str) -> None:
        index = len(self.output)
        item = compaction_item(summary)
        self.output.append(item)
        self._event(
            out,
            "response.output_item.added",
            {"type": "response.output_item.added", "output_index": index, "item": item},
        )
        self._item_done(out, index, item)

    # -- text and reasoning items ---------------------------------------------------------
    def _piece(self, out: list[bytes], kind: str, piece: str) -> None:
        if self.summary is not None:
            if kind == "text":
                self.summary.append(piece)
            return
        cur = self._open
        if cur is None or cur.kind != kind:
            self._close_text(out)
            self._close_calls(out)
            index = len(self.output)
            if kind == "text":
                cur = _Text(kind, index, new_id("msg"))
                item, part = message_item(cur.id, None, "in_progress"), text_part("")
            else:
                cur = _Text(kind, index, new_id("rs"))
                item = reasoning_item(cur.id, "", "in_progress")
                part = {"type": "reasoning_text", "text": ""}
            self._open = cur
            self.output.append(item)
            self._event(
                out,
                "response.output_item.added",
                {"type": "response.output_item.added", "output_index": index, "item": item},
            )
            self._event(out, "response.content_part.added", self._part(cur, part, "added"))
        cur.pieces.append(piece)
        kind_name = (
            "response.output_text.delta" if kind == "text" else "response.reasoning_text.delta"
        )
        data = {
            "type": kind_name,
            "item_id": cur.id,
            "output_index": cur.index,
            "content_index": 0,
            "delta": piece,
        }
        if kind == "text":
            data["logprobs"] = []
        self._event(out, kind_name, data)

    def _part(self, cur: _Text, part: dict, which: str) -> dict:
        return {
            "type": f"response.content_part.{which}",
            "item_id": cur.id,
            "output_index": cur.index,
            "content_index": 0,
            "part": part,
        }

    def _close_text(self, out: list[bytes], status: str = "completed") -> None:
        cur, self._open = self._open, None
        if cur is None:
            return
        text = "".join(cur.pieces)
        done = {"item_id": cur.id, "output_index": cur.index, "content_index": 0, "text": text}
        if cur.kind == "text":
            self._event(
                out,
                "response.output_text.done",
                {"type": "response.output_text.done", **done, "logprobs": []},
            )
            part, item = text_part(text), message_item(cur.id, text, status)
        else:
            self._event(
                out,
                "response.reasoning_text.done",
                {"type": "response.reasoning_text.done", **done},
            )
            part, item = {"type": "reasoning_text", "text": text}, reasoning_item(cur.id, text)
        self._event(out, "response.content_part.done", self._part(cur, part, "done"))
        self._item_done(out, cur.index, item)

    def _item_done(self, out: list[bytes], index: int, item: dict) -> None:
        self.output[index] = item
        self._event(
            out,
            "response.output_item.done",
            {"type": "response.output_item.done", "output_index": index, "item": item},
        )

    # -- tool calls -------------------------------------------------------------------------
    def _tool_delta(self, out: list[bytes], delta: dict) -> None:
        if self.summary is not None:
            return
        call, idx, args = fold_tool_delta(self._calls, delta, _Call)
        if call.index is None:
            if args:
                call.args.append(args)
            if call.name is not None:
                self._open_call(out, call)
            return
        if not args:
            return
        if call.done:
            # Its output_item.done went out: a late fragment cannot be added any more.
            log.warning("dropped %d chars of arguments for closed tool call %d", len(args), idx)
            return
        call.args.append(args)
        if not call.custom:
            self._args_delta(out, call, args)

    def _open_call(self, out: list[bytes], call: _Call) -> None:
        self._close_text(out)
        name = call.name or ""
        call.custom = self.tools.get(name, ("function",))[0] == "custom"
        call.item = new_id("ctc" if call.custom else "fc")
        call.id = call.id or new_id("call")
        call.index = len(self.output)
        item = call_item(call.item, call.id, name, "", self.tools, "in_progress")
        self.output.append(item)
        self._event(
            out,
            "response.output_item.added",
            {"type": "response.output_item.added", "output_index": call.index, "item": item},
        )
        if call.args and not call.custom:
            self._args_delta(out, call, "".join(call.args))
        self._open_calls.append(call)

    def _args_delta(self, out: list[bytes], call: _Call, args: str) -> None:
        self._event(
            out,
            "response.function_call_arguments.delta",
            {
                "type": "response.function_call_arguments.delta",
                "item_id": call.item,
                "output_index": call.index,
                "delta": args,
            },
        )

    def _close_calls(self, out: list[bytes]) -> None:
        for call in self._open_calls:
            args = "".join(call.args)
            item = call_item(
                call.item, call.id or "", call.name or "", args, self.tools, "completed"
            )
            where = {"item_id": call.item, "output_index": call.index}
            if call.custom:
                text = item["input"]
                for kind, data in (
                    ("response.custom_tool_call_input.delta", {"delta": text}),
                    ("response.custom_tool_call_input.done", {"input": text}),
                ):
                    self._event(out, kind, {"type": kind, **where, **data})
            else:
                kind = "response.function_call_arguments.done"
                data = {"type": kind, **where, "name": item["name"], "arguments": args}
                self._event(out, kind, data)
            call.done = True
            self._item_done(out, call.index, item)  # type: ignore[arg-type]
        self._open_calls = []
