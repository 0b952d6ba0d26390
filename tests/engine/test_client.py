"""The engine's word on an error status: the upstream client's non-2xx answer, on loopback
from a raw server that writes exact bytes (:mod:`tests.upstream.test_http1`), read by
:class:`~prefixgate.engine.client.EngineClient` into the error tree."""

from __future__ import annotations

import contextlib
import json

import pytest

from prefixgate.engine.client import EngineClient, UpstreamRejected
from prefixgate.errors import (
    GatewayError,
    Overloaded,
    PromptTooLong,
    UpstreamError,
    UpstreamRateLimited,
)
from tests.upstream.test_http1 import (
    RawServer,
    Request,
    chunked,
    echo,
    fetch,
    pool_of,
    response,
    run,
)
from tests.upstream.test_http1 import client as http_client


@contextlib.asynccontextmanager
async def client(**kwargs):
    async with http_client(**kwargs) as up:
        yield EngineClient(up)


# -- error statuses -------------------------------------------------------------------------
SECRET = "sk-live-0123456789abcdef"


def _error(message: str) -> bytes:
    return json.dumps({"error": {"message": message}}).encode()


@pytest.mark.parametrize(
    "answer, check",
    [
        (
            response(_error("busy"), "Retry-After: 7", status="503 Service Unavailable"),
            lambda e: (
                isinstance(e, Overloaded)
                and e.retry_after == 7.0
                and e.upstream_status == 503
                and "busy" in e.message
            ),
        ),
        (
            response(_error("slow down"), "Retry-After: 2.5", status="429 Too Many Requests"),
            lambda e: isinstance(e, UpstreamRateLimited) and e.retry_after == 2.5,
        ),
        (
            response(
                _error(
                    "This model's maximum context length is 4096 tokens. However, your "
                    "request has 5000 input tokens. Please reduce the length of the input."
                ),
                status="400 Bad Request",
            ),
            lambda e: (
                isinstance(e, PromptTooLong) and (e.prompt_tokens, e.max_tokens) == (5000, 4096)
            ),
        ),
        (
            response(
                _error(
                    "This model's maximum context length is 4096 tokens. However, you "
                    "requested 5000 tokens (3000 in the messages, 2000 in the completion)."
                ),
                status="400 Bad Request",
            ),
            lambda e: (
                isinstance(e, UpstreamRejected)
                and e.overflow is not None
                and e.overflow.max_tokens_room == 1096
            ),
        ),
        (
            # a chunked error body, read to its end
            response(b"", "Transfer-Encoding: chunked", status="500 Oops", length=False)
            + chunked(b'{"error": {"mess', b'age": "kaput"}}')
            + b"0\r\n\r\n",
            lambda e: (
                type(e) is UpstreamError and e.upstream_status == 500 and "kaput" in e.message
            ),
        ),
    ],
    ids=["503-retry-after", "429", "prompt-too-long", "max-tokens-over", "500-chunked"],
)
def test_error_status_raises_the_mapped_error(answer, check):
    async def main():
        async with RawServer(echo(lambda req: answer)) as srv:
            async with client() as up:
                with pytest.raises(GatewayError) as ei:
                    await fetch(up, srv.url)
                assert check(ei.value), ei.value
                # the error's connection is not left counted
                assert pool_of(up.http).open_connections == 0

    run(main())


@pytest.mark.parametrize(
    "name, value, status",
    [
        ("authorization", f"Bearer {SECRET}", "500 Internal Server Error"),
        ("x-api-key", SECRET, "400 Bad Request"),
    ],
)
def test_credential_echoed_in_an_error_is_scrubbed(name, value, status):
    def reply(req: Request) -> bytes:
        echoed = f"invalid request, headers were {req.headers}"
        return response(_error(echoed), status=status)

    async def main():
        async with RawServer(echo(reply)) as srv:
            async with client() as up:
                with pytest.raises(GatewayError) as ei:
                    await fetch(up, srv.url, headers={name: value})
        assert srv.requests[0].headers[name] == value  # it was sent, and echoed
        assert "<redacted>" in ei.value.message
        assert SECRET not in ei.value.message and SECRET not in str(ei.value)

    run(main())
