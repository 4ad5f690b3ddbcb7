"""The builtin python reward: loading a user's file, both signatures, clear errors; required fields."""

from __future__ import annotations

import textwrap

import pytest

from rlcore.builtin.options import PythonRewardOptions
from rlcore.builtin.python_reward import build_python_reward
from rlcore.errors import RlcoreError
from rlcore.interfaces import Prompt, RewardInput, RewardResult
from rlcore.reward_pool import RewardRunner, check_required_fields
from rlcore.testing.rewards import check_reward_function


def write(tmp_path, text: str, name: str = "rewards.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def build(target: str):
    return build_python_reward(PythonRewardOptions(target=target), None)


ITEM = RewardInput(response="42", ground_truth="42", data_source="src", extra_info={"bonus": 0.5})


def test_verl_signature(tmp_path):
    path = write(
        tmp_path,
        """
        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            return float(solution_str == ground_truth) + extra_info["bonus"] + (data_source == "src")
        """,
    )
    fn = build(f"{path}:compute_score")
    assert fn.style == "verl_kw"
    assert fn(ITEM) == 2.5


def test_verl_signature_without_extra_info_and_with_a_dict_result(tmp_path):
    path = write(
        tmp_path,
        """
        def score3(data_source, solution_str, ground_truth):
            return {"score": float(solution_str == ground_truth), "acc": 1.0}

        def score4(source, text, truth, info):
            return len(info)
        """,
    )
    assert build(f"{path}:score3")(ITEM) == {"score": 1.0, "acc": 1.0}
    fn4 = build(f"{path}:score4")
    assert fn4.style == "verl4" and fn4(ITEM) == 1
    with RewardRunner(build(f"{path}:score3"), timeout_s=5, workers=1) as runner:
        batch = runner.score([ITEM])
    assert batch.scores == [1.0] and batch.metrics["reward/acc"] == 1.0


def test_item_signature_and_helpers_next_to_the_file(tmp_path):
    write(tmp_path, "FACTOR = 3\n", name="reward_helpers.py")
    path = write(
        tmp_path,
        """
        from rlcore.interfaces import RewardResult
        from reward_helpers import FACTOR

        def score(item):
            return RewardResult(FACTOR * len(item.response), {"len": len(item.response)})
        """,
    )
    fn = build(f"{path}:score")
    assert fn.style == "item"
    assert fn(ITEM) == RewardResult(6, {"len": 2})


def test_module_target():
    fn = build("rlcore.testing.rewards:score_of")  # any importable fn(x) works as fn(item)
    assert fn.style == "item"


def test_conformance_kit_accepts_a_user_function(tmp_path):
    from rlcore.builtin import rlcore_reward_functions

    path = write(
        tmp_path,
        """
        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            return 1.0 if solution_str.strip() == str(ground_truth) else 0.0
        """,
    )
    component = rlcore_reward_functions()[0]
    fn = check_reward_function(
        component,
        options={"target": f"{path}:compute_score"},
        cases=[
            (RewardInput(response=" 7 ", ground_truth="7"), 1.0),
            (RewardInput(response="8", ground_truth="7"), 0.0),
        ],
    )
    assert fn.style == "verl_kw"


def test_conformance_kit_catches_a_function_that_raises_on_garbage(tmp_path):
    from rlcore.builtin import rlcore_reward_functions

    path = write(tmp_path, "def f(item):\n    return float(item.response.split()[0] == item.ground_truth)\n")
    with pytest.raises(AssertionError, match="raised IndexError"):
        check_reward_function(
            rlcore_reward_functions()[0],
            options={"target": f"{path}:f"},
            cases=[(RewardInput(response="7", ground_truth="7"), 1.0)],
        )


@pytest.mark.parametrize(
    ("source", "target", "phrases"),
    [
        (
            "def score(item):\n    return 1\n",
            "scor",
            ["has no function 'scor'", "did you mean 'score'", "score"],
        ),
        ("def a(item): pass\ndef b(item): pass\n", "c", ["has no function 'c'", "a, b"]),
        ("def score(item)\n    return 1\n", "score", ["syntax error", "line 1"]),
        ("import no_such_module_xyz\n", "score", ["failed", "ModuleNotFoundError", "no_such_module_xyz"]),
        ("score = 3\n", "score", ["is not a function but a int value"]),
        ("def score(a, b):\n    return 1\n", "score", ["expected fn(item)", "compute_score"]),
    ],
)
def test_bad_files_are_clear_errors(tmp_path, source, target, phrases):
    path = write(tmp_path, source)
    with pytest.raises(RlcoreError) as info:
        build(f"{path}:{target}")
    message = str(info.value)
    assert str(path) in message
    for phrase in phrases:
        assert phrase in message, message


def test_missing_file_and_module(tmp_path):
    with pytest.raises(RlcoreError, match="does not exist"):
        build(f"{tmp_path}/nope.py:score")
    with pytest.raises(RlcoreError, match="cannot be imported"):
        build("no_such_pkg_xyz.mod:score")
    with pytest.raises(RlcoreError, match="expected 'FILE.py:FUNCTION'"):
        build("just_a_name")


def _prompts(*truths):
    return [
        Prompt(token_ids=[1], messages=[], ground_truth=t, index=i, extra_info={"k": 1})
        for i, t in enumerate(truths)
    ]


def test_check_required_fields_names_file_row_and_field():
    check_required_fields(_prompts("1", "2"), {"ground_truth"}, "train.parquet")
    check_required_fields(_prompts(None), set(), "train.parquet")
    check_required_fields(_prompts("1"), {"extra_info.k"}, "train.parquet")
    with pytest.raises(RlcoreError) as info:
        check_required_fields(_prompts("1", "2", None, None), {"ground_truth"}, "data/train.parquet")
    message = str(info.value)
    assert "data/train.parquet" in message and "row 2" in message and "ground_truth" in message
    with pytest.raises(RlcoreError, match="row 0 has no 'extra_info.level'"):
        check_required_fields(_prompts("1"), {"extra_info.level"}, "x.jsonl")
    with pytest.raises(RlcoreError, match="unknown field 'answer'"):
        check_required_fields(_prompts("1"), {"answer"}, "x.jsonl")
