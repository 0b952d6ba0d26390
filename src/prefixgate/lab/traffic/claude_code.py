"""Claude Code's requests: the billing header, the moving ``cache_control`` marker and
:class:`ClaudeCodeSession`."""

from __future__ import annotations

import base64
import hashlib
import random
from collections.abc import Iterator
from typing import Any

from .dialogue import Dialogue
from .prompts import COMPACT_PROMPT, IDENTITY_LINE, TITLE_PROMPT, claude_code_system_prompt
from .spec import (
    AGENT_CLAUDE_CODE,
    KIND_COMPACT,
    KIND_TITLE,
    KIND_TURN,
    MESSAGES_ENDPOINT,
    SimRequest,
    TrafficSpec,
    msg_size,
)
from .text import derive, dumps, hex_digits, uuid4
from .tools import claude_code_tools

BILLING_PREFIX = "x-anthropic-billing-header:"

_CC_BETAS = ",".join(
    [
        "claude-code-20250219",
        "interleaved-thinking-2025-05-14",
        "context-management-2025-06-27",
        "prompt-caching-scope-2026-01-05",
        "mid-conversation-system-2026-04-07",
        "effort-2025-11-24",
        "structured-outputs-2025-12-15",
    ]
)


def billing_header(
    version: str, suffix: str, entrypoint: str = "cli", cch: str | None = None
) -> str:
    """The text of Claude Code's ``system[0]`` block."""
    text = f"{BILLING_PREFIX} cc_version={version}.{suffix}; cc_entrypoint={entrypoint};"
    if cch is not None:
        text += f" cch={cch};"
    return text


def _cc_suffix(version: str, first_user_text: str, avoid: str | None = None) -> str:
    """3 hex chars derived from the version and characters of the first user message."""
    sample = first_user_text[4:5] + first_user_text[7:8] + first_user_text[20:21]
    salt = 0
    while True:
        digest = hashlib.sha256(f"{version}|{sample}|{first_user_text}|{salt}".encode()).hexdigest()
        if digest[:3] != avoid:
            return digest[:3]
        salt += 1


def _marked(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``history`` with ``cache_control`` on the last block of the last message only."""
    msgs = list(history)
    last = msgs[-1]
    content = last["content"]
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
    blocks[-1] = {**blocks[-1], "cache_control": {"type": "ephemeral"}}
    msgs[-1] = {**last, "content": blocks}
    return msgs


class ClaudeCodeSession:
    """One Claude Code session. ``requests()`` yields its requests in order (re-iterable:
    every call starts over from the seed)."""

    agent = AGENT_CLAUDE_CODE

    def __init__(
        self,
        spec: TrafficSpec,
        seed: int,
        *,
        device_id: str | None = None,
        model: str | None = None,
    ):
        self.spec = spec
        self.seed = seed
        rng = random.Random(derive("cc-session", seed))
        self.session_id = uuid4(rng)
        self.device_id = device_id or hashlib.sha256(f"device|{seed}".encode()).hexdigest()
        self.model = model or rng.choice(spec.models)

    # static parts ------------------------------------------------------------
    @property
    def tools(self) -> list[dict[str, Any]]:
        return claude_code_tools(self.spec.cc_version, self.spec.tools_kb)

    def headers(self) -> dict[str, str]:
        s = self.spec
        return {
            "Accept": "application/json",
            "Content-Type": "application/json",
            "User-Agent": f"claude-cli/{s.cc_version} (external, {s.cc_entrypoint})",
            "X-Claude-Code-Session-Id": self.session_id,
            "X-Stainless-Arch": "x64",
            "X-Stainless-Lang": "js",
            "X-Stainless-OS": "Linux",
            "X-Stainless-Package-Version": "0.128.0",
            "X-Stainless-Retry-Count": "0",
            "X-Stainless-Runtime": "node",
            "X-Stainless-Runtime-Version": "v24.11.1",
            "X-Stainless-Timeout": "600",
            "anthropic-beta": _CC_BETAS,
            "anthropic-dangerous-direct-browser-access": "true",
            "anthropic-version": "2023-06-01",
            "x-api-key": s.api_key,
            "x-app": "cli",
        }

    def _user_id(self) -> str:
        return dumps(
            {"device_id": self.device_id, "account_uuid": "", "session_id": self.session_id}
        )

    # requests ----------------------------------------------------------------
    def requests(self) -> Iterator[SimRequest]:
        spec = self.spec
        rng = random.Random(derive("cc-dialogue", self.seed))
        cch_rng = random.Random(derive("cc-cch", self.seed))
        dlg = Dialogue(rng, spec, thinking=True, id_style="toolu")
        version = spec.cc_version
        tools = self.tools
        main_prompt = {
            "type": "text",
            "text": claude_code_system_prompt(version, spec.system_kb),
            "cache_control": {"type": "ephemeral"},
        }
        identity = {"type": "text", "text": IDENTITY_LINE, "cache_control": {"type": "ephemeral"}}
        base_headers = self.headers()
        user_id = self._user_id()
        seq = 0
        epoch = 0

        def system(suffix: str, identity_block: dict, prompt_block: dict) -> list[dict]:
            cch = hex_digits(cch_rng, 5) if spec.cch else None
            header = billing_header(version, suffix, spec.cc_entrypoint, cch)
            return [{"type": "text", "text": header}, identity_block, prompt_block]

        def make(body: dict, turn: int, kind: str) -> SimRequest:
            nonlocal seq
            req = SimRequest(
                MESSAGES_ENDPOINT, dict(base_headers), body, self.session_id, turn, kind,
                AGENT_CLAUDE_CODE, seq, epoch,
            )  # fmt: skip
            seq += 1
            return req

        def body(messages: list, suffix: str) -> dict:
            return {
                "model": self.model,
                "messages": messages,
                "system": system(suffix, identity, main_prompt),
                "tools": tools,
                "metadata": {"user_id": user_id},
                "max_tokens": spec.max_tokens,
                "thinking": {"type": "adaptive", "display": "omitted"},
                "context_management": {
                    "edits": [{"type": "clear_thinking_20251015", "keep": "all"}]
                },
                "output_config": {"effort": "medium"},
                "stream": True,
            }

        env_msg = None
        if spec.mid_system:
            env_msg = {
                "role": "system",
                "content": [
                    {
                        "type": "text",
                        "text": (
                            f"# Environment\nWorking directory: {dlg.cwd}\nIs a git repository: "
                            f"true\nPlatform: linux\nShell: bash\nOS version: Linux 6.12.9\n\n"
                            f"The model powering this session is {self.model}.\n\n"
                            f"Today's date is {dlg.date}."
                        ),
                    }
                ],
            }

        def opening(first_text: str) -> list[dict]:
            reminder = (
                "<system-reminder>\nInstructions from " + dlg.cwd + "/CLAUDE.md (they override "
                "the defaults):\n" + "".join(f"- {r}\n" for r in dlg.rules) + "</system-reminder>\n"
            )
            user = {
                "role": "user",
                "content": [
                    {"type": "text", "text": reminder},
                    {"type": "text", "text": first_text},
                ],
            }
            return [user, env_msg] if env_msg is not None else [user]

        history = opening(dlg.task)
        size = sum(msg_size(m) for m in history)
        suffix = _cc_suffix(version, dlg.task)

        for turn in range(spec.turns):
            if turn > 0:
                step = dlg.step()
                blocks: list[dict[str, Any]] = []
                if step.thinking is not None:
                    sig = base64.b64encode(rng.getrandbits(8 * 96).to_bytes(96, "big")).decode()
                    blocks.append({"type": "thinking", "thinking": step.thinking, "signature": sig})
                if step.text is not None:
                    blocks.append({"type": "text", "text": step.text})
                for c in step.calls:
                    blocks.append(
                        {"type": "tool_use", "id": c.id, "name": c.name, "input": c.input}
                    )
                new = [{"role": "assistant", "content": blocks}]
                if step.calls:
                    results: list[dict[str, Any]] = []
                    for c in step.calls:
                        r = dlg.result(c)
                        block: dict[str, Any] = {"type": "tool_result", "tool_use_id": r.call_id}
                        block["content"] = (
                            [{"type": "text", "text": r.text}] if r.as_list else r.text
                        )
                        if r.is_error:
                            block["is_error"] = True
                        results.append(block)
                    note = dlg.reminder()
                    if note is not None:
                        results.append({"type": "text", "text": note})
                    new.append({"role": "user", "content": results})
                else:
                    new.append(
                        {"role": "user", "content": [{"type": "text", "text": dlg.followup()}]}
                    )
                history = history + new
                size += sum(msg_size(m) for m in new)

                if spec.compact_chars and size > spec.compact_chars:
                    ask = {"role": "user", "content": [{"type": "text", "text": COMPACT_PROMPT}]}
                    yield make(body(_marked([*history, ask]), suffix), turn, KIND_COMPACT)
                    epoch += 1
                    summary = (
                        "This session continues an earlier conversation that ran out of "
                        "context. The summary below covers the earlier part.\n\n"
                        + dlg.summary(epoch)
                        + "\n\nContinue with the last task where it was left off, without "
                        "asking further questions."
                    )
                    history = opening(summary)
                    size = sum(msg_size(m) for m in history)
                    suffix = _cc_suffix(version, summary, avoid=suffix)

            yield make(body(_marked(history), suffix), turn, KIND_TURN)

            if turn == 0 and spec.titles:
                yield make(self._title_body(dlg.task, user_id, system), 0, KIND_TITLE)

    def _title_body(self, task: str, user_id: str, system: Any) -> dict[str, Any]:
        text = (
            f"<session>\n{task}\n</session>\n\nWrite the title in the language the user wrote in."
        )
        suffix = _cc_suffix(self.spec.cc_version, text)
        return {
            "model": self.model,
            "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}],
            "system": system(
                suffix,
                {"type": "text", "text": IDENTITY_LINE},
                {"type": "text", "text": TITLE_PROMPT},
            ),
            "tools": [],
            "metadata": {"user_id": user_id},
            "max_tokens": self.spec.max_tokens,
            "thinking": {"type": "disabled"},
            "output_config": {
                "effort": "high",
                "format": {
                    "type": "json_schema",
                    "schema": {
                        "type": "object",
                        "properties": {"title": {"type": "string"}},
                        "required": ["title"],
                        "additionalProperties": False,
                    },
                },
            },
            "stream": True,
        }
