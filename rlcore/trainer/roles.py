"""The roles a run builds from its manifest, for what it is built for.

``build_roles(manifest, "train")`` builds everything a training run needs: the actor with its
optimizer, the reference and critic its algorithm asks for, the rollout engine and agent loop, the
reward (scorer), score shapers and batch filters, the training and validation data, and the
metrics sinks. ``"eval"`` (``rlcore eval``) builds only what scoring a policy needs: the actor
without an optimizer, the engine, agent loop and scorer; no critic, reference, estimator, filters,
training data or sinks. ``"serve"`` (``rlcore serve``, through :mod:`rlcore.serving`) builds the
engine alone, and the policy's module in its compute dtype only for an engine that generates with
it (``hf``): no optimizer, float32 master weights, compilation, scorer, tools or agent loop.

Every factory receives a complete :class:`rlcore.interfaces.BuildContext`: the tokenizer, the
step a resumed run continues after, and the run's total steps (counted from the data under
``[trainer] total_epochs``) are known before the first component is built; only the actor module
(``context.actor``) arrives once the actor is built, for the components that share it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loguru import logger

from rlcore.errors import RlcoreError, UsageError
from rlcore.interfaces import BuildContext
from rlcore.manifest.loader import ResolvedManifest

PURPOSES = ("train", "eval", "serve")


@dataclass(frozen=True)
class Roles:
    """What :func:`build_roles` built; a role the purpose does not need is None (or empty).

    ``start_step``: the optimizer steps the checkpoint had taken (0 without one);
    ``checkpoint_state``: its ``state.json`` (the data position, ...). ``total_steps``: the steps
    the run trains (``[trainer] steps``, or counted from ``total_epochs``; None unless training).
    ``engine_process``: the split engine's process (``[rollout] placement = "split"``), closed
    with the roles. For ``"serve"``, ``actor`` is None: the module an engine generates with, if
    any, is ``context.actor``."""

    purpose: str
    context: BuildContext
    device: str
    dist: Any
    precision: Any
    model_cfg: Any
    tokenizer: Any
    actor: Any
    rollout: Any
    sampling: Any
    start_step: int = 0
    checkpoint: Path | None = None
    checkpoint_state: dict[str, Any] | None = None
    total_steps: int | None = None
    engine_process: Any = None
    scorer: Any = None
    reference: Any = None
    critic: Any = None
    estimator: Any = None
    policy_loss: Any = None
    objective: Any = None
    shapers: tuple[Any, ...] = ()
    filters: tuple[Any, ...] = ()
    train_set: Any = None
    val_set: Any = None
    sinks: tuple[Any, ...] = ()

    @property
    def engine(self):
        return self.rollout.engine

    def closers(self) -> list[Callable[[], None]]:
        """What stops the roles' threads and processes (the split engine, the sinks, the reward
        workers, the process group), in the order they should close."""
        out = [self.engine_process.close] if self.engine_process is not None else []
        out += [sink.close for sink in self.sinks]
        out += [self.scorer.close] if self.scorer is not None else []
        return out + [self.dist.close]


def build_roles(
    manifest: ResolvedManifest,
    purpose: str,
    *,
    run_dir: str | Path | None = None,
    checkpoint: Path | None = None,
) -> Roles:
    """The roles ``purpose`` (one of :data:`PURPOSES`) needs, around the weights of ``checkpoint``
    when one is given. What was started before a failure (reward workers, an engine process) is
    closed before the error propagates."""
    if purpose not in PURPOSES:
        raise ValueError(f"unknown purpose {purpose!r}; expected one of {', '.join(PURPOSES)}")
    started: list[Callable[[], None]] = []
    try:
        return _build_roles(manifest, purpose, run_dir, checkpoint, started)
    except BaseException:
        for close in reversed(started):
            try:
                close()
            except Exception as exc:  # noqa: BLE001 - the error that stopped the build is the one to see
                logger.error("while closing a failed set-up: {}", exc)
        raise


def _build_roles(
    manifest: ResolvedManifest,
    purpose: str,
    run_dir,
    checkpoint: Path | None,
    started: list[Callable[[], None]],
) -> Roles:
    from rlcore.trainer import models, precision, startup_checks
    from rlcore.trainer.actor import Actor
    from rlcore.trainer.batching import Batching
    from rlcore.trainer.rollout import Rollout
    from rlcore.trainer.scoring import Scorer
    from rlcore.trainer.step_inputs import Sampling, eos_ids

    cfg = manifest.core
    training = purpose == "train"
    device, dist, state = _start(manifest, training, checkpoint, started)
    start_step = int(state["step"]) if state is not None else 0

    prec = precision.resolve(cfg.model, device)
    logger.info("loading tokenizer and model from {}", cfg.model.path)
    logger.info("precision: {}", prec.describe())
    model_cfg = models.materialize_gguf(cfg.model)
    tokenizer = models.load_tokenizer(model_cfg)
    context = BuildContext.from_manifest(
        manifest,
        run_dir=None if run_dir is None else str(run_dir),
        device=device,
        dtype=prec.compute,
        model_path=model_cfg.path,
        gguf_file=model_cfg.gguf_file,
        tokenizer=tokenizer,
        resume_step=start_step if state is not None else None,
        total_steps=cfg.trainer.steps if training else None,
    )
    train_set = val_set = None
    total_steps = None
    if training:
        train_set, val_set = _load_data(manifest, context)
        total_steps = _total_steps(cfg, len(train_set.prompts))
        context.total_steps = total_steps

    scorer = None
    # the reward before the model: its worker processes fork while this process is small
    if purpose != "serve":
        scorer = Scorer(
            _reward(manifest, context), cfg.reward.timeout_s, cfg.reward.workers, cfg.reward.batch_timeout_s
        )
        started.append(scorer.close)
        for dataset in filter(None, (train_set, val_set)):
            _check_data(scorer, dataset)

    if purpose == "serve":
        actor, module = None, _served_module(manifest, model_cfg, prec, device, checkpoint)
    else:
        batching = Batching(
            dist,
            device,
            cfg.trainer.micro_batch_tokens,
            cfg.algorithm.mini_batches,
            models.shares_prompts(cfg.model, device, prec.compute),
        )
        actor = Actor(cfg, model_cfg, prec, dist, device, batching, checkpoint, train=training)
        module = actor.module
    if module is not None:
        startup_checks.context_fits(manifest, module)
    context.actor = module
    algorithm: dict[str, Any] = {}
    if training:
        algorithm = _algorithm(manifest, context, actor, model_cfg, prec, dist, device, batching, tokenizer)
    if purpose != "serve":
        context.tools = {
            s.role.split(".", 1)[1]: s.component.build(s.options, context) for s in manifest.roles("tools")
        }
    if training:
        # Score shapers and batch filters ([shapers.NAME], [filters.NAME]), in the manifest's order.
        algorithm["shapers"] = tuple(s.component.build(s.options, context) for s in manifest.roles("shapers"))
        algorithm["filters"] = tuple(s.component.build(s.options, context) for s in manifest.roles("filters"))
        startup_checks.filters_select_groups(manifest, algorithm["filters"])

    engine, engine_process = _engine(manifest, context, dist, device)
    if engine_process is not None:
        started.append(engine_process.close)
    startup_checks.engine_takes_lora(manifest, engine, dist)
    if training:
        startup_checks.background_engine(manifest, engine)
    if cfg.model.lora is not None and not engine.shares_actor and purpose != "serve":
        from rlcore.trainer.lora import adapter_spec, takes_adapters

        if takes_adapters(engine):
            actor.engine_lora = adapter_spec(actor.module)
            logger.info(
                "LoRA: the engine receives the adapters alone at each weight sync (rank {})",
                cfg.model.lora.rank,
            )
    agent = _build(manifest, "agent.loop", context) if purpose != "serve" else None
    rollout = Rollout(engine, agent, actor)
    sampling = Sampling(
        cfg.rollout, cfg.data.max_response_tokens, eos_ids(tokenizer, module), cfg.run.seed, dist.rank
    )
    sinks = ()
    if training and dist.is_main:
        sinks = tuple(s.component.build(s.options, context) for s in manifest.roles("loggers"))
    return Roles(
        purpose=purpose,
        context=context,
        device=device,
        dist=dist,
        precision=prec,
        model_cfg=model_cfg,
        tokenizer=tokenizer,
        actor=actor,
        rollout=rollout,
        sampling=sampling,
        start_step=start_step,
        checkpoint=checkpoint,
        checkpoint_state=state,
        total_steps=total_steps,
        engine_process=engine_process,
        scorer=scorer,
        train_set=train_set,
        val_set=val_set,
        sinks=sinks,
        **algorithm,
    )


def _start(
    manifest: ResolvedManifest, training: bool, checkpoint: Path | None, started: list
) -> tuple[str, Any, Any]:
    """This rank's device and process group, torch's threads and seed, and the checkpoint's
    state (None without one): ``(device, dist, state)``."""
    import torch

    from rlcore.checkpoint import Checkpointer
    from rlcore.trainer import models, startup_checks
    from rlcore.trainer.distributed import Distributed

    cfg = manifest.core
    device = models.resolve_device(cfg.run.device)
    # fsdp_offload on one rank: FSDP2 over a process group of one, for its CPU offload policy.
    dist = Distributed.from_env(device, shard_one=cfg.trainer.fsdp_offload)
    started.append(dist.close)
    if device == "cuda":
        device = f"cuda:{dist.local_rank}"
    if training:
        startup_checks.batch_divides(manifest, dist.world)
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    if cfg.run.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    torch.manual_seed(cfg.run.seed)
    state = Checkpointer.read_state(checkpoint) if checkpoint is not None else None
    if state is not None and training:
        startup_checks.checkpoint_matches(manifest, checkpoint, state, dist)
    return device, dist, state


def _served_module(manifest: ResolvedManifest, model_cfg, prec, device: str, checkpoint: Path | None):
    """For ``"serve"``: the policy's module in its compute dtype, in eval mode, when the engine
    generates with it (needs ``actor_model``); None otherwise, so an engine holding its own
    weights (vLLM, SGLang) loads no second copy."""
    from rlcore.trainer import models

    if "actor_model" not in manifest.component("rollout.engine").component.needs:
        return None
    module = models.load_causal_lm(model_cfg, device, dtype=prec.compute)
    if checkpoint is not None:
        from rlcore.checkpoint import load_actor_weights

        load_actor_weights(module, checkpoint)
    module.eval()
    return module


def _algorithm(
    manifest, context, actor, model_cfg, prec, dist, device, batching, tokenizer
) -> dict[str, Any]:
    """The roles only training has, beside shapers and filters: reference, advantage estimator,
    policy loss (and the objective's options) and critic."""
    from rlcore.algorithms.objective import ObjectiveOptions
    from rlcore.trainer import startup_checks
    from rlcore.trainer.reference import build_reference

    cfg = manifest.core
    reference = (
        build_reference(actor.module, model_cfg, device, prec.compute) if cfg.algorithm.kl_coef > 0 else None
    )
    estimator = _build(manifest, "algorithm.advantage", context)
    policy_loss = _build(manifest, "algorithm.policy_loss", context)
    objective = ObjectiveOptions.from_algorithm(cfg.algorithm, policy_loss)
    if objective.loss_agg_mode != cfg.algorithm.loss_agg_mode:
        logger.info(
            "policy loss {!r} aggregates by {} (its definition), not [algorithm] loss_agg_mode = {}",
            manifest.component("algorithm.policy_loss").component.name,
            objective.loss_agg_mode,
            cfg.algorithm.loss_agg_mode,
        )
    critic = None
    if "critic" in manifest.component("algorithm.advantage").component.needs:
        from rlcore.trainer.critic import Critic

        critic = Critic(cfg, model_cfg, prec, dist, device, batching)
        startup_checks.critic_vocabulary(manifest, critic.module, tokenizer)
    return dict(
        reference=reference, estimator=estimator, policy_loss=policy_loss, objective=objective, critic=critic
    )


def _build(manifest: ResolvedManifest, role: str, context: BuildContext):
    selected = manifest.component(role)
    return selected.component.build(selected.options, context)


def _reward(manifest: ResolvedManifest, context: BuildContext):
    """``[reward] function``, or a router over ``[reward.routes]`` (with it as the default)."""
    from rlcore.trainer.scoring import RoutedReward

    routes = {
        s.role[len("reward.routes.") :]: s.component.build(s.options, context)
        for s in manifest.roles("reward.routes")
    }
    default = _build(manifest, "reward.function", context) if manifest.core.reward.function else None
    return RoutedReward(routes, default) if routes else default


def _engine(manifest: ResolvedManifest, context: BuildContext, dist, device: str):
    """The manifest's engine, in this process, or in a process of its own ([rollout] placement =
    "split"): ``(engine, its process or None)``."""
    from rlcore.trainer import startup_checks

    r = manifest.core.rollout
    if r.placement == "colocated":
        return _build(manifest, "rollout.engine", context), None
    from rlcore.trainer.engine_process import EngineProcess

    selected = manifest.component("rollout.engine")
    engine_device = startup_checks.engine_device(manifest, dist, device)
    logger.info(
        "rollout engine {!r} in its own process on {} (weights by {}, {} MiB buckets)",
        selected.component.name,
        engine_device,
        r.weight_transport,
        r.weight_bucket_mb,
    )
    child = dataclasses.replace(context, actor=None, tools={}, concurrent=True, device=engine_device)
    process = EngineProcess(
        selected.component, selected.options, child, device, r.weight_transport, r.weight_bucket_mb
    )
    return process, process


def _load_data(manifest: ResolvedManifest, context: BuildContext):
    """``[data] train`` and ``val`` (None without one), as prompt sets."""
    from rlcore.data import load_prompts

    d = manifest.core.data
    common = dict(
        tokenizer=context.tokenizer,
        max_prompt_tokens=d.max_prompt_tokens,
        prompt_key=d.prompt_key,
        base_dir=manifest.base_dir,
        chat_template_kwargs=d.chat_template_kwargs,
        context=context,
    )
    try:
        train_set = load_prompts(d.train, role="train", **common)
        val_set = load_prompts(d.val, role="val", limit=d.val_max_prompts, **common) if d.val else None
    except RlcoreError as exc:  # bad input data: a usage error, like a bad manifest
        raise UsageError(str(exc)) from None
    if len(train_set.prompts) < d.prompts_per_step:
        logger.warning(
            "data.train has {} usable prompts, fewer than data.prompts_per_step = {}: prompts repeat within a step",
            len(train_set.prompts),
            d.prompts_per_step,
        )
    return train_set, val_set


def _check_data(scorer, dataset) -> None:
    try:
        scorer.check_data(dataset.prompts, dataset.source)
    except RlcoreError as exc:
        raise UsageError(str(exc)) from None


def _total_steps(cfg, usable_prompts: int) -> int:
    """``[trainer] steps``, or under ``total_epochs`` as many steps as that many passes over the
    usable prompts take. A step draws ``gen_batch_size`` prompts at least (a batch filter's
    further rounds are not foreseen, as in verl, whose epoch is its gen_batch_size batches)."""
    t, d = cfg.trainer, cfg.data
    if t.steps is not None:
        return t.steps
    drawn = d.gen_batch_size or d.prompts_per_step
    steps = max(1, math.ceil(t.total_epochs * usable_prompts / drawn))
    logger.info(
        "total_epochs = {:g}: {} steps of {} prompts over {} usable prompts",
        t.total_epochs,
        steps,
        drawn,
        usable_prompts,
    )
    return steps
