"""Through the real gateway with the official anthropic SDK against simulated replicas:
sessions stick to a replica (high hit rates), and a replica killed mid-run costs no
request that had not received a byte; records name the replica that served them."""

from __future__ import annotations

import threading
import time

import anthropic
import pytest

from prefixgate.config import parse_config
from prefixgate.lab.upstream_sim import SimSettings, start_upstreams_in_thread
from prefixgate.serve.app import create_app
from prefixgate.serve.process import ServerThread
from tests.conftest import ListRecorder, settled

SYSTEM = "You are a careful coding agent working in a large repository. " * 40


def _stack(policy: str, replicas: int = 3):
    ups = start_upstreams_in_thread(SimSettings(default_output_tokens=8), replicas=replicas)
    channel = {
        "name": "sim",
        "base_url": ups[0].base_url,
        "replicas": [u.base_url for u in ups[1:]],
        "routing": {"policy": policy},
        "timeouts": {"connect": 2.0, "first_byte": 30.0, "idle": 30.0},
    }
    rec = ListRecorder()
    app = create_app(parse_config({"channels": [channel], "store": None}), recorder=rec)
    gw = ServerThread(app).start()
    return ups, gw, rec, app.state.gateway


def _session(url: str, i: int, turns: int, policy: str, errors: list, pause: float = 0.0):
    client = anthropic.Anthropic(base_url=url, api_key="k", max_retries=0)
    meta = {"metadata": {"user_id": f"user-{i}"}} if policy == "session" else {}
    messages: list = []
    try:
        for t in range(turns):
            messages.append({"role": "user", "content": f"Session {i}, step {t}: " + "x y " * 60})
            kw = dict(model="m", max_tokens=16, system=SYSTEM, messages=messages, **meta)
            try:
                if t % 2:
                    with client.messages.stream(**kw) as s:
                        msg = s.get_final_message()
                else:
                    msg = client.messages.create(**kw)
            except anthropic.APIError as exc:
                errors.append((i, t, repr(exc)))
                return
            messages.append({"role": "assistant", "content": msg.content[0].text})
            time.sleep(pause)
    finally:
        client.close()


def _run(url: str, sessions: int, turns: int, policy: str, errors: list, pause: float = 0.0):
    threads = [
        threading.Thread(target=_session, args=(url, i, turns, policy, errors, pause))
        for i in range(sessions)
    ]
    for th in threads:
        th.start()
    return threads


@pytest.mark.parametrize("policy", ["prefix", "session"])
def test_sessions_stick_and_hit(policy):
    ups, gw, rec, gateway = _stack(policy)
    try:
        errors: list = []
        for th in _run(gw.url, 6, 4, policy, errors):
            th.join(60)
        assert errors == []
        settled(gateway)  # each record closes just after its answer's last byte
        ok = [r for r in rec.records if r.status == 200]
        assert len(ok) == 24
        urls = {u.base_url for u in ups}
        assert all(r.replica in urls for r in ok)
        hit = sum(r.cached_tokens or 0 for r in ok) / sum(r.prompt_tokens or 0 for r in ok)
        assert hit > 0.6, hit  # the ideal here is ~0.75 (the first turns are cold)
        # Every turn after a session's first finds its prefix where it went.
        assert sum(1 for r in ok if (r.cached_tokens or 0) > 400) >= 18
        if policy == "session":
            for i in range(6):
                assert len({r.replica for r in ok if r.session_id == f"user-{i}"}) == 1
    finally:
        gw.stop()
        for u in ups:
            u.stop()


@pytest.mark.parametrize("policy", ["prefix", "session"])
def test_a_replica_killed_mid_run_fails_nothing_over(policy):
    ups, gw, rec, gateway = _stack(policy)
    router = gateway.router
    victim = None
    try:
        errors: list = []
        threads = _run(gw.url, 6, 8, policy, errors, pause=0.3)
        deadline = time.monotonic() + 60
        while len(rec.records) < 8 and time.monotonic() < deadline:
            time.sleep(0.01)
        busiest = max(ups, key=lambda u: sum(r.replica == u.base_url for r in rec.records))
        busiest.stop()  # mid-run: requests in flight there drain, new ones must fail over
        victim = busiest
        killed_at = time.time()
        for th in threads:
            th.join(120)
        assert errors == []
        assert len(rec.records) == 48 and all(r.status == 200 for r in rec.records)
        after = [r for r in rec.records if r.received_at > killed_at]
        assert after and all(r.replica != victim.base_url for r in after)
        assert any(r.retries >= 1 for r in rec.records)  # someone was failed over
        assert all(r.replica in {u.base_url for u in ups} for r in rec.records)
        assert router.is_ejected(victim.base_url)
    finally:
        gw.stop()
        for u in ups:
            if u is not victim:
                u.stop()
