"""A ground truth a reward can never compare (a dict; a list where one answer is expected) is
refused by that reward's own check_data, naming the file, row and field (issue 28, item 5c)."""

from __future__ import annotations

import pytest
from rlcore_reward_rule.exact import ExactMatchReward
from rlcore_reward_rule.gsm8k import GSM8KReward
from rlcore_reward_rule.math_answer import MathReward
from rlcore_reward_rule.math_dapo import MathDapoReward
from rlcore_reward_rule.options import ExactMatchOptions, GSM8KOptions, MathDapoOptions, MathOptions

from rlcore.errors import RlcoreError
from rlcore.interfaces import Prompt


def _prompts(*truths):
    return [Prompt(token_ids=[1], messages=[], ground_truth=t, index=i) for i, t in enumerate(truths)]


REWARDS = {
    "gsm8k": lambda: GSM8KReward(GSM8KOptions(method="numeric")),
    "gsm8k_strict": lambda: GSM8KReward(GSM8KOptions()),
    "exact_match": lambda: ExactMatchReward(ExactMatchOptions()),
    "math": lambda: MathReward(MathOptions(backend="builtin")),
    "math_dapo": lambda: MathDapoReward(MathDapoOptions()),
}
TAKES_LISTS = {"exact_match", "math"}  # any one of several answers may match


@pytest.mark.parametrize("name", sorted(REWARDS))
@pytest.mark.parametrize("bad", [["4", "5"], {"answer": "4"}, True, [], [["4"]]], ids=repr)
def test_a_ground_truth_the_reward_cannot_compare_is_refused(name, bad):
    reward = REWARDS[name]()
    if name in TAKES_LISTS and bad == ["4", "5"]:
        reward.check_data(_prompts("1", bad), "data/train.jsonl")  # a list of answers is fine there
        return
    with pytest.raises(RlcoreError) as caught:
        reward.check_data(_prompts("1", 2, bad), "data/train.jsonl")
    message = str(caught.value)
    assert message.startswith("data 'data/train.jsonl': row 2: field 'ground_truth'"), message
    assert f"is a {type(bad).__name__}" in message and "cannot compare" in message


@pytest.mark.parametrize("name", sorted(REWARDS))
def test_text_and_numbers_pass(name):
    REWARDS[name]().check_data(_prompts("1", 2, 3.5, None), "data/train.jsonl")
