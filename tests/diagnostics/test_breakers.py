"""A known breaker through the gateway, Claude Code's real request (its billing header's
``cch`` changing every request): the standard object names the system prompt; the
extension says the change's class and shape, the known breaker and its fix, or that the
change never reached the engine when the channel's hygiene removes it."""

from __future__ import annotations

import httpx
import pytest
from anthropic.types import Message

from prefixgate.config import parse_config
from prefixgate.diagnostics.verdict import EXTENSION
from prefixgate.serve.app import create_app
from prefixgate.serve.process import ServerThread
from tests.conftest import load_fixture


def _two_turns(url: str, fx: dict) -> Message:
    """The fixture's request as Claude Code sent it (fields the SDK's create does not take
    included), then its next turn; the answers read with the SDK's own type."""
    body = dict(fx["body"], stream=False)
    headers = {"x-claude-code-session-id": fx["headers"]["X-Claude-Code-Session-Id"]}
    system = [dict(b) for b in body["system"]]

    def create(**kw) -> Message:
        r = httpx.post(url + "/v1/messages", json=kw, headers=headers, timeout=60)
        assert r.status_code == 200, r.text
        return Message.model_validate(r.json())

    first = create(**body, diagnostics={"previous_message_id": None})
    system[0] = {"type": "text", "text": system[0]["text"].split(" cch=")[0] + " cch=9f3a1;"}
    messages = [
        *body["messages"],
        {"role": "assistant", "content": [{"type": "text", "text": first.content[0].text}]},
        {"role": "user", "content": "and now?"},
    ]
    return create(
        **{**body, "system": system, "messages": messages},
        diagnostics={"previous_message_id": first.id},
    )


@pytest.mark.parametrize("strip", [False, True], ids=["unprotected", "stripped"])
def test_claude_codes_billing_header(upstream, tmp_path, strip):
    fx = load_fixture("01_v2.1.332_print_turn1.json")
    config = parse_config(
        {
            "channels": [
                {"name": "main", "base_url": upstream.url, "strip_anthropic_billing_header": strip}
            ],
            "store": {"dsn": f"sqlite:///{tmp_path / 'r.db'}", "journal_path": str(tmp_path / "j")},
        }
    )
    with ServerThread(create_app(config)) as gw:
        second = _two_turns(gw.url, fx)
    # the request's structure changed at its head, whatever the gateway did with it
    assert second.diagnostics.cache_miss_reason.type == "system_changed"
    changed = getattr(second, EXTENSION)["changed"]
    assert changed["segment"] == "system[0]"
    if strip:
        assert changed["upstream_segment"] is None and changed["reached_engine"] is False
    else:
        assert changed["upstream_segment"] == "messages[0]:system"
        assert changed["known"] == "billing_header"
        assert changed["shape"]["cls"] == changed["class"]
        assert "strip_anthropic_billing_header" in getattr(second, EXTENSION)["fix"]
