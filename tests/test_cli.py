"""The command line: key digests, config errors, the loopback rule, the example config."""

from __future__ import annotations

import hashlib
from pathlib import Path

from click.testing import CliRunner

from prefixgate.cli import main
from prefixgate.config import load_config

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
