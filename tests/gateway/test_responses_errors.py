"""Bad input on ``/v1/responses``: a clear error in OpenAI's envelope naming the field,
nothing sent upstream, the failure recorded."""

from __future__ import annotations

import httpx
import openai
import pytest

PNG = "data:image/png;base64,iVBORw0KGgo="
CALL = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}


def _user(*parts: dict) -> dict:
    return {"role": "user", "content": list(parts)}


CASES = [
    (
        "unknown item type",
        {"input": [{"type": "web_search_call", "id": "ws_1"}]},
        "input[0].type",
        "unsupported item type 'web_search_call'",
    ),
    (
        "output without its call",
        {"input": [{"type": "function_call_output", "call_id": "c9", "output": "x"}]},
        "input[0].call_id",
        "no earlier function_call item has call_id 'c9'",
    ),
    (
        "output before its call",
        {
            "input": [
                {"type": "function_call_output", "call_id": "c1", "output": "x"},
                CALL,
            ]
        },
        "input[0].call_id",
        "no earlier function_call",
    ),
    (
        "custom output without its call",
        {"input": [CALL, {"type": "custom_tool_call_output", "call_id": "c1", "output": "x"}]},
        "input[1].call_id",
        "no earlier custom_tool_call item",
    ),
    (
        "item reference",
        {"input": [{"type": "item_reference", "id": "msg_1"}]},
        "input[0].type",
        "keeps no items",
    ),
    (
        "previous response",
        {"input": "x", "previous_response_id": "resp_1"},
        "previous_response_id",
        "stores no responses",
    ),
    ("background", {"input": "x", "background": True}, "background", "stored state"),
    (
        "image detail not a string",
        {"input": [_user({"type": "input_image", "image_url": PNG, "detail": 1})]},
        "input[0].content[0].detail",
        "a string is required",
    ),
    (
        "image by file id",
        {"input": [_user({"type": "input_image", "file_id": "file_1"})]},
        "input[0].content[0].image_url",
        "stores no files",
    ),
    (
        "a file",
        {"input": [_user({"type": "input_file", "file_data": "x", "filename": "a.pdf"})]},
        "input[0].content[0].type",
        "input_file is not supported",
    ),
    (
        "output text in a user message",
        {"input": [_user({"type": "output_text", "text": "x"})]},
        "input[0].content[0].type",
        "'output_text' is not accepted here",
    ),
    (
        "a text that is not a string",
        {"input": [_user({"type": "input_text", "text": 3})]},
        "input[0].content[0].text",
        "a string is required",
    ),
    ("bad role", {"input": [{"role": "robot", "content": "x"}]}, "input[0].role", "must be one of"),
    ("wrong type", {"input": 3}, "input", "Expected"),
    ("no input", {}, None, "missing required field `input`"),
    ("empty input", {"input": []}, "input", "at least one item"),
    ("no model", {"model": "", "input": "x"}, "model", "non-empty string"),
    ("max output tokens", {"input": "x", "max_output_tokens": 0}, "max_output_tokens", "positive"),
    (
        "a function without a name",
        {"input": "x", "tools": [{"type": "function", "parameters": {}}]},
        "tools[0].name",
        "a string is required",
    ),
    (
        "tool choice",
        {"input": "x", "tool_choice": {"type": "function"}},
        "tool_choice.name",
        "required",
    ),
]


@pytest.mark.parametrize(("why", "body", "param", "says"), CASES, ids=[c[0] for c in CASES])
def test_refused_with_the_field_named_and_nothing_sent(gateway, upstream, why, body, param, says):
    gw = gateway()
    resp = httpx.post(gw.url + "/v1/responses", json={"model": "m", **body}, timeout=10)
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param
    assert says in err["message"], err["message"]
    assert upstream.requests == []
    rec = gw.records[-1]
    assert (rec.endpoint, rec.status, rec.error_type) == ("responses", 400, "invalid_request_error")
    assert resp.headers["x-request-id"] == rec.request_id


def test_an_image_to_a_text_only_channel_is_refused_through_the_sdk(gateway, upstream):
    gw = gateway({"accepts_images": False})
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0)
    with client, pytest.raises(openai.BadRequestError) as info:
        client.responses.create(
            model="m",
            input=[
                _user(
                    {"type": "input_text", "text": "what is this"},
                    {"type": "input_image", "image_url": PNG},
                )
            ],
        )
    assert "takes text only" in info.value.message
    assert upstream.requests == [] and gw.records[-1].status == 400
    # a tool's image output counts too; text alone goes through
    out = {
        "type": "function_call_output",
        "call_id": "c1",
        "output": [{"type": "input_image", "image_url": PNG}],
    }
    resp = httpx.post(
        gw.url + "/v1/responses", json={"model": "m", "input": [CALL, out]}, timeout=10
    )
    assert resp.status_code == 400 and upstream.requests == []
    resp = httpx.post(gw.url + "/v1/responses", json={"model": "m", "input": "hi"}, timeout=10)
    assert resp.status_code == 200 and len(upstream.requests) == 1


def test_oversize_input(gateway, upstream):
    gw = gateway(limits={"max_body_bytes": 4096, "max_messages": 3, "max_blocks": 4})
    big = {"model": "m", "input": "x" * 5000}
    resp = httpx.post(gw.url + "/v1/responses", json=big, timeout=10)
    assert resp.status_code == 413
    err = resp.json()["error"]
    assert err["code"] == "request_too_large" and "limit is 4096 bytes" in err["message"]
    items = [{"role": "user", "content": "x"}] * 4
    resp = httpx.post(gw.url + "/v1/responses", json={"model": "m", "input": items}, timeout=10)
    assert resp.status_code == 400 and "at most 3 items" in resp.json()["error"]["message"]
    parts = [{"type": "input_text", "text": "x"}] * 5
    resp = httpx.post(
        gw.url + "/v1/responses", json={"model": "m", "input": [_user(*parts)]}, timeout=10
    )
    assert resp.status_code == 400 and "at most 4 content parts" in resp.json()["error"]["message"]
    deep: object = "x"
    for _ in range(80):
        deep = {"a": deep}
    resp = httpx.post(
        gw.url + "/v1/responses", json={"model": "m", "input": "x", "metadata": deep}, timeout=10
    )
    assert resp.status_code == 400 and "nested deeper" in resp.json()["error"]["message"]
    assert upstream.requests == []
    assert [r.status for r in gw.records] == [413, 400, 400, 400]


def test_not_json_and_not_an_object(gateway, upstream):
    gw = gateway()
    for data, says in (
        (b"{nope", "not valid JSON"),
        (b"[1]", "must be a JSON object"),
        (b"", "empty"),
    ):
        resp = httpx.post(
            gw.url + "/v1/responses", content=data, headers={"content-type": "application/json"}
        )
        assert resp.status_code == 400 and says in resp.json()["error"]["message"]
    assert upstream.requests == []
