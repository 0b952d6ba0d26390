"""The real Claude Code CLI (npm ``@anthropic-ai/claude-code``, pinned) through the gateway.

The upstream is the simulated vLLM (``prefixgate.upstream_sim``, block size 32): deterministic and
fast, with a recording wrapper that keeps every body the gateway sent upstream. The CLI
runs offline with a throw-away HOME, so it talks to nothing but the gateway.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx

from prefixgate.config import parse_config
from prefixgate.serve.app import build_app
from prefixgate.serve.process import ServerThread
from prefixgate.store import open_store
from prefixgate.upstream_sim import SimSettings, create_upstream_app
from tests.fakes import RecordingUpstream

BLOCK = 32
MODEL = "sim-model"
BILLING = "x-anthropic-billing-header"


@contextlib.contextmanager
def stack(tmp_path: Path, **sim) -> Iterator[tuple[str, str, RecordingUpstream]]:
    """Simulated vLLM → gateway (store in tmp_path, segment texts captured); yields
    ``(gateway url, store dsn, upstream recorder)``; the store is complete after exit."""
    upstream = RecordingUpstream(create_upstream_app(SimSettings(block_size=BLOCK, **sim)))
    dsn = f"sqlite:///{tmp_path / 'store.db'}"
    with ServerThread(upstream) as up:
        config = parse_config(
            {
                "channels": [{"name": "sim", "base_url": up.url + "/v1", "capture_text": True}],
                "store": {"dsn": dsn, "journal_path": str(tmp_path / "journal")},
            }
        )
        with ServerThread(build_app(config)) as gw:
            yield gw.url, dsn, upstream


class Claude:
    """Runs ``claude -p`` against a base URL, offline, in its own HOME and work folder."""

    def __init__(self, exe: Path, base_url: str, tmp_path: Path) -> None:
        self.exe = exe
        self.home = tmp_path / "home"
        self.work = tmp_path / "work"
        self.home.mkdir()
        self.work.mkdir()
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.home),
            "ANTHROPIC_BASE_URL": base_url,
            "ANTHROPIC_API_KEY": "test-key",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "CLAUDE_CODE_MAX_CONTEXT_TOKENS": "200000",  # the sim's window is unknown to it
        }

    def run(self, prompt: str, *, resume: bool = False) -> dict:
        args = [str(self.exe), "-p", prompt, "--output-format", "json", "--model", MODEL]
        if resume:
            args.append("--continue")
        proc = subprocess.run(
            args, cwd=self.work, env=self.env, capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        result = json.loads(proc.stdout)
        assert result["is_error"] is False and result["subtype"] == "success", result
        assert isinstance(result["result"], str) and result["result"]
        return result


def records(dsn: str) -> list:
    with open_store(dsn) as store:
        return [r for r in store.iter_records(with_texts=True) if r.endpoint == "messages"]


def test_two_turns_billing_header_stripped_and_second_turn_hits(claude_exe, tmp_path):
    with stack(tmp_path) as (url, dsn, upstream):
        cli = Claude(claude_exe, url, tmp_path)
        first = cli.run("say hi")
        second = cli.run("and once more", resume=True)
    assert first["session_id"] == second["session_id"]
    recs = [r for r in records(dsn) if r.status == 200]
    assert len(recs) == 2, [(r.status, r.prompt_tokens) for r in recs]
    # the billing header reached the gateway as system[0] ...
    for rec in recs:
        head = rec.segments_in[0]
        assert head.name == "system[0]"
        assert json.loads(rec.texts[head.hash])["text"].startswith(BILLING)
    # ... and never went upstream
    chats = upstream.chats()
    assert len(chats) == 2
    for entry in chats:
        assert BILLING not in json.dumps(entry["body"])
        assert entry["body"]["messages"][0]["role"] == "system"
    # the second turn's cache hit covers the first turn's prompt (all its full blocks)
    p1, c2 = recs[0].prompt_tokens, recs[1].cached_tokens
    assert c2 % BLOCK == 0 and c2 >= (p1 - 1) // BLOCK * BLOCK
    assert second["usage"]["cache_read_input_tokens"] == c2
    assert first["usage"]["cache_read_input_tokens"] == 0


def _notes(seed: int, words: tuple[str, ...], n: int = 5000) -> str:
    rng = random.Random(seed)
    return "Read these notes and reply OK.\n" + " ".join(rng.choice(words) for _ in range(n))


# the simulated vLLM's wording for a prompt over the window
_PROMPT_TOO_LONG = re.compile(r"However, your request has (\d+) input tokens")


def test_context_overflow_makes_the_cli_compact_and_retry(claude_exe, tmp_path):
    """Window 24000: the first long turn fits (~19.5k), the second (~27k) does not; the
    gateway turns vLLM's error into ``prompt is too long``; the CLI compacts and retries."""
    window = 24000
    with stack(tmp_path, max_model_len=window) as (url, dsn, upstream):
        cli = Claude(claude_exe, url, tmp_path)
        cli.run(_notes(1, ("red", "green", "blue", "cyan", "black", "white")))
        cli.run(_notes(2, ("alpha", "beta", "gamma", "delta", "omega", "kappa")), resume=True)
        # what the CLI was told, asked directly: Anthropic's wording, which it acts on
        resp = httpx.post(
            url + "/v1/messages",
            headers={"anthropic-version": "2023-06-01", "x-api-key": "k"},
            json={
                "model": MODEL,
                "max_tokens": 8,
                "messages": [{"role": "user", "content": "x " * 60000}],
            },
            timeout=60,
        )
    assert resp.status_code == 400
    assert re.fullmatch(
        rf"prompt is too long: \d+ tokens > {window} maximum", resp.json()["error"]["message"]
    )
    # upstream: a prompt over the window was refused ...
    too_long = [
        int(m.group(1))
        for e in upstream.chats()
        if e["status"] == 400 and (m := _PROMPT_TOO_LONG.search(e["error"] or ""))
        if int(m.group(1)) >= window
    ]
    assert too_long, [(e["status"], (e["error"] or "")[:120]) for e in upstream.chats()]
    # ... the client saw Anthropic's wording (recorded as a 400 on /v1/messages) ...
    recs = records(dsn)
    statuses = [r.status for r in recs]
    first_400 = statuses.index(400)
    assert recs[first_400].error_type == "invalid_request_error"
    # ... and later requests succeeded with a smaller prompt (the compacted history)
    after = [r for r in recs[first_400 + 1 :] if r.status == 200]
    assert len(after) >= 2  # the compaction request and the retried turn
    assert after[-1].prompt_tokens < min(too_long)
    assert after[-1].prompt_tokens < window
