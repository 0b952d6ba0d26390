"""The earlier request is found wherever it was served: by another worker of the same
gateway, and by a gateway started again on the same store; and the record keeps what was
asked and answered."""

from __future__ import annotations

import anthropic
import openai
from anthropic.types import CacheMissPreviousMessageNotFound, CacheMissSystemChanged

from prefixgate.config import parse_config
from prefixgate.diagnostics.verdict import EXTENSION
from prefixgate.serve.app import create_app
from prefixgate.serve.process import ServerThread
from prefixgate.store import open_store
from tests.diagnostics import keys
from tests.serve.served import Served

SYSTEM = "You are a careful coding agent. " * 40
MESSAGES = [{"role": "user", "content": "Fix the failing test in parser.py. " * 20}]


def _turns(url: str, i: int) -> tuple[anthropic.types.Message, anthropic.types.Message]:
    """Two turns of one conversation, each on a new connection (the kernel gives each new
    connection to either worker); the second changes the system prompt."""
    with anthropic.Anthropic(base_url=url, api_key="k", max_retries=0) as client:
        first = client.messages.create(
            model="m",
            max_tokens=16,
            system=SYSTEM,
            messages=MESSAGES,
            diagnostics={"previous_message_id": None},
        )
    with anthropic.Anthropic(base_url=url, api_key="k", max_retries=0) as client:
        second = client.messages.create(
            model="m",
            max_tokens=16,
            system=f"Conversation {i}. " + SYSTEM,
            messages=MESSAGES,
            diagnostics={"previous_message_id": first.id},
        )
    return first, second


def test_a_turn_served_by_the_other_worker_is_found(upstream, tmp_path, store_dsn):
    dsn = store_dsn
    config = {
        "embedded_upstream": False,
        "channels": [{"name": "main", "base_url": upstream.url}],
        "store": {"dsn": dsn, "journal_path": str(tmp_path / "journal")},
    }
    with Served(tmp_path, config, "--workers", "2") as gw:
        pairs = [_turns(gw.url, i) for i in range(16)]
    assert gw.returncode == 0, gw.output
    where = []
    for _, second in pairs:
        assert isinstance(second.diagnostics.cache_miss_reason, CacheMissSystemChanged)
        where.append(getattr(second, EXTENSION)["found_in"])
    # each conversation's second turn went to either worker: some found the first in
    # their own memory, the others in the store (16 coin flips all alike: 2**-15)
    assert set(where) == {"memory", "store"}, where
    with open_store(dsn) as store:
        rec = store.get_record(pairs[0][1].id.removeprefix("msg_"))
    assert rec.diagnosis.answer == "system_changed"
    assert rec.diagnosis.previous == pairs[0][0].id.removeprefix("msg_")
    assert rec.diagnosis.segment == "system"
    assert rec.diagnosis.params  # digests only
    assert all(len(v) == 16 for v in rec.diagnosis.params.values())


def test_another_owners_id_is_not_found_on_either_worker(upstream, tmp_path, store_dsn):
    """Bob names Alice's turns, each on a new connection: whichever worker serves him (the
    one that holds her turn in its memory, or the other, which reads the store), he gets
    what an unknown id gets; Alice's other key gets the comparison."""
    config = {
        "embedded_upstream": False,
        "channels": [{"name": "main", "base_url": upstream.url}],
        "store": {"dsn": store_dsn, "journal_path": str(tmp_path / "journal")},
        "keys": keys(),
    }

    def ask(url: str, key: str, system: str, previous: str | None):
        with anthropic.Anthropic(base_url=url, api_key=key, max_retries=0) as client:
            return client.messages.create(
                model="m",
                max_tokens=16,
                system=system,
                messages=MESSAGES,
                diagnostics={"previous_message_id": previous},
            )

    with Served(tmp_path, config, "--workers", "2") as gw:
        answers = []
        for i in range(16):
            first = ask(gw.url, "key-alice", SYSTEM, None)
            theirs = ask(gw.url, "key-bob", f"Conversation {i}. " + SYSTEM, first.id)
            mine = ask(gw.url, "key-alice-2", f"Conversation {i}. " + SYSTEM, first.id)
            answers.append((theirs, mine))
    assert gw.returncode == 0, gw.output
    where = []
    for theirs, mine in answers:
        reason = theirs.diagnostics.cache_miss_reason
        assert isinstance(reason, CacheMissPreviousMessageNotFound)
        assert getattr(theirs, EXTENSION)["found_in"] is None
        assert isinstance(mine.diagnostics.cache_miss_reason, CacheMissSystemChanged)
        where.append(getattr(mine, EXTENSION)["found_in"])
    # the owner's other key was answered from either worker's memory or the store (16
    # coin flips all alike: 2**-15); the other owner's requests, on new connections too,
    # met both alike (the same odds), and neither leaked the turn
    assert set(where) == {"memory", "store"}, where


def test_a_restarted_gateway_finds_the_earlier_turn_in_the_store(upstream, tmp_path):
    config = parse_config(
        {
            "channels": [{"name": "main", "base_url": upstream.url}],
            "store": {"dsn": f"sqlite:///{tmp_path / 'r.db'}", "journal_path": str(tmp_path / "j")},
        }
    )
    with ServerThread(create_app(config)) as gw:
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0)
        first = client.responses.create(
            model="m",
            instructions=SYSTEM,
            input=[{"role": "user", "content": "Fix the failing test."}],
            prompt_cache_options={"comparison_response_id": None},
        )
    with ServerThread(create_app(config)) as gw:
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0)
        second = client.responses.create(
            model="m",
            instructions=SYSTEM,
            input=[
                {"role": "user", "content": "Fix the failing test."},
                {"role": "assistant", "content": first.output_text},
                {"role": "user", "content": "Thanks; now the docs."},
            ],
            prompt_cache_options={"comparison_response_id": first.id},
        )
    assert second.prompt_cache_diagnostics.type == "cache_hit"
    assert getattr(second, EXTENSION)["found_in"] == "store"
