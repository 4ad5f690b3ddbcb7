"""The verifiers data source, agent loop and reward on environments defined in tests/envs/: a
single-turn taskset, a multi-turn Env (the env answers each guess), and a taskset with an MCP
toolset; played with a scripted engine and a tiny chat tokenizer (no model, no network)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rlcore.interfaces import BuildContext, Prompt, RewardInput, SamplingParams
from rlcore.testing.rewards import check_reward_function
from rlcore.testing.runs import (
    check_data_spec,
    discover_registry,
    prompts_of_spec,
    score_trajectories,
)
from rlcore.testing.tools import ScriptedEngine, make_chat_tokenizer

ENVS = Path(__file__).parent / "envs"
LAST_USER = re.compile(r"<\|im_start\|>(?:user|tool)\n(.*?)<\|im_end\|>", re.S)


@pytest.fixture(scope="module")
def tok():
    return make_chat_tokenizer()


@pytest.fixture(scope="module")
def registry():
    return discover_registry()


def build(registry, kind, tok=None, **options):
    return registry.get(kind, "verifiers").build(options, BuildContext(tokenizer=tok))


def params(tok, n=2, max_new_tokens=200, **kw) -> SamplingParams:
    return SamplingParams(n=n, max_new_tokens=max_new_tokens, stop_token_ids=[tok.eos_token_id], **kw)


def spec(name: str, query: str = "") -> str:
    return f"verifiers:python:{ENVS / name}" + (f"?{query}" if query else "")


# ----------------------------------------------------------------------------- single turn


CAPITAL = {"France": "Paris", "Japan": "Tokyo", "Peru": "Lima", "Kenya": "Nairobi"}


def capital_script(text: str, i: int) -> str:
    country = re.findall(r"capital of (\w+)", text)[-1]
    return CAPITAL[country] if i == 0 else f"I think it is probably Rome, {country}"


def test_single_turn_rows_episodes_and_the_tasks_own_rewards(tok, registry):
    prompts = prompts_of_spec(tok, spec("capitals.py", "countries=3"))
    assert [p.messages for p in prompts][0] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is the capital of France?"},
    ]
    assert {p.data_source for p in prompts} == {"verifiers/capitals"}
    loop = build(registry, "agent_loop", tok)
    engine = ScriptedEngine(tok, capital_script)
    out = loop.run(prompts, engine, params(tok))
    assert engine.calls == [6]  # every episode's model call in one engine call
    assert [t.prompt.index for t in out] == [0, 0, 1, 1, 2, 2]
    for t in out:
        assert (t.finish_reason, t.num_turns, t.tool_calls) == ("stop", 1, 0)
        assert t.response_mask == [1] * len(t.response_ids) and set(t.rollout_logprobs) == {-0.5}
        assert t.prompt.token_ids == prompts[t.prompt.index].token_ids  # no tools: the row's prompt as it was
        assert t.metrics["verifiers/stop/agent_completed"] == 1.0
    reward = build(registry, "reward_function")
    scores, metrics = score_trajectories(reward, out, tok)
    # right and short: 2 * 1 + 0.5 * 1; wrong and long: 0
    assert scores == [2.5, 0.0] * 3
    assert metrics["reward/correct"] == pytest.approx(0.5) and metrics["reward/metric/words"] > 1


def test_the_reward_scores_rows_played_by_another_loop_from_the_response(registry, tok):
    [prompt] = prompts_of_spec(tok, spec("capitals.py", "countries=1"))
    reward = build(registry, "reward_function")
    item = RewardInput(
        response="Paris.",
        data_source=prompt.data_source,
        extra_info=prompt.extra_info,
        messages=prompt.messages,
    )
    result = reward(item)
    assert result.score == 2.5 and result.metrics["metric/words"] == 1.0
    check_reward_function(
        registry.get("reward_function", "verifiers"),
        cases=[
            (item, 2.5),
            (
                RewardInput(
                    response="Lyon, I believe, is the capital",
                    extra_info=prompt.extra_info,
                    messages=prompt.messages,
                ),
                0.0,
            ),
        ],
    )


def test_the_reward_refuses_other_rows_unless_told_to_score_them_zero(registry, tok):
    reward = build(registry, "reward_function")
    other = Prompt(
        token_ids=[1], messages=[{"role": "user", "content": "1+1?"}], data_source="openai/gsm8k", index=3
    )
    with pytest.raises(
        Exception, match=r"row 3: the verifiers reward scores rows of the verifiers data source"
    ):
        reward.check_data([other], "data.jsonl")
    lenient = build(registry, "reward_function", missing="zero")
    lenient.check_data([other], "data.jsonl")
    assert lenient(RewardInput(response="2", data_source="openai/gsm8k")).score == 0.0


# ----------------------------------------------------------------------------- multi-turn


def guesser(text: str, i: int) -> str:
    """Even samples bisect on the env's hints; odd ones give up at once (the two rows' prompts are
    the same text, so their first turns go to the engine as one prompt of n = 4)."""
    if i % 2 == 1:
        return "I give up"
    low, high, guess = 1, 9, 5
    for previous, hint in zip(re.findall(r"assistant\n(\d+)", text), LAST_USER.findall(text)[1:]):
        guess = int(previous)
        low, high = (guess + 1, high) if "higher" in hint else (low, guess - 1)
    return str((low + high) // 2) if re.findall(r"assistant\n(\d+)", text) else "5"


def test_multi_turn_env_answers_each_turn_and_its_stop_ends_an_episode(tok, registry):
    prompts = prompts_of_spec(tok, spec("guess.py"))
    loop = build(registry, "agent_loop", tok)
    out = loop.run(prompts, ScriptedEngine(tok, guesser), params(tok))
    by_secret = {3: out[0], 7: out[2]}
    # secret 3: 5 -> lower -> 2 -> higher -> 3; secret 7: 5 -> higher -> 7
    assert [by_secret[3].num_turns, by_secret[7].num_turns] == [3, 2]
    t = by_secret[7]
    model = tok.decode([x for x, m in zip(t.response_ids, t.response_mask) if m], skip_special_tokens=False)
    env_side = tok.decode(
        [x for x, m in zip(t.response_ids, t.response_mask) if not m], skip_special_tokens=False
    )
    assert model == "5<|im_end|>7<|im_end|>"
    assert env_side == "\n<|im_start|>user\nNo, higher.<|im_end|>\n<|im_start|>assistant\n"
    assert all((lp == -0.5) if m else (lp == 0.0) for m, lp in zip(t.response_mask, t.rollout_logprobs))
    # the accumulated tokens are the template's rendering of the conversation
    rendered = tok.apply_chat_template(loop.last_messages[2], tokenize=False)
    assert tok.decode(t.prompt.token_ids + t.response_ids, skip_special_tokens=False) + "\n" == rendered
    # the second sample said "I give up": the task's @vf.stop ended the episode after one turn
    assert (out[1].num_turns, out[1].metrics["verifiers/stop/gave_up"]) == (1, 1.0)
    scores, _ = score_trajectories(build(registry, "reward_function"), out, tok)
    assert scores == [1.0, 0.0, 1.0, 0.0]


def test_max_turns_and_the_token_budget_end_episodes(tok, registry):
    prompts = prompts_of_spec(tok, spec("guess.py"))[:1]
    always_wrong = ScriptedEngine(tok, lambda text, i: "9")
    out = build(registry, "agent_loop", tok).run(prompts, always_wrong, params(tok, n=1))
    assert (out[0].num_turns, out[0].finish_reason) == (4, "stop")  # the seat's own max_turns = 4
    assert out[0].metrics["verifiers/stop/max_turns"] == 1.0
    out = build(registry, "agent_loop", tok, max_turns=2).run(prompts, always_wrong, params(tok, n=1))
    assert out[0].num_turns == 2  # the loop's option wins
    out = build(registry, "agent_loop", tok).run(prompts, always_wrong, params(tok, n=1, max_new_tokens=12))
    assert out[0].finish_reason == "length" and out[0].metrics["verifiers/stop/max_output_tokens"] == 1.0
    assert len(out[0].response_ids) <= 12
    rambling = ScriptedEngine(tok, lambda text, i: "nine " * 50)
    out = build(registry, "agent_loop", tok).run(prompts, rambling, params(tok, n=1, max_new_tokens=20))
    assert (out[0].finish_reason, out[0].num_turns, len(out[0].response_ids)) == ("length", 1, 20)


def test_env_options_reach_the_seat(tok, registry):
    table = {
        "source": "verifiers",
        "env": f"python:{ENVS / 'guess.py'}",
        "env_options": {"player": {"max_turns": 2}},
    }
    prompts = prompts_of_spec(tok, table)[:1]
    out = build(registry, "agent_loop", tok).run(
        prompts, ScriptedEngine(tok, lambda text, i: "9"), params(tok, n=1)
    )
    assert out[0].num_turns == 2


# ----------------------------------------------------------------------------- tools


def lookup_script(text: str, i: int) -> str:
    results = LAST_USER.findall(text)[1:]
    key = re.findall(r"Look up (\w+)", text)[-1]
    if i == 1 and not results:
        return '<tool_call>{"name": "lookup_get", "arguments": {"key": "gamma"}}</tool_call>'
    if not results:
        return f'<tool_call>{{"name": "lookup_get", "arguments": {{"key": "{key}"}}}}</tool_call>'
    return results[-1].strip() if not results[-1].startswith("Error") else "unknown"


def test_tool_calls_run_the_tasks_mcp_toolset_in_process(tok, registry):
    prompts = prompts_of_spec(tok, spec("lookup.py"))
    loop = build(registry, "agent_loop", tok)
    out = loop.run(prompts, ScriptedEngine(tok, lookup_script), params(tok))
    alpha, alpha_bad = out[0], out[1]
    # the toolset's tool, named as verifiers names it (<server>_<tool>), is offered in the prompt
    prompt_text = tok.decode(alpha.prompt.token_ids, skip_special_tokens=False)
    assert '"name": "lookup_get"' in prompt_text and "The value stored under key." in prompt_text
    assert (alpha.num_turns, alpha.tool_calls, alpha.tool_errors) == (2, 1, 0)
    tool_text = tok.decode(
        [x for x, m in zip(alpha.response_ids, alpha.response_mask) if not m], skip_special_tokens=False
    )
    assert tool_text == "\n<|im_start|>tool\n17<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(alpha.response_ids, skip_special_tokens=True).endswith("17")
    # a failing call is an error message to the model, counted, and the episode goes on
    assert (alpha_bad.tool_calls, alpha_bad.tool_errors, alpha_bad.num_turns) == (1, 1, 2)
    assert "no key 'gamma'" in tok.decode(alpha_bad.response_ids, skip_special_tokens=False)
    # the toolset wrote the keys it was asked into the rollout's state; the task's reward reads it
    assert [t.state.asked for t in loop.last_traces] == [["alpha"], ["gamma"], ["beta"], ["gamma"]]
    # the trace holds the call as verifiers records one: beside the text, with its tool result after it
    first = loop.last_traces[0]
    call = first.assistant_messages[0].tool_calls[0]
    assert (call.name, call.arguments, first.assistant_messages[0].content) == (
        "lookup_get",
        '{"key": "alpha"}',
        "",
    )
    assert [(m.tool_call_id, m.content) for m in first.tool_messages] == [(call.id, "17")]
    scores, _ = score_trajectories(build(registry, "reward_function"), out, tok)
    assert scores == pytest.approx([1.1, 0.0, 1.1, 0.0])


def test_long_tool_results_are_cut(tok, registry):
    table = {
        "source": "verifiers",
        "env": f"python:{ENVS / 'lookup.py'}",
        "task": {"tools": {"table": {"alpha": "x" * 500}}},
    }
    prompts = prompts_of_spec(tok, table)
    out = build(registry, "agent_loop", tok, max_tool_response_chars=40).run(
        prompts, ScriptedEngine(tok, lookup_script), params(tok, n=1, max_new_tokens=400)
    )
    text = tok.decode(
        [x for x, m in zip(out[0].response_ids, out[0].response_mask) if not m], skip_special_tokens=False
    )
    assert "characters cut" in text and text.count("x") == 40


def test_an_env_that_fails_ends_its_episode_which_scores_zero(tok, registry):
    prompts = prompts_of_spec(tok, spec("broken.py"))
    out = build(registry, "agent_loop", tok).run(
        prompts, ScriptedEngine(tok, lambda text, i: "hi"), params(tok, n=2)
    )
    assert [(t.num_turns, t.metrics["verifiers/episode_errors"]) for t in out] == [(1, 1.0), (1, 1.0)]
    assert out[0].response_mask == [1] * len(out[0].response_ids)  # what was played is kept
    scores, metrics = score_trajectories(build(registry, "reward_function"), out, tok)
    assert scores == [0.0, 0.0] and metrics["reward/episode_error"] == 1.0


def test_an_installed_package_is_named_by_its_module(tok, registry, monkeypatch):
    monkeypatch.syspath_prepend(str(ENVS))
    [prompt] = prompts_of_spec(tok, "verifiers:capitals?countries=1")
    assert prompt.extra_info["verifiers"]["env"] == "capitals" and prompt.data_source == "verifiers/capitals"
    [named] = prompts_of_spec(tok, "verifiers:capitals:CapitalsTaskset?countries=1")
    assert named.data_source == "verifiers/capitals.CapitalsTaskset"
    item = RewardInput(
        response="Paris",
        data_source=prompt.data_source,
        extra_info=prompt.extra_info,
        messages=prompt.messages,
    )
    assert build(registry, "reward_function")(item).score == 2.5


# ----------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    "written, expected",
    [
        (
            spec("capitals.py", "countires=2"),
            "taskset CapitalsTaskset has no option 'countires'; did you mean 'countries'?",
        ),
        (
            spec("capitals.py", "countries=many"),
            "taskset CapitalsTaskset: countries: Input should be a valid integer",
        ),
        (spec("capitals.py") + ":Capitals", "no 'Capitals' in it; did you mean 'CapitalsTaskset'?"),
        (spec("missing.py"), "does not exist"),
        (
            "verifiers:rlcore_no_such_env",
            "verifiers environment package 'rlcore_no_such_env' is not installed",
        ),
        (spec("two_seats.py"), "has 2 seats (solver, critic); rlcore's policy plays one seat"),
        (spec("sandbox.py"), "@vf.reward file_written needs a runtime"),
        (spec("sandbox.py"), "@vf.intercept rewrite is an interception-server hook"),
        (spec("judged.py"), "env JudgedEnv overrides finalize(): cross-agent judgement"),
        (
            {
                "source": "verifiers",
                "env": f"python:{ENVS / 'guess.py'}",
                "env_options": {"player": {"harness": {"id": "bash"}}},
            },
            "seat 'player' pins the harness 'bash': harness programs",
        ),
        (
            {"source": "verifiers", "env": f"python:{ENVS / 'guess.py'}", "env_options": {"players": {}}},
            "GuessEnvConfig has no option 'players'; did you mean 'player'?",
        ),
    ],
)
def test_what_rlcore_cannot_play_is_a_located_error_at_validate(written, expected):
    problem = check_data_spec(written)
    assert problem is not None and expected in problem, problem


def test_validation_imports_no_torch(tmp_path):
    import subprocess
    import sys

    code = (
        "import sys; from rlcore.testing.runs import check_data_spec; "
        f"assert check_data_spec({spec('lookup.py')!r}) is None; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"


def test_the_plugin_uses_only_the_plugin_api():
    from rlcore.testing.api import check_plugin_imports, describe_violations

    src = Path(__file__).resolve().parents[1] / "src"
    violations = check_plugin_imports(sorted(src.rglob("*.py")), own={"rlcore_verifiers"})
    assert not violations, describe_violations(violations)
