#!/usr/bin/env python3
"""Build a tiny Llama-architecture model for the real-vLLM tests, offline.

The weights are random (the tests are about prompts, tokens and the prefix cache, never
about what the model says). The tokenizer is a byte-level BPE trained here on the Python
standard library's own sources, so nothing is fetched from a model hub.

Run with the interpreter of the vLLM environment (it needs torch, tokenizers and
transformers)::

    python tests/real/build_tiny_model.py OUT_DIR [--max-model-len 16384] [--vocab 8192]

The chat template is ChatML-like and is written into ``tokenizer_config.json`` (and into
``chat_template.jinja``), where both vLLM and ``prefixgate.cache.JinjaChatTemplate`` read it.
"""

from __future__ import annotations

import argparse
import json
import sysconfig
from pathlib import Path

SPECIAL_TOKENS = ("<|pad|>", "<|im_start|>", "<|im_end|>")

# Content may be a string or a list of OpenAI parts (vLLM passes either, depending on the
# content format it detects); tools are listed as JSON lines at the end of the system turn.
CHAT_TEMPLATE = """\
{%- macro text_of(content) -%}
  {%- if content is string -%}{{ content }}
  {%- elif content is iterable -%}
    {%- for part in content if part.type == 'text' -%}{{ part.text }}{%- endfor -%}
  {%- endif -%}
{%- endmacro -%}
{%- set offset = 0 -%}
{%- if messages and messages[0].role == 'system' -%}
  {%- set offset = 1 -%}
{%- endif -%}
{%- if offset == 1 or tools -%}
  {{- '<|im_start|>system\\n' -}}
  {%- if offset == 1 -%}{{- text_of(messages[0].content) -}}{%- endif -%}
  {%- if tools -%}
    {{- '\\n\\nFunctions you can call:' -}}
    {%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}
  {%- endif -%}
  {{- '<|im_end|>\\n' -}}
{%- endif -%}
{%- for message in messages[offset:] -%}
  {{- '<|im_start|>' + message.role + '\\n' + text_of(message.content) -}}
  {%- if message.tool_calls -%}
    {%- for call in message.tool_calls -%}
      {{- '\\n<tool_call>' + (call.function | tojson) + '</tool_call>' -}}
    {%- endfor -%}
  {%- endif -%}
  {{- '<|im_end|>\\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}
"""


def training_files(limit: int) -> list[str]:
    """Python sources of the running interpreter's standard library, in a stable order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(str(p) for p in root.glob("*.py"))
    return files[:limit]


def train_tokenizer(vocab: int, limit: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train(training_files(limit), trainer)
    return tok


def save_tokenizer(tok, out: Path, max_len: int):
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        additional_special_tokens=["<|im_start|>"],
        model_max_length=max_len,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))
    # Some transformers versions write the template only to chat_template.jinja: keep it in
    # tokenizer_config.json too, where every reader finds it.
    cfg_file = out / "tokenizer_config.json"
    cfg = json.loads(cfg_file.read_text())
    cfg["chat_template"] = CHAT_TEMPLATE
    cfg_file.write_text(json.dumps(cfg, indent=2) + "\n")
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return fast


def save_model(fast, out: Path, max_len: int, seed: int) -> int:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    eos = fast.convert_tokens_to_ids("<|im_end|>")
    pad = fast.convert_tokens_to_ids("<|pad|>")
    config = LlamaConfig(
        vocab_size=-(-len(fast) // 64) * 64,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=4,  # head size 32: supported by the CPU attention backend
        num_key_value_heads=4,
        max_position_embeddings=max_len,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos,
        pad_token_id=pad,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(str(out), safe_serialization=True)
    gen = {"eos_token_id": [eos], "pad_token_id": pad}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    return sum(p.numel() for p in model.parameters())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--max-model-len", type=int, default=16384)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--files", type=int, default=300, help="stdlib files to train on")
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(args.vocab, args.files)
    fast = save_tokenizer(tok, out, args.max_model_len)
    params = save_model(fast, out, args.max_model_len, args.seed)
    sample = fast.apply_chat_template(
        [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    print(f"tiny model in {out}: {len(fast)} tokens, {params} parameters; sample {sample!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
