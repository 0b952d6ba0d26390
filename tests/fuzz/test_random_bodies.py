"""Hypothesis-generated bodies, valid-looking and not, against the live gateway: never a
5xx, never a hang, always the route's own error shape."""

from __future__ import annotations

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fakes import Reply

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=20,
)
block = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "image", "tool_use", "tool_result", "thinking", "bogus"])},
    optional={
        "text": json_values,
        "id": json_values,
        "name": json_values,
        "input": json_values,
        "tool_use_id": json_values,
        "content": json_values,
        "source": json_values,
        "thinking": json_values,
    },
)
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", "tool", "x"])},
    optional={"content": st.one_of(st.text(max_size=30), st.lists(block, max_size=3), json_values)},
)
messages_body = st.fixed_dictionaries(
    {},
    optional={
        "model": st.one_of(st.just("m"), json_values),
        "max_tokens": st.one_of(st.integers(-5, 100), json_values),
        "messages": st.one_of(st.lists(message, max_size=4), json_values),
        "system": st.one_of(st.text(max_size=20), st.lists(block, max_size=2), json_values),
        "tools": st.one_of(st.lists(json_values, max_size=2), json_values),
        "tool_choice": json_values,
        "stream": st.one_of(st.booleans(), json_values),
        "thinking": json_values,
        "metadata": json_values,
        "stop_sequences": json_values,
    },
)
chat_body = st.fixed_dictionaries(
    {},
    optional={
        "model": st.one_of(st.just("m"), json_values),
        "messages": st.one_of(st.lists(message, max_size=4), json_values),
        "stream": st.one_of(st.booleans(), json_values),
        "stream_options": json_values,
        "tools": json_values,
        "temperature": json_values,
    },
)


def test_random_bodies_never_5xx(gateway, upstream):
    gw = gateway()
    upstream.script = lambda b: Reply(text="ok")
    client = httpx.Client(base_url=gw.url, timeout=20)

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        st.sampled_from(["/v1/messages", "/v1/messages/count_tokens", "/v1/chat/completions"]),
        st.data(),
    )
    def check(path, data):
        body = data.draw(chat_body if "chat" in path else messages_body)
        r = client.post(path, json=body)
        assert r.status_code < 500, (path, body, r.text)
        if r.status_code >= 400:
            doc = r.json()
            if path.startswith("/v1/messages"):
                assert doc["type"] == "error" and doc["error"]["message"]
            else:
                assert doc["error"]["message"]

    try:
        check()
    finally:
        client.close()
