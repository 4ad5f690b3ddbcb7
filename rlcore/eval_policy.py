"""The policy an outside evaluation harness scores: the run's engine and actor, on token ids.

``rlcore eval --harness NAME`` builds the run's eval roles around the chosen checkpoint or export
(as ``rlcore eval`` does for its own sets), wraps them in :class:`TrainerPolicy` and hands that to
the harness. Sampling goes through the run's rollout engine, so a harness sees what training and
validation sample; log-likelihoods come from the actor's forward pass, the same numbers the
trainer's losses use. Imports torch: load only when a harness runs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch

from rlcore.interfaces import SamplingParams


class TrainerPolicy:
    """:class:`rlcore.interfaces.EvalPolicy` over built roles (:func:`rlcore.trainer.roles.build_roles`:
    their tokenizer, actor, device and rollout engine). ``quiet()``: held while the engine samples
    (a trainer's scheduler's, which pauses background rollouts)."""

    def __init__(
        self, roles: Any, batch_tokens: int = 8192, quiet: Callable[[], Any] = contextlib.nullcontext
    ) -> None:
        self.roles, self.quiet = roles, quiet
        self.tokenizer = roles.tokenizer
        config = getattr(roles.actor.module, "config", None)
        self.max_length = int(getattr(config, "max_position_embeddings", 0) or 2048)
        self.batch_tokens = batch_tokens

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[list[int]]:
        if not prompts:
            return []
        if params.n != 1:
            params = params.model_copy(update={"n": 1})
        engine = self.roles.rollout.engine
        with self.quiet():
            engine.wake_up()
            try:
                completions = engine.generate([list(p) for p in prompts], params)
            finally:
                engine.sleep()
        return [list(samples[0].token_ids) for samples in completions]

    @torch.no_grad()
    def loglikelihood(
        self, requests: Sequence[tuple[Sequence[int], Sequence[int]]]
    ) -> list[tuple[float, bool]]:
        module = self.roles.actor.module
        device = self.roles.device
        was_training = module.training
        module.eval()
        out: list[tuple[float, bool] | None] = [None] * len(requests)
        # Longest first, in batches of about batch_tokens padded tokens.
        order = sorted(range(len(requests)), key=lambda i: -(len(requests[i][0]) + len(requests[i][1])))
        try:
            start = 0
            while start < len(order):
                longest = len(requests[order[start]][0]) + len(requests[order[start]][1])
                size = max(1, self.batch_tokens // max(longest, 1))
                chunk = order[start : start + size]
                start += size
                for index, value in zip(chunk, self._score([requests[i] for i in chunk], device, module)):
                    out[index] = value
        finally:
            module.train(was_training)
        return out  # type: ignore[return-value]

    def _score(
        self, batch: list[tuple[Sequence[int], Sequence[int]]], device: str, module: Any
    ) -> list[tuple[float, bool]]:
        rows = []
        for context, continuation in batch:
            if not continuation:
                raise ValueError("a log-likelihood request needs a non-empty continuation")
            ids = (list(context) + list(continuation))[-(self.max_length + 1) :]
            rows.append((ids[:-1], len(continuation)))  # the last token is only ever a target
        width = max(len(ids) for ids, _ in rows)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
        attention = torch.zeros((len(rows), width), dtype=torch.long)
        for r, (ids, _) in enumerate(rows):
            input_ids[r, : len(ids)] = torch.tensor(ids)
            attention[r, : len(ids)] = 1
        logits = module(input_ids=input_ids.to(device), attention_mask=attention.to(device)).logits.float()
        results = []
        for r, ((_context, continuation), (ids, n)) in enumerate(zip(batch, rows)):
            end = len(ids)
            logp = torch.log_softmax(logits[r, end - n : end], dim=-1)
            target = torch.tensor(list(continuation)[-n:], device=logp.device)
            total = logp.gather(1, target[:, None]).sum().item()
            greedy = bool((logp.argmax(-1) == target).all().item())
            results.append((float(total), greedy))
        return results
