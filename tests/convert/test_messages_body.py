"""The typed decode of Messages requests (``protocol/messages_body.py``): it accepts and
rejects exactly what the plain check does, converts the same, and keeps texts raw."""

from __future__ import annotations

import copy
import json

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixgate.apis.messages.request import ConvertOptions, anthropic_to_openai, convert
from prefixgate.config import Limits
from prefixgate.errors import GatewayError, InvalidRequest
from prefixgate.hygiene.billing import strip_billing_header, strip_billing_header_typed
from prefixgate.protocol import messages_body
from prefixgate.protocol.anthropic import check_messages_request
from prefixgate.protocol.common import decode_body
from prefixgate.protocol.messages_body import MessagesBody, decode_messages_body, typed_request
from prefixgate.sequences import common_prefix
from tests.conftest import fixture_names, load_fixture
from tests.convert.test_properties import ident, json_value, messages_request, text

OPTS = (
    ConvertOptions("up"),
    ConvertOptions("up", "reasoning_effort", "drop"),
    ConvertOptions("up", "drop"),
)

# -- a richer request than test_properties' (images, documents, choices, sampling) ---------
_img = st.one_of(
    st.builds(
        lambda m, d: {"type": "image", "source": {"type": "base64", "media_type": m, "data": d}},
        st.sampled_from(["image/png", "image/jpeg"]),
        text,
    ),
    st.builds(lambda u: {"type": "image", "source": {"type": "url", "url": u}}, text),
    st.just({"type": "image", "source": {"type": "base64"}}),
)
_doc = st.one_of(
    st.builds(lambda d: {"type": "document", "source": {"type": "text", "data": d}}, text),
    st.builds(
        lambda d: {
            "type": "document",
            "title": "T",
            "source": {"type": "content", "content": [{"type": "text", "text": d}]},
        },
        text,
    ),
    st.just({"type": "document", "source": {"type": "base64", "media_type": "application/pdf"}}),
)
_txt = st.builds(lambda t: {"type": "text", "text": t}, text)
_result = st.builds(
    lambda c, e: {"type": "tool_result", "tool_use_id": "t1", "content": c, "is_error": e},
    st.one_of(st.none(), text, st.lists(st.one_of(_txt, _img, _doc), max_size=3)),
    st.one_of(st.booleans(), st.none()),
)
_user = st.one_of(_txt, _img, _doc, _result, st.just({"type": "search_result"}))
_assistant = st.one_of(
    _txt,
    st.builds(lambda t: {"type": "thinking", "thinking": t, "signature": "s"}, text),
    st.just({"type": "redacted_thinking", "data": "x"}),
    st.builds(
        lambda i: {"type": "tool_use", "id": "t1", "name": "n", "input": i},
        st.dictionaries(ident, json_value, max_size=3),
    ),
)
_message = st.one_of(
    st.builds(
        lambda c: {"role": "user", "content": c}, st.one_of(text, st.lists(_user, max_size=4))
    ),
    st.builds(
        lambda c: {"role": "assistant", "content": c},
        st.one_of(text, st.lists(_assistant, max_size=4)),
    ),
    st.builds(
        lambda c: {"role": "system", "content": c}, st.one_of(text, st.lists(_txt, max_size=2))
    ),
)
_MISSING = object()
_tool = st.builds(
    lambda n, d, s, t: {
        k: v
        for k, v in (("name", n), ("description", d), ("input_schema", s), ("type", t))
        if v is not _MISSING
    },
    ident,
    st.one_of(text, st.none(), st.just(_MISSING)),
    st.sampled_from(
        [{}, None, _MISSING, {"type": "object", "properties": {"a": {"type": "string"}}}]
    ),
    st.sampled_from([_MISSING, None, "custom", "web_search_20250305"]),
)
_OPTIONAL = {
    "system": st.one_of(
        text, st.just("x-anthropic-billing-header: a=1;\nrest"), st.lists(_txt, max_size=3)
    ),
    "tools": st.lists(_tool, max_size=3),
    "tool_choice": st.sampled_from(
        [
            {"type": "auto"},
            {"type": "any", "disable_parallel_tool_use": True},
            {"type": "tool", "name": "n"},
            {"type": "none"},
        ]
    ),
    "thinking": st.sampled_from(
        [{"type": "enabled", "budget_tokens": 5000}, {"type": "disabled"}, {"type": "adaptive"}]
    ),
    "output_config": st.builds(lambda e: {"effort": e}, st.sampled_from(["low", "high", "max"])),
    "metadata": st.builds(lambda u: {"user_id": u}, text),
    "temperature": st.one_of(st.integers(0, 2), st.floats(0, 2)),
    "top_p": st.floats(0, 1),
    "top_k": st.integers(0, 50),
    "stop_sequences": st.lists(text, max_size=2),
    "stream": st.booleans(),
}


@st.composite
def rich_request(draw):
    body = {
        "model": "m",
        "max_tokens": draw(st.integers(1, 9)),
        "messages": draw(st.lists(_message, min_size=1, max_size=5)),
    }
    for key, values in _OPTIONAL.items():
        if draw(st.booleans()):
            body[key] = draw(values)
    return copy.deepcopy(body)


@st.composite
def mutated_request(draw):
    """A request with one value somewhere replaced (or removed): mostly invalid."""
    return _mutate(draw, draw(rich_request()))


def _mutate(draw, body: dict) -> dict:
    """``body`` with one value somewhere replaced or removed (in place)."""
    paths: list[tuple] = []

    def walk(node, path):
        paths.append(path)
        if isinstance(node, dict | list):
            for k, v in node.items() if isinstance(node, dict) else enumerate(node):
                walk(v, (*path, k))

    walk(body, ())
    path = draw(st.sampled_from(paths[1:]))
    parent = body
    for k in path[:-1]:
        parent = parent[k]
    if isinstance(parent, dict) and draw(st.booleans()):
        del parent[path[-1]]
    else:
        parent[path[-1]] = draw(st.one_of(json_value, st.just([[[[[[[[[[[[1]]]]]]]]]]]])))
    return body


def _plain_verdict(raw: bytes, limits: Limits) -> str:
    try:
        check_messages_request(decode_body(raw, limits), limits)
    except GatewayError as err:
        return err.message
    return "ok"


def _typed_verdict(raw: bytes, limits: Limits) -> str:
    try:
        decode_messages_body(raw, limits)
    except GatewayError as err:
        return err.message
    return "ok"


def _read_fields(cls) -> set[str]:
    """The fields of a typed-decode struct that the gateway decodes (not the raw ones)."""
    return {f.name for f in msgspec.structs.fields(cls) if f.type is not msgspec.Raw}


_BLOCK_FIELDS = {
    cls.__struct_config__.tag: _read_fields(cls)
    for cls in messages_body.Block.__args__  # type: ignore[attr-defined]
}


def _without_passed_on_values(body: dict) -> dict:
    """The request with only what the typed decode reads: the values it passes on or
    drops without reading them (texts, tool descriptions and schemas, image data, fields
    it does not know) taken out."""
    body = copy.deepcopy(body)

    def keep(d: dict, fields: set[str]) -> None:
        for k in [k for k in d if k not in fields]:
            del d[k]

    def blocks(content):
        for b in content if isinstance(content, list) else ():
            if isinstance(b, dict):
                keep(b, {"type"} | _BLOCK_FIELDS.get(b.get("type"), set()) | {"content"})
                if isinstance(b.get("source"), dict) and b.get("type") == "image":
                    keep(b["source"], _read_fields(messages_body.Source))
                blocks(b.get("content"))

    keep(body, _read_fields(messages_body.Request) | {"messages", "system", "tools"})
    for t in body.get("tools") or []:
        if isinstance(t, dict):
            keep(t, _read_fields(messages_body.Tool))
    for b in body.get("system") if isinstance(body.get("system"), list) else ():
        if isinstance(b, dict):
            keep(b, {"type"})
    for m in body.get("messages") or []:
        if isinstance(m, dict):
            keep(m, {"role", "content"})
            blocks(m.get("content"))
    return body


def _has_unusable_document(body: dict) -> bool:
    return any(
        isinstance(b, dict)
        and b.get("type") == "document"
        and b.get("source")
        and not isinstance(b["source"], dict)
        for m in body.get("messages") or []
        if isinstance(m, dict) and isinstance(m.get("content"), list)
        for b in m["content"]
    )


TIGHT = Limits(max_json_depth=12, max_blocks=6, max_messages=4, max_tools=2)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(mutated_request(), rich_request()))
def test_typed_decode_accepts_and_rejects_as_the_plain_check(body):
    raw = json.dumps(body).encode()
    plain, typed = _plain_verdict(raw, TIGHT), _typed_verdict(raw, TIGHT)
    if plain.startswith("request JSON is nested") and typed == "ok":
        # Values passed on verbatim are not walked (as on the chat route); only those
        # may hold what made the plain check refuse.
        stripped = json.dumps(_without_passed_on_values(body)).encode()
        assert _plain_verdict(stripped, TIGHT) != plain
        return
    if plain == "ok" and _has_unusable_document(body):
        # A document whose source is not an object: the plain converter failed on it
        # (a 500); it is now refused.
        assert typed.startswith("request body does not have the shape")
        return
    assert typed == plain


@settings(max_examples=800, deadline=None)
@given(body=rich_request())
def test_valid_requests_take_the_typed_path_and_convert_the_same(monkeypatch_plain, body):
    raw = json.dumps(body).encode()
    if _plain_verdict(raw, Limits()) != "ok":
        return
    before = len(monkeypatch_plain)
    typed = decode_messages_body(raw, Limits())
    assert len(monkeypatch_plain) == before, "a valid request fell back to the plain path"
    for opts in OPTS:
        assert anthropic_to_openai(typed, opts) == anthropic_to_openai(body, opts)


@pytest.fixture(scope="module")
def monkeypatch_plain():
    """Records every fall back to the plain path."""
    calls: list[bytes] = []
    original = messages_body._plain_path

    def spy(raw, limits):
        calls.append(raw)
        return original(raw, limits)

    messages_body._plain_path = spy
    yield calls
    messages_body._plain_path = original


@pytest.mark.parametrize("name", fixture_names())
def test_claude_code_requests_take_the_typed_path(name, monkeypatch_plain):
    body = load_fixture(name)["body"]
    body = json.loads(body) if isinstance(body, str) else body
    raw = json.dumps(body).encode()
    before = len(monkeypatch_plain)
    typed = decode_messages_body(raw, Limits())
    assert len(monkeypatch_plain) == before
    assert anthropic_to_openai(typed, OPTS[0]) == anthropic_to_openai(body, OPTS[0])


def test_texts_go_upstream_as_the_client_wrote_them():
    raw = (
        b'{"model":"m","max_tokens":5,"system":[{"type":"text","text":"caf\\u00e9"},'
        b'{"type":"text","text":"line\\ntwo \\"q\\""}],"messages":[{"role":"user","content":'
        b'[{"type":"text","text":"\\u00e9t\\u00e9 \\/ ok"}]}]}'
    )
    body = decode_messages_body(raw, Limits())
    sent = msgspec.json.encode(convert(body.typed, OPTS[0]))
    # the user's text verbatim; the system texts joined on their JSON
    assert b'"content":"\\u00e9t\\u00e9 \\/ ok"' in sent
    assert b'"content":"caf\\u00e9\\nline\\ntwo \\"q\\""' in sent
    decoded = msgspec.json.decode(sent)
    assert decoded["messages"][0]["content"] == 'café\nline\ntwo "q"'
    assert decoded["messages"][1]["content"] == "été / ok"


def test_joined_texts_and_error_results_decode_to_the_plain_strings():
    body = {
        "model": "m",
        "max_tokens": 5,
        "messages": [
            {
                "role": "assistant",
                "content": [{"type": "text", "text": "a\u2028"}, {"type": "text", "text": '"b\\'}],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t",
                        "is_error": True,
                        "content": [
                            {"type": "text", "text": "x\ty"},
                            {"type": "text", "text": "é"},
                        ],
                    },
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": "QUJD"},
                    },
                ],
            },
        ],
    }
    out = anthropic_to_openai(decode_messages_body(json.dumps(body).encode(), Limits()), OPTS[0])
    assert out["messages"][0]["content"] == 'a\u2028"b\\'
    assert out["messages"][1]["content"] == "Error: x\ty\né"
    assert out["messages"][2]["content"][0]["image_url"]["url"] == "data:image/png;base64,QUJD"


@pytest.mark.parametrize(
    "system",
    [
        [{"type": "text", "text": "x-anthropic-billing-header: cc_version=1; cch=ab;"}],
        [
            {"type": "text", "text": "  x-anthropic-billing-header: a"},
            {"type": "text", "text": "keep"},
        ],
        [{"type": "text", "text": "\n\tx-anthropic-billing-header: a"}],
        [{"type": "text", "text": "\u00a0x-anthropic-billing-header: a"}],
        [
            {"type": "text", "text": "keep"},
            {"type": "text", "text": "x-anthropic-billing-header: b"},
        ],
        [{"type": "text", "text": "not x-anthropic-billing-header: a"}],
        "x-anthropic-billing-header: a;\nthe rest",
        "plain system",
    ],
)
def test_billing_header_strip_is_the_same_on_typed_requests(system):
    body = {
        "model": "m",
        "max_tokens": 1,
        "system": system,
        "messages": [{"role": "user", "content": "hi"}],
    }
    plain_body, plain_removed = strip_billing_header(body)
    typed, removed = strip_billing_header_typed(typed_request(body))
    assert removed == plain_removed
    assert anthropic_to_openai(plain_body, OPTS[0]) == anthropic_to_openai(
        MessagesBody(typed, json.dumps(body).encode()), OPTS[0]
    )


def test_an_anthropic_upstream_gets_every_field_as_it_came():
    raw = (
        b'{"model":"m","max_tokens":5,"stream":false,"context_management":{"edits":[]},'
        b'"messages":[{"role":"user","content":[{"type":"text","text":"hi",'
        b'"cache_control":{"type":"ephemeral"}}]}],"future_field":[1,{"a":"\\u00e9"}]}'
    )
    body = decode_messages_body(raw, Limits())
    whole = body.whole()
    assert whole["stream"] is False  # decoded: the gateway reads it
    sent = msgspec.json.encode({**whole, "model": "up"})
    assert b'"future_field":[1,{"a":"\\u00e9"}]' in sent
    assert b'"cache_control":{"type":"ephemeral"}' in sent
    assert msgspec.json.decode(sent) == {**json.loads(raw), "model": "up"}


@settings(max_examples=300, deadline=None)
@given(messages_request())
def test_plain_and_typed_requests_convert_the_same(body):
    typed = decode_messages_body(json.dumps(body).encode(), Limits())
    assert anthropic_to_openai(typed, OPTS[0]) == anthropic_to_openai(body, OPTS[0])


_LEAD = st.sampled_from(
    [
        " ",
        "\n",
        "\t",
        "\r",
        "\x0c",
        "\x0b",
        "\x1c",
        "\u00a0",
        "\u2028",
        "\u3000",
        "x",
        "é",
        "\\",
        '"',
        "中",
    ]
)


@settings(max_examples=3000, deadline=None)
@given(st.lists(_LEAD, max_size=60), st.booleans(), text, st.booleans())
def test_the_billing_header_is_told_from_raw_json_as_from_the_text(lead, header, tail, ascii_only):
    from prefixgate.hygiene.billing import PREFIX, _raw_is_header, is_billing_header

    value = "".join(lead) + (PREFIX if header else "x-anthropic") + tail
    want = value.strip().startswith(PREFIX)
    assert is_billing_header(value) == want
    raw = msgspec.Raw(json.dumps(value, ensure_ascii=ascii_only).encode())
    assert _raw_is_header(raw) == want


# -- the decode lent by the session's previous request ------------------------------------
def _lent_verdict(raw: bytes, limits: Limits, turns) -> tuple[str, MessagesBody | None]:
    try:
        body = decode_messages_body(raw, limits, turns, lambda _small: "s")
    except GatewayError as err:
        return err.message, None
    return "ok", body


@st.composite
def request_pair(draw):
    """A request and the session's next one: the same with messages added, and maybe
    one value anywhere replaced or removed (an edited history, new tools, a moved
    marker), so that most parts are equal and some are not."""
    first = draw(rich_request())
    added = draw(st.lists(_message, max_size=3))
    second = copy.deepcopy({**first, "messages": first["messages"] + added})
    if draw(st.booleans()):
        second = _mutate(draw, second)
    return first, second


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(request_pair(), st.sampled_from([Limits(), TIGHT]), st.sampled_from([None, (",", ":")]))
def test_a_lent_decode_is_the_decode_alone(pair, limits, separators):
    from prefixgate.apis.messages.request import SessionTurns
    from prefixgate.record.cut import cut_from_bytes, cut_from_pieces

    turns = SessionTurns(1 << 24)
    first, second = (json.dumps(b, separators=separators).encode() for b in pair)
    kept = _lent_verdict(first, limits, turns)[1]
    verdict, body = _lent_verdict(second, limits, turns)
    assert verdict == _typed_verdict(second, limits)
    if body is None:
        return
    alone = decode_messages_body(second, limits)
    assert type(body.typed) is type(alone.typed)
    assert body.typed == alone.typed and dict(body) == dict(alone)
    segs, pieces = cut_from_pieces(body.pieces, "anthropic")
    assert (segs, pieces) == cut_from_bytes(second, "anthropic")
    assert plain_of(body, OPTS[0]) == plain_of(alone, OPTS[0])
    if kept is not None:  # what was equal was lent: the very structs
        a, b = pair[0]["messages"], pair[1]["messages"]
        for i in range(min(len(a), len(b))):
            if json.dumps(a[i]) == json.dumps(b[i]):
                assert body.typed.messages[i] is kept.typed.messages[i]


def plain_of(body: MessagesBody, opts: ConvertOptions) -> dict:
    return anthropic_to_openai(body, opts)


def test_the_lent_decode_holds_no_body_alive_and_keeps_within_its_budget():
    import gc
    import sys

    from prefixgate.apis.messages.request import SessionTurns

    turns = SessionTurns(1 << 20)
    bodies = [
        {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": f"q{i}"}] * n}
        for i, n in enumerate((2, 3, 4))
    ]
    raws = [json.dumps(b).encode() for b in bodies]
    alone = sys.getrefcount(raws[0])
    for i in range(3):
        decode_messages_body(raws[i], Limits(), turns, lambda _small: "s")
    gc.collect()
    got = [sys.getrefcount(raws[i]) for i in range(3)]  # (not in an assert: pytest's rewriting)
    # each part kept is a copy of its own; the latest body is kept (the next request is
    # compared with it), no earlier one
    assert got[:2] == [alone] * 2 and got[2] == alone + 1
    assert 0 < turns.bytes <= turns.budget
    small = SessionTurns(600)
    for s in range(4):
        decode_messages_body(raws[0], Limits(), small, lambda _small, s=s: s)
        assert small.bytes <= small.budget
    none = SessionTurns(0)
    decode_messages_body(raws[0], Limits(), none, lambda _small: "s")
    assert none.bytes == 0 and none.decoded("s") is None
    # no session: nothing kept, the decode as alone
    plain = SessionTurns(1 << 20)
    body = decode_messages_body(raws[2], Limits(), plain, lambda _small: None)
    assert plain.bytes == 0 and body.pieces is None


def _tail_of(raw: bytes) -> bytes:
    """The request's last two messages as an array (what a second messages key could
    hold to pass for the array in place)."""
    return json.dumps(json.loads(raw)["messages"][-2:]).encode()


def _top_documents(monkeypatch) -> list[bytes]:
    """The documents the typed decode's top level decodes from now on, as it decodes
    them (the list fills as requests are decoded): the top level's, or the array of the
    messages decoded alone when the top level around them is the previous request's."""
    from prefixgate.protocol import messages_body as mb

    decoded: list[bytes] = []
    real = mb._tops
    raws = mb._RAWS

    class Arrays:
        def decode(self, raw):
            decoded.append(raw)
            return raws.decode(raw)

    monkeypatch.setattr(mb, "_RAWS", Arrays())

    def counting(limits):
        top_dec, tools_dec, kind = real(limits)

        class Counting:
            def decode(self, raw):
                decoded.append(raw)
                return top_dec.decode(raw)

        return Counting(), tools_dec, kind

    monkeypatch.setattr(mb, "_tops", counting)
    return decoded


def _place_turns(separators, tail_moves: bool = False) -> list[bytes]:
    """A growing conversation whose last message moves its ``cache_control`` marker (as
    Claude Code's does), the top level's plain fields before the messages (``tail_moves``:
    a field after them changes every turn)."""
    turns, messages = [], []
    for i in range(8):
        messages = [
            {
                **m,
                "content": [
                    {k: v for k, v in b.items() if k != "cache_control"} for b in m["content"]
                ],
            }
            for m in messages
        ]
        messages.append({"role": "user" if i % 2 == 0 else "assistant",
                         "content": [{"type": "text", "text": f"turn {i} " + "x" * i,
                                      "cache_control": {"type": "ephemeral"}}]})  # fmt: skip
        body = {"model": "m", "max_tokens": 9, "messages": messages, "system": "s", "tools": []}
        if tail_moves:
            body["metadata"] = {"user_id": f"u{i}"}
        turns.append(json.dumps(body, separators=separators).encode())
    return turns


@pytest.mark.parametrize("tail_moves", [False, True])
@pytest.mark.parametrize("separators", [None, (",", ":")])
def test_a_session_told_by_its_headers_decodes_only_what_is_new_in_place(
    separators, tail_moves, monkeypatch
):
    """With the session known before the decode, the messages that stand in the previous
    request's bytes at the same place are not decoded again: the document decoded is the
    request without them, or, when the top level around the messages is the previous
    request's byte for byte, the new messages alone; the result is the decode alone's."""
    from prefixgate.apis.messages.request import SessionTurns

    decoded = _top_documents(monkeypatch)
    turns = SessionTurns(1 << 24)
    for k, raw in enumerate(_place_turns(separators, tail_moves)):
        decoded.clear()
        body = decode_messages_body(raw, Limits(), turns, lambda _small: "s")
        alone = decode_messages_body(raw, Limits())
        assert body.typed == alone.typed and dict(body) == dict(alone)
        assert body.pieces is not None
        if k:  # the previous request's message bytes, and how many lead as its very objects
            assert body.lent is not None
            base, same = body.lent
            parts = body.pieces[2]
            assert (
                same == common_prefix(parts, base) == len(parts) - 2
            )  # the last one edited, one new
            assert all(parts[i] is base[i] for i in range(same))
        # from turn 2 on, the messages before the last two (whose marker moved) are not
        # read again: the document decoded is the request without them and their commas
        msgs = json.loads(raw)["messages"]
        comma = b", " if separators is None else b","
        kept = msgs[: max(0, len(msgs) - 2)] if k >= 2 else []
        if k >= 2 and not tail_moves:  # the last two messages, alone
            assert len(decoded) == 1 and json.loads(decoded[0]) == msgs[-2:]
            continue
        left_out = sum(len(json.dumps(m, separators=separators)) + len(comma) for m in kept)
        assert [len(doc) for doc in decoded] == [len(raw) - left_out]


def test_the_messages_lent_in_place_end_at_the_first_that_differs(monkeypatch):
    """Whichever message of a long conversation differs from the previous request's (one
    byte of it), the messages before it are lent and it and those after it are decoded:
    the search for the first difference finds it at every place."""
    from prefixgate.apis.messages.request import SessionTurns

    decoded = _top_documents(monkeypatch)
    messages = [
        {"role": ("user", "assistant")[i % 2], "content": f"message {i:02d} " + "x" * (i * 7)}
        for i in range(37)
    ]
    body = {"model": "m", "max_tokens": 9, "system": "s", "messages": messages}
    first = json.dumps(body, separators=(",", ":")).encode()
    for i in range(1, 37):
        turns = SessionTurns(1 << 24)
        before = decode_messages_body(first, Limits(), turns, lambda _small: "s")
        edited = first.replace(f"message {i:02d}".encode(), f"message {i:02d}!".encode())
        decoded.clear()
        got = decode_messages_body(edited, Limits(), turns, lambda _small: "s")
        assert got.typed == decode_messages_body(edited, Limits()).typed
        # the capture is told how many lead as the previous request's very bytes objects
        assert before.pieces is not None and got.lent == (before.pieces[2], i)
        assert len(decoded) == 1
        left = json.loads(decoded[0])  # the messages decoded (alone): from the edit on
        assert [m["content"][:10] for m in left] == [f"message {j:02d}" for j in range(i, 37)]


def test_the_capture_is_told_every_leading_message_lent_not_only_those_found_in_place():
    """The previous request's last message, re-sent as it was, is found equal after those
    found in place (its end is not the previous bytes': a comma, not the array's end),
    lent too, and counted among those the capture need not compare."""
    from prefixgate.apis.messages.request import SessionTurns

    m = [json.dumps({"role": "user", "content": f"m{i}"}).encode() for i in range(4)]
    head = b'{"model":"m","max_tokens":9,"messages":['
    first = head + b",".join(m[:3]) + b"]}"
    second = head + b",".join(m) + b"]}"
    turns = SessionTurns(1 << 24)
    before = decode_messages_body(first, Limits(), turns, lambda _small: "s")
    got = decode_messages_body(second, Limits(), turns, lambda _small: "s")
    assert before.pieces is not None and got.pieces is not None
    assert got.lent == (before.pieces[2], 3)
    assert all(got.pieces[2][i] is before.pieces[2][i] for i in range(3))


def _utf8_turns() -> list[bytes]:
    """Three turns of a conversation in Chinese, each the previous one and two messages."""
    messages: list[dict] = []
    turns = []
    for i in range(3):
        messages += [
            {"role": "user", "content": f"第{i}轮：请解释这段代码。" + "缓存" * 50},
            {"role": "assistant", "content": f"好的，第{i}轮的回答。" + "前缀" * 50},
        ]
        body = {"model": "m", "max_tokens": 9, "system": "s", "messages": messages}
        turns.append(json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode())
    return turns


def test_a_lent_decode_checks_the_text_of_what_it_decodes_and_not_what_it_lends(monkeypatch):
    """The bytes a session's previous request lends were checked as UTF-8 with it: a turn
    checks the text of its new tail only, and refuses a bad byte there with the error the
    decode alone gives (naming where it is in the body)."""
    from prefixgate.apis.messages.request import SessionTurns
    from prefixgate.protocol import messages_body as mb

    turns = SessionTurns(1 << 24)
    first, second, third = _utf8_turns()
    decode_messages_body(first, Limits(), turns, lambda _small: "s")
    whole: list[int] = []
    real = mb.check_text
    monkeypatch.setattr(mb, "check_text", lambda raw: (whole.append(len(raw)), real(raw)))
    body = decode_messages_body(second, Limits(), turns, lambda _small: "s")
    assert body.typed == decode_messages_body(second, Limits()).typed
    assert whole == [len(second)]  # (the decode alone's, just above); the lent one: none
    bad = third.replace("第2轮".encode(), "第2".encode() + bytes([0xFF]), 1)
    assert bad != third
    with pytest.raises(InvalidRequest) as lent:
        decode_messages_body(bad, Limits(), turns, lambda _small: "s")
    with pytest.raises(InvalidRequest) as alone:
        decode_messages_body(bad, Limits())
    assert str(lent.value) == str(alone.value)
    assert f"at offset {bad.index(bytes([0xFF]))}" in str(lent.value)


def test_a_key_put_between_the_messages_and_the_tail_they_had_is_still_lent(monkeypatch):
    """A request that ends with the previous one's bytes after its messages, but holds a
    new key between its messages and them, is no array of messages up to there: the lent
    decode finds its messages the other way, and the result is the decode alone's (not
    the plain path's, which lends nothing)."""
    from prefixgate.apis.messages.request import SessionTurns
    from prefixgate.protocol import messages_body as mb

    turns = SessionTurns(1 << 24)
    raws = _place_turns((",", ":"))
    for raw in raws[:-1]:
        decode_messages_body(raw, Limits(), turns, lambda _small: "s")
    last = raws[-1].replace(b'],"system"', b'],"metadata":{"user_id":"u"},"system"', 1)
    assert last != raws[-1]

    def plain(raw, limits):
        raise AssertionError("the plain path")

    monkeypatch.setattr(mb, "_plain_path", plain)
    body = decode_messages_body(last, Limits(), turns, lambda _small: "s")
    monkeypatch.undo()
    alone = decode_messages_body(last, Limits())
    assert body.typed == alone.typed and body.typed.metadata == {"user_id": "u"}


@pytest.mark.parametrize(
    "edit",
    [
        lambda b: b.replace(b'"messages"', b'"max_tokens":9,"messages"', 1),  # another head
        lambda b: b[:-1] + b',"messages":[{"role":"user","content":"other"}]}',  # two keys
        lambda b: b[:-1] + b',"messag\\u0065s":' + _tail_of(b) + b"}",  # two, the same tail
        lambda b: b.replace(b"turn 5", b"turn 5\\u0000", 1),  # an edit mid-way
        lambda b: b.replace(b'"turn 6', b'"turn\x016', 1),  # a control character: invalid
        lambda b: b[:-3],  # cut short
        lambda b: b.replace(b'"tools"', b'"metadata":{"user_id":"u"},"tools"', 1),  # another tail
        lambda b: b.replace(b"}]}]", b"}]} ]", 1),  # a blank before the messages' end
        lambda b: b.replace(
            b'"messages":[', b'"messages":[' + b'{"role":"user","content":"a"},' * 40, 1
        ),
    ],
)
def test_a_request_unlike_its_previous_one_in_place_decodes_as_alone(edit):
    """Whatever differs from the previous request in its bytes (its head, a second
    messages key, an edit, an invalid byte, a body cut short, many messages more than
    the limit allows), the lent decode accepts and refuses as the decode alone, and
    gives what it gives."""
    from prefixgate.apis.messages.request import SessionTurns

    limits = Limits(max_messages=40)
    for separators in (None, (",", ":")):
        turns = SessionTurns(1 << 24)
        raws = _place_turns(separators)
        for raw in raws[:-1]:
            decode_messages_body(raw, limits, turns, lambda _small: "s")
        last = edit(raws[-1])
        verdict, body = _lent_verdict(last, limits, turns)
        assert verdict == _typed_verdict(last, limits), last
        if body is not None:
            alone = decode_messages_body(last, limits)
            assert body.typed == alone.typed and dict(body) == dict(alone)


@pytest.mark.parametrize(
    ("rest", "expected"),
    [
        (b"}", True),
        (b',"system":"s","tools":[]}', True),
        (b',"tools":[{"name":"t","input_schema":{"properties":{"messages":{}}}}]}', True),
        (b',"system":"\\u001b[0m colours"}', True),
        (b',"system":"caf\\u00e9","tools":[{"name":"\\u0073earch"}]}', True),
        (b',"messages":[]}', False),
        (b',"\\u006dessages":[]}', False),
        (b',"\\u006Dessages":[]}', False),
        (b',"message\\u0073":[]}', False),
        (b',"mess\\u0061ges":[]}', False),
        (b',"system":"s" , "me\\u0073\\u0073ages" : [1]}', False),
    ],
)
def test_a_second_messages_key_is_found_in_any_spelling(rest, expected):
    """After the messages in place, a second messages key (JSON leaves open which of two
    counts) is found however its name is spelled; a messages property deeper down, or
    an escape that spells no key, is not one."""
    from prefixgate.protocol.placement import single

    head = b'{"model":"m","messages":[{"role":"user","content":"a"}]'
    assert single(head + rest, len(head)) is expected


def test_the_tools_a_session_lends_are_not_checked_again_and_new_ones_are(monkeypatch):
    """A turn whose tools are the previous request's bytes takes its very structs, checked
    when it was decoded under the same limits: they are not walked again. Tools that
    differ are decoded and checked, and a bad one is refused as the decode alone refuses
    it."""
    from prefixgate.apis.messages.request import SessionTurns
    from prefixgate.protocol import messages_body as mb

    tools = [
        {"name": f"t{i}", "description": "d", "input_schema": {"type": "object"}} for i in range(5)
    ]

    def body(n: int, tools=tools) -> bytes:
        msgs = [{"role": "user", "content": f"q{i}"} for i in range(n)]
        return json.dumps(
            {"model": "m", "max_tokens": 5, "tools": tools, "messages": msgs}
        ).encode()

    turns = SessionTurns(1 << 24)
    first = decode_messages_body(body(1), Limits(), turns, lambda _small: "s")
    walked: list[object] = []
    real = mb._deep
    monkeypatch.setattr(mb, "_deep", lambda v, room, at: (walked.append(at), real(v, room, at)))
    second = decode_messages_body(body(2), Limits(), turns, lambda _small: "s")
    assert second.typed.tools[0] is first.typed.tools[0]
    assert 4 not in walked  # no tool's type walked
    assert second.typed == decode_messages_body(body(2), Limits()).typed
    walked.clear()
    other = [*tools, {"name": "u", "description": "d", "input_schema": {"type": "object"}}]
    third = decode_messages_body(body(3, other), Limits(), turns, lambda _small: "s")
    assert walked.count(4) == len(other)  # new tools: each checked
    assert third.typed == decode_messages_body(body(3, other), Limits()).typed
    bad = [*tools, {"name": "u", "description": "d", "input_schema": [1]}]
    with pytest.raises(InvalidRequest) as lent:
        decode_messages_body(body(4, bad), Limits(), turns, lambda _small: "s")
    with pytest.raises(InvalidRequest) as alone:
        decode_messages_body(body(4, bad), Limits())
    assert str(lent.value) == str(alone.value)
