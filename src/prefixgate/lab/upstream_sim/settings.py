"""Settings of the simulated upstream (``prefixgate upstream-sim``), parsed once."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prefixgate.lab.events.publisher import PublisherSettings

__all__ = ["SimSettings", "settings_from_options"]

ZERO_CACHED_SINCE = (0, 32)  # the first vLLM release imitated as reporting a zero


@dataclass
class SimSettings:
    """How one simulated upstream behaves (every replica gets the same settings)."""

    models: tuple[str, ...] = ("sim-model",)
    accept_any_model: bool = True
    block_size: int = 16
    capacity_tokens: int | None = None  # None: unlimited
    render_order: str = "tools_first"  # or "system_first"
    # a .jinja file or tokenizer_config.json, or the name of one of the project's own
    # templates (cache/render.py TEMPLATES: hoisting, in_place, reasoning_last_query)
    chat_template: str | None = None
    tokenizer: str = "approx"  # a get_tokenizer() spec
    prefill_tokens_per_s: float = 0.0  # 0: instant
    decode_tokens_per_s: float = 0.0  # 0: instant
    default_output_tokens: int = 32
    max_model_len: int = 131072
    report_cached_tokens: bool = True  # vLLM's --enable-prompt-tokens-details
    # The vLLM release whose usage fields are imitated: from 0.32 a request that hit
    # nothing reports ``cached_tokens: 0``; earlier releases leave
    # ``prompt_tokens_details`` out then (absent is not "report off").
    vllm_version: str = "0.32"
    seed: int = 0
    stream_chunk_tokens: int = 2  # output tokens per content chunk
    nested_errors: bool = False  # newer vLLM: {"error": {...}}
    log_interval_s: float = 0.0  # >0: log vLLM-like stats lines this often
    # publish the cache's stores and evictions as vLLM's KV events (events/publisher.py);
    # also vLLM's --kv-events-config JSON (a str or dict), plus "encoding": map|array|map-batch
    kv_events: PublisherSettings | None = None
    # The key every route but /health asks for (Authorization: Bearer), as vLLM's --api-key;
    # None: none (then listen on loopback only).
    api_key: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.models, str):
            self.models = (self.models,)
        self.models = tuple(self.models)
        if not self.models:
            raise ValueError("models must name at least one model")
        if self.block_size <= 0:
            raise ValueError(f"block_size must be positive, not {self.block_size}")
        if self.capacity_tokens is not None and self.capacity_tokens < 0:
            raise ValueError("capacity_tokens must be >= 0 or None")
        if self.render_order not in ("tools_first", "system_first"):
            raise ValueError(
                f"render_order must be tools_first or system_first, not {self.render_order!r}"
            )
        if self.prefill_tokens_per_s < 0 or self.decode_tokens_per_s < 0:
            raise ValueError("token rates must be >= 0")
        if self.default_output_tokens < 1 or self.max_model_len < 1:
            raise ValueError("default_output_tokens and max_model_len must be >= 1")
        self.vllm_version = str(self.vllm_version)
        if not re.fullmatch(r"\d+(\.\d+)*", self.vllm_version):
            raise ValueError(f"vllm_version must look like 0.32, not {self.vllm_version!r}")
        if self.chat_template is not None and "/" not in self.chat_template:
            from prefixgate.cache.render import TEMPLATES, template_file

            if self.chat_template in TEMPLATES:  # one of the project's own, by name
                self.chat_template = str(template_file(self.chat_template))
        if isinstance(self.kv_events, str | dict):
            from prefixgate.lab.events.publisher import PublisherSettings

            self.kv_events = PublisherSettings.from_engine_config(self.kv_events)

    @property
    def reports_zero_cached(self) -> bool:
        """Whether a request that hit nothing says ``cached_tokens: 0`` (vLLM ≥ 0.32)."""
        parts = tuple(int(x) for x in self.vllm_version.split("."))
        return parts >= ZERO_CACHED_SINCE

    def for_replica(self, i: int) -> SimSettings:
        """The settings of the ``i``-th replica: its event ports offset by ``i``."""
        if self.kv_events is None or i == 0:
            return self
        return dataclasses.replace(self, kv_events=self.kv_events.offset(i))


_OPTION_ALIASES = {
    "prefill_rate": "prefill_tokens_per_s",
    "decode_rate": "decode_tokens_per_s",
    "model": "models",
    "kv_events_config": "kv_events",
}


def settings_from_options(**options: Any) -> SimSettings:
    """SimSettings from CLI-style options (``prefill_rate``, ``decode_rate``, ``model`` are
    accepted as aliases; ``None`` means "default"; ``port``/``replicas``/``host`` are ignored)."""
    names = {f.name for f in dataclasses.fields(SimSettings)}
    values: dict[str, Any] = {}
    for key, value in options.items():
        if value is None or key in ("port", "replicas", "host"):
            continue
        name = _OPTION_ALIASES.get(key, key)
        if name not in names:
            raise TypeError(f"unknown upstream-sim option {key!r}")
        if name == "models" and isinstance(value, str):
            value = tuple(m.strip() for m in value.split(",") if m.strip())
        values[name] = value
    return SimSettings(**values)
