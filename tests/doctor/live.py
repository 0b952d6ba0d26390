"""Traffic through the real gateway over loopback into a simulated vLLM, recorded in a
real store: what the doctor's end-to-end tests diagnose."""

from __future__ import annotations

import asyncio

import httpx

from prefixgate.config import parse_config
from prefixgate.lab.traffic import breakers as bk
from prefixgate.lab.upstream_sim import SimSettings, create_upstream_app
from prefixgate.serve.app import create_app
from prefixgate.serve.process import ServerThread

MODEL = "claude-opus-4-8"


async def send(url: str, sessions, *, ok_only: bool = True) -> list[int]:
    """Each session's requests in order, the sessions side by side; the statuses."""
    statuses: list[int] = []
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:

        async def one(session):
            for req in session:
                r = await client.post(req.endpoint, headers=req.headers, content=req.content())
                statuses.append(r.status_code)
                assert not ok_only or r.status_code == 200, r.text

        await asyncio.gather(*(one(s) for s in sessions))
    return statuses


def record(
    case: str,
    dsn: str,
    *,
    block: int = 32,
    order: str = "tools_first",
    sessions: int = 3,
    turns: int = 5,
    channel: dict | None = None,
    config: dict | None = None,
    sim: dict | None = None,
    model: str = MODEL,
    ok_only: bool = True,
) -> tuple[str, list[int]]:
    """The case's traffic through a gateway (billing-header strip off) into ``dsn``;
    returns the DSN and the statuses the client saw (all 200 unless not ``ok_only``)."""
    settings = SimSettings(
        block_size=block, render_order=order, **{"max_model_len": 1_048_576, **(sim or {})}
    )
    with ServerThread(create_upstream_app(settings)) as upstream:
        ch = {
            "name": "vllm",
            "base_url": upstream.url + "/v1",
            "models": [MODEL],
            "model_map": {MODEL: "sim-model"},
            "strip_anthropic_billing_header": False,
            **(channel or {}),
        }
        # No load shedding: these sessions are what the doctor reads, and a busy machine's
        # late loop refused one with a 529 that says nothing of the doctor.
        extra = dict(config or {})
        server = {"shed_loop_lag": None, **extra.pop("server", {})}
        cfg = parse_config({"channels": [ch], "store": {"dsn": dsn}, "server": server, **extra})
        spec = bk.spec_for(sessions=sessions, turns=turns, models=(model,))
        with ServerThread(create_app(cfg)) as gw:
            statuses = asyncio.run(send(gw.url, bk.sessions(case, spec), ok_only=ok_only))
    return dsn, statuses
