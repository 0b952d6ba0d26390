from __future__ import annotations

import pytest

from prefixgate.record.redact import REDACTED, redact

SECRETS = [
    ("x-api-key: sk-ant-api03-abcdefghijklmnopqrstuvwxyz0123", "x-api-key: " + REDACTED),
    ("OPENAI_API_KEY=sk-proj-AbCdEfGhIjKlMnOpQrStUv012345", "OPENAI_API_KEY=" + REDACTED),
    (
        "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.abc",
        "Authorization: Bearer " + REDACTED,
    ),
    ('{"api_key":"0123456789abcdef0123456789abcdef"}', '{"api_key":"' + REDACTED + '"}'),
    ('{\\"token\\": \\"Zm9vYmFyYmF6cXV4MTIzNDU2Nzg=\\"}', '{\\"token\\": \\"' + REDACTED + '\\"}'),
    ("secret_key = 'AbCdEf0123456789AbCdEf'", "secret_key = '" + REDACTED + "'"),
    ("PASSWORD: 9f86d081884c7d659a2feaa0c55ad015", "PASSWORD: " + REDACTED),
    ("GITHUB_TOKEN=ghp_abcdefghijklmnopqrstuvwxyz0123456789", "GITHUB_TOKEN=" + REDACTED),
    ("aws AKIAABCDEFGHIJKLMNOP here", f"aws {REDACTED} here"),
]

HARMLESS = [
    '"max_tokens":1024,"input_tokens":12345678901234567890',
    "the key: to_success_is_a_long_sentence_without_digits",
    "password: hunter2",
    '"id":"toolu_01ABCDEFGHIJKLMNOPQRSTUV","name":"Bash"',
    "task-abcdefghijklmnopqrstuvwxyz0123 and risk-management-1234567890",
    "sha: 9f86d081884c7d659a2feaa0c55ad015",
]


@pytest.mark.parametrize(("text", "expected"), SECRETS)
def test_secrets_are_redacted(text: str, expected: str) -> None:
    assert redact(text) == expected


@pytest.mark.parametrize("text", HARMLESS)
def test_ordinary_text_is_kept(text: str) -> None:
    assert redact(text) == text
