"""Who the client is and which session a request belongs to, from headers and body."""

from __future__ import annotations

import json
import re

_UA = re.compile(r"^\s*([A-Za-z][\w.\-]*)(?:/([\w.\-+]+))?")
_SDK = re.compile(r"^(OpenAI|Anthropic)/(Python|JS|Node)\s+([\w.\-]+)", re.I)


def client_of(user_agent: str | None) -> tuple[str | None, str | None]:
    """``("claude-cli", "2.1.332")`` from ``claude-cli/2.1.332 (external, cli)``;
    ``("openai-python", "1.40.0")`` from ``OpenAI/Python 1.40.0``."""
    if not user_agent:
        return None, None
    known = _CLIENTS.get(user_agent)
    if known is None:
        if len(_CLIENTS) > 4096:  # user agents repeat; a flood of new ones does not grow it
            _CLIENTS.clear()
        known = _CLIENTS[user_agent] = _client_of(user_agent)
    return known


_CLIENTS: dict[str, tuple[str | None, str | None]] = {}


def _client_of(user_agent: str) -> tuple[str | None, str | None]:
    m = _SDK.match(user_agent)
    if m:
        return f"{m.group(1).lower()}-{m.group(2).lower()}", m.group(3)
    m = _UA.match(user_agent)
    if not m:
        return None, None
    return m.group(1).lower(), m.group(2)


def session_of_messages(body: dict, headers) -> tuple[str | None, str | None]:
    """Claude Code's ``session_id`` inside ``metadata.user_id`` (a JSON string) or its
    ``X-Claude-Code-Session-Id`` header; else the raw ``metadata.user_id``."""
    sid = headers.get("x-claude-code-session-id")
    if sid:
        return sid, "claude-code"
    md = body.get("metadata")
    uid = md.get("user_id") if isinstance(md, dict) else None
    if isinstance(uid, str) and uid:
        if uid.startswith("{"):
            try:
                doc = json.loads(uid)
            except ValueError:
                doc = None
            if isinstance(doc, dict) and isinstance(doc.get("session_id"), str):
                return doc["session_id"], "claude-code"
        m = re.search(r"_session_([0-9a-f\-]{8,})", uid)
        if m:
            return m.group(1), "claude-code"
        return uid, "anthropic-user"
    return None, None


def session_of_chat(body: dict, headers) -> tuple[str | None, str | None]:
    """The request's ``user``; else opencode's session (its ``x-session-affinity`` header,
    sent with the same id in ``X-Session-Id`` to any provider but its own: opencode
    1.18.33); else an ``x-session-id`` header."""
    user = body.get("user")
    if isinstance(user, str) and user:
        return user, "openai-user"
    sid = headers.get("x-session-affinity")
    if sid:
        return sid, "opencode"
    sid = headers.get("x-session-id")
    if sid:
        return sid, "header"
    return None, None


def session_of_responses(body: dict, headers) -> tuple[str | None, str | None]:
    """Codex CLI's ``session-id`` header (its ``prompt_cache_key`` is the same id), else
    the request's ``prompt_cache_key`` (what OpenAI routes its prompt cache by), else as
    a chat request: ``user``, then ``x-session-id``."""
    sid = headers.get("session-id")
    if sid and headers.get("originator", "").startswith("codex"):
        return sid, "codex"
    key = body.get("prompt_cache_key")
    if isinstance(key, str) and key:
        return key, "prompt-cache-key"
    if sid:
        return sid, "header"
    return session_of_chat(body, headers)
