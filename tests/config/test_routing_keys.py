"""A channel's ``routing:`` and ``health:`` sections, and the flat keys they replace
(``routing: prefix`` as a string, ``routing_balance_abs``, ``health_check_interval``...):
still read, with one warning that names the new keys."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from prefixgate.config import (
    ChannelConfig,
    ConfigError,
    HealthConfig,
    RoutingConfig,
    load_config,
    parse_config,
)

EXAMPLE = (
    Path(__file__).resolve().parents[2] / "src" / "prefixgate" / "examples" / "prefixgate.yaml"
)
URL = "http://10.0.0.1:8000/v1"


def channel(name: str = "c", **kw) -> dict:
    return {"name": name, "base_url": URL, **kw}


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "prefixgate.config"]


NESTED = {
    "routing": {
        "policy": "prefix",
        "block_size": 32,
        "match_threshold": 0.5,
        "balance_abs": 8,
        "balance_rel": 2.0,
        "lru_blocks": 1024,
        "shared": "redis://127.0.0.1:6379/0",
        "shared_ttl": 60,
    },
    "health": {"interval": 5, "path": "/v1/models", "timeout": 1.5},
}


def test_nested_sections_and_their_defaults(caplog) -> None:
    caplog.set_level(logging.WARNING)
    routing, health = NESTED["routing"], NESTED["health"]
    cfg = parse_config({"channels": [channel(routing=routing, health=health), channel("d")]})
    ch, plain = cfg.channels
    assert ch.routing == RoutingConfig(**routing) and ch.health == HealthConfig(**health)
    assert (ch.routing.policy, ch.routing.block_size, ch.health.interval) == ("prefix", 32, 5.0)
    assert plain.routing == RoutingConfig() and plain.health == HealthConfig()
    assert (plain.routing.policy, plain.routing.block_size, plain.routing.lru_blocks) == (
        "session",
        16,
        65536,
    )
    assert (plain.health.interval, plain.health.path, plain.health.timeout) == (
        None,
        "/health",
        2.0,
    )
    assert warnings_of(caplog) == []


@pytest.mark.parametrize(
    "section, complaint",
    [
        ({"routing": {"policy": "fastest"}}, "channels.0.routing.policy"),
        ({"routing": {"match_threshold": 1.5}}, "channels.0.routing.match_threshold"),
        ({"routing": {"shared": "http://x"}}, "redis://"),
        ({"routing": {"bogus": 1}}, "channels.0.routing.bogus"),
        ({"health": {"interval": 0}}, "channels.0.health.interval"),
        ({"health": {"timeout": -1}}, "channels.0.health.timeout"),
    ],
)
def test_the_sections_are_checked(section, complaint) -> None:
    with pytest.raises(ConfigError, match=complaint):
        parse_config({"channels": [channel(**section)]})


FLAT = {
    "routing": "prefix",
    "routing_block_size": 32,
    "routing_match_threshold": 0.5,
    "routing_balance_abs": 8,
    "routing_balance_rel": 2.0,
    "routing_lru_blocks": 1024,
    "routing_shared": "redis://127.0.0.1:6379/0",
    "routing_shared_ttl": 60,
    "health_check_interval": 5,
    "health_path": "/v1/models",
    "health_timeout": 1.5,
}


def test_the_flat_keys_load_as_the_nested_ones_with_one_warning(caplog) -> None:
    caplog.set_level(logging.WARNING)
    old = parse_config({"channels": [channel(**FLAT), channel("d", routing="least_busy")]})
    (warning,) = warnings_of(caplog)
    new = parse_config(
        {"channels": [channel(**NESTED), channel("d", routing={"policy": "least_busy"})]}
    )
    assert old == new
    assert "deprecated" in warning
    for line in (
        "channels[c].routing → routing.policy",
        "channels[c].routing_block_size → routing.block_size",
        "channels[c].routing_match_threshold → routing.match_threshold",
        "channels[c].routing_balance_abs → routing.balance_abs",
        "channels[c].routing_balance_rel → routing.balance_rel",
        "channels[c].routing_lru_blocks → routing.lru_blocks",
        "channels[c].routing_shared → routing.shared",
        "channels[c].routing_shared_ttl → routing.shared_ttl",
        "channels[c].health_check_interval → health.interval",
        "channels[c].health_path → health.path",
        "channels[c].health_timeout → health.timeout",
        "channels[d].routing → routing.policy",
    ):
        assert line in warning
    assert len(warnings_of(caplog)) == 1


def test_a_file_with_flat_keys_loads_with_one_warning(tmp_path, caplog) -> None:
    caplog.set_level(logging.WARNING)
    path = tmp_path / "old.yaml"
    path.write_text(
        "channels:\n"
        f"  - name: c\n    base_url: {URL}\n    routing: round_robin\n"
        "    routing_balance_abs: 8\n    health_check_interval: 5\n"
    )
    ch = load_config(path).channels[0]
    assert (ch.routing.policy, ch.routing.balance_abs, ch.health.interval) == ("round_robin", 8, 5)
    (warning,) = warnings_of(caplog)
    assert "routing_balance_abs → routing.balance_abs" in warning
    assert "health_check_interval → health.interval" in warning


def test_flat_keys_beside_their_section_are_merged_and_one_given_twice_is_an_error(
    caplog,
) -> None:
    caplog.set_level(logging.WARNING)
    cfg = parse_config({"channels": [channel(routing={"policy": "prefix"}, routing_balance_abs=8)]})
    assert (cfg.channels[0].routing.policy, cfg.channels[0].routing.balance_abs) == ("prefix", 8)
    assert len(warnings_of(caplog)) == 1
    with pytest.raises(ConfigError, match="health_timeout and health.timeout both given"):
        parse_config({"channels": [channel(health={"timeout": 1}, health_timeout=2)]})


def test_a_channel_built_alone_reads_the_flat_keys_with_one_warning(caplog) -> None:
    caplog.set_level(logging.WARNING)
    ch = ChannelConfig.model_validate(channel(routing="prefix", health_path="/ready"))
    assert (ch.routing.policy, ch.health.path) == ("prefix", "/ready")
    (warning,) = warnings_of(caplog)
    assert "routing → routing.policy" in warning and "health_path → health.path" in warning


def test_precise_needs_kv_events_in_either_form() -> None:
    for routing in ({"policy": "precise"}, "precise"):
        with pytest.raises(ConfigError, match="precise needs kv_events"):
            parse_config({"channels": [channel(routing=routing)]})


def test_the_example_config_is_nested_and_warns_of_nothing(monkeypatch, caplog) -> None:
    caplog.set_level(logging.WARNING)
    monkeypatch.setenv("PREFIXGATE_CI_KEY", "x")
    vllm = load_config(EXAMPLE).channels[0]
    assert (vllm.routing.policy, vllm.routing.balance_abs, vllm.health.interval) == ("prefix", 8, 5)
    assert warnings_of(caplog) == []
