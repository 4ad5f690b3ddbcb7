"""The ``verifiers`` agent loop passes rlcore's agent-loop kit (rlcore.testing.agents) over its
environments' own rows: a single-turn taskset (scripted answers, and the kit engine's seeded random
tokens), a multi-turn env that answers each guess (mask-0 user turns between the model's), and a
taskset whose MCP toolset the model calls (mask-0 tool results). The kit checks every model
token's log-prob is the engine's own in its context, the grouping by prompt, the token budget,
determinism, and that ``params.seed`` reaches the engine."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("verifiers")

from rlcore.testing.agents import check_agent_loop  # noqa: E402
from rlcore.testing.runs import discover_registry, prompts_of_spec  # noqa: E402
from rlcore.testing.tools import make_chat_tokenizer  # noqa: E402

ENVS = Path(__file__).parent / "envs"
LAST_USER = re.compile(r"<\|im_start\|>(?:user|tool)\n(.*?)<\|im_end\|>", re.S)
CAPITAL = {"France": "Paris", "Japan": "Tokyo", "Peru": "Lima", "Kenya": "Nairobi"}


def spec(name: str, query: str = "") -> str:
    return f"verifiers:python:{ENVS / name}" + (f"?{query}" if query else "")


def capital_script(text: str, k: int) -> str:
    country = re.findall(r"capital of (\w+)", text)[-1]
    return CAPITAL[country] if k == 0 else f"I think it is probably Rome, {country}"


def guesser(text: str, k: int) -> str:
    """Even samples bisect on the env's hints; odd ones give up at once."""
    if k % 2 == 1:
        return "I give up"
    low, high = 1, 9
    guesses = re.findall(r"assistant\n(\d+)", text)
    for previous, hint in zip(guesses, LAST_USER.findall(text)[1:]):
        low, high = (int(previous) + 1, high) if "higher" in hint else (low, int(previous) - 1)
    return str((low + high) // 2) if guesses else "5"


def lookup_script(text: str, k: int) -> str:
    """Sample 0 looks its key up, sample 1 a key that is not there; then each says what it got."""
    results = LAST_USER.findall(text)[1:]
    key = re.findall(r"Look up (\w+)", text)[-1] if k == 0 else "gamma"
    if not results:
        return f'<tool_call>{{"name": "lookup_get", "arguments": {{"key": "{key}"}}}}</tool_call>'
    return results[-1].strip() if not results[-1].startswith("Error") else "unknown"


@pytest.fixture(scope="module")
def tok():
    return make_chat_tokenizer()


def _on_text(tok, play):
    """A kit script (context ids, sample) from a script of the decoded context (text, sample)."""
    return lambda ids, k: play(tok.decode(ids, skip_special_tokens=False), k)


def _check(tok, rows, play, **options):
    loop = discover_registry().get("agent_loop", "verifiers")
    return check_agent_loop(
        loop,
        options or None,
        tokenizer=tok,
        prompts=prompts_of_spec(tok, rows),
        script=None if play is None else _on_text(tok, play),
        max_new_tokens=200,
    )


def test_single_turn_rows_pass_the_kit(tok):
    trajectories = _check(tok, spec("capitals.py", "countries=3"), capital_script)["trajectories"]
    assert [t.num_turns for t in trajectories] == [1] * 6
    assert all(t.prompt.data_source == "verifiers/capitals" for t in trajectories)


def test_single_turn_rows_pass_the_kit_on_random_tokens(tok):
    trajectories = _check(tok, spec("capitals.py", "countries=2"), None)["trajectories"]
    assert len(trajectories) == 4 and all(set(t.response_mask) == {1} for t in trajectories)


def test_a_multi_turn_env_passes_the_kit(tok):
    trajectories = _check(tok, spec("guess.py"), guesser)["trajectories"]
    played = [t for t in trajectories if t.num_turns > 1]
    assert played and all(0 in t.response_mask for t in played)  # the env's answers: not the model's tokens


def test_tool_calls_pass_the_kit(tok):
    trajectories = _check(tok, spec("lookup.py"), lookup_script)["trajectories"]
    called = [t for t in trajectories if t.tool_calls]
    assert called and all(0 in t.response_mask and t.num_turns == 2 for t in called)


def test_the_loops_max_turns_option_passes_the_kit(tok):
    always_wrong = lambda text, k: "9"  # noqa: E731
    trajectories = _check(tok, spec("guess.py"), always_wrong, max_turns=2)["trajectories"]
    assert {t.num_turns for t in trajectories} == {2}
