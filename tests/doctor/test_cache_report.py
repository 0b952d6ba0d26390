"""Absent is not off: responses without a cached-token figure, told apart — the report is
off, or nothing hit — with the evidence said (metrics, an active probe, the records)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from prefixgate.cli import main
from prefixgate.doctor import diagnose, exit_code
from prefixgate.lab.traffic import breakers as bk
from prefixgate.lab.upstream_sim import SimSettings, create_upstream_app
from prefixgate.serve.process import ServerThread
from tests.doctor import live


def kinds(d, kind):
    return [f for f in d.findings if f.kind == kind]


def test_an_older_vllm_that_never_hit_is_not_called_off(tmp_path):
    """The issue's worst case: block 64, the system prompt before the tools, the billing
    header at token 0, and a vLLM that omits a zero: every request missed, and no response
    carried a figure."""
    dsn, _ = live.record(
        bk.BILLING,
        f"sqlite:///{tmp_path / 'b.db'}",
        block=64,
        order="system_first",
        sim={"vllm_version": "0.10.1"},
    )
    d = diagnose(dsn)
    assert not kinds(d, "cache_report_off")
    [absent] = kinds(d, "cache_report_absent")
    assert absent.severity == "info"
    assert absent.facts["channels"]["vllm"]["evidence"] == "records"
    [broken] = [f for f in d.findings if f.facts.get("breaker")]
    assert broken.facts["breaker"]["known"] == "billing_header" and broken.severity == "critical"
    assert broken.facts["breaker"]["at_tokens"] < 64
    assert exit_code(d) == 2


def test_a_report_that_is_off_is_told_by_the_records(tmp_path):
    dsn, _ = live.record(
        bk.CONTROL, f"sqlite:///{tmp_path / 'c.db'}", sim={"report_cached_tokens": False}
    )
    d = diagnose(dsn)
    [f] = kinds(d, "cache_report_off")
    assert f.title == "the upstream's cache report is off on channel(s) vllm"
    assert f.facts["channels"]["vllm"]["evidence"] == "records"
    assert any("--enable-prompt-tokens-details" in x for x in f.fix)


def test_the_engines_metrics_come_first(tmp_path):
    """The same silent responses; the engine's own counters say it hit."""
    settings = SimSettings(report_cached_tokens=False)
    with ServerThread(create_upstream_app(settings)) as sim:
        dsn, _ = live.record(
            bk.CONTROL, f"sqlite:///{tmp_path / 'm.db'}", sim={"report_cached_tokens": False}
        )
        # this engine served traffic of its own and hit: its counters are the evidence
        for _ in range(2):
            live.httpx.post(
                sim.url + "/v1/chat/completions",
                json={"model": "m", "messages": [{"role": "user", "content": "x " * 500}]},
            )
        d = diagnose(dsn, channel_metrics={"vllm": sim.url + "/metrics"})
    [f] = kinds(d, "cache_report_off")
    assert f.facts["channels"]["vllm"]["evidence"] == "metrics"
    assert "prefix-cache hit tokens" in f.facts["channels"]["vllm"]["detail"]


def _config(tmp_path, upstream: str, dsn: str) -> str:
    path = tmp_path / "gw.yaml"
    path.write_text(
        json.dumps(
            {
                "channels": [
                    {"name": "vllm", "base_url": upstream, "models": ["sim-model"]},
                ],
                "store": {"dsn": dsn},
            }
        )
    )
    return str(path)


def test_the_probe_tells_on_from_off(tmp_path):
    """`prefixgate doctor --probe`: two identical requests to the channel's upstream."""
    dsn, _ = live.record(
        bk.CONTROL, f"sqlite:///{tmp_path / 'p.db'}", sim={"report_cached_tokens": False}
    )
    runner = CliRunner()
    for settings, verdict, kind in (
        (SimSettings(report_cached_tokens=False), "off", "cache_report_off"),
        (SimSettings(vllm_version="0.10.1"), "nothing_hit", "cache_report_absent"),
    ):
        with ServerThread(create_upstream_app(settings)) as sim:
            cfg = _config(tmp_path, sim.url + "/v1", dsn)
            r = runner.invoke(main, ["doctor", "--config", cfg, "--probe", "--json"])
        assert r.exit_code in (0, 2), r.output
        d = json.loads(r.output)
        [f] = [x for x in d["findings"] if x["kind"] == kind]
        ch = f["facts"]["channels"]["vllm"]
        assert (ch["verdict"], ch["evidence"]) == (verdict, "probe")


def test_the_probe_needs_a_config(tmp_path):
    r = CliRunner().invoke(main, ["doctor", "--store", str(tmp_path / "x.db"), "--probe"])
    assert r.exit_code == 2 and "--probe needs --config" in r.output
