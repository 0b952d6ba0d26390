"""Bind or connect, and the ``kv_events`` section of a channel."""

from __future__ import annotations

import pytest

from prefixgate.config import ConfigError, parse_config
from prefixgate.events import engine_binds, subscriber_endpoints


def test_the_subscriber_takes_the_other_side() -> None:
    e = subscriber_endpoints(
        "tcp://127.0.0.1:15557", "tcp://127.0.0.1:15558", "kv-events", "http://h:8000/v1"
    )
    assert (e.events, e.bind, e.replay, e.topic) == (
        "tcp://127.0.0.1:15557",
        True,  # the engine connects there: the subscriber binds
        "tcp://127.0.0.1:15558",
        "kv-events",
    )
    e = subscriber_endpoints("tcp://*:5557", "tcp://*:5558", "", "http://10.1.2.3:8000/v1")
    assert (e.events, e.bind, e.replay, e.mode) == (
        "tcp://10.1.2.3:5557",  # the engine binds on its host: connect there
        False,
        "tcp://10.1.2.3:5558",
        "connect",
    )
    e = subscriber_endpoints("tcp://[::]:5557", None, "", "http://[fd00::7]:8000/v1")
    assert (e.events, e.bind, e.replay) == ("tcp://[fd00::7]:5557", False, None)
    e = subscriber_endpoints("ipc:///run/kv.sock", None, "", "http://h/v1")
    assert (e.events, e.bind) == ("ipc:///run/kv.sock", False)
    assert engine_binds("inproc://x") and not engine_binds("tcp://10.0.0.1:1")


@pytest.mark.parametrize("bad", ["http://h:1", "tcp://nohost", "5557", ""])
def test_bad_endpoints(bad) -> None:
    with pytest.raises(ValueError):
        subscriber_endpoints(bad, None, "", "http://h/v1")


def channel(**kw) -> dict:
    return {"name": "c", "base_url": "http://10.0.0.1:8000/v1", **kw}


def test_config_one_replica() -> None:
    cfg = parse_config(
        {"channels": [channel(kv_events={"endpoint": "tcp://*:5557", "topic": "kv"})]}
    )
    kv = cfg.channels[0].kv_events
    assert kv is not None and kv.max_blocks == 200_000 and kv.block_size is None
    (ep,) = kv.endpoints_for(cfg.channels[0].urls()).values()
    assert (ep.events, ep.bind, ep.topic) == ("tcp://10.0.0.1:5557", False, "kv")


def test_config_several_replicas() -> None:
    urls = {"replicas": ["http://10.0.0.2:8000/v1"]}
    cfg = parse_config(
        {"channels": [channel(**urls, kv_events={"endpoint": "tcp://*:5557"})]}
    )  # each engine binds on its own host
    eps = cfg.channels[0].kv_events.endpoints_for(cfg.channels[0].urls())
    assert [e.events for e in eps.values()] == ["tcp://10.0.0.1:5557", "tcp://10.0.0.2:5557"]
    per_replica = {
        "replay_endpoint": "tcp://*:6000",
        "replicas": [
            {"endpoint": "tcp://192.168.0.9:5557"},
            {"endpoint": "tcp://192.168.0.9:5558", "replay_endpoint": "tcp://*:6001", "topic": "b"},
        ],
    }
    cfg = parse_config({"channels": [channel(**urls, kv_events=per_replica)]})
    a, b = cfg.channels[0].kv_events.endpoints_for(cfg.channels[0].urls()).values()
    assert (a.events, a.bind, a.replay, a.topic) == ("tcp://192.168.0.9:5557", True, None, "")
    assert (b.events, b.replay, b.topic) == ("tcp://192.168.0.9:5558", "tcp://10.0.0.2:6001", "b")


@pytest.mark.parametrize(
    "kv, complaint",
    [
        ({}, "needs an endpoint"),
        ({"endpoint": "udp://x:1"}, "tcp://"),
        ({"endpoint": "tcp://127.0.0.1:5557"}, "share one event address"),
        ({"replicas": [{"endpoint": "tcp://*:1"}]}, "1 entries for 2 replicas"),
        ({"endpoint": "tcp://*:5557", "max_blocks": 0}, "max_blocks"),
        ({"endpoint": "tcp://*:5557", "bogus": 1}, "bogus"),
    ],
)
def test_config_errors(kv, complaint) -> None:
    raw = channel(replicas=["http://10.0.0.1:8001/v1"], kv_events=kv)
    with pytest.raises(ConfigError, match=complaint):
        parse_config({"channels": [raw]})
