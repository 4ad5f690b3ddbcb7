"""rlcore.testing.agents: the builtin ``single_turn`` loop passes the agent-loop kit, and loops
broken in the ways that corrupt training (counts, grouping, alignment, masks, determinism, the
seed) fail it with a message naming the rule."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("transformers")

from rlcore.builtin.single_turn import SingleTurnLoop  # noqa: E402
from rlcore.interfaces import Trajectory  # noqa: E402
from rlcore.testing import isolated_registry  # noqa: E402
from rlcore.testing.agents import KitEngine, check_agent_loop, kit_prompts  # noqa: E402
from rlcore.testing.tools import make_chat_tokenizer  # noqa: E402


def test_single_turn_passes_the_kit():
    result = check_agent_loop(isolated_registry().get("agent_loop", "single_turn"))
    trajectories = result["trajectories"]
    assert len(trajectories) == 6 and result["engine_calls"] == 1
    assert {t.finish_reason for t in trajectories} <= {"stop", "length"}


def test_the_kit_engine_is_seeded_and_its_logprobs_are_those_of_the_context():
    from rlcore.interfaces import SamplingParams

    tokenizer = make_chat_tokenizer()
    prompts = [p.token_ids for p in kit_prompts(tokenizer)]
    params = SamplingParams(n=3, max_new_tokens=10)
    a = KitEngine(tokenizer, seed=1).generate(prompts, params)
    assert [[c.token_ids for c in g] for g in a] == [
        [c.token_ids for c in g] for g in KitEngine(tokenizer, seed=1).generate(prompts, params)
    ]
    assert [[c.token_ids for c in g] for g in a] != [
        [c.token_ids for c in g] for g in KitEngine(tokenizer, seed=2).generate(prompts, params)
    ]
    for prompt, group in zip(prompts, a):
        assert len({tuple(c.token_ids) for c in group}) > 1  # the n samples differ
        for c in group:
            assert len(c.token_ids) == len(c.logprobs) and 1 <= len(c.token_ids) <= 10
            assert c.logprobs == [
                KitEngine.logprob(prompt + c.token_ids[:i], t) for i, t in enumerate(c.token_ids)
            ]
            assert (c.finish_reason == "stop") == (c.token_ids[-1] == tokenizer.eos_token_id)


# ----------------------------------------------------------------------------- broken loops


class IgnoresN(SingleTurnLoop):
    def run(self, prompts, engine, params):
        return super().run(prompts, engine, params.model_copy(update={"n": 1}))


class ShiftedLogprobs(SingleTurnLoop):
    def run(self, prompts, engine, params):
        out = super().run(prompts, engine, params)
        for t in out:
            t.rollout_logprobs = t.rollout_logprobs[1:] + [-1.0]
        return out


class ReversedGroups(SingleTurnLoop):
    def run(self, prompts, engine, params):
        return super().run(list(reversed(prompts)), engine, params)


class ShortMask(SingleTurnLoop):
    def run(self, prompts, engine, params):
        out = super().run(prompts, engine, params)
        for t in out:
            t.response_mask = t.response_mask[:-1]
        return out


class GlueMarkedAsModel(SingleTurnLoop):
    """Appends 'tool output' tokens but marks them as the model's, with a made-up log-prob."""

    def run(self, prompts, engine, params):
        out = super().run(
            prompts, engine, params.model_copy(update={"max_new_tokens": params.max_new_tokens - 2})
        )
        for t in out:
            t.response_ids += [5, 6]
            t.response_mask += [1, 1]
            t.rollout_logprobs += [-0.5, -0.5]
        return out


class GlueWithLogprob(SingleTurnLoop):
    def run(self, prompts, engine, params):
        out = super().run(
            prompts, engine, params.model_copy(update={"max_new_tokens": params.max_new_tokens - 1})
        )
        for t in out:
            t.response_ids += [5]
            t.response_mask += [0]
            t.rollout_logprobs += [-0.5]
        return out


class Unseeded(SingleTurnLoop):
    """Shuffles each group with the global random state."""

    def run(self, prompts, engine, params):
        out = super().run(prompts, engine, params)
        n = params.n
        groups = [out[i : i + n] for i in range(0, len(out), n)]
        for g in groups:
            random.shuffle(g)
        return [t for g in groups for t in g]


class DropsTheSeed(SingleTurnLoop):
    def run(self, prompts, engine, params):
        return super().run(prompts, engine, params.model_copy(update={"seed": None}))


class Fabricates:
    def run(self, prompts, engine, params):
        return [
            Trajectory(prompt=p, response_ids=[5], response_mask=[1], rollout_logprobs=[-1.0])
            for p in prompts
            for _ in range(params.n)
        ]


class EditsPrompts(SingleTurnLoop):
    def run(self, prompts, engine, params):
        for p in prompts:
            p.token_ids.append(0)
        return super().run(prompts, engine, params)


class OverBudget(SingleTurnLoop):
    def run(self, prompts, engine, params):
        return super().run(
            prompts, engine, params.model_copy(update={"max_new_tokens": params.max_new_tokens + 8})
        )


@pytest.mark.parametrize(
    "loop, message",
    [
        (IgnoresN(), "6 expected|expected 6"),
        (ShiftedLogprobs(), "log-probs misaligned with tokens"),
        (ReversedGroups(), "belongs to prompt 0"),
        (ShortMask(), "must have one entry per response token"),
        (GlueMarkedAsModel(), "the engine gave"),
        (GlueWithLogprob(), r"mask 0 .*\(must be 0.0\)"),
        (Unseeded(), "different trajectories"),
        (DropsTheSeed(), "must pass params.seed on"),
        (Fabricates(), "the engine gave|without calling the engine"),
        (EditsPrompts(), "changed the prompts"),
        (OverBudget(), "more than max_new_tokens"),
    ],
    ids=lambda v: type(v).__name__ if not isinstance(v, str) else "",
)
def test_broken_loops_fail_the_kit_saying_why(loop, message):
    if isinstance(loop, Unseeded):
        random.seed(0)
    with pytest.raises(AssertionError, match=message):
        check_agent_loop(loop)
