"""The ``prefix`` policy's estimate of what each replica has cached.

Like llm-d's approximate scorer: the upstream request is rendered with the cache model
(:class:`~prefixgate.cache.ChatRenderer` + :class:`~prefixgate.cache.ApproxTokenizer`,
about 4 characters a token), cut into blocks (16 tokens, or the channel's
``routing.block_size``) and hashed as vLLM chains them. A bounded LRU per replica keeps
the block hashes recently sent there; a replica's match is the number of LEADING prompt
blocks found in its LRU (a prefix cache only helps up to the first miss).

The prompt is hashed once per request and reused for every replica. Blocks are inserted
tail first, so the LRU forgets the end of a chain before its beginning, the order in
which vLLM's free queue evicts.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from prefixgate.cache import ApproxTokenizer, ChatRenderer, hash_blocks

__all__ = ["BlockLRU", "PromptBlocks", "engine_messages", "prompt_blocks"]

_TOKENIZER = ApproxTokenizer()


@dataclass(frozen=True, slots=True)
class PromptBlocks:
    """The chained hashes of a prompt's full blocks. ``engine_tokens``: set when they are
    the content keys of the engine's token ids (``routing.policy: precise``), their count."""

    hashes: tuple[bytes, ...]
    block_size: int
    engine_tokens: int | None = None

    def __len__(self) -> int:
        return len(self.hashes)


def prompt_blocks(
    request: dict, block_size: int = 16, order: str = "tools_first", rendering=None
) -> PromptBlocks:
    """Render an OpenAI chat request as the cache model does and hash its full blocks;
    with the upstream's ``rendering`` (:class:`~prefixgate.engine.rendering.Rendering`),
    in the order its template renders the pieces (:func:`engine_messages`)."""
    messages = request.get("messages") or []
    if rendering is not None:
        order, messages = rendering.tools, engine_messages(messages, rendering)
    text = ChatRenderer(order).render(messages, request.get("tools"))  # type: ignore[arg-type]
    tokens = _TOKENIZER.encode_array(text)
    return PromptBlocks(tuple(hash_blocks(tokens, block_size)), block_size)


def engine_messages(messages: list, rendering) -> list:
    """The messages in the order the upstream's template renders them, for the estimate:
    a template that hoists later system messages (``system: hoisted``) gets them after the
    leading ones, at the head; one that renders past reasoning only after the last user
    query (``reasoning: until_next_user``) gets the assistant messages before it without
    their reasoning. Anything else: the same list."""
    if rendering.hoists_system:
        lead = 0
        while lead < len(messages) and _role(messages[lead]) == "system":
            lead += 1
        later = [m for m in messages[lead:] if _role(m) == "system"]
        if later:
            rest = [m for m in messages[lead:] if _role(m) != "system"]
            messages = [*messages[:lead], *later, *rest]
    if rendering.drops_past_reasoning:
        users = [i for i, m in enumerate(messages) if _role(m) == "user"]
        last = users[-1] if users else -1
        messages = [
            {k: v for k, v in m.items() if k not in _REASONING}
            if i < last and _role(m) == "assistant" and any(k in m for k in _REASONING)
            else m
            for i, m in enumerate(messages)
        ]
    return messages


_REASONING = ("reasoning_content", "reasoning")


def _role(m) -> str | None:
    return m.get("role") if isinstance(m, dict) else None


class BlockLRU:
    """A bounded set of block hashes in least-recently-used order."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._blocks: OrderedDict[bytes, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block: bytes) -> bool:
        return block in self._blocks

    def match(self, hashes: Sequence[bytes]) -> int:
        """How many leading ``hashes`` are present."""
        blocks = self._blocks
        n = 0
        for h in hashes:
            if h not in blocks:
                break
            n += 1
        return n

    def add(self, hashes: Sequence[bytes]) -> None:
        """Insert (or refresh) ``hashes``; the first ends up the most recent."""
        blocks = self._blocks
        move = blocks.move_to_end
        for h in reversed(hashes):
            if h in blocks:
                move(h)
            else:
                blocks[h] = None
        while len(blocks) > self.capacity:
            blocks.popitem(last=False)

    def clear(self) -> None:
        self._blocks.clear()
