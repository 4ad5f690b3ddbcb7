"""The lm_eval harness on local tasks (a task YAML over a local jsonl; nothing from the hub): the
adapter against a policy whose answers are known, then `rlcore eval --harness lm_eval` end to end
on a tiny model, whose multiple-choice accuracy is checked against the model's own log-probs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from rlcore_lm_eval.harness import LmEvalHarness
from rlcore_lm_eval.plugin import LmEvalOptions

from rlcore.errors import UsageError
from rlcore.testing import require_plugins
from rlcore.testing.api import check_plugin_imports, describe_violations
from rlcore.testing.runs import run_cli, write_run_manifest

QUESTIONS = [("2 + 3", "5"), ("4 + 4", "8"), ("1 + 6", "7"), ("9 - 2", "7"), ("3 + 3", "6"), ("8 - 5", "3")]


def write_tasks(directory: Path) -> Path:
    """Two local tasks: a generative one (exact match) and a multiple-choice one (log-likelihoods)."""
    directory.mkdir(parents=True, exist_ok=True)
    data = directory / "sums.jsonl"
    with data.open("w") as f:
        for q, a in QUESTIONS:
            wrong = str((int(a) + 1) % 10)
            f.write(
                json.dumps(
                    {
                        "question": q,
                        "answer": a,
                        "choices": [a, wrong] if int(a) % 2 else [wrong, a],
                        "label": 0 if int(a) % 2 else 1,
                    }
                )
                + "\n"
            )
    common = f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n"
    (directory / "sums_gen.yaml").write_text(
        "task: rlcore_sums_gen\n" + common + "output_type: generate_until\n"
        'doc_to_text: "What is {{question}}? Answer:"\ndoc_to_target: " {{answer}}"\n'
        'generation_kwargs:\n  until: ["\\n", "."]\n  max_gen_toks: 4\n'
        'metric_list:\n  - metric: exact_match\n    regexes_to_ignore: [" "]\n'
    )
    (directory / "sums_mc.yaml").write_text(
        "task: rlcore_sums_mc\n" + common + "output_type: multiple_choice\n"
        'doc_to_text: "What is {{question}}? Answer:"\ndoc_to_choice: "{{choices}}"\ndoc_to_target: "{{label}}"\n'
        "metric_list:\n  - metric: acc\n"
    )
    return directory


class WordTokenizer:
    """Characters as tokens (id = code point), enough for the adapter's text handling."""

    eos_token_id, bos_token_id, pad_token_id, name_or_path, chat_template = 0, None, 0, "chars", None

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids if i)


class KnowingPolicy:
    """Answers every sum right; the right choice has the higher log-likelihood."""

    tokenizer, max_length = WordTokenizer(), 512

    def __init__(self):
        self.prompts = []

    def _answer(self, text):
        for q, a in QUESTIONS:
            if f"What is {q}?" in text.split("\n")[-1] or text.rstrip().endswith(f"What is {q}? Answer:"):
                return a
        raise AssertionError(text)

    def generate(self, prompts, params):
        self.prompts += prompts
        assert params.temperature == 0.0 and params.max_new_tokens == 4 and "\n" in params.stop
        return [[ord(c) for c in f" {self._answer(self.tokenizer.decode(p))}.\nmore"] for p in prompts]

    def loglikelihood(self, requests):
        out = []
        for context, continuation in requests:
            right = self.tokenizer.decode(continuation).strip() == self._answer(
                self.tokenizer.decode(context)
            )
            out.append((-0.1 if right else -5.0, right))
        return out


def test_the_plugin_uses_only_the_plugin_api():
    src = Path(__file__).resolve().parents[1] / "src"
    violations = check_plugin_imports(sorted(src.rglob("*.py")), own={"rlcore_lm_eval"})
    assert not violations, describe_violations(violations)


def test_the_adapter_hands_lm_eval_what_the_policy_answers(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    tasks = write_tasks(tmp_path / "tasks")
    harness = LmEvalHarness(
        LmEvalOptions(
            tasks=["rlcore_sums_gen", "rlcore_sums_mc"], include_path=str(tasks), include_defaults=False
        )
    )
    policy = KnowingPolicy()
    report = harness.run(policy, str(tmp_path))
    assert report["results"]["rlcore_sums_gen"]["exact_match,none"] == 1.0
    assert report["results"]["rlcore_sums_mc"]["acc,none"] == 1.0
    assert len(policy.prompts) == len(QUESTIONS)
    assert "rlcore_sums_gen" in report["table"] and "exact_match" in report["table"]
    assert (tmp_path / "results.json").is_file() and (tmp_path / "samples_rlcore_sums_mc.jsonl").is_file()


def test_unknown_tasks_are_refused_before_any_model_loads(tmp_path):
    tasks = write_tasks(tmp_path / "tasks")
    with pytest.raises(UsageError, match=r"no task 'rlcore_sums_gn' \(did you mean 'rlcore_sums_gen'\?\)"):
        LmEvalHarness(
            LmEvalOptions(tasks=["rlcore_sums_gn"], include_path=str(tasks), include_defaults=False)
        )
    with pytest.raises(UsageError, match="not a directory"):
        LmEvalHarness(LmEvalOptions(tasks=["x"], include_path=str(tmp_path / "nope")))


def test_rlcore_eval_runs_lm_eval_through_the_engine(tiny_model, tmp_path):
    require_plugins("rlcore_rollout_hf", "rlcore_reward_rule", "rlcore_algo_grpo")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tasks = write_tasks(tmp_path / "tasks")
    manifest = write_run_manifest(tmp_path, tiny_model)
    out = tmp_path / "eval.json"
    proc = run_cli(
        "eval",
        str(manifest),
        "--model",
        str(tiny_model),
        "--harness",
        "lm_eval",
        "--tasks",
        "rlcore_sums_gen,rlcore_sums_mc",
        "--harness-option",
        f"include_path='{tasks}'",
        "--harness-option",
        "include_defaults=false",
        "--output",
        str(out),
        env={"HF_DATASETS_OFFLINE": "1"},
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    harness = report["harness"]
    assert harness["name"] == "lm_eval" and "rlcore_sums_mc" in proc.stdout and "exact_match" in proc.stdout
    assert report["sets"]["val"]["prompts"] > 0  # rlcore's own validation, beside lm-eval's
    kept = Path(harness["output_dir"])
    assert kept == tmp_path / "eval.lm_eval" and (kept / "results.json").is_file()
    assert 0.0 <= harness["results"]["rlcore_sums_gen"]["exact_match,none"] <= 1.0

    # The accuracy lm-eval reports is what the model's own log-probs give.
    tok = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, torch_dtype=torch.float32).eval()
    right = 0
    for line in (tasks / "sums.jsonl").read_text().splitlines():
        doc = json.loads(line)
        context = f"What is {doc['question']}? Answer:"
        scores = []
        for choice in doc["choices"]:
            head = tok(context, add_special_tokens=False)["input_ids"]
            whole = tok(context + " " + choice, add_special_tokens=False)["input_ids"]
            with torch.no_grad():
                logp = torch.log_softmax(model(torch.tensor([whole])).logits[0].float(), -1)
            scores.append(sum(logp[i - 1, whole[i]].item() for i in range(len(head), len(whole))))
        right += int(max(range(len(scores)), key=scores.__getitem__) == doc["label"])
    assert math.isclose(harness["results"]["rlcore_sums_mc"]["acc,none"], right / len(QUESTIONS))
