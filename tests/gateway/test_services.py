"""``async with Gateway.from_config(config)`` starts every service and stops each, in the
reverse order of the starts; a start that fails stops those already started."""

from __future__ import annotations

import asyncio

import pytest

from prefixgate.config import parse_config
from prefixgate.gateway import Gateway
from prefixgate.services import STARTS


def _config(tmp_path):
    return parse_config(
        {
            "channels": [
                {"name": "c", "base_url": "http://127.0.0.1:9/v1", "render_order": "tools_first"}
            ],
            "store": {"dsn": f"sqlite:///{tmp_path}/s.db", "journal_path": str(tmp_path / "j")},
            "server": {"loop_watch": True},
        }
    )


def _recording(log: list, name: str, fail: bool = False):
    async def start(gw, stack) -> None:
        if fail:
            raise RuntimeError(f"{name} cannot start")
        log.append(f"start {name}")
        stack.callback(log.append, f"stop {name}")

    return start


def test_every_service_starts_and_stops(tmp_path):
    gw = Gateway.from_config(_config(tmp_path))
    assert gw.services == STARTS
    closed = []
    for name in ("upstream", "router", "recorder", "ledger", "limiter"):
        service = getattr(gw, name)
        if name == "upstream":
            service = service.http  # the HTTP client the engine client reads answers of
        stop = "close" if name == "recorder" else "aclose"
        original = getattr(service, stop)

        async def spy(*a, _name=name, _original=original, **kw):
            closed.append(_name)
            return await _original(*a, **kw)

        setattr(service, stop, spy)

    async def main() -> None:
        async with gw:
            assert gw.metrics.loop._handle is not None  # the loop watch runs
            assert gw.recorder._task is not None  # the writer's batches go to the store
            assert closed == []
        assert gw.metrics.loop._handle is None
        assert gw.recorder._closed

    asyncio.run(main())
    # each stop in the reverse order of its service's start
    assert closed == ["ledger", "router", "recorder", "limiter", "upstream"]


def test_services_stop_in_the_reverse_order_of_their_starts(tmp_path):
    log: list[str] = []
    gw = Gateway.from_config(_config(tmp_path))
    gw.services = (_recording(log, "a"), *STARTS, _recording(log, "b"), _recording(log, "c"))

    async def main() -> None:
        async with gw:
            assert log == ["start a", "start b", "start c"]

    asyncio.run(main())
    assert log == ["start a", "start b", "start c", "stop c", "stop b", "stop a"]


def test_a_start_that_fails_stops_those_already_started(tmp_path):
    log: list[str] = []
    gw = Gateway.from_config(_config(tmp_path))
    gw.services = (*STARTS, _recording(log, "a"), _recording(log, "b", fail=True))

    async def main() -> None:
        with pytest.raises(RuntimeError, match="b cannot start"):
            async with gw:
                pytest.fail("the gateway started")
        assert gw.recorder._closed  # the writer, started before, is stopped
        assert gw.metrics.loop._handle is None

    asyncio.run(main())
    assert log == ["start a", "stop a"]
