"""Active health checks against real (simulated) replicas on loopback."""

from __future__ import annotations

import asyncio

from prefixgate.config import parse_config
from prefixgate.lab.upstream_sim import SimSettings, SimUpstream
from prefixgate.routing import ChannelRouter, health_url


def test_health_url_is_the_root_plus_the_path():
    assert health_url("http://h:8000/v1") == "http://h:8000/health"
    assert health_url("http://h:8000/v1/") == "http://h:8000/health"
    assert health_url("http://h:8000/api", "ready") == "http://h:8000/api/ready"


def test_probe_marks_a_dead_replica_down_and_back_up():
    live = SimUpstream(SimSettings()).start()
    dead = SimUpstream(SimSettings()).start()
    port = dead.port
    dead.stop()  # nothing listens on its port now
    revived = None
    try:
        config = parse_config(
            {
                "channels": [
                    {
                        "name": "c",
                        "base_url": live.base_url,
                        "replicas": [f"http://127.0.0.1:{port}/v1"],
                        "health": {"interval": 0.05, "timeout": 2.0},
                    }
                ],
                "store": None,
            }
        )
        router = ChannelRouter(config.channels)
        dead_url = f"http://127.0.0.1:{port}/v1"

        async def until(cond, what: str) -> None:
            for _ in range(400):  # generous: up to ~20 s on a loaded machine
                if cond():
                    return
                await asyncio.sleep(0.05)
            raise AssertionError(f"timed out waiting for: {what}")

        async def scenario() -> None:
            nonlocal revived
            verdicts = await router.health.check_all()
            assert verdicts == {live.base_url: True, dead_url: False}
            assert router.is_down(dead_url) and not router.is_down(live.base_url)
            targets = await router.plan("m", "any")
            assert targets[-1].base_url == dead_url  # a last resort only
            await router.start()  # the periodic task from here on
            try:
                revived = SimUpstream(SimSettings(), port=port).start()
                await until(lambda: not router.is_down(dead_url), "replica back up")
                revived.stop()
                await until(lambda: router.is_down(dead_url), "replica down again")
            finally:
                await router.aclose()

        asyncio.run(scenario())
    finally:
        live.stop()
        if revived is not None and revived._thread.is_alive():
            revived.stop()
