"""The RL loop on one process (one rank): the step reads as the concept diagram.

    generate (scheduler: agent loop driving the engine; reward; shapers, filters) -> assemble
      -> prepare (old / reference log-probs, values) -> estimate (advantages)
      -> update (actor, critic) -> sync (the engine's weights) -> report

``train_step`` is that list of stages over one step record (step_record.py). The roles they use
are built by roles.py for training; every swappable part comes from the manifest through the
registry. This module runs the loop around the steps: validation, checkpoints, metrics
(docs/architecture.md).
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from loguru import logger

from rlcore import progress
from rlcore.algorithms.importance import mismatch_metrics, mismatch_sums
from rlcore.checkpoint import Checkpointer
from rlcore.errors import RlcoreError
from rlcore.interfaces import AdvantageInput, Trajectory
from rlcore.manifest.loader import ResolvedManifest
from rlcore.testing.faults import fault_point
from rlcore.trainer import startup_checks
from rlcore.trainer.batch import RolloutBatch, build_batch
from rlcore.trainer.data_cursor import DataCursor, MixedCursor, shares
from rlcore.trainer.filling import BatchMaker, Filling
from rlcore.trainer.flops import mfu, peak_tflops
from rlcore.trainer.metrics import merge_metrics
from rlcore.trainer.phases import MemoryHistory, Timer, generation_knobs, profiled
from rlcore.trainer.roles import build_roles
from rlcore.trainer.scheduler import Background, InTurn
from rlcore.trainer.step_inputs import StepInputs
from rlcore.trainer.step_record import StepRecord
from rlcore.trainer.stopping import Stopped, StopRequest
from rlcore.trainer.validation import validate


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    if values.numel() == 0:
        return {}
    values = values.float()
    return {
        f"{prefix}/mean": values.mean().item(),
        f"{prefix}/max": values.max().item(),
        f"{prefix}/min": values.min().item(),
    }


def _masked_stats(prefix: str, values: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    return _stats(prefix, values[mask.bool()])


class RLTrainer:
    def __init__(
        self,
        manifest: ResolvedManifest,
        run_dir: str | Path,
        resume: bool = False,
        checkpoint: Path | None = None,
    ):
        """``checkpoint``: restore this checkpoint directory rather than the run's latest."""
        self.manifest = manifest
        self.checkpoint = checkpoint
        self.cfg = manifest.core
        self.run_dir = Path(run_dir)
        self.resume = resume
        self.step = 0
        t = self.cfg.trainer
        self.checkpointer = Checkpointer(
            self.run_dir,
            keep=t.keep_checkpoints,
            keep_best=t.keep_best,
            best_metric=t.best_metric,
            best_mode=t.best_mode,
        )
        self.validation: tuple[int, dict[str, float]] | None = None  # the last one's step and metrics
        self.memory_history: MemoryHistory | None = None  # fit's: [trainer] memory_snapshot_*

    # ------------------------------------------------------------------ set-up

    def setup(self) -> None:
        """Build the training roles (roles.py), restore the checkpoint into them, and start the scheduler."""
        checkpoint = self.checkpoint or (self.checkpointer.latest() if self.resume else None)
        if self.resume and checkpoint is None:
            logger.warning("--resume: no checkpoint in {}; starting from the beginning", self.run_dir)
        roles = self.roles = build_roles(self.manifest, "train", run_dir=self.run_dir, checkpoint=checkpoint)
        self.dist, self.device, self.tokenizer, self.sampling = (
            roles.dist,
            roles.device,
            roles.tokenizer,
            roles.sampling,
        )
        self.actor, self.critic, self.reference, self.rollout = (
            roles.actor,
            roles.critic,
            roles.reference,
            roles.rollout,
        )
        self.estimator, self.policy_loss, self.objective = roles.estimator, roles.policy_loss, roles.objective
        self.scorer, self.shapers, self.filters, self.sinks = (
            roles.scorer,
            list(roles.shapers),
            list(roles.filters),
            list(roles.sinks),
        )
        self.train_set, self.val_set, self.total_steps = roles.train_set, roles.val_set, roles.total_steps
        self._peak_tflops = (
            peak_tflops(torch.cuda.get_device_name(self.device)) if self.device.startswith("cuda") else None
        )
        selected = self.manifest.component("rollout.engine")
        self._memory_knobs = {"gen": generation_knobs(selected.component.name, selected.component.options)}
        try:
            self.cursor = self._cursor()
            if checkpoint is not None:
                with self._stored_weights():
                    self.checkpointer.restore(
                        checkpoint,
                        optimizers=self.optimizers,
                        schedulers=self.schedulers,
                        modules=self.modules,
                        dist=self.dist,
                    )
                self.step = roles.start_step
                self.cursor.load(roles.checkpoint_state["data"])
                logger.info("resumed from {} (step {})", checkpoint, self.step)
            self.scheduler = self._scheduler(self._in_flight(checkpoint))
        except BaseException:
            self.close(raise_errors=False)
            raise

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
                logger.warning(
                    "checkpoint {} holds no in-flight batches (written by an older rlcore): the background "
                    "rollouts restart their lag from the restored weights, so the next {} step(s) differ "
                    "from an uninterrupted run's",
                    checkpoint,
                    staleness,
                )
            return None
        if saved["max_staleness"] != staleness:
            logger.warning(
                "checkpoint {} was written at max_staleness = {} and this run has {}: its {} in-flight "
                "batch(es) are dropped and regenerated from the restored weights (not an exact resume)",
                checkpoint,
                saved["max_staleness"],
                staleness,
                len(saved["batches"]),
            )
            return None
        return saved["batches"]

    def _scheduler(self, in_flight: list | None = None):
        """Rollout and training take turns, or rollouts run in the background ([rollout] max_staleness)."""
        staleness = self.cfg.rollout.max_staleness
        filling = Filling(
            shapers=self.shapers,
            filters=self.filters,
            score_chunks=self.cfg.rollout.score_chunks,
            groups=self.cfg.data.prompts_per_step // self.dist.world,
        )
        inputs = StepInputs(
            self.train_set.prompts,
            self.cfg.data.gen_batch_size or self.cfg.data.prompts_per_step,
            self.sampling,
            self.dist.shard,
        )
        maker = BatchMaker(self.scorer, self.tokenizer, inputs, filling)
        if staleness is None:
            # an engine holding its own weights still has the initial ones
            if self.step and not self.engine.shares_actor:
                self.rollout.sync_weights(self.actor.weights_to_sync())
            return InTurn(self.rollout, maker, self.actor.weights_to_sync, self.cursor)
        logger.info(
            "rollouts in the background, at most {} step(s) behind the trainer; rollout_correction = {}",
            staleness,
            self.cfg.algorithm.rollout_correction,
        )
        return Background(
            self.rollout,
            maker,
            self.actor.weights_to_sync,
            self.step,
            self.cursor,
            max_staleness=staleness,
            in_flight=in_flight,
        )

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

    def _cursor(self) -> DataCursor | MixedCursor:
        """Where the training prompts come from: one shuffled order, or per-source orders mixed in
        the proportions of ``[data] source_weights``."""
        d = self.cfg.data
        if not d.source_weights:
            return DataCursor(len(self.train_set.prompts), seed=self.cfg.run.seed, shuffle=d.shuffle)
        members: dict[str, list[int]] = defaultdict(list)
        for i, prompt in enumerate(self.train_set.prompts):
            members[prompt.data_source].append(i)
        startup_checks.source_weights_cover(self.manifest, sorted(members), self.train_set.source)
        counts = shares(d.prompts_per_step, {k: v for k, v in d.source_weights.items() if v > 0})
        logger.info(
            "prompts a step by data source: {}", ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        )
        return MixedCursor(dict(members), dict(d.source_weights), seed=self.cfg.run.seed, shuffle=d.shuffle)

    # ------------------------------------------------------------------ the loop

    def fit(self) -> None:
        finished = False
        try:
            t = self.cfg.trainer
            self.memory_history = MemoryHistory(
                t.memory_snapshot_steps,
                t.memory_snapshot_on_oom,
                self.run_dir,
                cuda=self.device.startswith("cuda"),
                rank=self.dist.rank,
            )
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
        closers = [self.scheduler.close] if hasattr(self, "scheduler") else []
        closers += self.roles.closers() if hasattr(self, "roles") else []
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
        t, steps = self.cfg.trainer, self.total_steps
        if self.step and self.step >= steps:
            logger.info(
                "the run is already complete: its checkpoint is at step {} of trainer.steps = {}, so there is "
                "nothing to train; to train on, raise the steps (--set trainer.steps={})",
                self.step,
                steps,
                self.step + max(1, t.save_every or 1),
            )
        if self.step == 0 and t.eval_before_train and self.val_set is not None:
            self._log(self.evaluate(), self.step)
        while self.step < steps:
            with (
                self.memory_history.step(self.step + 1),
                profiled(self.step + 1, t.profile_steps, self.run_dir),
            ):
                metrics = self.train_step()
            self.step += 1
            self._log(metrics, self.step)
            signum = stop.agreed(self.dist)
            if signum:  # SIGTERM or SIGUSR1: keep what this step learnt, then stop (stopping.py)
                raise Stopped(signum, self.save())
            last = self.step == steps
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
        """One step: the stages of the pipeline, in order, over one record (step_record.py)."""
        record = StepRecord(self.step, Timer(self.memory_history, knobs=self._memory_knobs))
        with record.timer("step"):
            self.generate(record)  # the scheduler's batch: generated, scored, shaped, filtered
            self.assemble(record)  # its tensors; padded and loss-masked groups out of the loss
            self.prepare(record)  # old and reference log-probs, values
            self.estimate(record)  # advantages and returns
            self.update(record)  # the actor's (and critic's) optimizer steps
            self.sync(record)  # the engine's weights; the data position advances
        return self.report(record)

    # ------------------------------------------------------------------ the stages of a step

    def generate(self, record: StepRecord) -> None:
        """The scheduler's scored batch for this step: it decides when it was generated (in turn,
        or ahead in the background); filling.py decides how (rounds, shapers, filters)."""
        record.scored = self.scheduler.next_batch(record.step, record.timer)
        record.metrics.update(record.scored.metrics)
        staleness = record.scored.staleness()
        record.metrics["rollout/staleness/mean"] = sum(staleness) / max(len(staleness), 1)
        record.metrics["rollout/staleness/max"] = float(max(staleness, default=0))

    def assemble(self, record: StepRecord) -> None:
        """The batch's tensors. Groups that only pad a step short of selected ones, and those a
        filter's ``loss_mask`` leaves out, stay in the batch but out of the loss and its divisor."""
        scored = record.scored
        # Group ids unique across ranks, however many groups each kept (dynamic sampling).
        per_rank = self.cfg.data.prompts_per_step // self.dist.world
        batch = build_batch(
            scored.trajectories, scored.scores, scored.params.n, group_offset=self.dist.rank * per_rank
        )
        padding = getattr(scored, "padding", [])  # (a batch in flight saved before it had the field: none)
        if padding:
            batch.response_mask[torch.tensor(padding, dtype=torch.bool)] = 0
        for loss_mask in (f for f in self.filters if hasattr(f, "loss_mask")):
            keep, mask_metrics = loss_mask.loss_mask(scored.trajectories)
            batch.response_mask[torch.tensor([not k for k in keep], dtype=torch.bool)] = 0
            record.metrics.update(mask_metrics)
        record.batch = batch

    def prepare(self, record: StepRecord) -> None:
        """What the update and the estimator read beside the batch: old log-probs (when several
        optimizer steps need them fixed before the first), reference log-probs, values."""
        algo, batch, timer, temperature = (
            self.cfg.algorithm,
            record.batch,
            record.timer,
            record.params.temperature,
        )
        self.actor.module.train()
        # With one optimizer step per batch, the update's own forward pass runs on the current
        # weights, the PPO ratio's "old" policy: its detached log-probs are the old ones, at no
        # extra cost, and the rollout correction weighs them against the generating weights'
        # (rollout_logprobs), for a stale batch as for a fresh one. Several optimizer steps per
        # batch need the old log-probs fixed before the first.
        record.recomputed_old = algo.ppo_epochs > 1 or algo.mini_batches > 1
        if record.recomputed_old:
            with timer("old_log_prob"):
                batch.tensors["old_logprobs"] = self.actor.logprobs(batch, temperature)
            record.metrics.update(
                mismatch_metrics(
                    mismatch_sums(batch.tensors["old_logprobs"], batch.rollout_logprobs, batch.response_mask)
                )
            )
        if self.reference is not None:
            with timer("ref"), self.reference.policy() as ref:
                model = None if ref is self.actor.module else ref
                batch.tensors["ref_logprobs"] = self.actor.logprobs(batch, temperature, model=model)
        if self.critic is not None:
            with timer("values"):
                batch.tensors["values"] = self.critic.values(batch)

    def estimate(self, record: StepRecord) -> None:
        with record.timer("adv"):
            self._advantages(record.batch, record.metrics)

    def update(self, record: StepRecord) -> None:
        with record.timer("update_actor"):
            record.metrics.update(
                self.update_actor(record.batch, record.params.temperature, has_old=record.recomputed_old)
            )
        if self.critic is not None:
            with record.timer("update_critic"):
                record.metrics.update(self.critic.update(record.batch))

    def sync(self, record: StepRecord) -> None:
        """The scheduler gets the new weights to the engine; the trainer's data position moves
        past the prompts it trained (the position its checkpoints keep)."""
        self.scheduler.sync_weights(record.timer)
        fault_point("update")
        self.cursor.load(record.cursor)

    def report(self, record: StepRecord) -> dict[str, Any]:
        """The step's metrics (every rank's, merged), times and throughput among them."""
        algo, metrics, timer, batch = self.cfg.algorithm, record.metrics, record.timer, record.batch
        metrics.update(timer.times)
        metrics.update(timer.memory)
        if "timing_s/wait_rollout" in metrics:
            metrics["async/trainer_wait_fraction"] = metrics["timing_s/wait_rollout"] / max(
                metrics["timing_s/step"], 1e-9
            )
        metrics.update(self._batch_metrics(batch, record.trajectories))
        tokens = sum(batch.sequence_lengths())
        metrics["perf/total_num_tokens"] = tokens
        # verl's perf/throughput is per GPU: this rank's tokens per second (ranks average it).
        metrics["perf/throughput"] = metrics["perf/throughput_total"] = tokens / max(
            timer.times["timing_s/step"], 1e-9
        )
        utilisation = mfu(
            self.actor.parameter_count,
            tokens * algo.ppo_epochs,
            timer.times["timing_s/update_actor"],
            self._peak_tflops,
        )
        if utilisation is not None:
            metrics["perf/mfu/actor"] = utilisation
        metrics["training/epoch"] = self.cursor.epoch
        metrics["actor/lr"] = self.actor.scheduler.get_last_lr()[0]
        return merge_metrics(self.dist.gather(metrics)) if self.dist.enabled else metrics

    # ------------------------------------------------------------------ pieces of a step

    def update_actor(self, batch: RolloutBatch, temperature: float, has_old: bool) -> dict[str, float]:
        return self.actor.update(
            batch,
            temperature,
            has_old,
            self.policy_loss,
            self.objective,
            norm_length=self.cfg.algorithm.loss_norm_length or self.cfg.data.max_response_tokens,
        )

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
            f: (
                None
                if parts[0][f] is None
                else torch.cat([p[f] if p[f].dim() == 1 else pad(p[f]) for p in parts])
            )
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
        out["response_length/clip_ratio"] = float(
            sum(t.finish_reason == "length" for t in trajectories)
        ) / max(len(trajectories), 1)
        out.update(
            _stats("prompt_length", torch.tensor([len(p) for p in batch.prompt_ids], dtype=torch.float32))
        )
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
        return validate(
            self.roles,
            self.val_set.prompts,
            self.step,
            quiet=self.scheduler.quiet,
            sinks=self.sinks,
            log_generations=self.cfg.trainer.log_val_generations,
        )

    @progress.during("saving a checkpoint", within_step=False)
    def save(self) -> Path:
        # Batches in flight were (or will be) made by weights older than these: saved as they are.
        in_flight = self.scheduler.in_flight() if isinstance(self.scheduler, Background) else []
        objects = (
            {IN_FLIGHT: {"max_staleness": self.cfg.rollout.max_staleness, "batches": in_flight}}
            if in_flight
            else None
        )
        with self._stored_weights():
            return self.checkpointer.save(
                self.step,
                actor=self.actor.module,
                tokenizer=self.tokenizer,
                optimizers=self.optimizers,
                schedulers=self.schedulers,
                modules=self.modules,
                state={
                    "data": self.cursor.state(),
                    "world_size": self.dist.world,
                    "fsdp": self.dist.sharded,
                    # this step's validation, for [trainer] keep_best
                    **(
                        {"validation": self.validation[1]}
                        if self.validation and self.validation[0] == self.step
                        else {}
                    ),
                },
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
