"""The sessions the real clients name, as their pinned versions send them."""

from __future__ import annotations

from prefixgate.identify import session_of_chat, session_of_messages, session_of_responses


def test_opencode_names_its_session_in_two_headers():
    # opencode 1.18.33 to a provider other than its own (read from its binary): the same
    # session id in x-session-affinity and X-Session-Id, a sub-agent's parent beside them
    headers = {
        "x-session-affinity": "ses_4f2a",
        "x-session-id": "ses_4f2a",
        "x-parent-session-id": "ses_0001",
    }
    assert session_of_chat({}, headers) == ("ses_4f2a", "opencode")
    assert session_of_responses({}, headers) == ("ses_4f2a", "opencode")
    assert session_of_chat({"user": "u1"}, headers) == ("u1", "openai-user")
    assert session_of_chat({}, {"x-session-id": "s"}) == ("s", "header")


def test_codex_names_its_session_in_a_header_and_the_cache_key():
    headers = {"session-id": "0199-abc", "originator": "codex_exec"}
    body = {"prompt_cache_key": "0199-abc"}
    assert session_of_responses(body, headers) == ("0199-abc", "codex")
    assert session_of_responses(body, {}) == ("0199-abc", "prompt-cache-key")


def test_claude_code_names_its_session_in_a_header_and_the_metadata():
    assert session_of_messages({}, {"x-claude-code-session-id": "b8e8"}) == ("b8e8", "claude-code")
    uid = '{"device_id":"bfae","account_uuid":"","session_id":"b8e8"}'
    assert session_of_messages({"metadata": {"user_id": uid}}, {}) == ("b8e8", "claude-code")
    old = "user_bfae_account__session_3c9c017d-3d25"
    assert session_of_messages({"metadata": {"user_id": old}}, {}) == (
        "3c9c017d-3d25",
        "claude-code",
    )
