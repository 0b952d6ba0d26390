"""What every section of the config shares: the frozen model that refuses unknown keys,
URLs that may hold no secret, Redis URLs, and the stored form of an API key."""

from __future__ import annotations

import hashlib
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict


class Model(BaseModel):
    """A config section: frozen, and an unknown key is an error (a typo is not ignored)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def _redis_url(v: str) -> str:
    if not v.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError("must be a redis:// or rediss:// URL")
    return v


RedisUrl = Annotated[str, AfterValidator(_redis_url)]


def no_userinfo(url: str) -> str:
    """``url``, refused when it holds a user or password (``http://user:pass@host``): an
    upstream's URL is kept in every record, the journal, the dashboard and log lines, so
    it must hold no secret. The message never repeats the URL."""
    if "@" in urlsplit(url).netloc:
        raise ValueError(
            "a user or password in an upstream URL is refused (the URL is recorded and "
            "logged): put the key in an environment variable named by api_key_env"
        )
    return url


def hash_key(key: str) -> str:
    """The stored form of an API key."""
    return hashlib.sha256(key.encode()).hexdigest()
