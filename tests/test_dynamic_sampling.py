"""DAPO's dynamic sampling as verl's recipe means it: which groups are kept by which metric
(``acc`` before the overlong penalty, or the penalised ``score``), what happens when the rounds
run out (pad, with the padding out of the loss and its divisor; raise; unlimited rounds), and
over-generation (``[data] gen_batch_size``) with the data position exact across a resume: the
``[filters.dynamic_sampling]`` filter of rlcore-algo-dapo through the core's batch-filter seam."""

from __future__ import annotations

import math

import pytest

from rlcore.interfaces import Prompt, SamplingParams, Trajectory
from rlcore.trainer.data_cursor import DataCursor
from rlcore.trainer.filling import BatchMaker, Filling

dapo = pytest.importorskip("rlcore_algo_dapo")

from rlcore_algo_dapo import plugin, shaping  # noqa: E402
from rlcore_algo_dapo.shapers import Overlong  # noqa: E402

from rlcore.trainer import filling  # noqa: E402

# ----------------------------------------------------------------------------- the pure functions


def test_accuracy_is_the_rewards_acc_else_its_score():
    items = filling.reward_items([1.0, -1.0, 0.5], [{"acc": 1.0}, {"acc": 0.0}, {}])
    assert items == [{"acc": 1.0, "score": 1.0}, {"acc": 0.0, "score": -1.0}, {"score": 0.5}]
    assert shaping.accuracies_of(items) == [1.0, 0.0, 0.5]
    assert shaping.accuracies_of(filling.reward_items([0.25, 0.0], [])) == [
        0.25,
        0.0,
    ]  # a reward reporting nothing per item
    with pytest.raises(ValueError, match="2 reward metrics for 3 scores"):
        filling.reward_items([1, 2, 3], [{}, {}])


def test_acc_and_score_keep_different_groups_by_hand():
    # Two samples a prompt, max 4 tokens, a buffer of 2 (penalty -0.5 at 3 tokens, -1 at 4):
    #   group 0: both correct, 3 and 4 tokens -> scores 0.5, 0.0: informative by score only
    #   group 1: correct / wrong, 1 token each -> 1, 0: informative by both
    #   group 2: both wrong -> 0, 0: neither;  group 3: both correct at 4 tokens -> 0, 0: neither
    acc = [1, 1, 1, 0, 0, 0, 1, 1]
    penalised = [0.5, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert shaping.informative_groups(shaping.filter_values("acc", penalised, acc), 2) == [1]
    assert shaping.informative_groups(shaping.filter_values("score", penalised, acc), 2) == [0, 1]
    with pytest.raises(ValueError, match="unknown dynamic sampling metric 'seq_reward'"):
        shaping.filter_values("seq_reward", penalised, acc)


def test_rounds_cap_the_total_and_zero_is_unlimited():
    assert [filling.more_rounds(done, 3) for done in (1, 2, 3, 4)] == [True, True, False, False]
    assert all(filling.more_rounds(done, 0) for done in (1, 10, 10_000))


def test_completing_a_batch_keeps_pads_or_raises():
    assert filling.complete_batch(["a", "b", "c"], ["x"], 2, "raise", rounds=1) == (
        ["a", "b"],
        0,
    )  # extra groups discarded
    assert filling.complete_batch(["a"], ["x", "y", "z"], 3, "pad", rounds=2) == (["a", "x", "y"], 2)
    with pytest.raises(
        filling.SamplingExhausted,
        match=r"step 7: dynamic sampling found 1 of the 3 informative groups a step "
        r"needs in 2 generation round\(s\).*max_generation_rounds \(0 = unlimited\)",
    ):
        filling.complete_batch(["a"], ["x", "y"], 3, "raise", rounds=2, where="step 7: ")
    with pytest.raises(filling.SamplingExhausted, match="only 1 groups left out to pad the other 2 with"):
        filling.complete_batch(["a"], ["x"], 3, "pad", rounds=1)


# ----------------------------------------------------------------------------- filling a step's batch


class Plan:
    """A fake engine + reward. ``plan[i]``: prompt i's samples as (correct, response tokens); an
    unplanned prompt's samples are all wrong, of one token. ``signed``: score +1/-1 and report
    ``acc`` 1/0 (as math_dapo), else score 1/0 and report nothing per item (as gsm8k)."""

    def __init__(
        self, plan: dict[int, list[tuple[bool, int]]], per_round: int = 2, n: int = 2, signed: bool = False
    ):
        self.plan, self.per_round, self.n, self.signed = plan, per_round, n, signed
        self.rounds: list[list[int]] = []

    def inputs(self, step, cursor):
        prompts = [
            Prompt(token_ids=[i], messages=[], ground_truth="1", index=i) for i in cursor.take(self.per_round)
        ]
        return prompts, SamplingParams(n=self.n, max_new_tokens=4, seed=11)

    def generate(self, prompts, params):
        self.rounds.append([p.index for p in prompts])
        out = []
        for p in prompts:
            for k in range(params.n):
                correct, length = self.plan.get(p.index, [(False, 1)] * params.n)[k]
                out.append(
                    Trajectory(
                        prompt=p,
                        response_ids=[1] * length,
                        response_mask=[1] * length,
                        rollout_logprobs=[0.0] * length,
                        metrics={"correct": float(correct)},
                    )
                )
        return out

    def score(self, trajectories, tokenizer):  # the scorer's plain form
        scores, metrics, _ = self.score_items(trajectories, tokenizer)
        return scores, metrics

    def score_items(self, trajectories, tokenizer):
        correct = [t.metrics["correct"] for t in trajectories]
        if self.signed:
            return [2 * c - 1 for c in correct], {}, [{"acc": c} for c in correct]
        return correct, {}, [{} for _ in correct]


# The groups of test_acc_and_score_keep_different_groups_by_hand, one round of four prompts.
GROUPS = {
    0: [(True, 3), (True, 4)],
    1: [(True, 1), (False, 1)],
    2: [(False, 1), (False, 1)],
    3: [(True, 4), (True, 4)],
}


def _make(fake, step=0, cursor=None, groups=0, **options):
    """One step's batch through [filters.dynamic_sampling] (its options, by default one round) and
    [shapers.overlong] (a buffer of 2 before 4 tokens)."""
    cursor = cursor or DataCursor(size=1000, seed=0, shuffle=False)
    sampling = plugin.rlcore_batch_filters()[0]
    assert sampling.name == "dynamic_sampling"
    built = sampling.build({"max_generation_rounds": 1} | options, None)
    f = Filling(
        shapers=[Overlong(buffer=2, penalty=1.0, max_response_tokens=4)], filters=[built], groups=groups
    )
    return BatchMaker(fake, None, fake.inputs, f).make(fake.generate, step, cursor, 0), cursor


@pytest.mark.parametrize("signed", [False, True])
def test_acc_drops_the_all_correct_group_that_score_keeps_for_its_lengths(signed):
    by_acc, _ = _make(Plan(GROUPS, per_round=4, signed=signed), groups=1, metric="acc")
    by_score, _ = _make(Plan(GROUPS, per_round=4, signed=signed), groups=1, metric="score")
    assert [p.index for p in by_acc.prompts] == [1]
    assert [p.index for p in by_score.prompts] == [0]
    # Both train on the penalised score: group 1 is 1 and 0 (or +1 and -1), 1 token each, no penalty.
    assert by_acc.scores == ([1.0, -1.0] if signed else [1.0, 0.0])
    assert by_score.scores == ([0.5, 0.0] if signed else [0.5, 0.0])
    assert (
        by_acc.metrics["dynamic_sampling/groups_dropped"] == 3
        and by_score.metrics["dynamic_sampling/groups_dropped"] == 2
    )


def test_acc_is_the_default_metric():
    batch, _ = _make(Plan(GROUPS, per_round=4), groups=1)
    assert [p.index for p in batch.prompts] == [1]


def test_out_of_rounds_it_raises_as_verl_does():
    with pytest.raises(
        filling.SamplingExhausted,
        match="step 3: dynamic sampling found 0 of the 2 informative groups a step "
        r"needs in 3 generation round\(s\)",
    ):
        _make(Plan({}), step=2, max_generation_rounds=3, on_exhausted="raise")


def test_unlimited_rounds_go_on_until_the_step_is_full():
    fake = Plan({13: [(True, 1), (False, 1)], 17: [(False, 1), (True, 1)]})
    batch, cursor = _make(fake, max_generation_rounds=0, on_exhausted="raise")
    assert [p.index for p in batch.prompts] == [13, 17]
    assert (
        len(fake.rounds) == 9 and batch.metrics["dynamic_sampling/rounds"] == 9
    )  # prompts 0-17, two a round
    assert cursor.state() == {"epoch": 0, "offset": 18} and not batch.padding


def test_padding_marks_the_padded_groups_trajectories():
    batch, _ = _make(
        Plan({3: [(True, 1), (False, 1)]}, n=2), max_generation_rounds=2, groups=3, on_exhausted="pad"
    )
    # Rounds of two prompts: 0, 1 (uniform), 2, 3 (3 informative); padded with 0 and 1, in that order.
    assert [p.index for p in batch.prompts] == [3, 0, 1]
    assert batch.padding == [False, False, True, True, True, True]
    assert (
        batch.metrics["dynamic_sampling/groups_kept"] == 1
        and batch.metrics["dynamic_sampling/groups_padded"] == 2
    )


def test_gen_batch_size_draws_more_prompts_a_round_and_keeps_the_step_size():
    informative = {i: [(True, 1), (False, 1)] for i in (1, 3, 4, 9)}
    fake = Plan(informative, per_round=6)  # the step input draws gen_batch_size = 6 prompts a round
    cursor = DataCursor(size=1000, seed=0, shuffle=False)
    first, _ = _make(fake, cursor=cursor, groups=2, max_generation_rounds=3)
    assert [p.index for p in first.prompts] == [1, 3] and first.metrics["dynamic_sampling/rounds"] == 1
    assert first.cursor == {
        "epoch": 0,
        "offset": 6,
    }  # the whole round's prompts are used, 4 of them discarded
    second, _ = _make(fake, step=1, cursor=cursor, groups=2, max_generation_rounds=3)
    # Step 2's three rounds: 6-11 (9 informative), 12-17, 18-23; padded with 6, its first uniform group.
    assert fake.rounds == [list(range(lo, lo + 6)) for lo in (0, 6, 12, 18)]
    assert [p.index for p in second.prompts] == [9, 6] and second.metrics[
        "dynamic_sampling/groups_padded"
    ] == 1
    assert second.cursor == {"epoch": 0, "offset": 24}


# ----------------------------------------------------------------------------- the manifest


def _validate(tmp_path, tiny_model, **tables):
    from rlcore.manifest.checks import check_resolved
    from rlcore.manifest.loader import load_manifest
    from rlcore.testing.runs import write_run_manifest

    manifest = load_manifest(write_run_manifest(tmp_path, tiny_model, **tables))
    check_resolved(manifest)
    return manifest


def test_the_manifest_keys_and_their_checks(tmp_path, tiny_model):
    from rlcore.errors import RlcoreError
    from rlcore.interfaces import BuildContext

    ok = _validate(
        tmp_path,
        tiny_model,
        data={"gen_batch_size": 12},
        filters={"dynamic_sampling": {"max_generation_rounds": 0, "on_exhausted": "raise"}},
    )
    chosen = ok.selected["filters.dynamic_sampling"]
    options = chosen.options
    assert (options.metric, options.max_generation_rounds, options.on_exhausted) == ("acc", 0, "raise")
    assert ok.core.data.gen_batch_size == 12
    built = chosen.component.build(options, BuildContext.from_manifest(ok))
    assert (built.metric, built.max_rounds, built.on_exhausted) == ("acc", 0, "raise")
    with pytest.raises(RlcoreError, match="with no batch filter .* every generated group trains"):
        _validate(tmp_path, tiny_model, data={"gen_batch_size": 12})
    few = _validate(
        tmp_path,
        tiny_model,
        data={"gen_batch_size": 1},
        filters={"dynamic_sampling": {"max_generation_rounds": 3}},
    )
    chosen = few.selected["filters.dynamic_sampling"]
    with pytest.raises(RlcoreError, match="cannot fill a step of data.prompts_per_step = 4 groups"):
        chosen.component.build(chosen.options, BuildContext.from_manifest(few))
    with pytest.raises(RlcoreError, match="metric"):
        _validate(tmp_path, tiny_model, filters={"dynamic_sampling": {"metric": "seq_reward"}})


# ----------------------------------------------------------------------------- the trainer


def _trainer(tmp_path, tiny_model, name, mini_batches):
    from rlcore.manifest.loader import load_manifest
    from rlcore.testing.runs import write_run_manifest
    from rlcore.trainer.rl import RLTrainer

    directory = tmp_path / name
    directory.mkdir()
    manifest = write_run_manifest(
        directory,
        tiny_model,
        rollout={"samples_per_prompt": 2},
        algorithm={"mini_batches": mini_batches, "ppo_epochs": 2},
        filters={"dynamic_sampling": {}},
        data={"prompts_per_step": 4, "max_response_tokens": 6},
    )
    trainer = RLTrainer(load_manifest(manifest), directory / "run")
    trainer.setup()
    return trainer


@pytest.mark.slow
def test_padded_groups_leave_the_update_as_the_found_groups_alone_would_make_it(tmp_path, tiny_model):
    """Four groups, the last two padding, in two mini-batches, two PPO epochs: the first
    mini-batch's gradient is the two found groups' own (the padding is not in the token-mean's
    divisor), and the second, all padding, makes no optimizer step. So the weights end as after
    two epochs of one mini-batch of the two groups alone, over two steps (an Adam step on the
    empty mini-batch would move them by its momentum)."""
    import torch

    padded = _trainer(tmp_path, tiny_model, "padded", mini_batches=2)
    alone = _trainer(tmp_path, tiny_model, "alone", mini_batches=1)
    try:
        real = padded.scheduler.maker.make(padded.rollout.generate, 0, padded.cursor.copy(), 0)
        n = real.params.n
        scores = [1.0, 0.0, 0.0, 1.0] + [0.5] * (2 * n)  # two informative groups, two uniform
        with_padding = type(real)(
            0,
            real.prompts,
            real.params,
            real.trajectories,
            scores,
            real.cursor,
            {},
            [False] * (2 * n) + [True] * (2 * n),
        )
        found = type(real)(
            0, real.prompts[:2], real.params, real.trajectories[: 2 * n], scores[: 2 * n], real.cursor, {}
        )
        for step in range(2):
            padded.scheduler.next_batch = lambda step, timer: with_padding
            alone.scheduler.next_batch = lambda step, timer: found
            a, b = padded.train_step(), alone.train_step()
            assert a["actor/grad_norm"] == pytest.approx(b["actor/grad_norm"], rel=1e-4), step
            assert a["actor/pg_loss"] == pytest.approx(b["actor/pg_loss"], rel=1e-4, abs=1e-7), step
            assert a["actor/empty_mini_batches"] == 2.0 and "actor/empty_mini_batches" not in b
            assert math.isfinite(a["actor/grad_norm"]) and a["actor/grad_norm"] > 0
        # Adam's first steps are about lr x sign(gradient): a gradient near 0 in one run and in the
        # other (float noise of the recomputed old log-probs) moves an element by up to lr; an
        # Adam step on the empty mini-batch would move every one by about 0.7 lr (1e-3 here).
        for (name, p), q in zip(padded.actor.module.named_parameters(), alone.actor.module.parameters()):
            close = torch.isclose(p, q, rtol=1e-4, atol=1e-6)
            assert close.float().mean() > 0.999, name
            torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-4, msg=name)
    finally:
        padded.close()
        alone.close()


@pytest.mark.slow
def test_over_generation_trains_and_resumes_exactly(tmp_path, tiny_model):
    from rlcore.cli import main
    from rlcore.testing.runs import read_metrics, write_run_manifest

    # A reward a random model's samples differ in (the tiny model solves nothing): a third score 1.
    (tmp_path / "rewards.py").write_text(
        "def score(item):\n    return float(sum(map(ord, item.response)) % 3 == 0)\n"
    )
    manifest = write_run_manifest(
        tmp_path,
        tiny_model,
        rollout={"samples_per_prompt": 4, "temperature": 1.0},
        data={
            "prompts_per_step": 2,
            "gen_batch_size": 6,
            "val": None,
            "train": "synthetic:addition?size=16&seed=0&split=train",
        },  # 16 prompts: the steps cross an epoch
        reward={"function": f"python:{tmp_path / 'rewards.py'}:score", "method": None},
        filters={"dynamic_sampling": {"max_generation_rounds": 2}},
        trainer={"steps": 3},
    )
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert main(["run", str(manifest), "--run-dir", str(straight)]) == 0
    assert (
        main(
            [
                "run",
                str(manifest),
                "--run-dir",
                str(resumed),
                "--set",
                "trainer.steps=2",
                "--set",
                "trainer.save_every=1",
            ]
        )
        == 0
    )
    assert main(["run", str(manifest), "--run-dir", str(resumed), "--resume"]) == 0
    keys = (
        "critic/score/mean",
        "response_length/mean",
        "dynamic_sampling/rounds",
        "dynamic_sampling/groups_dropped",
        "training/epoch",
        "actor/pg_loss",
    )
    rows = lambda run: [{k: r.get(k) for k in keys} for r in read_metrics(run) if "actor/pg_loss" in r]  # noqa: E731
    assert len(rows(straight)) == 3
    assert rows(resumed) == rows(straight)
    # Each step draws 6 prompts a round, so 3 steps of at least one round each pass the 16 prompts.
    assert all(r["dynamic_sampling/rounds"] in (1.0, 2.0) for r in rows(straight))
    assert rows(straight)[-1]["training/epoch"] >= 1


@pytest.mark.slow
def test_a_run_out_of_rounds_stops_with_the_reason_and_no_traceback(tmp_path, tiny_model):
    from rlcore.testing.runs import run_cli, write_run_manifest

    # The tiny model solves nothing: every group is all wrong, and on_exhausted = "raise" stops at step 1.
    manifest = write_run_manifest(
        tmp_path,
        tiny_model,
        data={"val": None},
        trainer={"steps": 2},
        filters={"dynamic_sampling": {"max_generation_rounds": 2, "on_exhausted": "raise"}},
    )
    proc = run_cli("run", str(manifest), "--run-dir", str(tmp_path / "run"), timeout=600)
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 1 and "Traceback" not in out, out[-2000:]
    assert (
        "step 1: dynamic sampling found 0 of the 4 informative groups a step needs in 2 generation round(s)"
        in out
    )
