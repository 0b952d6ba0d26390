"""The router: LRU bounds, the prefix estimate, in-flight accounting, health marks, and
independent router instances agreeing."""

from __future__ import annotations

import asyncio

from prefixgate.config import parse_config
from prefixgate.routing import BlockLRU, ChannelRouter, prompt_blocks

URLS = ["http://10.0.0.1:8000/v1", "http://10.0.0.2:8000/v1", "http://10.0.0.3:8000/v1"]


def router(**channel) -> ChannelRouter:
    ch = {"name": "c", "base_url": URLS[0], "replicas": URLS[1:], **channel}
    return ChannelRouter(parse_config({"channels": [ch], "store": None}).channels)


def chat(*turns: str, system: str = "You are a helpful agent. " * 20) -> dict:
    msgs = [{"role": "system", "content": system}]
    for i, t in enumerate(turns):
        msgs.append({"role": "user" if i % 2 == 0 else "assistant", "content": t})
    return {"model": "m", "messages": msgs}


def plan(r: ChannelRouter, key: str | None, request: dict | None = None):
    prompt = (lambda ch: request) if request is not None else None
    return asyncio.run(r.plan("m", key, prompt=prompt))


def test_lru_is_bounded_and_forgets_a_chain_tail_first():
    lru = BlockLRU(4)
    chain = [bytes([i]) * 16 for i in range(6)]
    lru.add(chain)
    assert len(lru) == 4
    assert lru.match(chain) == 4  # the first four survive, the tail went
    other = [bytes([100 + i]) * 16 for i in range(3)]
    lru.add(other)
    assert len(lru) == 4 and lru.match(other) == 3 and lru.match(chain) == 1
    lru.add(chain[:1])  # refreshing moves it to the most recent end
    lru.add([b"x" * 16, b"y" * 16])
    assert chain[0] in lru


def test_prompt_blocks_hash_the_rendered_prompt_in_16_token_blocks():
    short = prompt_blocks(chat("hello"))
    longer = prompt_blocks(chat("hello", "hi there", "what next? " * 30))
    assert short.block_size == 16
    assert len(longer) > len(short) > 0
    assert longer.hashes[: len(short) - 1] == short.hashes[: len(short) - 1]  # shared prefix
    assert prompt_blocks(chat("hello"), 64).block_size == 64
    assert len(prompt_blocks(chat("hello"), 64)) == len(short) // 4


def test_two_router_instances_make_the_same_session_choice():
    a, b = router(), router()
    for i in range(50):
        ta, tb = plan(a, f"session-{i}"), plan(b, f"session-{i}")
        assert [t.base_url for t in ta] == [t.base_url for t in tb]
    assert len({plan(a, f"session-{i}")[0].base_url for i in range(50)}) == 3


def test_round_robin_and_least_busy_through_the_router():
    rr = router(routing={"policy": "round_robin"})
    assert [plan(rr, "k")[0].base_url for _ in range(6)] == URLS * 2
    lb = router(routing={"policy": "least_busy"})
    first = plan(lb, "k")[0]
    lb.acquire(first, "req-1")
    second = plan(lb, "k")[0]
    assert second.base_url != first.base_url
    lb.acquire(second, "req-2")
    assert plan(lb, "k")[0].base_url not in {first.base_url, second.base_url}
    lb.release("req-1")
    lb.release("req-1")  # idempotent
    assert lb.inflight(first.base_url) == 0 and lb.inflight(second.base_url) == 1


def test_prefix_follows_the_estimated_cache_and_spreads_new_prompts():
    r = router(routing={"policy": "prefix", "balance_abs": 2})
    conv = chat("task one: " + "fix the parser " * 40)
    t = plan(r, None, conv)[0]
    assert t.blocks is not None and len(t.blocks) > 10
    r.acquire(t, "1")
    r.release("1")
    # The next turn extends the prompt: it goes where the prefix is cached, whatever the key.
    nxt = chat("task one: " + "fix the parser " * 40, "done", "now the lexer")
    for key in ("a", "b", "c", None):
        assert plan(r, key, nxt)[0].base_url == t.base_url
    # A different prompt matches nothing: the least busy (ties broken by the key).
    r.acquire(plan(r, None, nxt)[0], "busy")
    other = chat("another task " * 50, system="A different system prompt. " * 20)
    assert plan(r, "z", other)[0].base_url != t.base_url


def test_prefix_gives_way_to_load_when_imbalanced():
    r = router(routing={"policy": "prefix", "balance_abs": 2, "balance_rel": 1.5})
    conv = chat("a long task " * 60)
    home = plan(r, "k", conv)[0]
    for i in range(3):  # home: 3 in flight, the others 0: 3 - 0 > 2 and 3 > 0
        r.acquire(home, f"r{i}")
    assert plan(r, "k", conv)[0].base_url != home.base_url
    r.release("r0")  # 2 - 0 is not > 2: back to the best match
    assert plan(r, "k", conv)[0].base_url == home.base_url


def test_unhealthy_replicas_are_tried_last():
    r = router()
    key = "sess"
    first = plan(r, key)[0]
    r.report_failure(first)  # passive: ejected for the cool-down
    order = [t.base_url for t in plan(r, key)]
    assert order[-1] == first.base_url and len(order) == 3
    r.report_success(first)
    assert plan(r, key)[0].base_url == first.base_url
    r.mark_health(first.channel, first.base_url, False)  # active: down until a probe passes
    assert r.is_down(first.base_url) and plan(r, key)[-1].base_url == first.base_url
    r.mark_health(first.channel, first.base_url, True)
    assert plan(r, key)[0].base_url == first.base_url


def test_a_replica_marked_down_loses_its_estimated_cache():
    r = router(routing={"policy": "prefix"})
    conv = chat("some work " * 60)
    t = plan(r, None, conv)[0]
    r.acquire(t, "1")
    r.release("1")
    r.mark_health(t.channel, t.base_url, False)
    r.mark_health(t.channel, t.base_url, True)
    assert r._lru_of(t.channel, t.base_url).match(t.blocks.hashes) == 0
