"""The prefix-cache model: one truth about vLLM's automatic prefix caching.

Pipeline: chat request --render--> prompt text --tokenizer--> token ids --blocks-->
chained block hashes --pool/prefix_cache--> hit (``cached_tokens``), LRU state, counters.
"""

from .blocks import BlockHash, chain_seed, hash_blocks, hit_tokens_cap, num_blocks, num_full_blocks
from .pool import BlockPool, Handle
from .prefix_cache import CacheResult, Lease, PrefixCache, StoredBlocks
from .render import (
    ChatRenderer,
    JinjaChatTemplate,
    Renderer,
    RenderError,
    canonical_json,
    render_tokens,
)
from .tokenizer import (
    ApproxTokenizer,
    HFTokenizer,
    RemoteTokenizer,
    Tokenizer,
    TokenizerError,
    get_tokenizer,
)

__all__ = [
    "ApproxTokenizer",
    "BlockHash",
    "BlockPool",
    "CacheResult",
    "ChatRenderer",
    "HFTokenizer",
    "Handle",
    "JinjaChatTemplate",
    "Lease",
    "PrefixCache",
    "RemoteTokenizer",
    "RenderError",
    "Renderer",
    "StoredBlocks",
    "Tokenizer",
    "TokenizerError",
    "canonical_json",
    "chain_seed",
    "get_tokenizer",
    "hash_blocks",
    "hit_tokens_cap",
    "num_blocks",
    "num_full_blocks",
    "render_tokens",
]
