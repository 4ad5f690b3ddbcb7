"""``build_roles``: each purpose builds the roles it needs and no others, around a complete
``BuildContext``; the step pipeline's inputs come from ``StepInputs``, not from the trainer."""

from __future__ import annotations

import pytest

from rlcore.manifest.loader import load_manifest
from rlcore.testing.runs import write_run_manifest
from rlcore.trainer.data_cursor import DataCursor
from rlcore.trainer.roles import PURPOSES, build_roles
from rlcore.trainer.step_inputs import StepInputs


def _close(roles) -> None:
    for close in roles.closers():
        close()


def test_training_roles_have_a_complete_context_and_leave_the_manifest_alone(tmp_path, tiny_model):
    # total_epochs: the steps are counted from the usable prompts, before any factory runs (the
    # console sink, built last, reads them), and [trainer] steps is not rewritten.
    manifest = load_manifest(
        write_run_manifest(
            tmp_path,
            tiny_model,
            trainer={"steps": None, "total_epochs": 0.125, "loggers": ["console", "jsonl"]},
            algorithm={"kl_coef": 0.01},
        )
    )
    roles = build_roles(manifest, "train", run_dir=tmp_path / "run")
    try:
        assert roles.total_steps == 2  # 64 prompts / 4 a step * 0.125
        assert manifest.core.trainer.steps is None
        assert roles.context.total_steps == 2 and roles.context.tokenizer is roles.tokenizer
        assert roles.context.resume_step is None and roles.start_step == 0
        console = next(s for s in roles.sinks if type(s).__name__ == "ConsoleSink")
        assert console.total == 2
        assert roles.actor.optimizer is not None and roles.reference is not None
        assert roles.estimator is not None and roles.policy_loss is not None and roles.objective is not None
        assert len(roles.train_set.prompts) == 64 and roles.val_set is not None
    finally:
        _close(roles)


def test_eval_roles_build_no_optimizer_critic_reference_training_data_or_sinks(tmp_path, tiny_model):
    manifest = load_manifest(
        write_run_manifest(
            tmp_path,
            tiny_model,
            algorithm={"advantage": "gae", "kl_coef": 0.01},
            trainer={"loggers": ["jsonl"]},
        )
    )
    roles = build_roles(manifest, "eval")
    try:
        assert roles.actor.optimizer is None and roles.actor.scheduler is None
        assert roles.critic is None and roles.reference is None
        assert (
            roles.estimator is None and roles.policy_loss is None and not roles.filters and not roles.shapers
        )
        assert roles.train_set is None and roles.val_set is None and roles.sinks == ()
        assert roles.total_steps is None and roles.context.total_steps is None
        assert roles.scorer is not None and roles.rollout.agent is not None
        prompts = _prompts(roles)
        trajectories = roles.rollout.generate(prompts, roles.sampling(train=False, step=0))
        assert len(trajectories) == len(prompts) and all(t.response_ids for t in trajectories)
    finally:
        _close(roles)
    assert not (tmp_path / "run").exists()


def test_serve_roles_are_the_engine_and_the_module_it_generates_with(tmp_path, tiny_model):
    # hf generates with the policy's module: loaded in the compute dtype, in eval mode, with no
    # optimizer, float32 masters or Actor around it.
    import torch

    from rlcore.interfaces import SamplingParams
    from rlcore.trainer.precision import torch_dtype

    manifest = load_manifest(write_run_manifest(tmp_path, tiny_model))
    roles = build_roles(manifest, "serve")
    try:
        assert roles.actor is None and roles.scorer is None and roles.rollout.agent is None
        assert roles.engine is roles.rollout.engine and roles.train_set is None and roles.sinks == ()
        module = roles.context.actor
        assert isinstance(module, torch.nn.Module) and not module.training
        assert {p.dtype for p in module.parameters()} == {torch_dtype(roles.precision.compute)}
        ids = roles.tokenizer.encode("What is 2 + 3?")
        params = SamplingParams(n=1, max_new_tokens=4, temperature=1.0, seed=0)
        [[completion]] = roles.engine.generate([ids], params)
        assert 1 <= len(completion.token_ids) <= 4
    finally:
        _close(roles)


def test_serve_loads_no_model_for_an_engine_with_its_own_weights(tmp_path, tiny_model):
    import rlcore
    from rlcore.components import Component
    from rlcore.registry import Registry
    from rlcore.testing import register
    from rlcore.testing.tools import ScriptedEngine

    class OwnWeights:
        @rlcore.hookimpl
        def rlcore_rollout_engines(self):
            def build(options, context):
                return ScriptedEngine(context.tokenizer, lambda text, i: "5")

            return [Component("own_weights", build, needs={"tokenizer"})]

    registry = Registry.discover()
    register(registry, OwnWeights(), name="own_weights")
    path = write_run_manifest(tmp_path, tiny_model, rollout={"engine": "own_weights"})
    manifest = load_manifest(path, registry=registry)
    roles = build_roles(manifest, "serve")
    try:
        assert roles.context.actor is None and roles.actor is None
        assert type(roles.engine).__name__ == "ScriptedEngine"
    finally:
        _close(roles)


def test_an_unknown_purpose_is_refused(tmp_path, tiny_model):
    manifest = load_manifest(write_run_manifest(tmp_path, tiny_model))
    with pytest.raises(ValueError, match="unknown purpose 'training'; expected one of train, eval, serve"):
        build_roles(manifest, "training")
    assert PURPOSES == ("train", "eval", "serve")


def test_step_inputs_take_this_ranks_share_of_a_round_and_the_steps_sampling(tmp_path, tiny_model):
    manifest = load_manifest(write_run_manifest(tmp_path, tiny_model))
    roles = build_roles(manifest, "serve")
    try:
        prompts = list(range(10))
        second_rank = StepInputs(
            prompts, per_round=4, sampling=roles.sampling, shard=lambda items: items[1::2]
        )
        cursor = DataCursor(len(prompts), seed=0, shuffle=False)
        got, params = second_rank(3, cursor)
        assert got == [1, 3]
        assert (
            params == roles.sampling(train=True, step=3)
            and params.seed != roles.sampling(train=True, step=4).seed
        )
        assert params.n == manifest.core.rollout.samples_per_prompt
        assert second_rank(3, cursor)[0] == [5, 7]  # the cursor moved past the first round
    finally:
        _close(roles)


def _prompts(roles):
    from rlcore.data import load_prompts

    return load_prompts(
        "synthetic:addition?size=2&seed=0&split=test",
        role="val",
        tokenizer=roles.tokenizer,
        max_prompt_tokens=128,
    ).prompts
