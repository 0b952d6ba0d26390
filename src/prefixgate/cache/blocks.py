"""Chained block hashes, the key of vLLM's automatic prefix cache.

A prompt is cut into blocks of ``block_size`` tokens. Only FULL blocks get a hash; the
partial last block gets none. Each hash covers its parent's hash and its own token ids::

    h[0] = H(seed(salt), tokens[0:B])
    h[k] = H(h[k-1],     tokens[k*B:(k+1)*B])

so a change anywhere in block k changes ``h[k]`` and every hash after it.

``H`` is BLAKE2b with a 16-byte digest over ``parent || token ids as little-endian
int64``. Hashes are returned as 16-byte ``bytes`` objects: cheap to compare and to use as
dict keys, identical on every machine and in every process (no salted ``hash()``), and
exact (no 64-bit truncation). ``int.from_bytes(h, "little")`` gives an int if one is needed.

``cache_salt`` (vLLM's multi-tenant isolation knob) is an extra key of the FIRST block
only. Here it is folded into the seed that the first block uses as its parent, which is the
same thing: the first hash differs, so every hash differs, and two salts share nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from hashlib import blake2b

import numpy as np

__all__ = [
    "DIGEST_SIZE",
    "ROOT_SEED",
    "BlockHash",
    "chain_seed",
    "hash_blocks",
    "hit_tokens_cap",
    "num_blocks",
    "num_full_blocks",
]

BlockHash = bytes
DIGEST_SIZE = 16
ROOT_SEED: bytes = blake2b(b"prefixgate/block-chain/v1", digest_size=DIGEST_SIZE).digest()
_TOKEN_DTYPE = np.dtype("<i8")

Tokens = Sequence[int] | np.ndarray


def chain_seed(salt: str | None = None) -> bytes:
    """The parent of the first block: the root seed, or the root seed keyed by a salt."""
    if salt is None:
        return ROOT_SEED
    data = ROOT_SEED + b"cache_salt\0" + salt.encode("utf-8")
    return blake2b(data, digest_size=DIGEST_SIZE).digest()


def _parent_bytes(parent: int | bytes) -> bytes:
    if isinstance(parent, bytes | bytearray | memoryview):
        return bytes(parent)
    if isinstance(parent, int):
        return (parent & ((1 << 128) - 1)).to_bytes(16, "little")
    raise TypeError(f"parent must be bytes, int or None, not {type(parent).__name__}")


def hash_blocks(
    tokens: Tokens,
    block_size: int,
    *,
    salt: str | None = None,
    parent: int | bytes | None = None,
) -> list[BlockHash]:
    """One chained 16-byte hash per FULL block of ``tokens`` (a partial last block has none).

    ``parent`` continues an existing chain (e.g. the hash of the last full prompt block,
    when hashing the blocks that output tokens complete); it cannot be combined with
    ``salt``, which only applies to the first block of a chain.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, not {block_size}")
    if parent is None:
        h = chain_seed(salt)
    elif salt is not None:
        raise ValueError("salt applies to the first block only; it cannot follow a parent")
    else:
        h = _parent_bytes(parent)
    arr = np.asarray(tokens, dtype=_TOKEN_DTYPE)
    if arr.ndim != 1:
        raise ValueError("tokens must be one-dimensional")
    n = len(arr) // block_size
    if n == 0:
        return []
    data = arr[: n * block_size].tobytes()
    step = block_size * _TOKEN_DTYPE.itemsize
    out: list[BlockHash] = []
    append = out.append
    for start in range(0, n * step, step):
        h = blake2b(h + data[start : start + step], digest_size=DIGEST_SIZE).digest()
        append(h)
    return out


def num_full_blocks(num_tokens: int, block_size: int) -> int:
    """Blocks that ``num_tokens`` fill completely (the ones that get a hash)."""
    return max(num_tokens, 0) // block_size


def num_blocks(num_tokens: int, block_size: int) -> int:
    """Blocks needed to hold ``num_tokens`` (the partial last block included)."""
    return -(-max(num_tokens, 0) // block_size)


def hit_tokens_cap(num_tokens: int, block_size: int) -> int:
    """Most prompt tokens a cache hit can cover: ``floor((L-1)/B) * B``.

    vLLM always recomputes at least the last prompt token (it needs its logits), so a
    64-token prompt with 16-token blocks hits at most 48 tokens, a 65-token prompt 64.
    """
    if num_tokens <= 1:
        return 0
    return (num_tokens - 1) // block_size * block_size
