"""The RL loop on one process: rollout, reward, advantages, policy (and critic) update, weight sync.

Every swappable part comes from the manifest through the registry; this module only wires them
together in the order of one step (see docs/architecture.md).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterator

import torch
from loguru import logger

from rlcore.errors import RlcoreError, UsageError
from rlcore.interfaces import (
    AdvantageInput,
    BuildContext,
    PolicyLossInput,
    Prompt,
    RewardInput,
    SamplingParams,
    Trajectory,
)
from rlcore.algorithms.importance import correction_weights, merge_mismatch, mismatch_metrics, mismatch_sums, tis_weights
from rlcore.manifest.loader import ResolvedManifest
from rlcore.trainer import compiling, models, precision
from rlcore.trainer.batch import MicroBatch, RolloutBatch, build_batch, mask_totals, pack, token_weights
from rlcore.trainer.checkpoint import Checkpointer, load_actor_weights
from rlcore.trainer.data_cursor import DataCursor
from rlcore.trainer.distributed import Distributed, clip_grad_norm, combine_metrics, fsdp_wrap, unsharded
from rlcore.trainer.logprobs import TokenLogprobs, token_logprobs


class Timer:
    def __init__(self) -> None:
        self.times: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.times[f"timing_s/{name}"] = self.times.get(f"timing_s/{name}", 0.0) + time.perf_counter() - start


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    if values.numel() == 0:
        return {}
    values = values.float()
    return {f"{prefix}/mean": values.mean().item(), f"{prefix}/max": values.max().item(), f"{prefix}/min": values.min().item()}


def _masked_stats(prefix: str, values: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    return _stats(prefix, values[mask.bool()])


class RLTrainer:
    def __init__(self, manifest: ResolvedManifest, run_dir: str | Path, resume: bool = False):
        self.manifest = manifest
        self.cfg = manifest.core
        self.run_dir = Path(run_dir)
        self.resume = resume
        self.step = 0
        self.checkpointer = Checkpointer(self.run_dir, keep=self.cfg.trainer.keep_checkpoints)
        self.critic = None

    # ------------------------------------------------------------------ set-up

    def setup(self) -> None:
        cfg = self.cfg
        self.device = cfg.run.device if cfg.run.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise RlcoreError("[run] device = \"cuda\" but no CUDA device is available")
        self.dist = Distributed.from_env(self.device)
        if self.device == "cuda":
            self.device = f"cuda:{self.dist.local_rank}"
        if cfg.data.prompts_per_step % (self.dist.world * cfg.algorithm.mini_batches):
            raise RlcoreError(
                f"data.prompts_per_step = {cfg.data.prompts_per_step} must be divisible by the number of ranks "
                f"({self.dist.world}) times algorithm.mini_batches ({cfg.algorithm.mini_batches})"
            )
        if cfg.run.threads:
            torch.set_num_threads(cfg.run.threads)
        if cfg.run.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
        torch.manual_seed(cfg.run.seed)

        checkpoint = self.checkpointer.latest() if self.resume else None
        if self.resume and checkpoint is None:
            logger.warning("--resume: no checkpoint in {}; starting from the beginning", self.run_dir)

        # Reward workers are forked processes: start them while this process is still small.
        reward = self.manifest.component("reward.function")
        self.reward_fn = reward.component.build(reward.options, BuildContext(manifest=self.manifest.resolved_dict(), run_dir=str(self.run_dir)))
        from rlcore.trainer.reward_runner import RewardRunner

        self.rewards = RewardRunner(self.reward_fn, timeout_s=cfg.reward.timeout_s, workers=cfg.reward.workers)
        self.rewards.start()

        logger.info("loading tokenizer and model from {}", cfg.model.path)
        self.model_cfg = models.materialize_gguf(cfg.model)
        self.precision = precision.resolve(cfg.model, self.device)
        logger.info("precision: {}", self.precision.describe())
        self.tokenizer = models.load_tokenizer(self.model_cfg)
        actor = models.load_causal_lm(self.model_cfg, self.device)
        self.actor = models.prepare_actor(actor, self.model_cfg)
        if checkpoint is not None:
            load_actor_weights(self.actor, checkpoint)
        # Mixed precision: one process keeps float32 masters beside a compute-dtype module; FSDP2
        # keeps float32 shards and gathers them in the compute dtype (precision.py).
        self.masters: dict[str, precision.MasterWeights] = {}
        if self.precision.mixed and not self.dist.enabled:
            self.masters["actor"] = precision.MasterWeights(self.actor, precision.torch_dtype(self.precision.compute))
        compile_wanted = compiling.wanted(self.model_cfg.compile, self.device, self.dist.world)
        compiling.enable_kernels(compile_wanted)
        if compile_wanted:
            layers = compiling.compile_decoder_layers(self.actor)
            logger.info("torch.compile: {} decoder layers and the log-prob head ([model] compile)", layers)
        self.policy = TokenLogprobs(self.actor)
        if self.dist.enabled:
            fsdp_wrap(self.policy, self._dummy_forward, precision.fsdp_policy(self.precision))
        self.trainable = self._trainable("actor", self.actor)
        t = cfg.trainer
        self.optimizers: dict[str, torch.optim.Optimizer] = {"actor": _adamw(self.trainable, t.lr, t)}
        self.schedulers: dict[str, Any] = {"actor": _warmup(self.optimizers["actor"], t.warmup_steps)}
        self.modules: dict[str, torch.nn.Module] = {}

        algo = cfg.algorithm
        self.reference = (
            models.build_reference(self.actor, self.model_cfg, self.device, self.precision.compute) if algo.kl_coef > 0 else None
        )

        context = self._context()
        self.estimator = self._build("algorithm.advantage", context)
        self.policy_loss = self._build("algorithm.policy_loss", context)
        self.critic = None
        if "critic" in self.manifest.component("algorithm.advantage").component.needs:
            self._setup_critic()

        self.tools = {s.role.split(".", 1)[1]: s.component.build(s.options, context) for s in self.manifest.roles("tools")}
        context.extras["tools"] = self.tools
        self.engine = self._build("rollout.engine", context)
        if self.dist.enabled and not getattr(self.engine, "shares_actor", False):
            raise RlcoreError(
                f"rollout engine {self.manifest.component('rollout.engine').component.name!r} does not share the actor's "
                "weights; with several training ranks only an engine that does (the hf engine) is supported yet"
            )
        self.agent = self._build("agent.loop", context)
        self._load_data()

        state: dict[str, Any] = {}
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
            logger.info("resumed from {} (step {})", checkpoint, self.step)
        context.extras["resume_step"] = self.step if checkpoint is not None else None
        context.extras["total_steps"] = t.steps
        self.sinks = [s.component.build(s.options, context) for s in self.manifest.roles("loggers")] if self.dist.is_main else []

    def _context(self) -> BuildContext:
        cfg = self.cfg
        return BuildContext(
            manifest=self.manifest.resolved_dict(),
            run_dir=str(self.run_dir),
            model_path=self.model_cfg.path,
            gguf_file=self.model_cfg.gguf_file,
            dtype=self.precision.compute,
            device=self.device,
            seed=cfg.run.seed,
            tokenizer=self.tokenizer,
            actor=self.actor,
            sampling=self._sampling(train=True),
            extras={"manifest_dir": str(self.manifest.base_dir)},
        )

    def _build(self, role: str, context: BuildContext):
        selected = self.manifest.component(role)
        return selected.component.build(selected.options, context)

    def _trainable(self, role: str, module: torch.nn.Module) -> list[torch.nn.Parameter]:
        """What the optimizer of ``role`` steps: the float32 masters under mixed precision on one
        process, else the module's own trainable parameters."""
        if role in self.masters:
            return self.masters[role].params
        return [p for p in module.parameters() if p.requires_grad]

    def _stored_weights(self):
        """Inside: every module holds its weights as stored (float32 masters under mixed
        precision), for checkpoints and export."""
        stack = contextlib.ExitStack()
        for masters in self.masters.values():
            stack.enter_context(masters.full_precision())
        return stack

    def _optimizer_step(self, role: str) -> None:
        self.optimizers[role].step()
        if role in self.masters:
            self.masters[role].publish()

    def _setup_critic(self) -> None:
        from rlcore.algorithms.value import CriticModel

        cfg, model = self.cfg, self.model_cfg
        self.critic = CriticModel.from_pretrained(
            model.path, gguf_file=model.gguf_file, torch_dtype=precision.torch_dtype(self.precision.storage)
        ).to(self.device)
        if self.precision.mixed and not self.dist.enabled:
            self.masters["critic"] = precision.MasterWeights(self.critic, precision.torch_dtype(self.precision.compute))
        if self.dist.enabled:
            fsdp_wrap(self.critic, self._dummy_forward, precision.fsdp_policy(self.precision))
        if model.gradient_checkpointing:
            self.critic.gradient_checkpointing_enable()
        self.modules["critic"] = self.critic
        self.critic_params = self._trainable("critic", self.critic)
        # torch's AdamW default weight decay (0.01), as the critic has always had.
        self.optimizers["critic"] = _adamw(self.critic_params, cfg.critic.lr, cfg.trainer, weight_decay=0.01)
        self.schedulers["critic"] = _warmup(self.optimizers["critic"], cfg.critic.warmup_steps)

    def _load_data(self) -> None:
        from rlcore.data import load_prompts
        from rlcore.trainer.reward_runner import check_required_fields

        d = self.cfg.data
        common = dict(tokenizer=self.tokenizer, max_prompt_tokens=d.max_prompt_tokens, prompt_key=d.prompt_key, base_dir=self.manifest.base_dir)
        try:
            self.train_set = load_prompts(d.train, **common)
            self.val_set = load_prompts(d.val, limit=d.val_max_prompts, **common) if d.val else None
            required = set(getattr(self.reward_fn, "required_fields", ()) or ())
            for dataset in filter(None, (self.train_set, self.val_set)):
                check_required_fields(dataset.prompts, required, dataset.source)
        except RlcoreError as exc:  # bad input data: a usage error, like a bad manifest
            raise UsageError(str(exc)) from None
        if len(self.train_set.prompts) < d.prompts_per_step:
            logger.warning(
                "data.train has {} usable prompts, fewer than data.prompts_per_step = {}: prompts repeat within a step",
                len(self.train_set.prompts), d.prompts_per_step,
            )
        self.cursor = DataCursor(len(self.train_set.prompts), seed=self.cfg.run.seed, shuffle=d.shuffle)

    def _rank(self) -> int:
        return self.dist.rank if hasattr(self, "dist") else 0

    def _sampling(self, *, train: bool, step: int = 0) -> SamplingParams:
        r = self.cfg.rollout
        eos = _eos_ids(self.tokenizer, self.actor) if hasattr(self, "tokenizer") else []
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
        t = self.cfg.trainer
        try:
            if self.step == 0 and t.eval_before_train and self.val_set is not None:
                self._log(self.evaluate(), self.step)
            while self.step < t.steps:
                metrics = self.train_step()
                self.step += 1
                self._log(metrics, self.step)
                last = self.step == t.steps
                if self.val_set is not None and (last or (t.eval_every and self.step % t.eval_every == 0)):
                    self._log(self.evaluate(), self.step)
                if last or (t.save_every and self.step % t.save_every == 0):
                    self.save()
            if t.export_final:
                self.export(self.run_dir / "export")
        finally:
            for sink in getattr(self, "sinks", []):
                sink.close()
            close = getattr(self.rewards, "close", None)
            if callable(close):
                close()
            self.dist.close()

    def _log(self, metrics: dict[str, float], step: int) -> None:
        for sink in self.sinks:
            sink.log(metrics, step)

    def rollout(self, prompts: list[Prompt], params: SamplingParams) -> list[Trajectory]:
        wake = getattr(self.engine, "wake_up", None)
        if callable(wake):
            wake()
        was_training = self.actor.training
        try:
            with unsharded(self.policy):
                return self.agent.run(prompts, self.engine, params)
        finally:
            self.actor.train(was_training)
            sleep = getattr(self.engine, "sleep", None)
            if callable(sleep):
                sleep()

    def score(self, trajectories: list[Trajectory]) -> tuple[list[float], dict[str, float]]:
        items = [
            RewardInput(
                response=self.tokenizer.decode(t.response_ids, skip_special_tokens=True),
                prompt=self.tokenizer.decode(t.prompt.token_ids, skip_special_tokens=False),
                ground_truth=t.prompt.ground_truth,
                data_source=t.prompt.data_source,
                extra_info=t.prompt.extra_info,
            )
            for t in trajectories
        ]
        result = self.rewards.score(items)
        scores = [s + t.step_reward for s, t in zip(result.scores, trajectories)]
        return scores, dict(result.metrics)

    def train_step(self) -> dict[str, Any]:
        cfg, algo = self.cfg, self.cfg.algorithm
        timer = Timer()
        metrics: dict[str, Any] = {}
        with timer("step"):
            indices = self.cursor.take(cfg.data.prompts_per_step)
            local = self.dist.shard(list(range(len(indices))))
            prompts = [self.train_set.prompts[indices[i]] for i in local]
            params = self._sampling(train=True, step=self.step)
            with timer("gen"):
                trajectories = self.rollout(prompts, params)
            with timer("reward"):
                scores, reward_metrics = self.score(trajectories)
            metrics.update(reward_metrics)
            batch = build_batch(trajectories, scores, params.n, group_offset=self.dist.rank * len(prompts))
            self.actor.train()
            # With one optimizer step per batch, the update's own forward pass runs on the weights
            # that generated the batch: its detached log-probs are the old ones, at no extra cost.
            recompute_old = algo.ppo_epochs > 1 or algo.mini_batches > 1
            if recompute_old:
                with timer("old_log_prob"):
                    batch.tensors["old_logprobs"] = self._logprobs(self.policy, batch, params.temperature)
                metrics.update(mismatch_metrics(mismatch_sums(batch.tensors["old_logprobs"], batch.rollout_logprobs, batch.response_mask)))
            if self.reference is not None:
                with timer("ref"), self.reference.policy() as ref:
                    batch.tensors["ref_logprobs"] = self._logprobs(self.policy if ref is self.actor else ref, batch, params.temperature)
            if self.critic is not None:
                with timer("values"):
                    batch.tensors["values"] = self._values(batch)
            with timer("adv"):
                self._advantages(batch, metrics)
            with timer("update_actor"):
                metrics.update(self._update_actor(batch, params.temperature, has_old=recompute_old))
            if self.critic is not None:
                with timer("update_critic"):
                    metrics.update(self._update_critic(batch))
            with timer("update_weights"):
                self.engine.update_weights(self._weights_for_engine())
        metrics.update(timer.times)
        metrics.update(self._batch_metrics(batch, trajectories))
        tokens = sum(batch.sequence_lengths())
        metrics["perf/total_num_tokens"] = tokens
        metrics["perf/throughput"] = tokens / max(timer.times["timing_s/step"], 1e-9)
        metrics["training/epoch"] = self.cursor.epoch
        metrics["actor/lr"] = self.schedulers["actor"].get_last_lr()[0]
        return combine_metrics(self.dist.gather(metrics)) if self.dist.enabled else metrics

    # ------------------------------------------------------------------ pieces of a step

    def _micro_batches(self, batch: RolloutBatch, rows=None) -> list[MicroBatch | None]:
        """Packed micro-batches of ``rows``; with several ranks, padded with ``None`` (a dummy
        forward) to the largest count, since every sharded forward is a collective."""
        rows = range(batch.size) if rows is None else rows
        micro: list[MicroBatch | None] = list(pack(batch, list(rows), self.cfg.trainer.micro_batch_tokens, self.device))
        return micro + [None] * (self.dist.max(len(micro)) - len(micro))

    def _dummy_forward(self, model) -> torch.Tensor:
        """A forward whose loss is 0 but reaches every parameter (keeps ranks in step)."""
        ids = torch.zeros(1, 2, dtype=torch.long, device=self.device)
        if model is self.critic:
            return model(input_ids=ids).float().sum() * 0.0
        one = torch.zeros(1, dtype=torch.long, device=self.device)
        model = model if isinstance(model, TokenLogprobs) else TokenLogprobs(model)
        lp, _ = model(ids, torch.arange(2, device=self.device).unsqueeze(0), one, one)
        return lp.sum() * 0.0

    @torch.no_grad()
    def _logprobs(self, model, batch: RolloutBatch, temperature: float) -> torch.Tensor:
        out = torch.zeros(batch.size, batch.width)
        for micro in self._micro_batches(batch):
            if micro is None:
                self._dummy_forward(model)
                continue
            lp, _ = token_logprobs(model, micro, _train_temperature(temperature))
            out[micro.rows] = micro.scatter(lp.float(), batch.width).cpu()
        return out * batch.response_mask

    @torch.no_grad()
    def _values(self, batch: RolloutBatch) -> torch.Tensor:
        out = torch.zeros(batch.size, batch.width)
        for micro in self._micro_batches(batch):
            if micro is None:
                self._dummy_forward(self.critic)
                continue
            values = self.critic(input_ids=micro.input_ids, position_ids=micro.position_ids)[0][micro.select]
            out[micro.rows] = micro.scatter(values.float(), batch.width).cpu()
        return out * batch.response_mask

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

    def _mini_batches(self, batch: RolloutBatch) -> list[list[int]]:
        """Split rows into mini-batches along prompt groups, so a group stays together."""
        count = self.cfg.algorithm.mini_batches
        groups = defaultdict(list)
        for row, g in enumerate(batch.group_ids.tolist()):
            groups[g].append(row)
        ordered = [groups[g] for g in sorted(groups)]
        per = math.ceil(len(ordered) / count)
        return [sum(ordered[i : i + per], []) for i in range(0, len(ordered), per)]

    def _update_actor(self, batch: RolloutBatch, temperature: float, has_old: bool) -> dict[str, float]:
        algo, t = self.cfg.algorithm, self.cfg.trainer
        optimizer = self.optimizers["actor"]
        sums: dict[str, list[float]] = defaultdict(list)
        temperature = _train_temperature(temperature)
        need_entropy = True  # reported as actor/entropy even when it is not in the loss
        gap = None  # the rollout/trainer log-prob gap, measured on this pass when old log-probs were not recomputed
        for _ in range(algo.ppo_epochs):
            for rows in self._mini_batches(batch):
                optimizer.zero_grad(set_to_none=True)
                mask_rows = batch.response_mask[rows]
                tokens, sequences = mask_totals(mask_rows)
                totals = (self.dist.sum(tokens), self.dist.sum(sequences))
                weights_all = token_weights(mask_rows, algo.loss_agg_mode, totals)
                row_pos = {r: i for i, r in enumerate(rows)}
                # Metrics stay on the device until the mini-batch ends: a read-back per micro-batch
                # would stall the GPU between its forward and backward passes.
                acc: dict[str, Any] = defaultdict(float)
                for micro in self._micro_batches(batch, rows):
                    if micro is None:
                        self._dummy_forward(self.policy).backward()
                        continue
                    lp, ent = token_logprobs(self.policy, micro, temperature, with_entropy=need_entropy,
                                             entropy_grad=algo.entropy_coef > 0)
                    logprobs = micro.scatter(lp, batch.width)
                    entropy = micro.scatter(ent, batch.width)
                    dev = logprobs.device
                    sel = micro.rows
                    mask = batch.response_mask[sel].to(dev)
                    weights = weights_all[[row_pos[r] for r in sel]].to(dev)
                    old = batch.tensors["old_logprobs"][sel].to(dev) if has_old else logprobs.detach()
                    rollout_lp = batch.rollout_logprobs[sel].to(dev)
                    pg, pg_metrics = self.policy_loss(
                        PolicyLossInput(
                            logprobs=logprobs,
                            old_logprobs=old,
                            advantages=batch.tensors["advantages"][sel].to(dev),
                            response_mask=mask,
                            rollout_logprobs=rollout_lp,
                        )
                    )
                    share = weights.sum()  # this micro-batch's share of the mini-batch
                    if not has_old:
                        gap = merge_mismatch(gap, mismatch_sums(old, rollout_lp, mask))
                    if algo.tis_cap is not None:
                        pg = pg * tis_weights(old, rollout_lp, algo.tis_cap, mask)
                    elif algo.rollout_correction != "none":
                        lower = algo.rollout_is_threshold_lower or 1.0 / algo.rollout_is_threshold
                        correction, correction_stats = correction_weights(
                            old, rollout_lp, mask, algo.rollout_correction, algo.rollout_is_threshold, lower
                        )
                        pg = pg * correction
                        for key, value in correction_stats.items():
                            acc[key] += value * share
                    loss = (pg * weights).sum()
                    acc["actor/pg_loss"] += loss.detach()
                    if algo.entropy_coef > 0:
                        loss = loss - algo.entropy_coef * (entropy * weights).sum()
                    if self.reference is not None and not algo.kl_in_reward:
                        from rlcore.algorithms.kl import kl_penalty

                        ref = batch.tensors["ref_logprobs"][sel].to(dev)
                        kl_loss = (kl_penalty(logprobs, ref, algo.kl_estimator) * weights).sum()
                        loss = loss + algo.kl_coef * kl_loss
                        acc["actor/kl_loss"] += kl_loss.detach()
                    # FSDP averages gradients over ranks; the weights already normalise globally.
                    (loss * self.dist.world).backward()
                    acc["actor/entropy"] += (entropy.detach() * weights).sum()
                    for key, value in pg_metrics.items():
                        acc[f"actor/{key}"] += (value.detach() if torch.is_tensor(value) else value) * share
                # Each rank holds its share of every sum; add them up.
                acc = {k: self.dist.sum(float(v)) for k, v in sorted(acc.items())}
                grad_norm = clip_grad_norm(self.trainable, t.grad_clip, self.dist)
                if math.isfinite(grad_norm):
                    self._optimizer_step("actor")
                else:
                    logger.warning("step {}: non-finite gradient norm; the update is skipped", self.step + 1)
                    sums["actor/skipped_updates"].append(1.0)
                acc["actor/grad_norm"] = grad_norm
                for key, value in acc.items():
                    sums[key].append(value)
        self.schedulers["actor"].step()
        out = {k: sum(v) / len(v) for k, v in sums.items()}
        if gap is not None:
            out.update(mismatch_metrics(gap))
        return out

    def _update_critic(self, batch: RolloutBatch) -> dict[str, float]:
        from rlcore.algorithms.value import clipped_value_loss

        c, algo = self.cfg.critic, self.cfg.algorithm
        optimizer = self.optimizers["critic"]
        sums: dict[str, list[float]] = defaultdict(list)
        for _ in range(algo.ppo_epochs):
            for rows in self._mini_batches(batch):
                optimizer.zero_grad(set_to_none=True)
                total = 0.0
                clip_fracs = []
                tokens = max(self.dist.sum(float(batch.response_mask[rows].sum())), 1.0)
                for micro in self._micro_batches(batch, rows):
                    if micro is None:
                        self._dummy_forward(self.critic).backward()
                        continue
                    values = self.critic(input_ids=micro.input_ids, position_ids=micro.position_ids)[0][micro.select]
                    sel = micro.rows
                    values = micro.scatter(values.float(), batch.width)
                    dev = values.device
                    mask = batch.response_mask[sel].to(dev)
                    loss, vm = clipped_value_loss(
                        values, batch.tensors["values"][sel].to(dev), batch.tensors["returns"][sel].to(dev),
                        mask, c.value_clip, "token-mean",
                    )
                    share = float(mask.sum()) / tokens
                    (loss * share * c.value_coef * self.dist.world).backward()
                    total += float(loss.detach()) * share
                    clip_fracs.append(float(vm.get("critic/vf_clipfrac", 0.0)) * share)
                grad_norm = clip_grad_norm(self.critic_params, self.cfg.trainer.grad_clip, self.dist)
                if math.isfinite(grad_norm):
                    self._optimizer_step("critic")
                sums["critic/vf_loss"].append(self.dist.sum(total))
                sums["critic/vf_clipfrac"].append(self.dist.sum(sum(clip_fracs)))
                sums["critic/grad_norm"].append(grad_norm)
        self.schedulers["critic"].step()
        return {k: sum(v) / len(v) for k, v in sums.items()}

    def _weights_for_engine(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The actor's weights under Hugging Face names (LoRA merged in), produced lazily: an
        engine that shares the actor's parameters never iterates it."""
        from rlcore.trainer.lora import merged_state

        yield from merged_state(self.actor)

    def _batch_metrics(self, batch: RolloutBatch, trajectories: list[Trajectory]) -> dict[str, float]:
        mask = batch.response_mask
        lengths = mask.sum(1)
        all_lengths = torch.tensor([len(r) for r in batch.response_ids], dtype=torch.float32)
        out: dict[str, float] = {}
        out.update(_stats("critic/score", batch.scores))
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
            out["agent/num_turns/mean"] = sum(t.num_turns for t in trajectories) / len(trajectories)
            out["agent/tool_calls/mean"] = sum(t.tool_calls for t in trajectories) / len(trajectories)
            out["agent/tool_errors/sum"] = float(sum(t.tool_errors for t in trajectories))
        extra: dict[str, list[float]] = defaultdict(list)
        for t in trajectories:
            for k, v in t.metrics.items():
                extra[k].append(float(v))
        out.update({k: sum(v) / len(v) for k, v in extra.items()})
        return out

    # ------------------------------------------------------------------ validation, saving

    def evaluate(self) -> dict[str, float]:
        assert self.val_set is not None
        params = self._sampling(train=False, step=self.step)
        start = time.perf_counter()
        trajectories = self.rollout(self.dist.shard(self.val_set.prompts), params)
        scores, _ = self.score(trajectories)
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

    def save(self) -> Path:
        with self._stored_weights():
            return self.checkpointer.save(
                self.step,
                actor=self.actor,
                tokenizer=self.tokenizer,
                optimizers=self.optimizers,
                schedulers=self.schedulers,
                modules=self.modules,
                state={"data": self.cursor.state(), "world_size": self.dist.world},
                dist=self.dist,
            )

    def export(self, target: Path) -> Path:
        """Write the trained model as a plain Hugging Face directory (LoRA merged)."""
        from rlcore.trainer.export import export_model

        with self._stored_weights():
            return export_model(self.actor, self.tokenizer, target)


def _train_temperature(temperature: float) -> float:
    return temperature if temperature > 0 else 1.0


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


def _adamw(params: list[torch.nn.Parameter], lr: float, t, weight_decay: float | None = None) -> torch.optim.AdamW:
    """AdamW, fused into one kernel per step when every parameter is on a CUDA device."""
    fused = bool(params) and all(p.is_cuda for p in params)
    return torch.optim.AdamW(params, lr=lr, betas=t.betas, weight_decay=t.weight_decay if weight_decay is None else weight_decay,
                             fused=fused or None)


def _warmup(optimizer, steps: int):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / (steps + 1)) if steps else 1.0)
