"""Schema-driven fuzzing (schemathesis) of the gateway's own OpenAPI document: whatever a
client sends to /v1/messages, /v1/messages/count_tokens, /v1/chat/completions or
/v1/responses, the answer is never a 5xx and never a hang, and errors come in the route's
own shape."""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, settings

from prefixgate.protocol.schemas import openapi_document
from tests.fakes import Reply

schema = schemathesis.openapi.from_dict(openapi_document())


@schema.parametrize()
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_5xx_and_error_shapes(case, gateway, upstream):
    gw = _shared(gateway)
    upstream.script = lambda b: Reply(text="fuzzed", prompt_tokens=10, cached_tokens=0)
    response = case.call(base_url=gw.url, timeout=20)
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        body = response.json()
        if case.path.startswith("/v1/messages"):
            assert body["type"] == "error" and isinstance(body["error"]["message"], str)
        else:
            assert isinstance(body["error"]["message"], str)


_gateways: dict[int, object] = {}


def _shared(start):
    """One gateway per test function (hypothesis calls the body once per example)."""
    key = id(start)
    if key not in _gateways:
        _gateways.clear()
        _gateways[key] = start()
    return _gateways[key]
