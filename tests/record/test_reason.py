"""The reason a failed record keeps: the error's message, short and scrubbed."""

from __future__ import annotations

from prefixgate.errors import PromptTooLong, UpstreamError
from prefixgate.record.reason import MAX_CHARS, failed, scrub
from prefixgate.record.record import Record


def test_the_message_as_the_client_was_told():
    rec = Record(request_id="r", received_at=0.0)
    failed(rec, PromptTooLong(102_001, 16_384))
    assert (rec.status, rec.error_type) == (400, "invalid_request_error")
    assert rec.error_message == "prompt is too long: 102001 tokens > 16384 maximum"


def test_an_echoed_input_is_elided():
    quoted = "You are an interactive command-line agent that helps people with code"
    msg = f"upstream rejected the request: Input should be a valid string '{quoted}' at body"
    assert scrub(msg) == "upstream rejected the request: Input should be a valid string '…' at body"
    assert scrub('short "ok" stays') == 'short "ok" stays'


def test_secrets_are_redacted_and_whitespace_collapsed():
    rec = Record(request_id="r", received_at=0.0)
    failed(
        rec, UpstreamError("upstream error (500):\n  bad key sk-ant-api03-abcdefghijklmnopqrstuv")
    )
    assert rec.error_message == "upstream error (500): bad key <redacted>"


def test_long_reasons_are_cut():
    text = scrub("x " * 1000)
    assert len(text) == MAX_CHARS and text.endswith("…")
    assert scrub("") is None and scrub(None) is None
