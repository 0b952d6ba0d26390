"""The ``tools`` arrays: the catalogue rendered for Anthropic or OpenAI, with descriptions
padded to a target size."""

from __future__ import annotations

import random
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from .catalog import BY_NAME, CATALOG, STABLE_NAMES, ToolDef
from .text import derive, dumps, json_len, pieces


def _schema(t: ToolDef, with_meta: bool) -> dict[str, Any]:
    schema: dict[str, Any] = {}
    if with_meta:
        schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["type"] = "object"
    schema["properties"] = t.properties
    schema["required"] = list(t.required)
    schema["additionalProperties"] = False
    return schema


def _render_tool(t: ToolDef, name: str, description: str, fmt: str) -> dict[str, Any]:
    if fmt == "anthropic":
        return {"name": name, "description": description, "input_schema": _schema(t, True)}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": _schema(t, False)},
    }


def _build_tools(
    defs: Sequence[tuple[ToolDef, str]], target_chars: int, key: str, fmt: str
) -> list[dict[str, Any]]:
    """Render ``defs`` and pad the descriptions so the compact JSON is ~``target_chars``."""
    rng = random.Random(derive("tools", key))
    tools = [_render_tool(t, name, t.description, fmt) for t, name in defs]
    extra = target_chars - len(dumps(tools))
    if extra <= 0:
        return tools
    total_w = sum(t.weight for t, _ in defs)
    quota = 0.0
    added = 0
    for i, (t, name) in enumerate(defs):
        quota += extra * t.weight / total_w
        parts: list[str] = []
        gen = pieces(rng, name)
        while added < quota:
            piece = next(gen)
            parts.append(piece)
            added += json_len(piece)
        if parts:
            tools[i] = _render_tool(t, name, t.description + "".join(parts), fmt)
    return tools


@lru_cache(maxsize=16)
def claude_code_tools(version: str, tools_kb: float = 70.0) -> list[dict[str, Any]]:
    """Claude Code's ``tools`` (Anthropic format): ~``tools_kb`` KiB of compact JSON,
    byte-identical for a version. Cached and shared: treat as read-only."""
    defs = [(t, t.name) for t in CATALOG]
    return _build_tools(defs, int(tools_kb * 1024), f"cc|{version}", "anthropic")


@lru_cache(maxsize=16)
def stable_tools(version: str, tools_kb: float = 24.0, api: str = "openai") -> list[dict[str, Any]]:
    """The stable agent's tools in OpenAI (``api="openai"``) or Anthropic format."""
    defs = [(BY_NAME[cc], name) for cc, name in STABLE_NAMES.items()]
    fmt = "anthropic" if api == "anthropic" else "openai"
    return _build_tools(defs, int(tools_kb * 1024), f"stable|{version}", fmt)
