"""The ``verl`` reward: each row scored by the scorer verl's ``default_compute_score`` picks for its
``data_source`` (``verl/utils/reward_score/__init__.py``), among the scorers this plugin has.

A verl run without a custom reward function scores a mixture of datasets this way. Sources whose
verl scorer rlcore lacks (code, geometry, search QA, PRIME math) are refused before training,
naming the row and what to write instead; rows of other sources can still be routed to any
function with ``[reward.routes."SOURCE"]``, which take precedence.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rlcore.errors import RlcoreError, did_you_mean
from rlcore.interfaces import Prompt, RewardInput, RewardResult
from rlcore_reward_rule.options import GSM8KOptions, MathDapoOptions, MathOptions


@dataclass(frozen=True)
class VerlRoute:
    """One branch of verl's table: the sources it matches, verl's scorer module, rlcore's scorer."""

    sources: tuple[str, ...]
    verl_module: str  # under verl.utils.reward_score
    scorer: str | None  # the rlcore reward function scoring them; None: none in rlcore
    prefix: str | None = None  # verl also matches data_source.startswith(prefix)

    def matches(self, source: str) -> bool:
        return source in self.sources or (self.prefix is not None and source.startswith(self.prefix))

    def describe(self) -> str:
        names = ", ".join(self.sources) + (f", {self.prefix}*" if self.prefix else "")
        how = 'gsm8k, method "strict"' if self.scorer == "gsm8k" else self.scorer
        return f"{names} ({how})"


# verl's default_compute_score, branch by branch and in its order (verl b178a3cd).
VERL_TABLE: tuple[VerlRoute, ...] = (
    VerlRoute(("openai/gsm8k",), "gsm8k", "gsm8k"),  # with verl's default method, strict
    VerlRoute(
        ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"),
        "math_reward",
        "math",
    ),
    VerlRoute(("math_dapo", "math", "math_dapo_reasoning"), "math_dapo", "math_dapo", prefix="aime"),
    VerlRoute(
        (
            "numina_aops_forum",
            "numina_synthetic_math",
            "numina_amc_aime",
            "numina_synthetic_amc",
            "numina_cn_k12",
            "numina_olympiads",
        ),
        "prime_math",
        None,
    ),
    VerlRoute(("codecontests", "apps", "codeforces", "taco"), "sandbox_fusion or prime_code", None),
    VerlRoute(("hiyouga/geometry3k",), "geo3k", None),
    VerlRoute(
        (
            "searchR1_nq",
            "searchR1_triviaqa",
            "searchR1_popqa",
            "searchR1_hotpotqa",
            "searchR1_2wikimultihopqa",
            "searchR1_musique",
            "searchR1_bamboogle",
        ),
        "search_r1_like_qa_em",
        None,
    ),
)


def verl_route(source: str) -> VerlRoute | None:
    """The branch of verl's table that ``source`` takes (the first that matches), or None."""
    return next((route for route in VERL_TABLE if route.matches(source)), None)


def _scorers() -> dict[str, Callable[[RewardInput], RewardResult]]:
    """Each scorer as verl's table calls it: its default arguments."""
    from rlcore_reward_rule.gsm8k import GSM8KReward
    from rlcore_reward_rule.math_answer import MathReward
    from rlcore_reward_rule.math_dapo import MathDapoReward

    return {
        "gsm8k": GSM8KReward(GSM8KOptions(method="strict")),
        "math": MathReward(MathOptions()),
        "math_dapo": MathDapoReward(MathDapoOptions()),
    }


class VerlDefaultReward:
    required_fields = frozenset({"ground_truth"})

    def __init__(self) -> None:
        self.scorers = _scorers()

    def scorer_for(self, source: str) -> Callable[[RewardInput], RewardResult] | None:
        route = verl_route(source)
        return self.scorers.get(route.scorer) if route is not None and route.scorer else None

    def __call__(self, item: RewardInput) -> RewardResult:
        scorer = self.scorer_for(item.data_source)
        if scorer is None:  # check_data refuses such rows before training; this is for rows made elsewhere
            raise ValueError(unscorable(item.data_source))
        return scorer(item)

    def check_data(self, prompts: Sequence[Prompt], source_name: str) -> None:
        """Every row's data_source is one verl's table sends to a scorer rlcore has (and passes
        that scorer's own check)."""
        by_source: dict[str, list[Prompt]] = {}
        for prompt in prompts:
            by_source.setdefault(prompt.data_source, []).append(prompt)
        for source, rows in by_source.items():
            scorer = self.scorer_for(source)
            if scorer is None:
                raise RlcoreError(f"data {source_name!r}: row {rows[0].index}: {unscorable(source)}")
            own_check = getattr(scorer, "check_data", None)
            if callable(own_check):
                own_check(rows, source_name)


def unscorable(source: str) -> str:
    """Why the ``verl`` reward cannot score rows of ``source``, and what it can score."""
    route = verl_route(source)
    if route is not None:
        why = (
            f"data_source {source!r} is one verl's default scorer sends to verl.utils.reward_score."
            f"{route.verl_module}, which rlcore has no scorer for"
        )
    else:
        known = [s for r in VERL_TABLE for s in r.sources]
        close = did_you_mean(source, known)
        why = (
            f"data_source {source!r} is not in verl's default scorer's table, where verl raises "
            "NotImplementedError" + (f" (did you mean {close!r}?)" if close else "")
        )
    scored = "; ".join(route.describe() for route in VERL_TABLE if route.scorer)
    return (
        f'{why}. [reward] function = "verl" scores: {scored}. Score it with '
        f'[reward.routes."{source}"] function = "..." (a registered reward or "python:file.py:function")'
    )


def build(options: object = None, context: object = None) -> VerlDefaultReward:
    return VerlDefaultReward()
