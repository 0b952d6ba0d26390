"""Request → the engine's tokens: the exact token ids an engine sees for a chat request.

Everything the engine tells (KV events keyed by token ids, ``prompt_tokens``) is about
tokens, and the gateway holds messages. This module turns the OpenAI chat request a
channel receives into the ids its engine will compute, two ways:

- **locally** (:meth:`EngineTokens.token_ids`, sync, CPU only): the channel's chat
  template (``chat_template:``, a ``.jinja`` file or ``tokenizer_config.json``; without
  one, the cache model's :class:`~prefixgate.cache.ChatRenderer` in ``render_order``, the
  simulated upstream's own format) and its tokenizer (``tokenizer:``, ``approx`` or
  ``hf:PATH``). Messages go through what vLLM does before its template (text parts joined
  by newlines, tool-call arguments decoded to objects). Per session, the previous prompt
  is kept: a turn renders only the messages that changed (the ``ChatRenderer``; a Jinja
  template renders the whole conversation, unless its inputs equal the previous
  request's, as when routing and then the ledger ask for one request: then neither the
  template nor the tokenizer runs again) and tokenizes only from the last special
  token both prompts share (:mod:`tokenizers` cuts its input at added tokens, so
  the ids before such a cut do not depend on the text after it), and hashes only the
  blocks past the common prefix (:meth:`EngineTokens.content_keys`).
- **from the upstream** (:meth:`EngineTokens.remote_token_ids`, async): vLLM's
  ``POST /tokenize`` with ``messages`` and ``tools`` (the simulated upstream has it too),
  through the gateway's own :class:`~prefixgate.upstream.Upstream`. The truth, at the cost
  of a round trip: a check, or for work off the request path.

How to call it (the gateway holds one, ``gateway.engine_tokens``; ``app.state.gateway``)::

    tokens = gateway.engine_tokens                       # or EngineTokens(config.channels)
    ids = tokens.token_ids(channel, chat_request, session=record.session_id).ids
    ids = await tokens.remote_token_ids(channel, chat_request, replica_url, gateway.upstream)

``channel`` is a :class:`~prefixgate.config.ChannelConfig` (or its name), ``chat_request``
the OpenAI chat request as that channel receives it, decoded (``messages``, ``tools``,
optionally ``chat_template_kwargs`` / ``add_generation_prompt``). ``len(ids)`` equals the
engine's ``prompt_tokens`` when the channel's template and tokenizer are the engine's.
Errors (a template that fails, a tokenizer file that cannot be read, an upstream that
does not answer) raise :class:`EngineTokensError`; callers on the request path fall back.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np

from prefixgate.cache import (
    ApproxTokenizer,
    ChatRenderer,
    HFTokenizer,
    JinjaChatTemplate,
    RenderError,
    TokenizerError,
    get_tokenizer,
)
from prefixgate.cache.blocks import Tokens, hash_blocks
from prefixgate.cache.render import vllm_messages
from prefixgate.config import ChannelConfig
from prefixgate.engine.order import RenderOrders

if TYPE_CHECKING:
    from prefixgate.upstream import Upstream

__all__ = ["EngineTokens", "EngineTokensError", "PromptTokens"]

_CHUNK = 4096  # characters compared at once when looking for the common prefix
_JINJA = "jinja"  # a Jinja template's kept inputs: (_JINJA, messages, the rest, text)
_JSON, _JSON_OUT = msgspec.json.Decoder(), msgspec.json.Encoder()


class EngineTokensError(Exception):
    """The request's tokens could not be had (template, tokenizer or upstream failed)."""


@dataclass(frozen=True, slots=True)
class PromptTokens:
    """A request's prompt as its engine tokenizes it. ``ids`` is a list of ints, or a
    numpy array for the approximate tokenizer; ``reused`` leading ids were taken from the
    session's previous prompt without tokenizing them again."""

    ids: Tokens
    reused: int = 0

    def __len__(self) -> int:
        return len(self.ids)


@dataclass(slots=True)
class _Previous:
    """One session's last prompt on one channel."""

    text: str
    ids: Tokens
    offsets: list[int] | None = None  # per token, its end (chars), for a cut
    cuts: list[tuple[int, int]] = field(default_factory=list)  # (end char, tokens) at cuts
    keys: dict[int, list[bytes]] = field(default_factory=dict)  # block size -> content keys
    parts: tuple | None = None  # ChatRenderer: (tools, their text, messages, their texts)

    @property
    def size(self) -> int:
        text = len(self.text) * (2 if self.parts is not None else 1)
        return text + 8 * len(self.ids) + 40 * sum(len(k) for k in self.keys.values())


class _Channel:
    """One channel's renderer and tokenizer, built on first use."""

    def __init__(self, ch: ChannelConfig, orders: RenderOrders) -> None:
        self.name = ch.name
        self.tokenizer_spec = ch.tokenizer
        self.template_path = ch.chat_template
        self.channel = ch  # its render order: learned from the upstream, at first use
        self.orders = orders
        self._renderer: Any = None
        self._tokenizer: Any = None
        self.special: frozenset[int] = frozenset()

    def renderer(self) -> Any:
        if self.template_path:
            if self._renderer is None:
                self._renderer = JinjaChatTemplate.from_file(self.template_path)
            return self._renderer
        order = self.orders.render_order(self.channel)  # learned after the first use, maybe
        if self._renderer is None or self._renderer.order != order:
            self._renderer = ChatRenderer(order)
        return self._renderer

    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            tok = get_tokenizer(self.tokenizer_spec)
            if isinstance(tok, HFTokenizer):
                self.special = frozenset(tok.hard_boundaries())
            self._tokenizer = tok
        return self._tokenizer

    def render(self, request: dict, prev: tuple | None) -> tuple[str, tuple | None]:
        """The prompt text, and for the :class:`ChatRenderer` its parts, of which those
        equal to the previous request's (``prev``) are not rendered again."""
        renderer = self.renderer()
        messages = request.get("messages") or []
        tools = request.get("tools") or None
        generation = request.get("add_generation_prompt", True) is not False
        if isinstance(renderer, JinjaChatTemplate):
            kwargs = request.get("chat_template_kwargs")
            kwargs = kwargs if isinstance(kwargs, dict) else {}
            prepared = vllm_messages(messages)
            # The template is a function of its inputs (unless it reads the clock): the
            # same inputs as the previous request's give the same text, not rendered
            # again. The prepared messages are built anew from the request; the tools
            # and the template's arguments are kept as a copy (a caller's later edit to
            # its own objects cannot make a stale text look current). Compared in C.
            rest = [tools, generation, kwargs]
            if prev is not None and prev[0] == _JINJA and prev[1] == prepared and prev[2] == rest:
                return prev[3], prev
            text = renderer.render(prepared, tools, generation, **kwargs)
            if not renderer.deterministic:
                return text, None
            try:
                kept = _JSON.decode(_JSON_OUT.encode(rest))
            except (TypeError, ValueError):  # not JSON (not from a request): not kept
                return text, None
            return text, (_JINJA, prepared, kept, text)
        if not isinstance(renderer, ChatRenderer):
            return renderer.render(messages, tools, generation), None
        same, texts = 0, []
        if prev is not None and prev[0] == _JINJA:
            prev = None
        if prev is None or tools != prev[0]:
            tools_text = renderer.tools_text(tools)
        else:
            tools_text = prev[1]
        if prev is not None:
            old, n = prev[2], min(len(messages), len(prev[2]))
            while same < n and messages[same] == old[same]:  # each compared in C
                same += 1
            texts = prev[3][:same]
        texts += [renderer.message_text(m) for m in messages[same:]]
        text = renderer.assemble(tools_text, messages, texts, generation)
        return text, (tools, tools_text, list(messages), texts)


def _common_prefix(a: Sequence, b: Sequence) -> int:
    """Length of the longest common prefix of two strings or lists (compared in C, chunk
    by chunk, then by halves)."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i : i + _CHUNK] == b[i : i + _CHUNK]:
        i += _CHUNK
    if i >= n:
        return n
    lo, hi = i, min(i + _CHUNK, n)  # a[:lo] == b[:lo]; they differ before hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _common_ids(a: Tokens, b: Tokens) -> int:
    """Length of the longest common prefix of two id sequences."""
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        n = min(len(a), len(b))
        diff = np.flatnonzero(a[:n] != b[:n])
        return int(diff[0]) if len(diff) else n
    return _common_prefix(list(a), list(b))


class EngineTokens:
    """Per channel, the engine's token ids of a chat request; per session, the last
    prompt, so that a turn costs its new tail. Memory is bounded by ``max_bytes`` (an LRU
    of sessions; a session's entry is about 9 bytes per prompt token, and for a
    template's text and its inputs, twice the prompt's characters). ``orders``: what the
    gateway learned of each channel's template (none learned yet, when not given)."""

    def __init__(
        self,
        channels: Iterable[ChannelConfig],
        *,
        max_bytes: int = 64 << 20,
        orders: RenderOrders | None = None,
    ) -> None:
        self.orders = orders if orders is not None else RenderOrders()
        self._channels = {ch.name: _Channel(ch, self.orders) for ch in channels}
        self.max_bytes = max_bytes
        self._sessions: OrderedDict[tuple[str, str], _Previous] = OrderedDict()
        self._bytes = 0
        self.reused_tokens = 0  # ids taken from a session's previous prompt
        self.tokenized_tokens = 0  # ids tokenized

    # -- local ------------------------------------------------------------------------------
    def token_ids(
        self, channel: ChannelConfig | str, request: dict, *, session: str | None = None
    ) -> PromptTokens:
        """The ids the channel's engine computes for ``request`` (see the module doc)."""
        entry, reused, _ = self._tokens(channel, request, session)
        return PromptTokens(entry.ids, reused)

    def content_keys(
        self,
        channel: ChannelConfig | str,
        request: dict,
        block_size: int,
        *,
        session: str | None = None,
    ) -> tuple[PromptTokens, list[bytes]]:
        """The ids and the content keys of their full blocks (the keys of
        :mod:`prefixgate.events.index`), the session's shared blocks not hashed again."""
        entry, reused, kept = self._tokens(channel, request, session)
        old = entry.keys.get(block_size) or []  # valid for entry.ids (see _tokens)
        done = len(old) * block_size
        keys = old + hash_blocks(entry.ids[done:], block_size, parent=old[-1] if old else None)
        if kept:  # kept for the session (or the opening): its keys too
            self._bytes += 40 * (len(keys) - sum(len(k) for k in entry.keys.values()))
            entry.keys = {block_size: keys}
        return PromptTokens(entry.ids, reused), keys

    def _tokens(
        self, channel: ChannelConfig | str, request: dict, session: str | None
    ) -> tuple[_Previous, int, bool]:
        """The prompt's entry, how many ids were reused, and whether the entry is kept
        (for the session, or the opening). The entry keeps the content keys of the blocks
        it shares with the previous prompt."""
        ch = self._channels.get(_name(channel))
        if ch is None:
            if not isinstance(channel, ChannelConfig):
                raise EngineTokensError(f"no channel named {channel!r}")
            ch = self._channels[channel.name] = _Channel(channel, self.orders)
        if session is None:  # an earlier prompt that began alike helps just as well
            session = _opening(request)
        key = (ch.name, session) if session is not None else None
        prev = self._sessions.pop(key, None) if key is not None else None
        if prev is not None:
            self._bytes -= prev.size
        try:
            text, parts = ch.render(request, None if prev is None else prev.parts)
            tok = ch.tokenizer()
            if prev is not None and text is prev.text:  # the same prompt again: its ids
                entry, reused = _Previous(text, prev.ids, prev.offsets, prev.cuts), len(prev.ids)
            elif isinstance(tok, ApproxTokenizer):
                entry, reused = _Previous(text, tok.encode_array(text)), 0
            elif isinstance(tok, HFTokenizer):
                entry, reused = _hf_tokens(tok, ch.special, text, prev)
            else:
                entry, reused = _Previous(text, tok.encode(text)), 0
        except (RenderError, TokenizerError, OSError, ValueError, TypeError) as exc:
            raise EngineTokensError(f"channel {ch.name}: {exc}") from exc
        entry.parts = parts if key is not None else None
        self.reused_tokens += reused
        self.tokenized_tokens += len(entry.ids) - reused
        if prev is not None and prev.keys:
            common = reused or _common_ids(prev.ids, entry.ids)
            entry.keys = {b: k[: common // b] for b, k in prev.keys.items()}
        kept = key is not None and self._keep(key, entry)
        return entry, reused, kept

    def _keep(self, key: tuple[str, str], entry: _Previous) -> bool:
        size = entry.size
        if size > self.max_bytes:
            return False
        self._sessions[key] = entry
        self._bytes += size
        while self._bytes > self.max_bytes:
            _, old = self._sessions.popitem(last=False)
            self._bytes -= old.size
        return key in self._sessions

    def forget(self, session: str) -> None:
        """Drop a session's previous prompts (every channel)."""
        for key in [k for k in self._sessions if k[1] == session]:
            self._bytes -= self._sessions.pop(key).size

    # -- from the upstream ------------------------------------------------------------------
    async def remote_token_ids(
        self, channel: ChannelConfig, request: dict, replica: str, upstream: Upstream
    ) -> list[int]:
        """The ids the replica's engine reports for ``request`` (vLLM's ``POST /tokenize``
        with ``messages`` and ``tools``, at the server's root), through ``upstream``."""
        from prefixgate.engine.channel import bearer
        from prefixgate.errors import GatewayError

        payload: dict[str, Any] = {"messages": tokenize_messages(request.get("messages") or [])}
        for k in ("model", "tools", "chat_template_kwargs", "add_generation_prompt"):
            if request.get(k) is not None:
                payload[k] = request[k]
        url = replica.rstrip("/").removesuffix("/v1") + "/tokenize"
        try:
            resp = await upstream.open(
                url,
                msgspec.json.encode(payload),
                timeouts=channel.timeouts,
                extra_headers=bearer(channel),
                tls=channel.tls,
            )
            parts = []
            try:
                while (chunk := await resp.next(channel.timeouts.idle)) is not None:
                    parts.append(chunk)
            finally:
                await resp.aclose()
            body = msgspec.json.decode(b"".join(parts))
        except (GatewayError, msgspec.DecodeError) as exc:
            raise EngineTokensError(f"POST {url}: {exc}") from exc
        tokens = body.get("tokens") if isinstance(body, dict) else None
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise EngineTokensError(f"POST {url}: no token list in the answer")
        return tokens


def tokenize_messages(messages: list) -> list:
    """Messages for ``/tokenize`` as its chat completion saw them: vLLM's chat request
    renames an assistant's ``reasoning_content`` to ``reasoning`` before templating, its
    ``/tokenize`` request does not (0.32), so a message carrying only the old name would
    render there without its reasoning. Both names are given."""
    out = []
    for m in messages:
        if (
            isinstance(m, dict)
            and m.get("reasoning_content") is not None
            and m.get("reasoning") is None
        ):
            m = {**m, "reasoning": m["reasoning_content"]}
        out.append(m)
    return out


def _opening(request: dict) -> str | None:
    """For a request without a session: the start of its first message, under which the
    previous prompt that began alike is kept (its shared parts are reused as a session's
    would be; which earlier prompt it is changes the cost, never the ids)."""
    messages = request.get("messages")
    if not messages or not isinstance(messages[0], dict):
        return None
    content = messages[0].get("content")
    if isinstance(content, list) and content and isinstance(content[0], dict):
        content = content[0].get("text")
    if not isinstance(content, str):
        return None
    return f"\0{messages[0].get('role')}\0{content[:2048]}"


def _name(channel: ChannelConfig | str) -> str:
    return channel if isinstance(channel, str) else channel.name


def _hf_tokens(
    tok: HFTokenizer, special: frozenset[int], text: str, prev: _Previous | None
) -> tuple[_Previous, int]:
    """Tokenize ``text``, reusing the previous prompt's ids up to the last cut (the end of
    an added token) inside the common text prefix; (entry, ids reused)."""
    start, kept, ids, ends, cuts = 0, 0, [], [], []
    if prev is not None and prev.offsets is not None and prev.cuts:
        common = _common_prefix(prev.text, text)
        i = bisect.bisect_right(prev.cuts, (common, 1 << 62)) - 1
        if i >= 0:
            start, kept = prev.cuts[i]
            ids, ends, cuts = prev.ids[:kept], prev.offsets[:kept], prev.cuts[: i + 1]
    tail, tail_ends = tok.encode_tail(text, start)
    ids = list(ids) + tail
    ends = ends + tail_ends
    cuts += [(ends[j], j + 1) for j in range(kept, len(ids)) if ids[j] in special]
    return _Previous(text, ids, ends, cuts), kept
