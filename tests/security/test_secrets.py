"""Rows 4, 7 and 9 of the security review (issue 29): no credential from an upstream URL
is ever kept, the gateway's own key format is redacted from captured texts, the simulated
upstream asks for a key, and the doctor's DSN redaction is whole."""

from __future__ import annotations

import secrets

import httpx
import pytest
from click.testing import CliRunner

from prefixgate.cli import main
from prefixgate.config import ConfigError, parse_config
from prefixgate.doctor.diagnose import _safe_dsn
from prefixgate.lab.upstream_sim.app import create_upstream_app
from prefixgate.lab.upstream_sim.settings import SimSettings
from prefixgate.record.redact import redact
from prefixgate.serve.process import ServerThread


@pytest.mark.parametrize(
    "channel",
    [
        {"base_url": "http://user:s3cret-pw@127.0.0.1:9/v1"},
        {"base_url": "http://127.0.0.1:9/v1", "replicas": ["https://:s3cret-pw@h2/v1"]},
        {"base_url": "http://127.0.0.1:9/v1", "metrics_url": "http://u:s3cret-pw@h/metrics"},
    ],
)
def test_credentials_in_an_upstream_url_are_refused_at_load(channel):
    with pytest.raises(ConfigError) as exc:
        parse_config({"channels": [{"name": "c", **channel}]})
    assert "user or password in an upstream URL" in str(exc.value)
    assert "s3cret-pw" not in str(exc.value)


def test_serve_with_credentials_in_the_upstream_says_so_without_them():
    result = CliRunner().invoke(main, ["serve", "--upstream", "http://u:s3cret-pw@h/v1"])
    assert result.exit_code != 0
    assert "s3cret-pw" not in result.output


def test_the_gateways_own_keys_are_redacted():
    for prefix in ("pg-",):
        key = prefix + secrets.token_urlsafe(32)
        for text in (f"my key is {key}.", f'{{"k": "{key}"}}', f"export PG={key}"):
            assert key not in redact(text) and "<redacted>" in redact(text)


def test_the_simulated_upstream_asks_for_its_key():
    with ServerThread(create_upstream_app(SimSettings(api_key="sim-key"))) as sim:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        url = sim.url + "/v1/chat/completions"
        assert httpx.post(url, json=body).status_code == 401
        bad = {"authorization": "Bearer wrong"}
        assert httpx.post(url, json=body, headers=bad).status_code == 401
        assert httpx.get(sim.url + "/metrics").status_code == 401
        good = {"authorization": "Bearer sim-key"}
        assert httpx.post(url, json=body, headers=good).status_code == 200
        assert httpx.get(sim.url + "/health").status_code == 200  # probes need no key


def test_a_keyless_simulated_upstream_stays_on_loopback():
    result = CliRunner().invoke(main, ["upstream-sim", "--host", "0.0.0.0", "--port", "1"])
    assert result.exit_code != 0 and "loopback" in result.output


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://app:pa@ss-w0rd@db.internal:5432/records",
        "postgresql://db.internal/records?password=pa@ss-w0rd&sslmode=require",
        "postgresql://app@db.internal/records?sslpassword=pa@ss-w0rd",
        "host=db.internal password=pa@ss-w0rd dbname=records",
        "host=db.internal password='pa@ss-w0rd x' dbname=records",
    ],
)
def test_the_doctor_prints_no_password_of_a_dsn(dsn):
    safe = _safe_dsn(dsn)
    assert "pa@ss" not in safe and "w0rd" not in safe and "db.internal" in safe
