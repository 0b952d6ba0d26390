"""Running an endpoint's steps: a client that leaves while its body arrives."""

from __future__ import annotations

import asyncio
import logging

from starlette.requests import Request

from prefixgate.apis.messages.endpoint import ENDPOINT as MESSAGES
from prefixgate.config import parse_config
from prefixgate.gateway import Gateway
from prefixgate.pipeline import Exchange, run
from tests.conftest import ListRecorder

CONFIG = parse_config({"channels": [{"name": "c", "base_url": "http://up/v1"}], "store": None})


def test_a_client_that_leaves_mid_body_leaves_a_499_record_and_no_traceback(caplog):
    recorder = ListRecorder()
    gw = Gateway.from_config(CONFIG, recorder=recorder)
    messages = [
        {"type": "http.request", "body": b'{"model": "m", "mess', "more_body": True},
        {"type": "http.disconnect"},
    ]

    async def receive():
        return messages.pop(0)

    scope = {"type": "http", "method": "POST", "path": "/v1/messages", "headers": []}
    with caplog.at_level(logging.WARNING):
        response = asyncio.run(run(Exchange(gw, Request(scope, receive), MESSAGES)))
    assert response.status_code == 499
    [rec] = recorder.records
    assert (rec.status, rec.error_type) == (499, "client_disconnected")
    assert gw.open_records == 0
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
