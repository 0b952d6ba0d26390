"""Held-out scenarios the incident report does not list: each must be named by its own cause."""

from prefixgate.doctor import diagnose, exit_code, render_text
from tests.doctor import builders as b


def store(tmp_path, records, name="s.db"):
    return b.write(f"sqlite:///{tmp_path / name}", records)


def findings(d, kind):
    return [f for f in d.findings if f.kind == kind]


def control():
    return b.simulate(b.chat_sessions(6, 8, prefix="ctl"))


def test_timestamp_in_the_system_prompt(tmp_path):
    dated = b.chat_sessions(
        6,
        8,
        client="dated-agent",
        prefix="dt",
        texts=True,
        system=lambda s, t: (
            f"You are an agent. Current time: 2026-08-17 09:{t * 7:02d}:{s:02d}. Be brief."
        ),
        start=b.T0 + 9 * 3600 + 5,
    )
    d = diagnose(store(tmp_path, b.simulate(dated + control())))
    [f] = findings(d, "prefix_broken")
    assert f.facts["slice"]["slice"] in ("endpoint=chat", "client=dated-agent")
    seg = f.facts["segments"]
    assert seg["cause"] == "timestamp"
    assert seg["volatility"] == "per-request"
    assert seg["first_unstable"] == "messages[0]:system"
    assert any("09:" in x and "→" in x for x in seg["diffs"])
    # the tools are rendered before the system prompt: that is the pinned constant
    assert f.facts["distribution"]["pinned"]["value"] == 6000 // 64 * 64
    assert f.facts["offset_matches_constant"]
    pred = f.facts["prediction"]
    assert pred["predicted_rate"] > pred["measured_rate"] + 0.3
    assert any("date/time" in x for x in f.fix)


def test_reordered_tools(tmp_path):
    tools = b.STABLE_TOOLS

    def rotating(s, t):
        return tools[t % len(tools) :] + tools[: t % len(tools)]

    shuffled = b.chat_sessions(
        6, 8, client="shuffler", prefix="sh", tools=rotating, start=b.T0 + 9 * 3600 + 5
    )
    d = diagnose(store(tmp_path, b.simulate(shuffled + control())))
    [f] = findings(d, "prefix_broken")
    seg = f.facts["segments"]
    assert seg["cause"] == "reordered_tools"
    assert seg["first_unstable"] == "tools"
    assert f.facts["prediction"]["predicted_rate"] > 0.7
    assert any("stable order" in x for x in f.fix)


def test_hoisted_system_messages(tmp_path):
    hoisted = b.claude_sessions(
        6,
        lambda s: 8,
        header=lambda s, t: None,
        system_messages=lambda s, t: [
            (3 * k + 1, f"<system-reminder> note {k}") for k in range(t + 1)
        ],
        hoist=True,
        growth=8000,
        prefix="hs",
    )
    d = diagnose(store(tmp_path, b.simulate(hoisted + control())))
    [f] = findings(d, "prefix_broken")
    seg = f.facts["segments"]
    assert seg["cause"] == "hoisted_system_message"
    assert seg["first_unstable"] == "messages[0]:system"
    assert f.facts["prediction"]["predicted_rate"] > f.facts["prediction"]["measured_rate"] + 0.3
    assert any("in place" in x for x in f.fix)


def test_per_session_billing_header(tmp_path):
    # no cch=: stable within a session, different across sessions; the system prompt is
    # rendered before the tools, so new sessions cannot even share the tools
    recs = b.claude_sessions(
        12, lambda s: 4, header=b.per_session_header, tools_first=False, texts=True, prefix="ps"
    )
    d = diagnose(store(tmp_path, b.simulate(recs)))
    [f] = findings(d, "per_session_prefix")
    seg = f.facts["segments"]
    assert seg["cause"] == "billing_header"
    assert seg["scope"] == "cross-session"
    assert seg["volatility"] == "per-session"
    assert any("cc_version" in x for x in seg["diffs"])
    assert f.severity in ("warning", "info")
    assert f.facts["prediction"]["predicted_rate"] > f.facts["prediction"]["measured_rate"]
    assert any("strip_anthropic_billing_header" in x for x in f.fix)


def test_billing_header_without_texts_is_found_by_position(tmp_path):
    recs = b.claude_sessions(6, lambda s: 6, header=b.cch, texts=False, prefix="nt")
    d = diagnose(store(tmp_path, b.simulate(recs + control())))
    [f] = findings(d, "prefix_broken")
    seg = f.facts["segments"]
    assert seg["cause"] == "billing_header" and seg["in_segment"] == "system[0]"
    assert not seg["diffs"]
    assert "texts not captured" in render_text(d)


def test_cache_report_off(tmp_path):
    silent = b.simulate(b.chat_sessions(3, 5, prefix="sg"))
    for r in silent:
        r.channel, r.cached_tokens = "sglang-box", None
    d = diagnose(store(tmp_path, silent + control()))
    [f] = findings(d, "cache_report_off")
    assert "sglang-box" in f.title
    assert any("--enable-cache-report" in x for x in f.fix)
    assert any("--enable-prompt-tokens-details" in x for x in f.fix)
    assert not findings(d, "prefix_broken")  # a silent channel is not "0% hit rate"
    assert all(s["channel"] != "sglang-box" for s in d.slices)


def test_usage_includes_cache(tmp_path):
    recs = b.simulate(b.claude_sessions(4, lambda s: 5, header=lambda s, t: None, prefix="us"))
    for r in recs:
        r.reported_input_tokens = r.prompt_tokens  # the bug: cache counted as new input
        r.reported_cache_read_tokens = r.cached_tokens
    d = diagnose(store(tmp_path, recs))
    [f] = findings(d, "usage_includes_cache")
    assert f.severity == "warning"
    assert any("anthropic_messages_exclude_cache" in x for x in f.fix)
    assert exit_code(d) == 0  # a warning alone does not fail cron


def test_correct_usage_is_not_flagged(seed_dsn):
    assert not findings(diagnose(seed_dsn), "usage_includes_cache")


def test_compaction_is_not_blamed_on_a_header(tmp_path):
    recs = []
    for s in range(6):
        sid = f"cp-session-{s}"
        history = [("user", f"start {s}", 20000)]
        for t in range(8):
            if t == 4:  # compaction: the history restarts from a summary
                history = [("user", f"summary {s}", 3000)]
            req = b.claude_request(header=None, history=history)
            recs.append(b.record(req, rid=f"{sid}-{t}", at=b.T0 + s * 5 + t * 300, session=sid))
            history = history + [("assistant", f"a{s}.{t}", 4000), ("user", f"q{s}.{t}", 4000)]
    d = diagnose(store(tmp_path, b.simulate(recs)))
    assert not findings(d, "prefix_broken") and not findings(d, "per_session_prefix")
    assert exit_code(d) == 0


def test_a_channel_weak_because_of_one_entry_is_reported_once(tmp_path):
    claude = b.claude_sessions(6, lambda s: 6, header=b.cch, prefix="w1")
    other = b.chat_sessions(6, 8, prefix="w2")
    for r in other:
        r.channel = "a6000-sglang"
    d = diagnose(store(tmp_path, b.simulate(claude + control() + other)))
    broken = findings(d, "prefix_broken")
    assert [f.facts["slice"]["slice"] for f in broken] == ["endpoint=messages"]
    assert "within channel=h200-vllm" in broken[0].facts["slice"]["aliases"]
