"""The RL loop on one process (one rank): the step reads as the concept diagram.

    prompts -> scheduler (agent loop driving the rollout engine; reward function) -> scores
      -> old / reference log-probs, values -> advantage estimator -> policy (and critic) update
      -> the scheduler syncs the engine

Each box is a role of its own (actor.py, critic.py, rollout.py, scoring.py, scheduler.py); every
swappable part comes from the manifest through the registry. This module wires them, in the order
of one step, and runs the loop: validation, checkpoints, metrics (docs/architecture.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from loguru import logger

from rlcore import progress
from rlcore.algorithms.importance import mismatch_metrics, mismatch_sums
from rlcore.algorithms.objective import ObjectiveOptions
from rlcore.errors import RlcoreError, UsageError
from rlcore.interfaces import AdvantageInput, BuildContext, Prompt, SamplingParams, Trajectory
from rlcore.manifest.loader import ResolvedManifest
from rlcore.testing.faults import fault_point
from rlcore.trainer import models, precision, startup_checks
from rlcore.trainer.actor import Actor
from rlcore.trainer.batch import RolloutBatch, build_batch
from rlcore.trainer.batching import Batching
from rlcore.checkpoint import Checkpointer
from rlcore.trainer.data_cursor import DataCursor, MixedCursor, shares
from rlcore.trainer.distributed import Distributed
from rlcore.trainer.metrics import merge_metrics
from rlcore.trainer.flops import mfu, peak_tflops
from rlcore.trainer.lora import adapter_spec, takes_adapters
from rlcore.trainer.phases import MemoryHistory, Timer, generation_knobs, profiled
from rlcore.trainer.reference import build_reference
from rlcore.trainer.rollout import Rollout
from rlcore.trainer.filling import BatchMaker, Filling
from rlcore.trainer.scheduler import Background, Colocated
from rlcore.trainer.scoring import RoutedReward, Scorer
from rlcore.trainer.stopping import Stopped, StopRequest


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    if values.numel() == 0:
        return {}
    values = values.float()
    return {f"{prefix}/mean": values.mean().item(), f"{prefix}/max": values.max().item(), f"{prefix}/min": values.min().item()}


def _masked_stats(prefix: str, values: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    return _stats(prefix, values[mask.bool()])


class RLTrainer:
    def __init__(self, manifest: ResolvedManifest, run_dir: str | Path, resume: bool = False,
                 checkpoint: Path | None = None):
        """``checkpoint``: restore this checkpoint directory rather than the run's latest (``rlcore eval``)."""
        self.manifest = manifest
        self.checkpoint = checkpoint
        self.cfg = manifest.core
        self.run_dir = Path(run_dir)
        self.resume = resume
        self.step = 0
        t = self.cfg.trainer
        self.checkpointer = Checkpointer(self.run_dir, keep=t.keep_checkpoints, keep_best=t.keep_best,
                                         best_metric=t.best_metric, best_mode=t.best_mode)
        self.validation: tuple[int, dict[str, float]] | None = None  # the last one's step and metrics
        self.critic = None
        self.memory_history: MemoryHistory | None = None  # fit's: [trainer] memory_snapshot_*

    # ------------------------------------------------------------------ set-up

    def setup(self) -> None:
        cfg = self.cfg
        self.device = models.resolve_device(cfg.run.device)
        # fsdp_offload on one rank: FSDP2 over a process group of one, for its CPU offload policy.
        self.dist = Distributed.from_env(self.device, shard_one=cfg.trainer.fsdp_offload)
        if self.device == "cuda":
            self.device = f"cuda:{self.dist.local_rank}"
        startup_checks.batch_divides(self.manifest, self.dist.world)
        if cfg.run.threads:
            torch.set_num_threads(cfg.run.threads)
        if cfg.run.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
        torch.manual_seed(cfg.run.seed)

        checkpoint = self.checkpoint or (self.checkpointer.latest() if self.resume else None)
        if self.resume and checkpoint is None:
            logger.warning("--resume: no checkpoint in {}; starting from the beginning", self.run_dir)

        self.precision = precision.resolve(cfg.model, self.device)
        context = BuildContext.from_manifest(self.manifest, run_dir=str(self.run_dir), device=self.device,
                                             dtype=self.precision.compute)
        # The reward role first: its worker processes fork while this process is still small.
        self.scorer = Scorer(self._reward(context), cfg.reward.timeout_s, cfg.reward.workers, cfg.reward.batch_timeout_s)

        logger.info("loading tokenizer and model from {}", cfg.model.path)
        logger.info("precision: {}", self.precision.describe())
        self.model_cfg = models.materialize_gguf(cfg.model)
        self.tokenizer = models.load_tokenizer(self.model_cfg)
        self.batching = Batching(self.dist, self.device, cfg.trainer.micro_batch_tokens, cfg.algorithm.mini_batches,
                                 models.shares_prompts(cfg.model, self.device, self.precision.compute))
        self.actor = Actor(cfg, self.model_cfg, self.precision, self.dist, self.device, self.batching, checkpoint)
        startup_checks.context_fits(self.manifest, self.actor.module)
        self._peak_tflops = peak_tflops(torch.cuda.get_device_name(self.device)) if self.device.startswith("cuda") else None
        self.reference = (
            build_reference(self.actor.module, self.model_cfg, self.device, self.precision.compute)
            if cfg.algorithm.kl_coef > 0 else None
        )
        context.model_path, context.gguf_file = self.model_cfg.path, self.model_cfg.gguf_file
        context.tokenizer, context.actor = self.tokenizer, self.actor.module
        self.estimator = self._build("algorithm.advantage", context)
        self.policy_loss = self._build("algorithm.policy_loss", context)
        self.objective = ObjectiveOptions.from_algorithm(cfg.algorithm, self.policy_loss)
        if self.objective.loss_agg_mode != cfg.algorithm.loss_agg_mode:
            logger.info("policy loss {!r} aggregates by {} (its definition), not [algorithm] loss_agg_mode = {}",
                        self.manifest.component("algorithm.policy_loss").component.name,
                        self.objective.loss_agg_mode, cfg.algorithm.loss_agg_mode)
        if "critic" in self.manifest.component("algorithm.advantage").component.needs:
            from rlcore.trainer.critic import Critic

            self.critic = Critic(cfg, self.model_cfg, self.precision, self.dist, self.device, self.batching)
            startup_checks.critic_vocabulary(self.manifest, self.critic.module, self.tokenizer)

        context.tools = {s.role.split(".", 1)[1]: s.component.build(s.options, context) for s in self.manifest.roles("tools")}
        # Score shapers and batch filters ([shapers.NAME], [filters.NAME]), in the manifest's order.
        self.shapers = [s.component.build(s.options, context) for s in self.manifest.roles("shapers")]
        self.filters = [s.component.build(s.options, context) for s in self.manifest.roles("filters")]
        d = cfg.data
        if d.gen_batch_size and d.gen_batch_size != d.prompts_per_step and not any(hasattr(f, "select") for f in self.filters):
            raise UsageError(
                f"{self.manifest.path}: [data] gen_batch_size = {d.gen_batch_size} differs from prompts_per_step = "
                f"{d.prompts_per_step}, and with no batch filter selecting groups ([filters.dynamic_sampling]) every "
                "generated group would train; set prompts_per_step to the groups a step trains on"
            )
        engine = self._engine(context)
        if self.dist.sharded and not engine.shares_actor and cfg.model.lora is not None:
            raise UsageError(
                f"{self.manifest.path}: rollout engine {self.manifest.component('rollout.engine').component.name!r} "
                "holds its own weights, and with FSDP (several training ranks, or [trainer] fsdp_offload) they are "
                "gathered from the shards for it, which is not done for LoRA adapters yet; train the LoRA run on one "
                "rank without fsdp_offload, or use the hf engine sharing the actor"
            )
        if cfg.model.lora is not None and not engine.shares_actor and takes_adapters(engine):
            self.actor.engine_lora = adapter_spec(self.actor.module)
            logger.info("LoRA: the engine receives the adapters alone at each weight sync (rank {})", cfg.model.lora.rank)
        self.rollout = Rollout(engine, self._build("agent.loop", context), self.actor)
        selected = self.manifest.component("rollout.engine")
        self._memory_knobs = {"gen": generation_knobs(selected.component.name, selected.component.options)}
        self._load_data()

        if checkpoint is not None:
            state = self.checkpointer.read_state(checkpoint)
            with self._stored_weights():
                self.checkpointer.restore(
                    checkpoint, optimizers=self.optimizers, schedulers=self.schedulers, modules=self.modules, dist=self.dist
                )
            self.step = int(state["step"])
            self.cursor.load(state["data"])
            if int(state.get("world_size", 1)) != self.dist.world:
                raise RlcoreError(
                    f"checkpoint {checkpoint} was written by {state.get('world_size', 1)} ranks; resume it with as many"
                )
            if bool(state.get("fsdp", int(state.get("world_size", 1)) > 1)) != self.dist.sharded:
                said = "with" if self.dist.sharded else "without"
                raise UsageError(
                    f"{self.manifest.path}: checkpoint {checkpoint} was written {'without' if self.dist.sharded else 'with'} "
                    f"FSDP and this run trains {said} it ([trainer] fsdp_offload): their optimizer states differ in "
                    "kind; resume with the fsdp_offload setting it was written with"
                )
            logger.info("resumed from {} (step {})", checkpoint, self.step)
            context.resume_step = self.step
        self.scheduler = self._scheduler(engine, self._in_flight(checkpoint))
        context.total_steps = cfg.trainer.steps  # known now, also under total_epochs
        self.sinks = [s.component.build(s.options, context) for s in self.manifest.roles("loggers")] if self.dist.is_main else []

    def _in_flight(self, checkpoint: Path | None) -> list | None:
        """The background batches the checkpoint holds (made by weights it does not hold), when
        this run can train them as the run that saved them would have."""
        if checkpoint is None:
            return None
        from rlcore.checkpoint import load_rank_object

        saved = load_rank_object(checkpoint, IN_FLIGHT, self.dist.rank)
        staleness = self.cfg.rollout.max_staleness or 0
        if saved is None:
            if staleness > 0:
                logger.warning("checkpoint {} holds no in-flight batches (written by an older rlcore): the background "
                               "rollouts restart their lag from the restored weights, so the next {} step(s) differ "
                               "from an uninterrupted run's", checkpoint, staleness)
            return None
        if saved["max_staleness"] != staleness:
            logger.warning("checkpoint {} was written at max_staleness = {} and this run has {}: its {} in-flight "
                           "batch(es) are dropped and regenerated from the restored weights (not an exact resume)",
                           checkpoint, saved["max_staleness"], staleness, len(saved["batches"]))
            return None
        return saved["batches"]

    def _scheduler(self, engine, in_flight: list | None = None):
        """Rollout and training take turns, or rollouts run in the background ([rollout] max_staleness)."""
        staleness = self.cfg.rollout.max_staleness
        filling = Filling(shapers=self.shapers, filters=self.filters, score_chunks=self.cfg.rollout.score_chunks,
                          groups=self.cfg.data.prompts_per_step // self.dist.world)
        maker = BatchMaker(self.scorer, self.tokenizer, self._step_inputs, filling)
        common = (self.rollout, maker, self.actor.weights_for_engine, self.step, self.cursor)
        if staleness is None:
            if self.step and not engine.shares_actor:  # an engine holding its own weights still has the initial ones
                self.rollout.sync(self.actor.weights_for_engine())
            return Colocated(*common)
        name = self.manifest.component("rollout.engine").component.name
        if engine.shares_actor:
            raise UsageError(
                f"{self.manifest.path}: [rollout] max_staleness: the {name!r} engine shares the actor's module, so it "
                "cannot generate while the trainer trains; use an engine that holds its own weights"
            )
        logger.info(
            "rollouts in the background, at most {} step(s) behind the trainer; rollout_correction = {}",
            staleness, self.cfg.algorithm.rollout_correction,
        )
        return Background(*common, max_staleness=staleness, in_flight=in_flight)

    def _step_inputs(self, step: int, cursor: DataCursor | MixedCursor) -> tuple[list[Prompt], SamplingParams]:
        """Step ``step``'s prompts (this rank's share; ``cursor`` advances past them) and sampling."""
        indices = cursor.take(self.cfg.data.gen_batch_size or self.cfg.data.prompts_per_step)
        local = self.dist.shard(list(range(len(indices))))
        return [self.train_set.prompts[indices[i]] for i in local], self._sampling(train=True, step=step)

    def _engine(self, context: BuildContext):
        """The manifest's engine, in this process, or in a process of its own ([rollout] placement = "split")."""
        r = self.cfg.rollout
        if r.placement == "colocated":
            return self._build("rollout.engine", context)
        from rlcore.trainer.engine_process import EngineProcess

        selected = self.manifest.component("rollout.engine")
        device = self._engine_device()
        logger.info("rollout engine {!r} in its own process on {} (weights by {}, {} MiB buckets)",
                    selected.component.name, device, r.weight_transport, r.weight_bucket_mb)
        child = dataclasses.replace(context, actor=None, tools={}, concurrent=True, device=device)
        self.engine_process = EngineProcess(selected.component, selected.options, child, self.device,
                                            r.weight_transport, r.weight_bucket_mb)
        return self.engine_process

    def _engine_device(self) -> str:
        """Where this rank's split engine runs: ``engine_device``, one device per local rank when it
        is a list, else the rank's own device. Each rank drives its own engine (data-parallel
        rollout), as engines holding their own weights do with several ranks."""
        wanted = self.cfg.rollout.engine_device
        if wanted is None:
            return self.device
        if isinstance(wanted, str):
            if self.dist.world > 1 and wanted.startswith("cuda"):
                raise UsageError(
                    f"{self.manifest.path}: [rollout] engine_device = {wanted!r} would put every rank's engine on one "
                    "GPU; give one device per local rank (engine_device = [\"cuda:4\", \"cuda:5\", ...]) or leave "
                    "it out (each engine on its rank's GPU)"
                )
            return wanted
        if self.dist.local_rank >= len(wanted):
            raise UsageError(
                f"{self.manifest.path}: [rollout] engine_device lists {len(wanted)} device(s), and local rank "
                f"{self.dist.local_rank} needs one; list one per rank on a node"
            )
        return wanted[self.dist.local_rank]

    def _reward(self, context: BuildContext):
        """``[reward] function``, or a router over ``[reward.routes]`` (with it as the default)."""
        routes = {s.role[len("reward.routes."):]: s.component.build(s.options, context)
                  for s in self.manifest.roles("reward.routes")}
        default = self._build("reward.function", context) if self.cfg.reward.function else None
        return RoutedReward(routes, default) if routes else default

    def _build(self, role: str, context: BuildContext):
        selected = self.manifest.component(role)
        return selected.component.build(selected.options, context)

    @property
    def engine(self):
        return self.rollout.engine

    @property
    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        roles = {"actor": self.actor, "critic": self.critic}
        return {name: role.optimizer for name, role in roles.items() if role is not None}

    @property
    def schedulers(self) -> dict[str, Any]:
        roles = {"actor": self.actor, "critic": self.critic}
        return {name: role.scheduler for name, role in roles.items() if role is not None}

    @property
    def modules(self) -> dict[str, torch.nn.Module]:
        """Modules checkpointed beside the actor's model directory."""
        return {"critic": self.critic.module} if self.critic is not None else {}

    def _stored_weights(self):
        """Inside: every trained module holds its weights as stored (float32 masters under mixed
        precision), for checkpoints and export."""
        stack = contextlib.ExitStack()
        for role in (self.actor, self.critic):
            if role is not None:
                stack.enter_context(role.stored_weights())
        return stack

    def _load_data(self) -> None:
        from rlcore.data import load_prompts

        d = self.cfg.data
        common = dict(tokenizer=self.tokenizer, max_prompt_tokens=d.max_prompt_tokens, prompt_key=d.prompt_key,
                      base_dir=self.manifest.base_dir, chat_template_kwargs=d.chat_template_kwargs,
                      context=BuildContext.from_manifest(self.manifest))
        try:
            self.train_set = load_prompts(d.train, role="train", **common)
            self.val_set = load_prompts(d.val, role="val", limit=d.val_max_prompts, **common) if d.val else None
            for dataset in filter(None, (self.train_set, self.val_set)):
                self.scorer.check_data(dataset.prompts, dataset.source)
        except RlcoreError as exc:  # bad input data: a usage error, like a bad manifest
            raise UsageError(str(exc)) from None
        if len(self.train_set.prompts) < d.prompts_per_step:
            logger.warning(
                "data.train has {} usable prompts, fewer than data.prompts_per_step = {}: prompts repeat within a step",
                len(self.train_set.prompts), d.prompts_per_step,
            )
        self.cursor = self._cursor()
        t = self.cfg.trainer
        if t.steps is None:  # total_epochs: as many steps as that many passes over the usable prompts take
            # A step draws gen_batch_size prompts at least (a batch filter's further rounds are not
            # foreseen, as in verl, whose epoch is its gen_batch_size batches).
            drawn = d.gen_batch_size or d.prompts_per_step
            t.steps = max(1, math.ceil(t.total_epochs * len(self.train_set.prompts) / drawn))
            logger.info("total_epochs = {:g}: {} steps of {} prompts over {} usable prompts", t.total_epochs, t.steps,
                        drawn, len(self.train_set.prompts))

    def _cursor(self) -> DataCursor | MixedCursor:
        """Where the training prompts come from: one shuffled order, or per-source orders mixed in
        the proportions of ``[data] source_weights``."""
        d = self.cfg.data
        if not d.source_weights:
            return DataCursor(len(self.train_set.prompts), seed=self.cfg.run.seed, shuffle=d.shuffle)
        members: dict[str, list[int]] = defaultdict(list)
        for i, prompt in enumerate(self.train_set.prompts):
            members[prompt.data_source].append(i)
        unweighted = sorted(set(members) - set(d.source_weights))
        missing = sorted(set(d.source_weights) - set(members))
        if unweighted or missing:
            problems = ([f"the sources {unweighted} of data.train have no weight (0 leaves one out)"] if unweighted else [])
            problems += ([f"{missing} are not data sources of data.train"] if missing else [])
            raise UsageError(
                f"{self.manifest.path}: [data] source_weights: " + "; ".join(problems)
                + f"; the sources of {self.train_set.source}: {sorted(members)}"
            )
        counts = shares(d.prompts_per_step, {k: v for k, v in d.source_weights.items() if v > 0})
        logger.info("prompts a step by data source: {}", ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
        return MixedCursor(dict(members), dict(d.source_weights), seed=self.cfg.run.seed, shuffle=d.shuffle)

    def _rank(self) -> int:
        return self.dist.rank if hasattr(self, "dist") else 0

    def _sampling(self, *, train: bool, step: int = 0) -> SamplingParams:
        r = self.cfg.rollout
        eos = _eos_ids(self.tokenizer, self.actor.module) if hasattr(self, "tokenizer") else []
        return SamplingParams(
            n=r.samples_per_prompt if train else r.val_samples_per_prompt,
            temperature=r.temperature if train else r.val_temperature,
            top_p=r.top_p if train else 1.0,
            top_k=r.top_k if train else -1,
            max_new_tokens=self.cfg.data.max_response_tokens,
            stop_token_ids=eos,
            stop=list(r.stop),
            # A seed per step (and rank) keeps a resumed run on the same samples as an uninterrupted one.
            seed=(self.cfg.run.seed * 1_000_003 + step * 2 + (0 if train else 1) + 7919 * self._rank()) % (2**31),
        )

    # ------------------------------------------------------------------ the loop

    def fit(self) -> None:
        finished = False
        try:
            t = self.cfg.trainer
            self.memory_history = MemoryHistory(t.memory_snapshot_steps, t.memory_snapshot_on_oom, self.run_dir,
                                                cuda=self.device.startswith("cuda"), rank=self.dist.rank)
            with StopRequest() as stop, self.memory_history.run():
                self._fit(stop)
            finished = True
        finally:
            self.close(raise_errors=finished)

    def close(self, raise_errors: bool = True) -> None:
        """Stop what setup started: the rollout thread, the sinks, the reward workers, the process group.
        Each is closed even if another fails; a failure found while closing (a rollout thread's
        error, an engine process that had died) is raised after all are closed, or, when
        ``raise_errors`` is off (the run is failing already), logged."""
        closers = []
        if hasattr(self, "scheduler"):
            closers.append(self.scheduler.close)
        if getattr(self, "engine_process", None) is not None:
            closers.append(self.engine_process.close)
        closers += [sink.close for sink in getattr(self, "sinks", [])]
        if hasattr(self, "scorer"):
            closers.append(self.scorer.close)
        if hasattr(self, "dist"):
            closers.append(self.dist.close)
        errors = []
        for close in closers:
            try:
                close()
            except Exception as exc:  # noqa: BLE001 - the others must still close
                errors.append(exc)
        if errors and raise_errors:
            for extra in errors[1:]:
                logger.error("also while closing the run: {}", extra)
            raise errors[0]
        for error in errors:
            logger.error("while closing the failed run: {}", error)

    def _fit(self, stop: StopRequest) -> None:
        t = self.cfg.trainer
        if self.step and self.step >= t.steps:
            logger.info("the run is already complete: its checkpoint is at step {} of trainer.steps = {}, so there is "
                        "nothing to train; to train on, raise the steps (--set trainer.steps={})",
                        self.step, t.steps, self.step + max(1, t.save_every or 1))
        if self.step == 0 and t.eval_before_train and self.val_set is not None:
            self._log(self.evaluate(), self.step)
        while self.step < t.steps:
            with self.memory_history.step(self.step + 1), profiled(self.step + 1, t.profile_steps, self.run_dir):
                metrics = self.train_step()
            self.step += 1
            self._log(metrics, self.step)
            signum = stop.agreed(self.dist)
            if signum:  # SIGTERM or SIGUSR1: keep what this step learnt, then stop (stopping.py)
                raise Stopped(signum, self.save())
            last = self.step == t.steps
            if self.val_set is not None and (last or (t.eval_every and self.step % t.eval_every == 0)):
                self.validation = (self.step, self.evaluate())
                self._log(self.validation[1], self.step)
            if last or (t.save_every and self.step % t.save_every == 0):
                self.save()
        if t.export_final:
            self.export(self.run_dir / "export")

    def _log(self, metrics: dict[str, float], step: int) -> None:
        for sink in self.sinks:
            sink.log(metrics, step)

    def train_step(self) -> dict[str, Any]:
        algo = self.cfg.algorithm
        timer = Timer(self.memory_history, knobs=self._memory_knobs)
        metrics: dict[str, Any] = {}
        with timer("step"):
            scored = self.scheduler.next_batch(timer)
            params, trajectories = scored.params, scored.trajectories
            metrics.update(scored.metrics)
            staleness = scored.staleness()
            metrics["rollout/staleness/mean"] = sum(staleness) / max(len(staleness), 1)
            metrics["rollout/staleness/max"] = float(max(staleness, default=0))
            # Group ids unique across ranks, however many groups each kept (dynamic sampling).
            per_rank = self.cfg.data.prompts_per_step // self.dist.world
            batch = build_batch(trajectories, scored.scores, params.n, group_offset=self.dist.rank * per_rank)
            padding = getattr(scored, "padding", [])  # (a batch in flight saved before it had the field: none)
            if padding:  # groups padding a step short of selected ones: out of the loss and its divisor
                batch.response_mask[torch.tensor(padding, dtype=torch.bool)] = 0
            for loss_mask in (f for f in self.filters if hasattr(f, "loss_mask")):
                keep, mask_metrics = loss_mask.loss_mask(trajectories)
                batch.response_mask[torch.tensor([not k for k in keep], dtype=torch.bool)] = 0
                metrics.update(mask_metrics)
            self.actor.module.train()
            # With one optimizer step per batch, the update's own forward pass runs on the current
            # weights, the PPO ratio's "old" policy: its detached log-probs are the old ones, at no
            # extra cost, and the rollout correction weighs them against the generating weights'
            # (rollout_logprobs), for a stale batch as for a fresh one. Several optimizer steps per
            # batch need the old log-probs fixed before the first.
            recompute_old = algo.ppo_epochs > 1 or algo.mini_batches > 1
            if recompute_old:
                with timer("old_log_prob"):
                    batch.tensors["old_logprobs"] = self.actor.logprobs(batch, params.temperature)
                metrics.update(mismatch_metrics(mismatch_sums(batch.tensors["old_logprobs"], batch.rollout_logprobs, batch.response_mask)))
            if self.reference is not None:
                with timer("ref"), self.reference.policy() as ref:
                    model = None if ref is self.actor.module else ref
                    batch.tensors["ref_logprobs"] = self.actor.logprobs(batch, params.temperature, model=model)
            if self.critic is not None:
                with timer("values"):
                    batch.tensors["values"] = self.critic.values(batch)
            with timer("adv"):
                self._advantages(batch, metrics)
            with timer("update_actor"):
                metrics.update(self.update_actor(batch, params.temperature, has_old=recompute_old))
            if self.critic is not None:
                with timer("update_critic"):
                    metrics.update(self.critic.update(batch))
            self.scheduler.weights_changed(timer)
            fault_point("update")
            self.cursor.load(scored.cursor)
        metrics.update(timer.times)
        metrics.update(timer.memory)
        if "timing_s/wait_rollout" in metrics:
            metrics["async/trainer_wait_fraction"] = metrics["timing_s/wait_rollout"] / max(metrics["timing_s/step"], 1e-9)
        metrics.update(self._batch_metrics(batch, trajectories))
        tokens = sum(batch.sequence_lengths())
        metrics["perf/total_num_tokens"] = tokens
        # verl's perf/throughput is per GPU: this rank's tokens per second (ranks average it).
        metrics["perf/throughput"] = metrics["perf/throughput_total"] = tokens / max(timer.times["timing_s/step"], 1e-9)
        utilisation = mfu(self.actor.parameter_count, tokens * algo.ppo_epochs, timer.times["timing_s/update_actor"],
                          self._peak_tflops)
        if utilisation is not None:
            metrics["perf/mfu/actor"] = utilisation
        metrics["training/epoch"] = self.cursor.epoch
        metrics["actor/lr"] = self.actor.scheduler.get_last_lr()[0]
        return merge_metrics(self.dist.gather(metrics)) if self.dist.enabled else metrics

    # ------------------------------------------------------------------ pieces of a step

    def update_actor(self, batch: RolloutBatch, temperature: float, has_old: bool) -> dict[str, float]:
        return self.actor.update(batch, temperature, has_old, self.policy_loss, self.objective,
                                 norm_length=self.cfg.algorithm.loss_norm_length or self.cfg.data.max_response_tokens)

    def _advantages(self, batch: RolloutBatch, metrics: dict[str, Any]) -> None:
        algo = self.cfg.algorithm
        mask = batch.response_mask
        token_rewards = torch.zeros_like(mask)
        lengths = mask.shape[1] - torch.flip(mask, dims=[1]).argmax(dim=1) - 1  # last masked position
        has_tokens = mask.sum(1) > 0
        rows = torch.arange(batch.size)[has_tokens]
        token_rewards[rows, lengths[has_tokens]] = batch.scores[has_tokens]
        if algo.kl_in_reward and self.reference is not None:
            from rlcore.algorithms.kl import kl_penalty

            old = batch.tensors.get("old_logprobs", batch.rollout_logprobs)
            kl = kl_penalty(old, batch.tensors["ref_logprobs"], algo.kl_estimator) * mask
            token_rewards = token_rewards - algo.kl_coef * kl
            metrics["actor/reward_kl_penalty"] = (kl.sum() / mask.sum().clamp(min=1)).item()
        advantages, returns = self._estimate(
            AdvantageInput(
                scores=batch.scores,
                token_rewards=token_rewards,
                response_mask=mask,
                group_ids=batch.group_ids,
                values=batch.tensors.get("values"),
            )
        )
        batch.tensors["advantages"] = advantages.float() * mask
        batch.tensors["returns"] = returns.float() * mask
        batch.tensors["token_rewards"] = token_rewards

    def _estimate(self, local: AdvantageInput) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the estimator on the whole step's batch (gathered from every rank), so group and
        batch statistics are those one process would compute; return this rank's rows."""
        if not self.dist.enabled:
            return self.estimator(local)
        fields = ("scores", "token_rewards", "response_mask", "group_ids", "values")
        parts = self.dist.gather({f: getattr(local, f) for f in fields})
        width = max(p["response_mask"].shape[1] for p in parts)
        pad = lambda t: None if t is None else torch.nn.functional.pad(t, (0, width - t.shape[1]))  # noqa: E731
        merged = {
            f: (None if parts[0][f] is None else torch.cat([p[f] if p[f].dim() == 1 else pad(p[f]) for p in parts]))
            for f in fields
        }
        advantages, returns = self.estimator(AdvantageInput(**merged))
        start = sum(p["scores"].shape[0] for p in parts[: self.dist.rank])
        rows = slice(start, start + local.scores.shape[0])
        cols = local.response_mask.shape[1]
        return advantages[rows, :cols], returns[rows, :cols]


    def _batch_metrics(self, batch: RolloutBatch, trajectories: list[Trajectory]) -> dict[str, float]:
        mask = batch.response_mask
        lengths = mask.sum(1)
        all_lengths = torch.tensor([len(r) for r in batch.response_ids], dtype=torch.float32)
        out: dict[str, float] = {}
        out.update(_stats("critic/score", batch.scores))
        by_source: dict[str, list[float]] = defaultdict(list)
        for t, score in zip(trajectories, batch.scores.tolist()):
            by_source[t.prompt.data_source or "default"].append(score)
        if len(by_source) > 1:  # a mixture: each source's training reward, as validation reports it
            out.update({f"critic/score/{src}/mean": sum(v) / len(v) for src, v in sorted(by_source.items())})
        out.update(_stats("critic/rewards", batch.tensors["token_rewards"].sum(1)))
        out.update(_masked_stats("critic/advantages", batch.tensors["advantages"], mask))
        out.update(_masked_stats("critic/returns", batch.tensors["returns"], mask))
        if "values" in batch.tensors:
            out.update(_masked_stats("critic/values", batch.tensors["values"], mask))
        out.update(_stats("response_length", all_lengths))
        out["response_length/clip_ratio"] = float(sum(t.finish_reason == "length" for t in trajectories)) / max(len(trajectories), 1)
        out.update(_stats("prompt_length", torch.tensor([len(p) for p in batch.prompt_ids], dtype=torch.float32)))
        out["response/model_tokens/mean"] = lengths.mean().item()
        if any(t.num_turns > 1 or t.tool_calls for t in trajectories):
            out.update(_stats("agent/num_turns", torch.tensor([float(t.num_turns) for t in trajectories])))
            out["agent/tool_calls/mean"] = sum(t.tool_calls for t in trajectories) / len(trajectories)
            out["agent/tool_errors/sum"] = float(sum(t.tool_errors for t in trajectories))
        extra: dict[str, list[float]] = defaultdict(list)
        for t in trajectories:
            for k, v in t.metrics.items():
                extra[k].append(float(v))
        out.update({k: sum(v) / len(v) for k, v in extra.items()})
        return out

    # ------------------------------------------------------------------ validation, saving

    @progress.during("validating", within_step=False)
    def evaluate(self) -> dict[str, float]:
        assert self.val_set is not None
        params = self._sampling(train=False, step=self.step)
        start = time.perf_counter()
        with self.scheduler.quiet():
            trajectories = self.rollout.generate(self.dist.shard(self.val_set.prompts), params)
        scores, _ = self.scorer.score(trajectories, self.tokenizer)
        self._log_samples(trajectories, scores)
        results = [
            (t.prompt.data_source or "default", t.prompt.index, s, len(t.response_ids)) for t, s in zip(trajectories, scores)
        ]
        results = [r for part in self.dist.gather(results) for r in part]
        by_source: dict[str, list[float]] = defaultdict(list)
        passed: dict[str, dict[int, bool]] = defaultdict(dict)
        for src, index, s, _ in results:
            by_source[src].append(s)
            passed[src][index] = passed[src].get(index, False) or s > 0
        scores = [r[2] for r in results]
        metrics: dict[str, float] = {"val/reward/mean": sum(scores) / max(len(scores), 1)}
        for src, values in by_source.items():
            metrics[f"val/{src}/reward/mean"] = sum(values) / len(values)
            metrics[f"val/{src}/pass@1"] = sum(v > 0 for v in values) / len(values)
            if params.n > 1:
                metrics[f"val/{src}/pass@{params.n}"] = sum(passed[src].values()) / len(passed[src])
        metrics["val/response_length/mean"] = sum(r[3] for r in results) / max(len(results), 1)
        metrics["timing_s/val"] = time.perf_counter() - start
        return metrics

    def _log_samples(self, trajectories: list[Trajectory], scores: list[float]) -> None:
        """The first ``[trainer] log_val_generations`` validation samples (this rank's), to the sinks that take them."""
        count = self.cfg.trainer.log_val_generations
        takers = [sink for sink in getattr(self, "sinks", []) if hasattr(sink, "log_samples")]
        if not count or not takers:
            return
        decode = self.tokenizer.decode
        rows = [
            {"data_source": t.prompt.data_source or "default", "prompt": decode(t.prompt.token_ids, skip_special_tokens=True),
             "response": decode(t.response_ids, skip_special_tokens=True), "score": float(score)}
            for t, score in list(zip(trajectories, scores))[:count]
        ]
        for sink in takers:
            sink.log_samples(rows, self.step)

    @progress.during("saving a checkpoint", within_step=False)
    def save(self) -> Path:
        # Batches in flight were (or will be) made by weights older than these: saved as they are.
        in_flight = self.scheduler.in_flight() if isinstance(self.scheduler, Background) else []
        objects = {IN_FLIGHT: {"max_staleness": self.cfg.rollout.max_staleness, "batches": in_flight}} if in_flight else None
        with self._stored_weights():
            return self.checkpointer.save(
                self.step,
                actor=self.actor.module,
                tokenizer=self.tokenizer,
                optimizers=self.optimizers,
                schedulers=self.schedulers,
                modules=self.modules,
                state={"data": self.cursor.state(), "world_size": self.dist.world, "fsdp": self.dist.sharded,
                       # this step's validation, for [trainer] keep_best
                       **({"validation": self.validation[1]} if self.validation and self.validation[0] == self.step else {})},
                dist=self.dist,
                rank_objects=objects,
            )

    def export(self, target: Path) -> Path:
        """Write the trained model as a plain Hugging Face directory (LoRA merged)."""
        from rlcore.trainer.export import export_model

        with self._stored_weights():
            if not self.dist.sharded:
                return export_model(self.actor.module, self.tokenizer, target)
            if self.cfg.model.lora is not None:
                raise RlcoreError(
                    f"{self.manifest.path}: [trainer] export_final: merging LoRA adapters into FSDP shards (several "
                    "ranks, or fsdp_offload) is not done yet; the checkpoints hold the adapters"
                )
            from rlcore.trainer.distributed import full_state_dict

            state = full_state_dict(self.actor.module)  # a collective: the full float32 model on rank 0
            if self.dist.is_main:
                export_model(self.actor.module, self.tokenizer, target, state_dict=state)
            self.dist.barrier()
            return Path(target)


IN_FLIGHT = "inflight"  # the checkpoint's per-rank file of background batches in flight (inflight-rankR.pt)


def _eos_ids(tokenizer, model) -> list[int]:
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen = getattr(model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    elif isinstance(eos, (list, tuple)):
        ids.update(int(e) for e in eos)
    return sorted(ids)
