"""The reward_model reward on tiny random classifiers: the scores are the model's own logits (batched
and padded the same as one by one), the input is the conversation in the reward model's chat
template, options transform and combine the score, and wrong directories fail at build time."""

from __future__ import annotations

import math
import shutil

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from rlcore_reward_model.model import build  # noqa: E402
from rlcore_reward_model.options import RewardModelOptions  # noqa: E402

from rlcore.errors import UsageError  # noqa: E402
from rlcore.interfaces import BuildContext, RewardInput, RewardResult  # noqa: E402


def rm(path, **options):
    return build(RewardModelOptions(path=str(path), **options), BuildContext())


def policy_prompt(tokenizer, question):
    """The prompt as the trainer decodes it: the policy's chat template with its generation prompt."""
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )


@pytest.fixture(scope="module")
def items(tiny_rm):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_rm)
    return [
        RewardInput(prompt=policy_prompt(tokenizer, "What is 2 + 3?"), response="5", group=0),
        RewardInput(
            prompt=policy_prompt(tokenizer, "What is 2 + 3?"),
            response="It is six, I think; or seven.",
            group=0,
        ),
        RewardInput(
            prompt=policy_prompt(tokenizer, "Name a colour."), response="A long answer. " * 12, group=1
        ),
    ]


def reference_logits(path, texts, label=0):
    """One sequence at a time, no padding: what the batched scores must equal."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    out = []
    with torch.no_grad():
        for text in texts:
            ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
            out.append(model(input_ids=ids).logits[0, label].item())
    return out


def test_batched_scores_are_the_models_logits_of_the_rendered_conversation(tiny_rm, items):
    reward = rm(tiny_rm, batch_size=2)  # two forward passes, one padded
    assert reward.batched and reward.chat
    results = reward.score_batch(items)
    assert all(isinstance(r, RewardResult) for r in results)
    # The RM reads the messages read back from the policy's prompt, and the response, in its own template.
    text = reward.render(items[0])
    assert text == reward.tokenizer.apply_chat_template(
        [
            {
                "role": "system",
                "content": "You are a helpful AI assistant named SmolLM, trained by Hugging Face",
            },
            {"role": "user", "content": "What is 2 + 3?"},
            {"role": "assistant", "content": "5"},
        ],
        tokenize=False,
    )
    expected = reference_logits(tiny_rm, [reward.render(i) for i in items])
    assert [r.score for r in results] == pytest.approx(expected, abs=1e-4)
    assert len({round(r.score, 4) for r in results}) == 3  # the random head tells them apart
    assert all(r.metrics["rm_truncated"] == 0 and r.metrics["rm_score"] == r.score for r in results)
    # Batch size and order do not change a score.
    again = rm(tiny_rm, batch_size=8).score_batch(items[::-1])
    assert [r.score for r in again][::-1] == pytest.approx(expected, abs=1e-4)


def test_text_input_is_the_decoded_prompt_then_the_response(tiny_rm, items):
    reward = rm(tiny_rm, input="text")
    assert not reward.chat and reward.render(items[1]) == items[1].prompt + items[1].response
    expected = reference_logits(tiny_rm, [items[1].prompt + items[1].response])
    assert reward.score_batch(items[1:2])[0].score == pytest.approx(expected[0], abs=1e-4)


def test_sigmoid_scale_and_shift(tiny_rm, items):
    raw = rm(tiny_rm).score_batch(items)
    shaped = rm(tiny_rm, sigmoid=True, scale=2.0, shift=-1.0).score_batch(items)
    for r, s in zip(raw, shaped):
        assert s.metrics["rm_logit"] == pytest.approx(r.score, abs=1e-5)
        assert s.score == pytest.approx(2.0 / (1.0 + math.exp(-r.score)) - 1.0, abs=1e-5)


def test_long_inputs_are_truncated_keeping_the_end(tiny_rm, items):
    reward = rm(tiny_rm, max_length=16)
    result = reward.score_batch(items)
    assert [r.metrics["rm_truncated"] for r in result] == [1.0, 1.0, 1.0]
    ids = reward.tokenizer(reward.render(items[2]), add_special_tokens=False)["input_ids"]
    assert reward._encode(reward.render(items[2])) == (ids[-16:], True)
    assert rm(tiny_rm, max_length=16, truncation="right")._encode(reward.render(items[2])) == (ids[:16], True)


def test_label_by_index_or_name(tiny_rm2, items):
    texts = [rm(tiny_rm2).render(i) for i in items]
    good = reference_logits(tiny_rm2, texts, label=1)
    assert [r.score for r in rm(tiny_rm2, label=1).score_batch(items)] == pytest.approx(good, abs=1e-4)
    assert [r.score for r in rm(tiny_rm2, label="good").score_batch(items)] == pytest.approx(good, abs=1e-4)


def test_a_path_relative_to_the_manifest(tiny_rm, tmp_path, items):
    shutil.copytree(tiny_rm, tmp_path / "rm")
    reward = build(RewardModelOptions(path="rm"), BuildContext(manifest_dir=str(tmp_path)))
    assert reward.path == tmp_path / "rm"


def test_a_causal_lm_is_refused_naming_the_path_and_what_it_holds(tiny_model):
    with pytest.raises(UsageError) as err:
        rm(tiny_model)
    message = str(err.value)
    assert (
        str(tiny_model) in message
        and "LlamaForCausalLM" in message
        and "not a sequence-classification" in message
    )
    assert "judge" in message


def test_a_head_without_saved_weights_is_refused(tiny_model, tmp_path):
    """A causal LM's directory with its config relabelled: the classification head would be random."""
    import json

    shutil.copytree(tiny_model, tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    config["architectures"] = ["LlamaForSequenceClassification"]
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    with pytest.raises(UsageError, match=r"no trained classification head .*score\.weight"):
        rm(tmp_path / "m")


@pytest.mark.parametrize(
    ("label", "match"),
    [
        (1, r"has 1 output \(num_labels = 1\), so label must be 0"),
        (-1, r"has 1 output"),
        ("great", r"no output of that name; its outputs \(id2label\): 0: 'LABEL_0'"),
    ],
)
def test_a_label_the_model_lacks_is_refused(tiny_rm, label, match):
    with pytest.raises(UsageError, match=match) as err:
        rm(tiny_rm, label=label)
    assert str(tiny_rm) in str(err.value)


def test_a_missing_directory_or_config_is_refused(tmp_path):
    with pytest.raises(UsageError, match=r"reward model directory .*nope.* does not exist"):
        rm(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match=r"empty has no config.json"):
        rm(tmp_path / "empty")


def test_chat_input_needs_a_chat_template(tiny_rm, tmp_path):
    shutil.copytree(tiny_rm, tmp_path / "rm")
    for name in ("chat_template.jinja", "chat_template.json"):
        (tmp_path / "rm" / name).unlink(missing_ok=True)
    import json

    config_path = tmp_path / "rm" / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.pop("chat_template", None)
    config_path.write_text(json.dumps(config))
    with pytest.raises(UsageError, match="has no chat template"):
        rm(tmp_path / "rm", input="chat")
    assert not rm(tmp_path / "rm").chat  # auto falls back to the text form


def test_sleep_and_wake_up_on_the_cpu_keep_scoring(tiny_rm, items):
    reward = rm(tiny_rm)
    first = [r.score for r in reward.score_batch(items)]
    reward.sleep()
    reward.wake_up()
    assert [r.score for r in reward.score_batch(items)] == pytest.approx(first, abs=1e-6)


@pytest.mark.parametrize("offload", ["cpu", "free", "none"])
def test_sleep_frees_the_gpu_and_wake_up_brings_the_model_back(tiny_rm, items, offload):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    expected = [r.score for r in rm(tiny_rm).score_batch(items)]
    reward = build(
        RewardModelOptions(path=str(tiny_rm), offload=offload), BuildContext(device="cuda:0", dtype="float32")
    )

    def where():
        return None if reward.model is None else next(reward.model.parameters()).device.type

    asleep = {"cpu": "cpu", "free": None, "none": "cuda"}[offload]
    assert where() == asleep  # built asleep: off the GPU while the engine and the actor load
    reward.wake_up()
    assert where() == "cuda"
    assert [r.score for r in reward.score_batch(items)] == pytest.approx(expected, abs=1e-3)
    reward.sleep()
    assert where() == asleep
    reward.wake_up()
    assert where() == "cuda"
    assert [r.score for r in reward.score_batch(items)] == pytest.approx(expected, abs=1e-3)
    reward.sleep()
    assert [r.score for r in reward.score_batch(items)] == pytest.approx(
        expected, abs=1e-3
    )  # a call without wake_up
    # bfloat16 on the GPU when the run computes in it
    half = build(RewardModelOptions(path=str(tiny_rm)), BuildContext(device="cuda:0", dtype="bfloat16"))
    assert next(half.model.parameters()).dtype == torch.bfloat16
    assert [r.score for r in half.score_batch(items)] == pytest.approx(expected, abs=0.1)


def test_an_abandoned_batch_stops_at_its_next_forward_pass(tiny_rm, items):
    """The trainer calls sleep() after a batch ran past [reward] batch_timeout_s; the late batch must not go on,
    and sleep() waits for the forward pass in flight only."""
    import threading
    import time

    reward = rm(tiny_rm, batch_size=1)
    calls, sleeper = [], threading.Thread(target=reward.sleep)
    forward = reward._forward

    def forward_during_which_the_time_limit_passes(sequences):
        calls.append(1)
        generation = reward._generation
        sleeper.start()
        while reward._generation == generation:
            time.sleep(0.01)
        return forward(sequences)

    reward._forward = forward_during_which_the_time_limit_passes
    with pytest.raises(TimeoutError, match="abandoned"):
        reward.score_batch(items)
    sleeper.join(5)
    assert len(calls) == 1 and not sleeper.is_alive()


def test_garbage_responses_get_finite_scores(tiny_rm, items):
    from rlcore.testing.rewards import GARBAGE_RESPONSES

    batch = [RewardInput(prompt=items[0].prompt, response=r) for r in GARBAGE_RESPONSES]
    results = rm(tiny_rm, max_length=256, batch_size=8).score_batch(batch)
    assert len(results) == len(batch) and all(math.isfinite(r.score) for r in results)
    assert sum(r.metrics["rm_truncated"] for r in results) >= 3  # the 5000-character ones
