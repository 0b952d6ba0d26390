from prefixgate.doctor import segments as sg
from prefixgate.record.record import Segment


def test_diff_shows_the_varying_part_with_context():
    a = "x-anthropic-billing-header: cc_version=2.1.116.d8c; cc_entrypoint=claude-vscode; cch=8c7f0;"
    b = a.replace("8c7f0", "7ee55")
    assert sg.diff_texts(a, b) == "cch=8c7f0 → 7ee55"


def test_diff_merges_a_timestamp():
    a = "You are helpful. Current time: 2026-08-17 09:28:01. Be brief."
    b = "You are helpful. Current time: 2026-08-17 09:29:44. Be brief."
    d = sg.diff_texts(a, b)
    assert "28" in d and "29" in d and "→" in d
    assert sg._dates_differ(a, b)


def test_plain_text_of_stored_segments():
    assert sg.plain_text('{"text":"hi","type":"text"}') == "hi"
    assert sg.plain_text('{"content":"yo","role":"system"}') == "yo"
    assert sg.plain_text('"just a string"') == "just a string"
    assert sg.plain_text("not json") == "not json"


def test_volatility_classes():
    assert sg.volatility(10, 10, 5, 5) == sg.PER_REQUEST
    assert sg.volatility(0, 40, 5, 5) == sg.PER_SESSION
    assert sg.volatility(0, 40, 1, 5) == "stable"
    assert sg.volatility(2, 40, 1, 5) == sg.OCCASIONAL


def test_offset_matches_constant():
    assert sg.matches_constant(17980, 17920, 64)  # block-aligned equal
    assert sg.matches_constant(19000, 17920, 64)  # within 15%
    assert not sg.matches_constant(30000, 17920, 64)
    assert not sg.matches_constant(None, 17920, 64)


def _captured(segs, change_class=None) -> sg.Captured:
    segments = [Segment(kind, name, h, 400, 100) for kind, name, h in segs]
    return sg.Captured(
        "r", "s", 0.0, "codex_exec", "codex", 1000, 0, segments, segments, False, change_class
    )


def test_a_pair_the_capture_recorded_as_a_compaction_step_is_a_compaction_boundary():
    """Codex's own summary request leaves the tools out and the turn after has them again:
    by themselves, tool changes; the record says a compaction (Codex named its summary
    request), and the doctor's pairs follow it on either side."""
    system, tool = ("system", "messages[0]:system", "s1"), ("tool", "exec_command", "t1")
    n1, asked = ("message", "messages[1]:user", "u1"), ("message", "messages[3]:user", "ck")
    turn = [system, ("tools", "tools", "tt"), tool, n1]
    summary = [system, n1, ("message", "messages[2]:assistant", "a1"), asked]
    after = [*turn, ("message", "messages[2]:user", "sm"), ("message", "messages[3]:user", "u2")]
    plain = sg.classify(_captured(turn), _captured(summary), {}, same_session=True)
    assert plain is not None and plain.cause == sg.TOOLS_CHANGED
    for prev, cur in ((turn, summary), (summary, after)):
        a, b = _captured(prev), _captured(cur)
        (a if cur is after else b).change_class = "context_compacted"
        brk = sg.classify(a, b, {}, same_session=True)
        assert brk is not None and brk.cause == sg.COMPACTION, brk
