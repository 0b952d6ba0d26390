"""The command line: key digests, config errors, the loopback rule, the example config."""

from __future__ import annotations

import hashlib
from pathlib import Path

from click.testing import CliRunner

from prefixgate.cli import main
from prefixgate.config import load_config
from prefixgate.gateway import NullRecorder

EXAMPLE = (
    Path(__file__).resolve().parents[1] / "src" / "prefixgate" / "examples" / "prefixgate.yaml"
)


def test_keys_hash_and_new():
    r = CliRunner().invoke(main, ["keys", "hash", "sk-abc"])
    assert r.exit_code == 0 and r.output.strip() == hashlib.sha256(b"sk-abc").hexdigest()
    r = CliRunner().invoke(main, ["keys", "new"])
    lines = dict(line.split(":", 1) for line in r.output.strip().splitlines())
    key, digest = lines["key"].strip(), lines["key_sha256"].strip()
    assert key.startswith("pg-") and hashlib.sha256(key.encode()).hexdigest() == digest


def test_serve_refuses_open_access_beyond_loopback():
    r = CliRunner().invoke(
        main, ["serve", "--upstream", "http://127.0.0.1:8000/v1", "--host", "0.0.0.0"]
    )
    assert r.exit_code != 0 and "without API keys" in r.output


def test_serve_reports_config_errors_clearly(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("channels:\n  - name: a\n    base_url: ftp://nope\n")
    r = CliRunner().invoke(main, ["serve", "--config", str(bad)])
    assert r.exit_code != 0
    assert "channels.0.base_url" in r.output and "Traceback" not in r.output


def test_example_config_is_valid(monkeypatch):
    monkeypatch.setenv("PREFIXGATE_CI_KEY", "x")
    config = load_config(EXAMPLE)
    assert [c.name for c in config.channels] == ["h200-vllm", "vendor"]
    vllm, vendor = config.channels
    assert vllm.strip_billing_header and not vendor.strip_billing_header
    assert vllm.upstream_model("llm-prime") == "deepseek-v4-flash-0731"
    assert config.keys[0].allows("llm-prime") and not config.keys[0].allows("other")


def test_keys_create_list_revoke_and_the_gateway_accepts_them(tmp_path, upstream):
    import time

    import httpx

    from prefixgate.config import parse_config
    from prefixgate.serve.app import create_app
    from prefixgate.serve.process import ServerThread

    dsn = f"sqlite:///{tmp_path / 'k.db'}"
    runner = CliRunner()
    r = runner.invoke(
        main, ["keys", "create", "alice", "--owner", "team-a", "--models", "m", "--store", dsn]
    )
    assert r.exit_code == 0, r.output
    key = r.stdout.strip().splitlines()[0]
    assert key.startswith("pg-")
    r = runner.invoke(main, ["keys", "create", "alice", "--store", dsn])
    assert r.exit_code != 0 and "exists" in r.output
    r = runner.invoke(main, ["keys", "list", "--store", dsn, "--json"])
    rows = __import__("json").loads(r.output)
    assert (
        rows[0]["name"] == "alice" and rows[0]["models"] == ["m"] and rows[0]["revoked_at"] is None
    )
    assert key not in r.output and key not in (tmp_path / "k.db").read_bytes().decode("latin-1")

    config = parse_config(
        {
            "channels": [{"name": "c", "base_url": upstream.url}],
            "store": {"dsn": dsn},
            "store_keys": True,
        }
    )
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
    with ServerThread(create_app(config, recorder=NullRecorder())) as gw:
        deadline = time.monotonic() + 10
        status = 0
        while time.monotonic() < deadline and status != 200:
            status = httpx.post(
                gw.url + "/v1/messages", json=body, headers={"x-api-key": key}
            ).status_code
            time.sleep(0.1)
        assert status == 200
        assert (
            httpx.post(
                gw.url + "/v1/messages", json=body, headers={"x-api-key": "pg-other"}
            ).status_code
            == 401
        )
        r = runner.invoke(main, ["keys", "revoke", "alice", "--store", dsn])
        assert r.exit_code == 0
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and status != 401:
            status = httpx.post(
                gw.url + "/v1/messages", json=body, headers={"x-api-key": key}
            ).status_code
            time.sleep(0.2)
        assert status == 401
    r = runner.invoke(main, ["keys", "revoke", "alice", "--store", dsn])
    assert r.exit_code != 0


def test_demo_and_doctor_commands(tmp_path):
    import json

    runner = CliRunner()
    store = tmp_path / "d.db"
    r = runner.invoke(
        main, ["demo", "--sessions", "4", "--turns", "6", "--store", str(store), "--json"]
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    kept = out["phases"][0]["entries"]["messages"]
    assert kept["pinned_value"] and out["doctor_predicted_rate"] > kept["hit_rate"]
    r = runner.invoke(main, ["doctor", "--store", f"sqlite:///{store}", "--json"])
    assert r.exit_code == 2  # a critical finding, for cron
    kinds = [f["kind"] for f in json.loads(r.stdout)["findings"]]
    assert "prefix_broken" in kinds
    r = runner.invoke(main, ["doctor", "--store", f"sqlite:///{store}"])
    assert "strip_anthropic_billing_header" in r.output
    r = runner.invoke(main, ["doctor", "--store", f"sqlite:///{tmp_path}/missing.db"])
    assert r.exit_code == 1 and "no store at" in r.output
    r = runner.invoke(main, ["doctor", "--store", f"sqlite:///{store}", "--since", "yesterday-ish"])
    assert r.exit_code == 2 and "Traceback" not in r.output
