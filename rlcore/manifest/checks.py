"""Checks across tables, run after every table validated on its own (still without torch)."""

from __future__ import annotations

from pathlib import Path

from rlcore.errors import ManifestError, Problem
from rlcore.manifest.loader import ResolvedManifest
from rlcore.manifest.locate import key_lines, line_of


def check_resolved(manifest: ResolvedManifest) -> list[str]:
    """Raise ManifestError for combinations that cannot train; return warnings for dubious ones."""
    core = manifest.core
    try:
        lines = key_lines(manifest.path.read_text(encoding="utf-8"))
    except OSError:
        lines = {}
    problems: list[Problem] = []
    warnings: list[str] = []

    def problem(key: str, message: str) -> None:
        problems.append(Problem(key, message, line_of(lines, key), str(manifest.path)))

    for role, chosen in manifest.selected.items():  # a component comparing the samples of one prompt
        if "groups" in chosen.component.needs and core.rollout.samples_per_prompt < 2:
            what = f"{chosen.component.kind.replace('_', ' ')} {chosen.component.name!r}"
            then = (
                "every advantage would be zero"
                if chosen.component.kind == "advantage_estimator"
                else f"it has nothing to compare ([{role}])"
            )
            problem(
                "rollout.samples_per_prompt",
                f"{what} compares samples of one prompt, so with samples_per_prompt = "
                f"{core.rollout.samples_per_prompt} {then}; use 2 or more",
            )
    d = core.data
    if (
        d.gen_batch_size
        and d.gen_batch_size != d.prompts_per_step
        and not any(role.startswith("filters.") for role in manifest.selected)
    ):
        problem(
            "data.gen_batch_size",
            f"gen_batch_size = {d.gen_batch_size} differs from prompts_per_step = {d.prompts_per_step}, and with no "
            "batch filter ([filters.dynamic_sampling]) every generated group trains; set prompts_per_step to the groups "
            "a step should train on, or add a filter that selects them",
        )
    if core.model.dtype != "float32":
        warnings.append(
            f"model.dtype = {core.model.dtype!r} stores the trainable weights and optimizer state in {core.model.dtype}: "
            "an update smaller than half a unit of a weight's precision (about 0.2% of the weight in bfloat16) is "
            f"lost, which is most updates at RL learning rates (trainer.lr = {core.trainer.lr:g}); keep dtype = "
            '"float32" (compute_dtype = "auto" already computes in bfloat16 on CUDA)'
        )
    if core.algorithm.kl_in_reward and core.algorithm.kl_coef == 0:
        warnings.append("algorithm.kl_in_reward is set but algorithm.kl_coef is 0: no KL penalty is applied")
    if core.data.prompts_per_step % core.algorithm.mini_batches:
        problem(
            "algorithm.mini_batches",
            f"data.prompts_per_step = {core.data.prompts_per_step} must be divisible by mini_batches = {core.algorithm.mini_batches}",
        )
    for key, spec in (("data.train", core.data.train), ("data.val", core.data.val)):
        if spec is None:
            continue
        try:
            from rlcore.data import check_data_spec
            from rlcore.data.prompts import resolve
            from rlcore.data.rows import VALIDATE_SAMPLE, check_sample
            from rlcore.data.sources import source_spec
        except ImportError:
            break
        if source_spec(spec) is not None and not (isinstance(spec, str) and Path(spec).exists()):
            continue  # a data source: validated with the manifest, by the source's own options
        message = check_data_spec(spec)
        if not message:  # the rows themselves, a sample of them
            message = check_sample(resolve(spec), core.data.prompt_key, VALIDATE_SAMPLE)
        if message:
            problem(key, message)
    t = core.trainer
    if t.keep_best:
        if not t.best_metric.startswith("val/"):
            problem(
                "trainer.best_metric",
                f"{t.best_metric!r} is not a validation metric; keep_best ranks checkpoints "
                'by one of the validation\'s metrics, such as "val/reward/mean" or "val/SOURCE/pass@1"',
            )
        elif core.data.val is None:
            problem(
                "trainer.keep_best", "keep_best ranks checkpoints by their validation, and [data] sets no val"
            )
        elif t.save_every and t.eval_every and t.save_every % t.eval_every:
            warnings.append(
                f"trainer.keep_best: checkpoints are saved every {t.save_every} steps and validated every "
                f"{t.eval_every}, so only those at a validation step (and the last) can count among the best"
            )
    if problems:
        raise ManifestError(problems)
    return warnings
