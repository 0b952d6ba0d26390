"""The control group: :class:`StableAgentSession`, an opencode-like agent with a
byte-stable prefix."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

from .catalog import STABLE_NAMES
from .dialogue import Dialogue, Result, Step
from .prompts import COMPACT_PROMPT, stable_system_prompt
from .spec import (
    AGENT_STABLE_ANTHROPIC,
    AGENT_STABLE_OPENAI,
    CHAT_ENDPOINT,
    KIND_COMPACT,
    KIND_TURN,
    STABLE_MESSAGES_ENDPOINT,
    SimRequest,
    TrafficSpec,
    msg_size,
)
from .text import b62, derive, dumps
from .tools import stable_tools


class StableAgentSession:
    """An opencode-like agent whose prefix never changes: fixed system prompt, the same tools
    every turn, append-only history. ``api`` is ``"openai"`` (Chat Completions) or
    ``"anthropic"`` (Messages with a single system string)."""

    def __init__(
        self,
        spec: TrafficSpec,
        seed: int,
        *,
        api: str = "openai",
        model: str | None = None,
    ):
        if api not in ("openai", "anthropic"):
            raise ValueError(f"api must be 'openai' or 'anthropic', not {api!r}")
        self.spec = spec
        self.seed = seed
        self.api = api
        self.agent = AGENT_STABLE_OPENAI if api == "openai" else AGENT_STABLE_ANTHROPIC
        rng = random.Random(derive("stable-session", seed))
        self.session_id = "ses_" + b62(rng, 26)
        self.model = model or rng.choice(spec.stable_models)

    @property
    def tools(self) -> list[dict[str, Any]]:
        return stable_tools(self.spec.stable_version, self.spec.stable_tools_kb, self.api)

    @property
    def endpoint(self) -> str:
        return CHAT_ENDPOINT if self.api == "openai" else STABLE_MESSAGES_ENDPOINT

    def headers(self) -> dict[str, str]:
        h = {
            "Accept": "application/json",
            "Content-Type": "application/json",
            "User-Agent": f"opencode/{self.spec.stable_version}",
        }
        if self.api == "openai":
            h["Authorization"] = f"Bearer {self.spec.api_key}"
        else:
            h["anthropic-version"] = "2023-06-01"
            h["x-api-key"] = self.spec.api_key
        return h

    def _body(self, messages: list[dict[str, Any]], system_text: str) -> dict[str, Any]:
        if self.api == "openai":
            return {
                "model": self.model,
                "messages": [{"role": "system", "content": system_text}, *messages],
                "tools": self.tools,
                "tool_choice": "auto",
                "max_tokens": self.spec.max_tokens,
                "stream": True,
                "stream_options": {"include_usage": True},
                "user": self.session_id,
            }
        return {
            "model": self.model,
            "max_tokens": self.spec.max_tokens,
            "system": system_text,
            "messages": messages,
            "tools": self.tools,
            "metadata": {"user_id": self.session_id},
            "stream": True,
        }

    def _assistant(self, step: Step) -> dict[str, Any]:
        if self.api == "openai":
            msg: dict[str, Any] = {"role": "assistant", "content": step.text or ""}
            if step.calls:
                msg["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": STABLE_NAMES[c.name], "arguments": dumps(c.input)},
                    }
                    for c in step.calls
                ]
            return msg
        blocks: list[dict[str, Any]] = []
        if step.text is not None:
            blocks.append({"type": "text", "text": step.text})
        for c in step.calls:
            blocks.append(
                {"type": "tool_use", "id": c.id, "name": STABLE_NAMES[c.name], "input": c.input}
            )
        return {"role": "assistant", "content": blocks}

    def _results(self, results: list[Result]) -> list[dict[str, Any]]:
        if self.api == "openai":
            return [{"role": "tool", "tool_call_id": r.call_id, "content": r.text} for r in results]
        blocks = []
        for r in results:
            block: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": r.call_id,
                "content": r.text,
            }
            if r.is_error:
                block["is_error"] = True
            blocks.append(block)
        return [{"role": "user", "content": blocks}]

    def _user(self, text: str) -> dict[str, Any]:
        if self.api == "openai":
            return {"role": "user", "content": text}
        return {"role": "user", "content": [{"type": "text", "text": text}]}

    def requests(self) -> Iterator[SimRequest]:
        spec = self.spec
        rng = random.Random(derive("stable-dialogue", self.seed))
        dlg = Dialogue(
            rng, spec, thinking=False, id_style="toolu" if self.api == "anthropic" else "call"
        )
        system_text = stable_system_prompt(spec.stable_version, spec.stable_system_kb)
        base_headers = self.headers()
        seq = 0
        epoch = 0

        def make(messages: list[dict[str, Any]], turn: int, kind: str) -> SimRequest:
            nonlocal seq
            req = SimRequest(
                self.endpoint, dict(base_headers), self._body(messages, system_text),
                self.session_id, turn, kind, self.agent, seq, epoch,
            )  # fmt: skip
            seq += 1
            return req

        first = f"{dlg.task}\n\nWorking directory: {dlg.cwd}"
        history = [self._user(first)]
        size = sum(msg_size(m) for m in history)
        allowed = set(STABLE_NAMES)
        for turn in range(spec.turns):
            if turn > 0:
                step = dlg.step()
                step.calls = [c for c in step.calls if c.name in allowed]
                if not step.calls and step.text is None:
                    step.text = "Done."
                new = [self._assistant(step)]
                if step.calls:
                    new += self._results([dlg.result(c) for c in step.calls])
                else:
                    new.append(self._user(dlg.followup()))
                history = history + new
                size += sum(msg_size(m) for m in new)
                if spec.compact_chars and size > spec.compact_chars:
                    yield make([*history, self._user(COMPACT_PROMPT)], turn, KIND_COMPACT)
                    epoch += 1
                    history = [
                        self._user("Summary of the conversation so far:\n" + dlg.summary(epoch))
                    ]
                    size = sum(msg_size(m) for m in history)
            yield make(history, turn, KIND_TURN)
