"""The comparison in the order the engine's template renders the prompt: through the
gateway to the simulated upstream with the project's own templates, the official
Anthropic SDK. A template that gathers every ``role: system`` message at the head makes
the next turn's new system message (Claude Code's ``<total_tokens>`` reminder) a change of
the system prompt, ``system_changed``, and the extension says the template moved it;
where the message renders in place (a template that keeps it, or the gateway delivering
it inside the turn) the turn only appended."""

from __future__ import annotations

import anthropic
import pytest
from anthropic.types import CacheMissSystemChanged

from prefixgate.diagnostics.verdict import EXTENSION
from tests.hygiene.test_system_in_place import _gateway, conversation


@pytest.mark.parametrize(
    ("template", "channel", "moved"),
    [
        ("hoisting", {"system_in_place": False}, True),  # delivered as it came: hoisted
        ("hoisting", {}, False),  # the gateway delivers it inside the turn (the default)
        ("in_place", {}, False),  # the template keeps it where it is
    ],
)
def test_a_new_system_message_the_template_moves_to_the_head(tmp_path, template, channel, moved):
    sim, up, gw = _gateway(tmp_path, template, **channel)
    try:
        with gw:
            client = anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0)
            first = client.messages.create(
                model="m",
                max_tokens=8,
                messages=conversation(1),
                diagnostics={"previous_message_id": None},
            )
            second = client.messages.create(
                model="m",
                max_tokens=8,
                messages=conversation(2),
                diagnostics={"previous_message_id": first.id},
            )
    finally:
        up.__exit__(None, None, None)
    ext = getattr(second, EXTENSION)
    if not moved:
        assert second.diagnostics is None and ext["answer"] == "none"
        return
    reason = second.diagnostics.cache_miss_reason
    assert isinstance(reason, CacheMissSystemChanged)
    assert reason.cache_missed_input_tokens > 0  # the conversation after the head
    changed = ext["changed"]
    assert changed["part"] == "system" and changed["segment"] == "messages[4]:system"
    assert changed["moved_by_template"] == "head"
    assert "system_in_place" in ext["fix"]
