"""The judge reward against a scripted OpenAI-compatible server on 127.0.0.1: replies are parsed
and normalised, junk and failures score 0 and are counted, 5xx and 429 are retried, a down
endpoint costs no exception, and no more than ``concurrency`` requests are in flight."""

from __future__ import annotations

import time

import pytest
from pydantic import ValidationError

pytest.importorskip("httpx")

from rlcore_reward_model.judge import build  # noqa: E402
from rlcore_reward_model.options import JudgeOptions  # noqa: E402

from rlcore.errors import UsageError  # noqa: E402
from rlcore.interfaces import BuildContext, RewardInput, RewardResult  # noqa: E402

CHATML = (
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWhat is {q}?<|im_end|>\n"
    "<|im_start|>assistant\n"
)


def item(q="2 + 3", response="5", truth="5", group=0):
    return RewardInput(prompt=CHATML.format(q=q), response=response, ground_truth=truth, group=group)


def judge(url, context=None, **options):
    options = {"base_url": url, "model": "grader", "backoff_s": 0.01, **options}
    return build(JudgeOptions(**options), context or BuildContext())


def scores(results):
    assert all(isinstance(r, RewardResult) for r in results)
    return [r.score for r in results]


def test_replies_are_parsed_and_normalised_and_the_request_is_what_the_options_say(judge_server):
    replies = {
        "5": "The answer is right, 5 = 5.\nScore: 9",
        "6": "<think>maybe 10? 2+3 is 5</think>Wrong.\n2",
        "7": "Final score: 7.5/10 ... no: 4",
    }
    server = judge_server(
        lambda body, n: (200, replies[body["messages"][-1]["content"].rsplit("ANSWER=", 1)[1]], 0)
    )
    j = judge(
        server.url,
        prompt_template='Q: {prompt}\nTruth: {ground_truth}\nJSON: {{"x": 1}}\nANSWER={response}',
        system_prompt="You grade.",
        temperature=0.3,
        max_tokens=64,
        extra_body={"top_p": 0.5},
    )
    results = j.score_batch([item(response="5"), item(response="6"), item(response="7")])
    assert scores(results) == pytest.approx([0.9, 0.2, 0.4])
    assert [r.metrics["judge_failed"] for r in results] == [0.0, 0.0, 0.0]
    body = server.bodies[0]
    assert (
        body["model"] == "grader"
        and body["temperature"] == 0.3
        and body["max_tokens"] == 64
        and body["top_p"] == 0.5
    )
    assert body["messages"][0] == {"role": "system", "content": "You grade."}
    # {prompt} is the question without the policy's template markup; {{ }} are literal braces.
    assert body["messages"][1]["content"].startswith('Q: What is 2 + 3?\nTruth: 5\nJSON: {"x": 1}\nANSWER=')
    assert "Authorization" not in server.headers[0]
    assert j.required_fields == {"ground_truth"}


def test_a_score_pattern_with_a_group(judge_server):
    server = judge_server(lambda body, n: (200, "I give it [[8]] out of 10 (step 3 of 4)", 0))
    j = judge(server.url, score_pattern=r"\[\[(\d+)\]\]", prompt_template="{response}")
    assert scores(j.score_batch([item()])) == [0.8]
    assert j.required_fields == set()  # the template does not use the ground truth


@pytest.mark.parametrize("reply", ["I cannot grade this.", "Score: 15", "Score: -2", "", "<think>9</think>"])
def test_a_junk_reply_scores_zero_and_is_counted(judge_server, reply):
    server = judge_server(lambda body, n: (200, reply if n == 1 else "Score: 10", 0))
    results = judge(server.url, concurrency=1).score_batch([item(), item()])
    assert scores(results) == [0.0, 1.0]
    assert [r.metrics["judge_failed"] for r in results] == [1.0, 0.0]


def test_5xx_and_429_are_retried_then_succeed(judge_server):
    statuses = {1: 500, 2: 429, 3: 200}
    server = judge_server(lambda body, n: (statuses.get(n, 200), "overloaded" if n < 3 else "6", 0))
    results = judge(server.url, retries=2).score_batch([item()])
    assert scores(results) == [0.6] and results[0].metrics["judge_retries"] == 2.0 and len(server.bodies) == 3


def test_retries_run_out_and_a_client_error_is_not_retried(judge_server):
    server = judge_server(lambda body, n: (503, "down for maintenance", 0))
    results = judge(server.url, retries=2).score_batch([item()])
    assert scores(results) == [0.0] and results[0].metrics["judge_failed"] == 1.0 and len(server.bodies) == 3
    server = judge_server(lambda body, n: (400, "bad request", 0))
    assert scores(judge(server.url, retries=5).score_batch([item()])) == [0.0] and len(server.bodies) == 1


def test_a_down_endpoint_scores_zeros_counted_without_raising(closed_port):
    j = judge(f"http://127.0.0.1:{closed_port}/v1", retries=1)
    started = time.monotonic()
    results = j.score_batch([item(), item(group=1)])
    assert scores(results) == [0.0, 0.0] and [r.metrics["judge_failed"] for r in results] == [1.0, 1.0]
    assert time.monotonic() - started < 5


def test_no_more_than_concurrency_requests_at_once(judge_server):
    server = judge_server(lambda body, n: (200, "7", 0.15))
    j = judge(server.url, concurrency=3)
    started = time.monotonic()
    results = j.score_batch([item(group=g) for g in range(9)])
    elapsed = time.monotonic() - started
    assert scores(results) == pytest.approx([0.7] * 9)
    assert server.max_active == 3  # in parallel, and never more
    assert elapsed < 9 * 0.15  # not one by one


def test_the_batch_ends_before_the_rewards_time_limit(judge_server):
    """A slow judge costs its unfinished items (counted), not the batch: [reward] batch_timeout_s = 4."""
    server = judge_server(lambda body, n: (200, "9", 0.1 if n <= 2 else 10.0))
    context = BuildContext(manifest={"reward": {"function": "judge", "batch_timeout_s": 4.0}})
    started = time.monotonic()
    results = judge(server.url, context, concurrency=2).score_batch([item(group=g) for g in range(4)])
    # It stops at 90% of the limit (3.6 s); the rest is slack for a loaded machine (2.018 s
    # against a 2 s limit was seen with two test workers on two cores).
    assert time.monotonic() - started < 4.0
    assert sorted(scores(results)) == [0.0, 0.0, 0.9, 0.9]
    assert sum(r.metrics["judge_failed"] for r in results) == 2


def test_the_api_key_comes_from_the_named_environment_variable(judge_server, monkeypatch):
    server = judge_server(lambda body, n: (200, "10", 0))
    monkeypatch.setenv("MY_JUDGE_KEY", "sk-test-123")
    assert scores(judge(server.url, api_key_env="MY_JUDGE_KEY").score_batch([item()])) == [1.0]
    assert server.headers[0]["Authorization"] == "Bearer sk-test-123"
    monkeypatch.delenv("MY_JUDGE_KEY")
    with pytest.raises(
        UsageError, match="api_key_env = 'MY_JUDGE_KEY': that environment variable is not set"
    ):
        judge(server.url, api_key_env="MY_JUDGE_KEY")


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"prompt_template": "Grade {respons}"}, r"unknown placeholder \{respons\}; known: \{prompt\}"),
        ({"prompt_template": "Grade {prompt}"}, r"put \{response\} in it"),
        ({"score_pattern": "(\\d+"}, "not a valid regular expression"),
        ({"api_key_env": "sk-abc-123"}, "never put the key itself in the manifest"),
        ({"base_url": "localhost:8000"}, "expected an http:// or https:// URL"),
        ({"extra_body": {"messages": []}}, "extra_body may not set messages"),
        ({"max_score": 0}, "greater than 0"),
    ],
)
def test_bad_options_are_refused_by_validation(options, match):
    with pytest.raises(ValidationError, match=match):
        JudgeOptions(**{"base_url": "http://127.0.0.1:1/v1", "model": "m", **options})
