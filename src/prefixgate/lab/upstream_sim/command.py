"""`prefixgate upstream-sim`: the simulated upstream as a command of its own."""

from __future__ import annotations

import asyncio
import contextlib
import os

import click

from prefixgate.commands.common import setup_logging


@click.command("upstream-sim")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option(
    "--port",
    type=int,
    default=8000,
    show_default=True,
    help="First port; replicas take the next ones.",
)
@click.option(
    "--replicas",
    type=int,
    default=1,
    show_default=True,
    help="Independent servers, each with its own cache.",
)
@click.option(
    "--model", default=None, help="Served model names, comma-separated (any name is accepted)."
)
@click.option("--block-size", type=int, default=None, help="KV block size in tokens (default 16).")
@click.option(
    "--capacity-tokens",
    type=int,
    default=None,
    help="Cache capacity in tokens (default unlimited).",
)
@click.option(
    "--prefill-rate",
    type=float,
    default=None,
    help="Prefill tokens/s for uncached tokens (0 = instant).",
)
@click.option("--decode-rate", type=float, default=None, help="Decode tokens/s (0 = instant).")
@click.option("--render-order", type=click.Choice(["tools_first", "system_first"]), default=None)
@click.option(
    "--chat-template",
    type=click.Path(exists=True),
    default=None,
    help="Jinja chat template or tokenizer_config.json.",
)
@click.option("--tokenizer", default=None, help="approx | hf:PATH | remote:URL[#model].")
@click.option("--max-model-len", type=int, default=None)
@click.option(
    "--default-output-tokens",
    type=int,
    default=None,
    help="Output length when the request sets no ignore_eos (default 32).",
)
@click.option(
    "--vllm-version",
    default=None,
    help="vLLM release whose usage fields are imitated (default 0.32: cached_tokens 0 is "
    "reported; earlier releases omit prompt_tokens_details when nothing hit).",
)
@click.option(
    "--no-cache-report",
    "report_cached_tokens",
    flag_value=False,
    default=None,
    help="Never report cached tokens (vLLM without --enable-prompt-tokens-details).",
)
@click.option(
    "--kv-events-config",
    default=None,
    help="Publish KV events as vLLM does: vLLM's JSON (endpoint, replay_endpoint, topic, "
    'buffer_steps), plus "encoding": map|array|map-batch. Replica i: ports + i.',
)
@click.option(
    "--strict-models/--any-model",
    "strict_models",
    default=None,
    help="Refuse a model not in --model with vLLM's 404, as vLLM does (default: any).",
)
@click.option(
    "--api-key-env",
    default=None,
    help="An environment variable holding the key every route but /health asks for "
    "(Authorization: Bearer), as vLLM's --api-key.",
)
@click.option("--log-level", default="info", show_default=True)
def upstream_sim(host, port, replicas, log_level, strict_models, api_key_env, **opts) -> None:
    """An OpenAI-compatible server whose prefix cache is prefixgate's cache model: vLLM's
    chained block hashes, last-token rule and LRU, with vLLM's usage fields and /metrics."""

    from prefixgate.lab.upstream_sim import serve_upstreams, settings_from_options

    setup_logging(log_level)
    if strict_models is not None:
        opts["accept_any_model"] = not strict_models
    if api_key_env:
        if not os.environ.get(api_key_env):
            raise click.UsageError(f"--api-key-env: {api_key_env} is not set")
        opts["api_key"] = os.environ[api_key_env]
    elif host not in ("127.0.0.1", "::1", "localhost"):
        raise click.UsageError(
            "a simulated upstream without a key listens on loopback only: "
            "give it one with --api-key-env, or --host 127.0.0.1"
        )
    settings = settings_from_options(**opts)

    def ready(urls) -> None:
        for u in urls:
            click.echo(f"upstream-sim listening on {u}/v1", err=True)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve_upstreams(settings, host=host, port=port, replicas=replicas, ready=ready))


__all__ = ["upstream_sim"]
