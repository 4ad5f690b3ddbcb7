"""What a step generates from: its prompts (this rank's share of the next ones a data cursor
gives) and its sampling parameters. The batch maker holds one of these instead of calling back
into the trainer, so it can fill a batch in any thread, for any step, with nothing but its inputs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rlcore.interfaces import Prompt, SamplingParams
from rlcore.manifest.schema import RolloutTable
from rlcore.trainer.data_cursor import DataCursor, MixedCursor


@dataclass(frozen=True)
class Sampling:
    """The sampling parameters of training rounds and of validation, step by step.

    ``eos_ids``: the tokens that end a response (the tokenizer's and the model's generation
    config's, :func:`eos_ids`). ``rank``: this rank, for a seed of its own."""

    rollout: RolloutTable
    max_new_tokens: int
    eos_ids: tuple[int, ...]
    seed: int
    rank: int = 0

    def __call__(self, *, train: bool, step: int = 0) -> SamplingParams:
        r = self.rollout
        return SamplingParams(
            n=r.samples_per_prompt if train else r.val_samples_per_prompt,
            temperature=r.temperature if train else r.val_temperature,
            top_p=r.top_p if train else 1.0,
            top_k=r.top_k if train else -1,
            max_new_tokens=self.max_new_tokens,
            stop_token_ids=list(self.eos_ids),
            stop=list(r.stop),
            # A seed per step (and rank) keeps a resumed run on the same samples as an uninterrupted one.
            seed=(self.seed * 1_000_003 + step * 2 + (0 if train else 1) + 7919 * self.rank) % (2**31),
        )


@dataclass(frozen=True)
class StepInputs:
    """A training round's inputs: ``per_round`` prompts from the cursor (``[data] gen_batch_size``,
    else ``prompts_per_step``), of which ``shard`` keeps this rank's, and the step's sampling.
    Called as ``inputs(step, cursor)``; the cursor advances past the round's prompts."""

    prompts: Sequence[Prompt]
    per_round: int
    sampling: Sampling
    shard: Callable[[Sequence[Any]], list[Any]] = list

    def __call__(self, step: int, cursor: DataCursor | MixedCursor) -> tuple[list[Prompt], SamplingParams]:
        indices = cursor.take(self.per_round)
        local = self.shard(list(range(len(indices))))
        return [self.prompts[indices[i]] for i in local], self.sampling(train=True, step=step)


def eos_ids(tokenizer: Any, model: Any) -> tuple[int, ...]:
    """The token ids that end a response: the tokenizer's end-of-sequence token and every one the
    model's generation config names."""
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen = getattr(model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    elif isinstance(eos, (list, tuple)):
        ids.update(int(e) for e in eos)
    return tuple(sorted(ids))
