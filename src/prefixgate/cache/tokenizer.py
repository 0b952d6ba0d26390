"""Tokenizer adapters: text to token ids, the input of every cache computation.

Three implementations share the small :class:`Tokenizer` protocol:

- :class:`ApproxTokenizer` ("approx", the default): no model files, deterministic on every
  machine, about 4 characters per token for ASCII and prefix-stable.
- :class:`HFTokenizer`: a Hugging Face ``tokenizer.json`` through the ``tokenizers`` package.
- :class:`RemoteTokenizer`: asks the upstream itself (vLLM's ``POST /tokenize``).

:func:`get_tokenizer` turns a spec string (``approx``, ``hf:PATH``, ``remote:URL[#model]``)
into one of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = [
    "ApproxTokenizer",
    "HFTokenizer",
    "RemoteTokenizer",
    "Tokenizer",
    "TokenizerError",
    "get_tokenizer",
]

_CHUNK = 4  # bytes per approximate token


class TokenizerError(Exception):
    """A tokenizer could not be built or could not tokenize (bad spec, file, upstream)."""


@runtime_checkable
class Tokenizer(Protocol):
    """What the cache model needs from a tokenizer."""

    name: str

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, without special tokens added."""
        ...

    def count(self, text: str) -> int:
        """``len(self.encode(text))``, possibly without building the list."""
        ...


class ApproxTokenizer:
    """UTF-8 bytes in 4-byte chunks; each chunk's little-endian uint32 is the token id.

    Deterministic across processes and machines (no salted ``hash()``), exactly 4 ASCII
    characters per token, and prefix-stable: if text A is a prefix of text B, then
    ``encode(A)[:-1]`` is a prefix of ``encode(B)`` (only A's last, zero-padded chunk can
    differ). Ids are in ``[0, 2**32)``.
    """

    name = "approx"

    def encode(self, text: str) -> list[int]:
        ids: list[int] = self.encode_array(text).tolist()
        return ids

    def encode_array(self, text: str) -> np.ndarray:
        """The token ids as a numpy ``uint32`` array (no Python int objects)."""
        data = text.encode("utf-8")
        pad = -len(data) % _CHUNK
        if pad:
            data += b"\0" * pad
        return np.frombuffer(data, dtype="<u4")

    def count(self, text: str) -> int:
        if text.isascii():
            n = len(text)
        else:
            n = len(text.encode("utf-8"))
        return -(-n // _CHUNK)

    def __repr__(self) -> str:
        return "ApproxTokenizer()"


class HFTokenizer:
    """A Hugging Face fast tokenizer (``tokenizer.json``); never adds special tokens,
    because the chat template already writes them into the prompt text."""

    def __init__(self, tokenizer: Any, name: str = "hf") -> None:
        self._tok = tokenizer
        self.name = name

    @classmethod
    def from_file(cls, path: str | Path) -> HFTokenizer:
        from tokenizers import Tokenizer as _HFTokenizer

        path = Path(path)
        if path.is_dir():
            path = path / "tokenizer.json"
        try:
            tok = _HFTokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises plain Exception subclasses
            raise TokenizerError(f"cannot load tokenizer from {path}: {exc}") from exc
        return cls(tok, name=f"hf:{path}")

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def count(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False).ids)

    def encode_tail(self, text: str, start: int = 0) -> tuple[list[int], list[int]]:
        """The ids of ``text[start:]`` and, per id, the end of its span in ``text``
        (characters): the tail of a prompt whose head is already tokenized."""
        enc = self._tok.encode(text[start:], add_special_tokens=False)
        return list(enc.ids), [start + e for _, e in enc.offsets]

    def hard_boundaries(self) -> list[int]:
        """Ids of the added tokens the tokenizer splits its input at, whatever surrounds
        them (matched on the raw text, no whitespace stripped): the text before and after
        one tokenize independently, so a prompt can be tokenized piecewise at them."""
        return [
            i
            for i, t in self._tok.get_added_tokens_decoder().items()
            if not (t.lstrip or t.rstrip or t.normalized or t.single_word)
        ]

    def __repr__(self) -> str:
        return f"HFTokenizer(name={self.name!r})"


def _tokenize_root(base_url: str) -> str:
    """vLLM serves ``/tokenize`` at the root, not under ``/v1``."""
    url = base_url.rstrip("/")
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    return url


class RemoteTokenizer:
    """Tokenizes through an upstream's vLLM-style ``POST /tokenize`` (sync, httpx).

    ``encode_chat`` asks the upstream to apply its own chat template, which is the most
    faithful way to learn the exact prompt tokens of a chat request.
    """

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        *,
        timeout: float = 30.0,
        transport: Any = None,
    ) -> None:
        import httpx

        self.base_url = _tokenize_root(base_url)
        self.model = model
        self.name = f"remote:{self.base_url}" + (f"#{model}" if model else "")
        self._client = httpx.Client(timeout=timeout, transport=transport)

    def _post(self, payload: dict[str, Any]) -> dict[str, Any]:
        import httpx

        if self.model is not None:
            payload = {"model": self.model, **payload}
        url = f"{self.base_url}/tokenize"
        try:
            resp = self._client.post(url, json=payload)
        except httpx.HTTPError as exc:
            raise TokenizerError(f"POST {url} failed: {type(exc).__name__}") from exc
        if resp.status_code != 200:
            raise TokenizerError(f"POST {url} returned HTTP {resp.status_code}")
        try:
            body: dict[str, Any] = resp.json()
            tokens = body["tokens"]
        except (ValueError, KeyError, TypeError) as exc:
            raise TokenizerError(f"POST {url} returned an unexpected body") from exc
        if not isinstance(tokens, list):
            raise TokenizerError(f"POST {url} returned non-list tokens")
        return body

    def encode(self, text: str) -> list[int]:
        body = self._post({"prompt": text, "add_special_tokens": False})
        return [int(t) for t in body["tokens"]]

    def count(self, text: str) -> int:
        body = self._post({"prompt": text, "add_special_tokens": False})
        count = body.get("count")
        return int(count) if isinstance(count, int) else len(body["tokens"])

    def encode_chat(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> list[int]:
        """Prompt tokens of a chat request, rendered by the upstream's own template."""
        payload: dict[str, Any] = {
            "messages": list(messages),
            "add_generation_prompt": True,
        }
        if tools:
            payload["tools"] = list(tools)
        body = self._post(payload)
        return [int(t) for t in body["tokens"]]

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> RemoteTokenizer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RemoteTokenizer(base_url={self.base_url!r}, model={self.model!r})"


def get_tokenizer(spec: str) -> Tokenizer:
    """Build a tokenizer from ``approx``, ``hf:PATH`` or ``remote:URL[#model]``."""
    spec = spec.strip()
    if spec in ("", "approx"):
        return ApproxTokenizer()
    kind, sep, rest = spec.partition(":")
    if sep and kind == "hf" and rest:
        return HFTokenizer.from_file(rest)
    if sep and kind == "remote" and rest:
        url, _, model = rest.partition("#")
        return RemoteTokenizer(url, model or None)
    raise TokenizerError(f"unknown tokenizer spec {spec!r} (approx, hf:PATH, remote:URL[#model])")
