from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from prefixgate.lab.traffic import (
    AGENT_CLAUDE_CODE,
    AGENT_STABLE_ANTHROPIC,
    AGENT_STABLE_OPENAI,
    CHAT_ENDPOINT,
    COMPACT_PROMPT,
    IDENTITY_LINE,
    KIND_COMPACT,
    KIND_TITLE,
    KIND_TURN,
    MESSAGES_ENDPOINT,
    ClaudeCodeSession,
    SimRequest,
    StableAgentSession,
    TrafficSpec,
    claude_code_tools,
    dumps,
    generate,
    interleave,
    make_sessions,
    traffic,
    without_cache_control,
)

HEADER_RE = re.compile(
    r"^x-anthropic-billing-header: cc_version=(?P<ver>\d+\.\d+\.\d+)\.(?P<suffix>[0-9a-f]{3}); "
    r"cc_entrypoint=(?P<entry>[a-z-]+);(?: cch=(?P<cch>[0-9a-f]{5});)?$"
)
TOOLU_RE = re.compile(r"^toolu_01[0-9A-Za-z]{22}$")
CC_ONLY = {AGENT_CLAUDE_CODE: 1.0}


def cc_spec(**kw) -> TrafficSpec:
    base = {"sessions": 6, "turns": 12, "seed": 11, "mix": CC_ONLY}
    base.update(kw)
    return TrafficSpec(**base)


def header(req: SimRequest) -> re.Match:
    m = HEADER_RE.match(req.body["system"][0]["text"])
    assert m, req.body["system"][0]["text"]
    return m


def epochs(reqs: list[SimRequest]) -> list[list[SimRequest]]:
    """Split a session's turn/compact requests into runs that share one history."""
    out: list[list[SimRequest]] = []
    for r in reqs:
        if r.kind == KIND_TITLE:
            continue
        if not out or out[-1][-1].epoch != r.epoch or out[-1][-1].kind == KIND_COMPACT:
            out.append([])
        out[-1].append(r)
    return out


def is_prefix(a: list, b: list) -> bool:
    return len(a) <= len(b) and b[: len(a)] == a


# --------------------------------------------------------------------------- reproducibility


DIGEST_SRC = """
import hashlib
from prefixgate.lab.traffic import TrafficSpec, dumps, traffic

def digest(spec):
    h = hashlib.sha256()
    for r in traffic(spec):
        h.update(r.endpoint.encode() + dumps(r.headers).encode() + r.content())
    return h.hexdigest()
"""
_ns: dict = {}
exec(DIGEST_SRC, _ns)
_digest = _ns["digest"]


def test_same_seed_same_bytes():
    spec = TrafficSpec(sessions=6, turns=8, seed=5, cch=True)
    a = [[r.body_json() for r in s] for s in generate(spec)]
    b = [
        [r.body_json() for r in s]
        for s in generate(TrafficSpec(sessions=6, turns=8, seed=5, cch=True))
    ]
    assert a == b
    # a session is re-iterable
    sess = make_sessions(spec)[0]
    assert [r.body_json() for r in sess.requests()] == [r.body_json() for r in sess.requests()]


def test_same_seed_same_bytes_across_processes():
    spec = TrafficSpec(sessions=4, turns=6, seed=9, cch=True)
    code = DIGEST_SRC + "print(digest(TrafficSpec(sessions=4, turns=6, seed=9, cch=True)))\n"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert out.stdout.strip() == _digest(spec)


def test_different_seed_differs():
    a = [r.body_json() for r in traffic(TrafficSpec(sessions=3, turns=5, seed=1))]
    b = [r.body_json() for r in traffic(TrafficSpec(sessions=3, turns=5, seed=2))]
    assert a != b
    assert not set(a) & set(b)


# --------------------------------------------------------------------------- Claude Code shape


def test_claude_code_request_shape():
    spec = cc_spec(sessions=2)
    for sess in generate(spec):
        for r in sess:
            b = r.body
            assert r.endpoint == MESSAGES_ENDPOINT == "/v1/messages?beta=true"
            assert r.agent == AGENT_CLAUDE_CODE
            assert len(b["system"]) == 3
            assert all(blk["type"] == "text" for blk in b["system"])
            m = header(r)
            assert m["ver"] == "2.1.332" and m["entry"] == "cli" and m["cch"] is None
            assert "cache_control" not in b["system"][0]
            assert b["stream"] is True
            meta = json.loads(b["metadata"]["user_id"])
            assert list(meta) == ["device_id", "account_uuid", "session_id"]
            assert re.fullmatch(r"[0-9a-f]{64}", meta["device_id"])
            assert meta["account_uuid"] == ""
            assert meta["session_id"] == r.session_id == r.headers["X-Claude-Code-Session-Id"]
            h = r.headers
            assert h["User-Agent"] == "claude-cli/2.1.332 (external, cli)"
            assert h["x-app"] == "cli"
            assert h["anthropic-version"] == "2023-06-01"
            assert "claude-code-20250219" in h["anthropic-beta"]
            if r.kind == KIND_TITLE:
                assert b["tools"] == [] and len(b["messages"]) == 1
                assert b["output_config"]["format"]["type"] == "json_schema"
                continue
            assert b["system"][1] == {
                "type": "text",
                "text": IDENTITY_LINE,
                "cache_control": {"type": "ephemeral"},
            }
            assert b["system"][2]["cache_control"] == {"type": "ephemeral"}
            assert 5 * 1024 <= len(b["system"][2]["text"]) <= 7 * 1024
            assert b["max_tokens"] == 32000
            assert b["thinking"]["type"] == "adaptive"
            assert b["context_management"]["edits"][0]["type"].startswith("clear_thinking")
            assert b["output_config"] == {"effort": "medium"}
            assert list(b)[:4] == ["model", "messages", "system", "tools"]


def test_first_message_and_mid_conversation_system():
    for sess in generate(cc_spec(sessions=3)):
        for r in sess:
            if r.kind == KIND_TITLE:
                continue
            msgs = r.body["messages"]
            first = msgs[0]
            assert first["role"] == "user"
            assert first["content"][0]["text"].startswith("<system-reminder>")
            assert msgs[1]["role"] == "system"
            assert msgs[1]["content"][0]["text"].startswith("# Environment")
            if len(msgs) > 2:
                assert msgs[2]["role"] == "assistant"  # system content in the middle
    for sess in generate(cc_spec(sessions=2, mid_system=False)):
        for r in sess:
            assert all(m["role"] != "system" for m in r.body["messages"])


def test_cache_control_only_on_last_block_of_last_message():
    for sess in generate(cc_spec(sessions=3)):
        for r in sess:
            msgs = r.body["messages"]
            marks = [
                (i, j)
                for i, m in enumerate(msgs)
                for j, blk in enumerate(m["content"])
                if isinstance(blk, dict) and "cache_control" in blk
            ]
            if r.kind == KIND_TITLE:
                assert marks == []
                continue
            assert marks == [(len(msgs) - 1, len(msgs[-1]["content"]) - 1)]
    assert all(
        "cache_control" not in t for t in claude_code_tools("2.1.332", 70.0)
    )  # tools carry none


def test_billing_suffix_stable_within_session_distinct_across_sessions():
    sessions = generate(cc_spec(sessions=8, titles=False))
    suffixes = []
    for sess in sessions:
        per = {header(r)["suffix"] for r in sess}
        assert len(per) == 1, per  # no compaction at the default threshold
        suffixes.append(per.pop())
    assert len(set(suffixes)) == len(suffixes)


def test_cch_changes_every_request_when_on():
    on = generate(cc_spec(sessions=3, cch=True))
    off = generate(cc_spec(sessions=3, cch=False))
    seen = []
    for s_on, s_off in zip(on, off, strict=True):
        assert len(s_on) == len(s_off)
        for a, b in zip(s_on, s_off, strict=True):
            ma, mb = header(a), header(b)
            assert ma["cch"] is not None and mb["cch"] is None
            assert ma["suffix"] == mb["suffix"]
            seen.append(ma["cch"])
            # the cch part is the only difference
            assert a.body["system"][1:] == b.body["system"][1:]
            assert a.body["messages"] == b.body["messages"]
    assert len(set(seen)) == len(seen)


# --------------------------------------------------------------------------- tools


def test_tools_byte_identical_and_sized():
    a = generate(cc_spec(sessions=3, seed=1))
    b = generate(cc_spec(sessions=2, seed=2))
    tools = {dumps(r.body["tools"]) for s in a + b for r in s if r.kind != KIND_TITLE}
    assert len(tools) == 1
    tools_list = json.loads(tools.pop())
    assert 18 <= len(tools_list) <= 24
    names = {t["name"] for t in tools_list}
    assert {
        "Bash",
        "Read",
        "Edit",
        "Write",
        "Glob",
        "Grep",
        "Agent",
        "TodoWrite",
        "WebFetch",
    } <= names
    for t in tools_list:
        assert set(t) == {"name", "description", "input_schema"}
        assert t["input_schema"]["type"] == "object"
        assert len(t["description"]) > 40
    for kb in (70.0, 40.0, 100.0):
        size = len(dumps(claude_code_tools("2.1.332", kb)))
        assert abs(size - kb * 1024) / (kb * 1024) < 0.02, (kb, size)
    # ~17-18k tokens at ~4 chars per token for the default
    assert 17_000 <= len(dumps(claude_code_tools("2.1.332", 70.0))) / 4 <= 18_500
    # another version gives other (but equally sized) tools
    other = dumps(claude_code_tools("2.1.197", 70.0))
    assert other != dumps(claude_code_tools("2.1.332", 70.0))


# --------------------------------------------------------------------------- history


def test_history_grows_as_prefix_until_compaction():
    for sess in generate(cc_spec(sessions=4, compact_chars=40_000, turns=20)):
        for run in epochs(sess):
            plain = [without_cache_control(r.body["messages"]) for r in run]
            for prev, nxt in zip(plain, plain[1:], strict=False):
                assert len(nxt) > len(prev)
                assert is_prefix(prev, nxt)


def test_compaction_restarts_history_with_new_suffix():
    spec = cc_spec(sessions=3, compact_chars=30_000, turns=25, titles=False)
    total = 0
    for sess in generate(spec):
        for i, r in enumerate(sess):
            if r.kind != KIND_COMPACT:
                continue
            total += 1
            prev, nxt = sess[i - 1], sess[i + 1]
            assert prev.kind == KIND_TURN and nxt.kind == KIND_TURN
            assert nxt.epoch == r.epoch + 1 and nxt.turn == r.turn
            last = r.body["messages"][-1]
            assert last["role"] == "user" and last["content"][-1]["text"] == COMPACT_PROMPT
            # same system (bar the header) and tools as the turns
            assert r.body["tools"] is prev.body["tools"]
            assert r.body["system"][1:] == prev.body["system"][1:]
            assert is_prefix(
                without_cache_control(prev.body["messages"]),
                without_cache_control(r.body["messages"]),
            )
            # the next turn starts over from a summary
            msgs = nxt.body["messages"]
            assert len(msgs) == 2 and msgs[1]["role"] == "system"
            assert "<summary>" in msgs[0]["content"][-1]["text"]
            assert len(dumps(msgs)) < len(dumps(r.body["messages"])) / 3
            assert header(nxt)["suffix"] != header(r)["suffix"]
            assert header(r)["suffix"] == header(prev)["suffix"]
            assert nxt.session_id == r.session_id
    assert total >= 3
    # compaction off
    spec = cc_spec(sessions=2, compact_chars=0, turns=25)
    assert not any(r.kind == KIND_COMPACT for s in generate(spec) for r in s)


def test_tool_use_and_tool_result_pair_up():
    kinds: dict[str, int] = {"error": 0, "list": 0, "str": 0, "thinking": 0, "reminder": 0}
    for sess in generate(cc_spec(sessions=6, turns=20)):
        msgs = without_cache_control([r for r in sess if r.kind == KIND_TURN][-1].body["messages"])
        for i, m in enumerate(msgs):
            if m["role"] != "assistant":
                continue
            assert m["content"], "empty assistant turn"
            uses = [b["id"] for b in m["content"] if b["type"] == "tool_use"]
            kinds["thinking"] += sum(b["type"] == "thinking" for b in m["content"])
            for b in m["content"]:
                if b["type"] == "thinking":
                    assert b["signature"] and b["thinking"]
            nxt = msgs[i + 1]
            assert nxt["role"] == "user"
            results = [b for b in nxt["content"] if b["type"] == "tool_result"]
            assert [b["tool_use_id"] for b in results] == uses
            for u in uses:
                assert TOOLU_RE.match(u)
            for b in results:
                kinds["error"] += b.get("is_error", False)
                kinds["list" if isinstance(b["content"], list) else "str"] += 1
            kinds["reminder"] += any(
                b["type"] == "text" and "<system-reminder>" in b["text"] for b in nxt["content"]
            )
    assert all(v > 0 for v in kinds.values()), kinds
    ids = [
        b["id"]
        for s in generate(cc_spec(sessions=6, turns=20))
        for m in [r for r in s if r.kind == KIND_TURN][-1].body["messages"]
        if m["role"] == "assistant"
        for b in m["content"]
        if b["type"] == "tool_use"
    ]
    assert len(ids) == len(set(ids))


def test_title_requests_optional():
    with_titles = generate(cc_spec(sessions=2))
    assert all(sum(r.kind == KIND_TITLE for r in s) == 1 for s in with_titles)
    without = generate(cc_spec(sessions=2, titles=False))
    assert not any(r.kind == KIND_TITLE for s in without for r in s)
    # titles do not disturb the conversation itself
    for a, b in zip(with_titles, without, strict=True):
        assert [r.body_json() for r in a if r.kind != KIND_TITLE] == [r.body_json() for r in b]


def test_turn_and_seq_numbering():
    spec = cc_spec(sessions=2, turns=15, compact_chars=30_000)
    for sess in generate(spec):
        assert [r.seq for r in sess] == list(range(len(sess)))
        assert [r.turn for r in sess if r.kind == KIND_TURN] == list(range(15))
        assert len({r.session_id for r in sess}) == 1


# --------------------------------------------------------------------------- stable agent


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_stable_agent_prefix_is_byte_stable(api):
    kind = AGENT_STABLE_OPENAI if api == "openai" else AGENT_STABLE_ANTHROPIC
    spec = TrafficSpec(sessions=3, turns=15, seed=4, mix={kind: 1.0})
    sessions = generate(spec)
    static = set()
    for sess in sessions:
        assert all(r.agent == kind and r.kind == KIND_TURN for r in sess)
        for prev, nxt in zip(sess, sess[1:], strict=False):
            # everything but the messages is byte-identical, and the messages only grow
            assert dumps({k: v for k, v in prev.body.items() if k != "messages"}) == dumps(
                {k: v for k, v in nxt.body.items() if k != "messages"}
            )
            assert is_prefix(prev.body["messages"], nxt.body["messages"])
            assert len(nxt.body["messages"]) > len(prev.body["messages"])
        for r in sess:
            assert "cache_control" not in r.body_json()
            assert r.headers["User-Agent"].startswith("opencode/")
        b = sess[0].body
        if api == "openai":
            assert sess[0].endpoint == CHAT_ENDPOINT
            assert b["messages"][0]["role"] == "system"
            assert b["stream"] is True and b["stream_options"] == {"include_usage": True}
            assert b["user"] == sess[0].session_id
            static.add(dumps(b["messages"][0]) + dumps(b["tools"]))
        else:
            assert sess[0].endpoint == "/v1/messages"
            assert isinstance(b["system"], str)
            static.add(b["system"] + dumps(b["tools"]))
    # the system line and tools are the same for every session
    assert len(static) == 1


def test_stable_agent_tool_calls_pair_up():
    spec = TrafficSpec(sessions=3, turns=20, seed=8, mix={AGENT_STABLE_OPENAI: 1.0})
    tool_names = None
    for sess in generate(spec):
        msgs = sess[-1].body["messages"]
        tool_names = {t["function"]["name"] for t in sess[-1].body["tools"]}
        n_calls = 0
        for i, m in enumerate(msgs):
            if m["role"] == "assistant" and m.get("tool_calls"):
                ids = [c["id"] for c in m["tool_calls"]]
                for c in m["tool_calls"]:
                    assert c["type"] == "function" and c["function"]["name"] in tool_names
                    assert isinstance(json.loads(c["function"]["arguments"]), dict)
                follow = msgs[i + 1 : i + 1 + len(ids)]
                assert [f["role"] for f in follow] == ["tool"] * len(ids)
                assert [f["tool_call_id"] for f in follow] == ids
                n_calls += len(ids)
        assert n_calls > 0
    assert tool_names and {"bash", "read", "edit", "grep"} <= tool_names


# --------------------------------------------------------------------------- mix, order, speed


def test_mix_apportionment():
    spec = TrafficSpec(
        sessions=10,
        turns=2,
        mix={AGENT_CLAUDE_CODE: 0.5, AGENT_STABLE_OPENAI: 0.3, AGENT_STABLE_ANTHROPIC: 0.2},
    )
    kinds = [type(s).__name__ + ":" + s.agent for s in make_sessions(spec)]
    assert kinds.count("ClaudeCodeSession:claude-code") == 5
    assert kinds.count("StableAgentSession:stable-openai") == 3
    assert kinds.count("StableAgentSession:stable-anthropic") == 2
    with pytest.raises(ValueError):
        TrafficSpec(mix={"nope": 1.0})


def test_interleave_keeps_session_order_and_limits_concurrency():
    sessions = generate(TrafficSpec(sessions=9, turns=6, seed=3))
    order = interleave(sessions, seed=3, concurrency=3)
    assert order == interleave(sessions, seed=3, concurrency=3)
    assert order != interleave(sessions, seed=4, concurrency=3)
    assert sorted(map(id, order)) == sorted(id(r) for s in sessions for r in s)
    by_session: dict[str, list[int]] = {}
    for r in order:
        by_session.setdefault(r.session_id, []).append(r.seq)
    assert all(seqs == sorted(seqs) for seqs in by_session.values())
    # never more than 3 sessions open at once
    last = {r.session_id: i for i, r in enumerate(order)}
    first: dict[str, int] = {}
    for i, r in enumerate(order):
        first.setdefault(r.session_id, i)
    for i in range(len(order)):
        assert sum(first[s] <= i <= last[s] for s in first) <= 3
    # without a limit every session may be open at once, still in order
    free = interleave(sessions, seed=3)
    assert len(free) == len(order)


def test_a_thousand_turns_from_a_cold_start():
    # (Speed is the demo's to show, not a test's to time: a timed assertion failed on a
    # loaded machine.)
    claude_code_tools.cache_clear()
    out = generate(TrafficSpec(sessions=50, turns=20, seed=123))
    assert sum(len(s) for s in out) >= 1000


def test_default_sizes_are_realistic():
    spec = TrafficSpec(sessions=4, turns=20, seed=0, mix=CC_ONLY, titles=False)
    for sess in generate(spec):
        last = sess[-1]
        assert last.kind == KIND_TURN and last.turn == 19
        hist = len(dumps(last.body["messages"]))
        assert 20_000 < hist < 400_000, hist


# --------------------------------------------------------------------------- SDK validation


def _force(x):
    """Drain pydantic's lazy ValidatorIterators so every nested item is validated."""
    if isinstance(x, dict):
        return {k: _force(v) for k, v in x.items()}
    if x is None or isinstance(x, str | bytes | int | float | bool):
        return x
    return [_force(v) for v in x]


def test_bodies_validate_against_official_sdk_types():
    pydantic = pytest.importorskip("pydantic")
    beta = pytest.importorskip("anthropic.types.beta.message_create_params")
    chat = pytest.importorskip("openai.types.chat.completion_create_params")
    anth = pydantic.TypeAdapter(beta.MessageCreateParamsStreaming)
    oai = pydantic.TypeAdapter(chat.CompletionCreateParamsStreaming)
    spec = TrafficSpec(
        sessions=3,
        turns=12,
        seed=2,
        compact_chars=30_000,
        mix={AGENT_CLAUDE_CODE: 1, AGENT_STABLE_OPENAI: 1, AGENT_STABLE_ANTHROPIC: 1},
    )
    n = 0
    for sess in generate(spec):
        for r in sess:
            adapter = oai if r.endpoint == CHAT_ENDPOINT else anth
            _force(adapter.validate_python(r.body))
            n += 1
    assert n > 30
    with pytest.raises(pydantic.ValidationError):
        _force(anth.validate_python({**r.body, "messages": [{"role": "user", "content": [{}]}]}))


def test_sessions_can_be_built_directly():
    spec = TrafficSpec(turns=3, titles=False)
    cc = ClaudeCodeSession(spec, seed=42, model="my-model")
    reqs = list(cc.requests())
    assert [r.kind for r in reqs] == [KIND_TURN] * 3
    assert all(r.body["model"] == "my-model" for r in reqs)
    st = StableAgentSession(spec, seed=42, api="anthropic")
    assert all(r.agent == AGENT_STABLE_ANTHROPIC for r in st.requests())
    with pytest.raises(ValueError):
        StableAgentSession(spec, seed=1, api="grpc")
    # fresh_body is a private copy
    body = reqs[0].fresh_body()
    body["tools"].clear()
    assert reqs[0].body["tools"]
