"""Tokenizer adapters: approximate, Hugging Face file, remote /tokenize."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixgate.cache.tokenizer import (
    ApproxTokenizer,
    HFTokenizer,
    RemoteTokenizer,
    Tokenizer,
    TokenizerError,
    get_tokenizer,
)

# -- approximate tokenizer -------------------------------------------------------------


def test_approx_is_four_ascii_chars_per_token() -> None:
    tok = ApproxTokenizer()
    assert tok.name == "approx"
    assert tok.encode("") == []
    assert tok.encode("abcd") == [int.from_bytes(b"abcd", "little")]
    assert tok.encode("abcde") == [int.from_bytes(b"abcd", "little"), ord("e")]
    assert len(tok.encode("x" * 400)) == 100
    assert isinstance(tok, Tokenizer)


def test_approx_ids_are_python_ints() -> None:
    ids = ApproxTokenizer().encode("héllo wörld ✓ \U0001f600")
    assert all(type(i) is int for i in ids)
    assert all(0 <= i < 2**32 for i in ids)


def test_approx_encode_array_matches_encode() -> None:
    tok = ApproxTokenizer()
    arr = tok.encode_array("some text, 12345")
    assert isinstance(arr, np.ndarray)
    assert arr.tolist() == tok.encode("some text, 12345")


def test_approx_is_deterministic_across_instances() -> None:
    # a fixed value: never depends on the process (no salted hash())
    assert ApproxTokenizer().encode("Hello, world") == [1819043144, 1998597231, 1684828783]


@settings(deadline=None)
@given(st.text())
def test_approx_count_equals_len_encode(text: str) -> None:
    tok = ApproxTokenizer()
    assert tok.count(text) == len(tok.encode(text))


@settings(deadline=None)
@given(st.text(), st.text())
def test_approx_is_prefix_stable(a: str, rest: str) -> None:
    tok = ApproxTokenizer()
    ea, eb = tok.encode(a), tok.encode(a + rest)
    stable = ea[:-1]
    assert eb[: len(stable)] == stable


@settings(deadline=None)
@given(st.text())
def test_approx_equal_text_equal_tokens(text: str) -> None:
    assert ApproxTokenizer().encode(text) == ApproxTokenizer().encode(str(text))


# -- Hugging Face tokenizer.json --------------------------------------------------------


@pytest.fixture()
def tokenizer_json(tmp_path: Path) -> Path:
    """A tiny WordLevel tokenizer trained here (offline), with a post-processor that adds
    <s> when special tokens are requested, so their absence is observable."""
    from tokenizers import Tokenizer as HFTok
    from tokenizers import models, pre_tokenizers, processors, trainers

    tok = HFTok(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=["<unk>", "<s>", "</s>"])
    tok.train_from_iterator(
        ["the cache is hot", "the cache is cold", "a prefix is a prefix"], trainer=trainer
    )
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", bos)]
    )
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return path


def test_hf_tokenizer_from_file(tokenizer_json: Path) -> None:
    tok = HFTokenizer.from_file(tokenizer_json)
    ids = tok.encode("the cache is hot")
    assert len(ids) == 4
    assert tok.count("the cache is hot") == 4
    assert tok.encode("the cache") == ids[:2]
    assert tok.name.startswith("hf:")
    assert isinstance(tok, Tokenizer)


def test_hf_tokenizer_adds_no_special_tokens(tokenizer_json: Path) -> None:
    from tokenizers import Tokenizer as HFTok

    raw = HFTok.from_file(str(tokenizer_json))
    bos = raw.token_to_id("<s>")
    assert raw.encode("the cache").ids[0] == bos  # the post-processor is active
    assert bos not in HFTokenizer.from_file(tokenizer_json).encode("the cache")


def test_hf_tokenizer_from_directory_and_spec(tokenizer_json: Path) -> None:
    by_dir = HFTokenizer.from_file(tokenizer_json.parent)
    by_spec = get_tokenizer(f"hf:{tokenizer_json}")
    assert by_dir.encode("a prefix") == by_spec.encode("a prefix")


def test_hf_tokenizer_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError):
        HFTokenizer.from_file(tmp_path / "nope.json")


# -- remote /tokenize -------------------------------------------------------------------


class _Stub:
    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.status = 200


@pytest.fixture()
def stub() -> Iterator[tuple[str, _Stub]]:
    """A vLLM-like /tokenize on loopback: ApproxTokenizer over the prompt, or over the
    JSON of the messages for chat requests."""
    state = _Stub()
    approx = ApproxTokenizer()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server API)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            state.requests.append((self.path, body))
            if self.path != "/tokenize" or state.status != 200:
                self.send_response(404 if self.path != "/tokenize" else state.status)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            text = body["prompt"] if "prompt" in body else json.dumps(body["messages"])
            tokens = approx.encode(text)
            out = json.dumps({"tokens": tokens, "count": len(tokens), "max_model_len": 4096})
            data = out.encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", state
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_remote_encode_posts_to_root_tokenize(stub: tuple[str, _Stub]) -> None:
    url, state = stub
    with RemoteTokenizer(url + "/v1/", "tiny") as tok:
        assert tok.encode("Hello, world") == ApproxTokenizer().encode("Hello, world")
        assert tok.count("Hello, world!") == 4
    path, body = state.requests[0]
    assert path == "/tokenize"
    assert body == {"model": "tiny", "prompt": "Hello, world", "add_special_tokens": False}


def test_remote_encode_chat(stub: tuple[str, _Stub]) -> None:
    url, state = stub
    messages = [{"role": "user", "content": "hi"}]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    with RemoteTokenizer(url, "tiny") as tok:
        ids = tok.encode_chat(messages, tools)
    assert ids == ApproxTokenizer().encode(json.dumps(messages))
    _, body = state.requests[0]
    assert body == {
        "model": "tiny",
        "messages": messages,
        "tools": tools,
        "add_generation_prompt": True,
    }


def test_remote_spec_and_model_optional(stub: tuple[str, _Stub]) -> None:
    url, state = stub
    tok = get_tokenizer(f"remote:{url}/v1#tiny")
    assert isinstance(tok, RemoteTokenizer)
    assert tok.model == "tiny"
    assert tok.name == f"remote:{url}#tiny"
    tok.close()
    with RemoteTokenizer(url) as bare:
        bare.encode("x")
    assert "model" not in state.requests[-1][1]


def test_remote_http_error_is_mapped(stub: tuple[str, _Stub]) -> None:
    url, state = stub
    state.status = 500
    with RemoteTokenizer(url, "tiny") as tok, pytest.raises(TokenizerError, match="500"):
        tok.encode("x")


def test_remote_connection_error_is_mapped() -> None:
    import socket

    with socket.socket() as s:  # a loopback port with nobody listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tok = RemoteTokenizer(f"http://127.0.0.1:{port}", timeout=2)
    with tok, pytest.raises(TokenizerError) as info:
        tok.encode("x")
    assert info.value.__cause__ is not None


# -- specs ------------------------------------------------------------------------------


def test_get_tokenizer_specs() -> None:
    assert isinstance(get_tokenizer("approx"), ApproxTokenizer)
    assert isinstance(get_tokenizer(""), ApproxTokenizer)
    for bad in ("bogus", "hf:", "remote:", "sentencepiece:x"):
        with pytest.raises(TokenizerError):
            get_tokenizer(bad)
