"""Busy polling (busypoll.py): the loop polls after activity, stops when the window closes
or the budget is spent, and a gateway that busy-polls serves exactly as one that sleeps."""

from __future__ import annotations

import asyncio
import time

import anthropic
import openai
import pytest

from prefixgate import busypoll
from prefixgate.config import ConfigError, parse_config
from prefixgate.serve.app import create_app
from prefixgate.serve.process import ServerThread
from tests.conftest import ListRecorder, settled
from tests.fakes import Reply


async def _until(cond, limit: float = 5.0) -> None:
    deadline = time.monotonic() + limit
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.001)


@pytest.fixture
def every_turn_counts(monkeypatch):
    """Count every polling turn against the budget, however long: a slow or loaded machine
    (a profiler, a busy CI) makes idle turns longer than ``_IDLE_TURN``, and the window and
    budget are what these tests check (the idle-turn rule has its own test)."""
    monkeypatch.setattr(busypoll, "_IDLE_TURN", 1.0)


def test_polls_for_the_window_after_activity_then_sleeps(every_turn_counts):
    async def main():
        loop = asyncio.get_running_loop()
        p = busypoll.poller_for(loop, window_us=20_000, share=1.0)
        assert p is not None and not p.spinning
        started = time.perf_counter()
        p.touch()
        assert p.spinning
        await _until(lambda: not p.spinning)
        # the window closed by itself; what it spent were turns inside it
        assert 0 < p.spent <= time.perf_counter() - started
        spent = p.spent
        await asyncio.sleep(0.03)  # no activity: nothing more is spent
        assert p.spent == spent and not p.spinning

    asyncio.run(main())


def test_the_budget_caps_polling_within_a_second(every_turn_counts):
    async def main():
        loop = asyncio.get_running_loop()
        # A 10 s window, but at most 2 % of a second polled.
        p = busypoll.poller_for(loop, window_us=10_000_000, share=0.02)
        assert p is not None
        p.touch()
        await _until(lambda: not p.spinning)  # only the budget can have stopped it
        assert p.spent >= 0.02
        if time.perf_counter() - p.second < 0.9:  # same second: no new polling
            p.touch()
            assert not p.spinning

    asyncio.run(main())


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class _Loop:
    """Holds what the poller schedules, to run it turn by turn."""

    def __init__(self) -> None:
        self.ready: list = []

    def call_soon(self, fn) -> None:
        self.ready.append(fn)

    def turn(self) -> bool:
        ready, self.ready = self.ready, []
        for fn in ready:
            fn()
        return bool(self.ready)


def test_only_idle_turns_count_against_the_budget(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(busypoll, "perf_counter", clock)
    loop = _Loop()
    p = busypoll.BusyPoll(loop, window=0.001, share=0.5)
    p.touch()
    assert p.spinning and len(loop.ready) == 1
    clock.now += 10e-6  # an idle turn: counted
    assert loop.turn()
    assert p.spent == pytest.approx(10e-6)
    clock.now += 300e-6  # the loop was working: not counted
    assert loop.turn()
    assert p.spent == pytest.approx(10e-6)
    clock.now += 20e-6
    assert loop.turn()
    assert p.spent == pytest.approx(30e-6)
    clock.now += 0.001  # the window closed since the last activity: polling stops
    assert not loop.turn()
    assert not p.spinning
    p.touch()  # new activity, same second, budget left: polling again
    assert p.spinning


def test_zero_turns_it_off():
    async def main():
        loop = asyncio.get_running_loop()
        assert busypoll.poller_for(loop, window_us=0) is None

    asyncio.run(main())


@pytest.mark.parametrize("value", [-1, 200_000])
def test_config_refuses_out_of_range_windows(value):
    with pytest.raises(ConfigError):
        parse_config(
            {
                "channels": [{"name": "a", "base_url": "http://127.0.0.1:1/v1"}],
                "server": {"busy_poll_us": value},
                "store": None,
            }
        )


def test_busy_polling_is_off_by_default_and_opt_in():
    channels = [{"name": "a", "base_url": "http://127.0.0.1:1/v1"}]
    cfg = parse_config({"channels": channels})
    assert cfg.server.busy_poll_us == 0 and 0 < cfg.server.busy_poll_share <= 1
    cfg = parse_config({"channels": channels, "server": {"busy_poll_us": 200}})
    assert cfg.server.busy_poll_us == 200


def test_a_busy_polling_gateway_serves_both_apis_and_records(upstream):
    cfg = parse_config({"channels": [{"name": "main", "base_url": upstream.url}], "store": None})
    rec = ListRecorder()
    app = create_app(cfg, recorder=rec)
    upstream.script = lambda body: Reply(text="polled", prompt_tokens=50, cached_tokens=32)
    with ServerThread(app, busy_poll_us=500) as srv:
        poller = srv.server.poller
        assert poller is not None
        with anthropic.Anthropic(base_url=srv.url, api_key="k", max_retries=0) as a:
            msg = a.messages.create(
                model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
            )
            assert msg.content[0].text == "polled"
            with a.messages.stream(
                model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
            ) as s:
                assert s.get_final_message().usage.cache_read_input_tokens == 32
        with openai.OpenAI(base_url=srv.url + "/v1", api_key="k", max_retries=0) as o:
            r = o.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
            assert r.choices[0].message.content == "polled"
        assert poller.last > 0  # the sockets' events reached it
        # and the upstream connections its requests opened touch the same poller
        idle = app.state.gateway.upstream.http._pool._idle.values()
        upstream_conns = [c for conns in idle for c in conns]
        assert upstream_conns and all(c.poller is poller for c in upstream_conns)
        settled(app.state.gateway)
        assert [r.status for r in rec.records] == [200, 200, 200]
    assert srv.server.poller is None  # the server is done with it
