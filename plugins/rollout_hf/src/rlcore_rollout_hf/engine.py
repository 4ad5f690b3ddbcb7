"""The ``hf`` rollout engine: batched, KV-cached sampling from any transformers causal LM.

Why a hand-written decode loop rather than ``model.generate``: an RL rollout needs things
``generate`` does not give together -- each prompt prefilled once and its KV cache shared by its
n samples (``generate`` repeats the prompt n times before prefill), finished samples dropped from
the batch (``generate`` keeps decoding them as padding), the sampling log-probability of every
token under the temperature-scaled distribution before truncation, and a per-call
``torch.Generator`` instead of the global RNG. The model's own forward pass, its cache classes
(``DynamicCache``: ``batch_select_indices`` copies a prompt's cache to its samples and drops
finished rows) and its attention-mask logic are reused as they are.

That loop is the plain path. For Llama-family models the fast path (``fast_path.py``) replaces
it: its own slot KV cache, continuous batching and CUDA-graphed decode steps, built from the same
model's submodules; ``fast_path = "auto"`` takes it on CUDA.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import inspect
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch

from rlcore.errors import RlcoreError, UsageError
from rlcore.interfaces import BuildContext, Completion, SamplingParams
from rlcore_rollout_hf.decoder import SlotDecoder, unsupported_reason
from rlcore_rollout_hf.fast_path import FastGenerator
from rlcore_rollout_hf.options import HFEngineOptions
from rlcore_rollout_hf.sampling import sample_next
from rlcore_rollout_hf.stopping import StopChecker, collect_stop_ids
from rlcore_rollout_hf.weights import copy_named_tensors, load_adapter

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def unwrap_module(module: Any) -> Any:
    """Strip wrappers that must not see the decode loop: torch.compile (it would recompile for
    every cache length) and DDP. peft models are kept: their forward applies the adapters."""
    while True:
        if hasattr(module, "_orig_mod"):
            module = module._orig_mod
        elif type(module).__name__ == "DistributedDataParallel":
            module = module.module
        else:
            return module


def module_device(module: Any) -> torch.device:
    for tensor in module.parameters():
        return tensor.device
    return torch.device("cpu")


def same_device(a: torch.device, b: torch.device) -> bool:
    if a.type != b.type:
        return False
    return a.index is None or b.index is None or a.index == b.index


class HFRolloutEngine:
    """A :class:`rlcore.interfaces.RolloutEngine` over one transformers causal LM.

    ``model`` is either the trainer's actor (``shares_actor``: generation sees the actor's
    current parameters, so :meth:`update_weights` has nothing to do) or the engine's own copy
    (``update_weights`` copies tensors in).
    """

    def __init__(
        self,
        model: Any,
        *,
        tokenizer: Any = None,
        options: HFEngineOptions | None = None,
        shares_actor: bool = False,
    ):
        self.options = options or HFEngineOptions()
        self.root = model  # what we toggle eval/train on and restore afterwards
        self.model = unwrap_module(model)
        self.tokenizer = tokenizer
        self.shares_actor = shares_actor
        self.device = module_device(self.model)
        self._asleep = False
        self._offloaded = False
        config = getattr(self.model, "config", None)
        self.max_positions = getattr(config, "max_position_embeddings", None)
        embeddings = self.model.get_input_embeddings()
        self.vocab_size = int(embeddings.num_embeddings)
        # transformers renamed ``past_key_values`` to ``cache`` (5.x); read the causal LM's own signature.
        inner = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
        forward_params = inspect.signature(inner.forward).parameters
        self._cache_arg = "cache" if "cache" in forward_params else "past_key_values"
        self._keeps_logits = "logits_to_keep" in forward_params
        peft_config = getattr(self.model, "active_peft_config", None)
        if peft_config is not None and getattr(peft_config, "is_prompt_learning", False):
            raise UsageError(
                "the hf rollout engine does not support peft prompt-learning adapters (prefix/prompt tuning)"
            )
        self.fast = self._fast_generator()

    def _fast_generator(self) -> FastGenerator | None:
        mode = self.options.fast_path
        if mode == "off" or (mode == "auto" and self.device.type != "cuda"):
            return None
        reason = unsupported_reason(self.model)
        if reason:
            if mode == "on":
                raise UsageError(
                    f'[rollout] fast_path = "on" cannot run this model: {reason}; use "auto" or "off"'
                )
            return None
        try:
            fuse = None if self.options.fuse_projections == "auto" else self.options.fuse_projections
            decoder = SlotDecoder(  # None: the decoder's default, on CUDA
                self.model, attention=self.options.decode_attention, fuse_qkv=fuse, fuse_mlp=fuse
            )
        except (
            ValueError
        ) as error:  # the model itself passed unsupported_reason: the attention kernel cannot run
            raise UsageError(
                f'[rollout] decode_attention = "triton": {error}; use "auto" or "sdpa"'
            ) from error
        return FastGenerator(
            decoder,
            self.device,
            max_rows=self.options.max_batch_size,
            cuda_graphs=self.options.cuda_graphs,
            sync_every=self.options.sync_every,
            compile=self.options.compile is True
            or (self.options.compile == "auto" and self.device.type == "cuda"),
        )

    # ------------------------------------------------------------------ contract

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        max_new_tokens: Sequence[int] | None = None,
    ) -> list[list[Completion]]:
        """Return ``params.n`` completions per prompt, in prompt order (see README for semantics).

        ``max_new_tokens`` (this engine only) caps each prompt's samples separately, below
        ``params.max_new_tokens``: benchmarks use it to end responses at set, varied lengths."""
        if self._asleep:
            raise RlcoreError("the hf rollout engine is asleep; call wake_up() before generate()")
        prompts = self._checked_prompts(prompts, params)
        if not prompts:
            return []
        if params.stop and self.tokenizer is None:
            raise UsageError(
                "stop strings need a tokenizer; build the hf engine with a tokenizer in its BuildContext"
            )
        stop_ids = self._stop_ids(params)
        seed = params.seed if params.seed is not None else int(torch.randint(0, 2**62, ()).item())
        generator = torch.Generator(device=self.device)
        generator.manual_seed(seed)

        caps = self._caps(prompts, params, max_new_tokens)
        rows = [i for i in range(len(prompts)) for _ in range(params.n)]
        out: list[Completion] = []
        with self._generation_mode():
            if self.fast is not None:
                out = self.fast.generate(
                    [prompts[i] for i in rows],
                    rows,
                    [caps[i] for i in rows],
                    params,
                    stop_ids,
                    generator,
                    self.tokenizer,
                    self.options.share_prefill,
                )
            else:
                for start in range(0, len(rows), self.options.max_batch_size):
                    chunk = rows[start : start + self.options.max_batch_size]
                    out.extend(
                        self._generate_chunk(
                            [prompts[i] for i in chunk],
                            chunk,
                            [caps[i] for i in chunk],
                            params,
                            stop_ids,
                            generator,
                        )
                    )
        n = params.n
        return [out[i * n : (i + 1) * n] for i in range(len(prompts))]

    def top_logprobs(
        self,
        prompts: Sequence[Sequence[int]],
        completions: Sequence[Sequence[int]],
        k: int,
        temperature: float = 1.0,
    ) -> list[list[list[tuple[int, float]]]]:
        """At every token of each completion, the ``k`` most likely tokens as ``(token id,
        log-prob)``, most likely first, from the distribution :class:`Completion` log-probs come
        from (``log_softmax(logits / T)`` before top-k / top-p truncation; T = 1 when greedy).

        One teacher-forced forward pass per (prompt, completion) pair, after generation: the
        decode loops keep only the sampled token's log-prob (``rlcore serve`` uses this for
        OpenAI's ``top_logprobs``)."""
        if self._asleep:
            raise RlcoreError("the hf rollout engine is asleep; call wake_up() before top_logprobs()")
        if len(prompts) != len(completions):
            raise UsageError(f"top_logprobs got {len(prompts)} prompts for {len(completions)} completions")
        k = min(int(k), self.vocab_size)
        out: list[list[list[tuple[int, float]]]] = []
        with self._generation_mode():
            for prompt, completion in zip(prompts, completions):
                prompt, completion = [int(t) for t in prompt], [int(t) for t in completion]
                if not completion or k < 1:
                    out.append([[] for _ in completion])
                    continue
                ids = torch.tensor([prompt + completion[:-1]], device=self.device)
                kwargs: dict[str, Any] = {"input_ids": ids, "use_cache": False}
                if self._keeps_logits:
                    kwargs["logits_to_keep"] = len(completion)
                logits = self.model(**kwargs).logits[0, -len(completion) :].float()
                if temperature not in (0.0, 1.0):
                    logits = logits / temperature
                values, indices = torch.topk(torch.log_softmax(logits, dim=-1), k, dim=-1)
                out.append([list(zip(i, v)) for i, v in zip(indices.tolist(), values.tolist())])
        return out

    def update_weights(
        self,
        named_tensors: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor],
        *,
        lora: Any = None,
    ) -> None:
        """Copy the trainer's tensors in; a no-op (the iterable is not consumed) when sharing the actor.
        With ``lora`` (rank, alpha, target modules, or an adapter_config.json as ``peft_config``)
        the tensors are a LoRA adapter alone (PEFT names): it is loaded over the engine's base
        weights, which stay as they were, and generation applies it from then on."""
        if self.shares_actor:
            return
        if lora is None:
            copy_named_tensors(self.model, named_tensors)
            return
        wrapped = load_adapter(self.model, named_tensors, lora)
        if wrapped is not self.model:  # LoRA layers were injected: generate through the peft model
            self.root = self.model = wrapped

    def sleep(self) -> None:
        """Free caches; with ``offload_weights`` move the engine's own accelerator weights to CPU."""
        if self._asleep:
            return
        self._asleep = True
        released = False
        if self.fast is not None and self._release_cache_on_sleep():
            self.fast.release()
            released = True
        if self.options.offload_weights and not self.shares_actor and self.device.type != "cpu":
            self.model.to("cpu")
            self._offloaded = released = True
        # Only when something was let go: a full gc.collect() took 0.1-0.2 s a step, and emptying
        # torch's cache makes the trainer allocate again what it could have reused.
        if released:
            gc.collect()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()

    def _release_cache_on_sleep(self) -> bool:
        mode = self.options.release_cache_on_sleep
        if mode != "auto":
            return mode == "always"
        workspace = self.fast.workspace if self.fast is not None else None
        if workspace is None or self.device.type != "cuda":
            return True
        return workspace.nbytes() > 0.05 * torch.cuda.get_device_properties(self.device).total_memory

    def wake_up(self) -> None:
        if not self._asleep:
            return
        if self._offloaded:
            self.model.to(self.device)
            self._offloaded = False
        self._asleep = False

    @property
    def asleep(self) -> bool:
        return self._asleep

    # ------------------------------------------------------------------ internals

    def _checked_prompts(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[list[int]]:
        checked = []
        for i, prompt in enumerate(prompts):
            ids = [int(t) for t in prompt]
            if not ids:
                raise UsageError(f"prompt {i} is empty; the hf engine needs at least one prompt token")
            bad = [t for t in ids if not 0 <= t < self.vocab_size]
            if bad:
                raise UsageError(
                    f"prompt {i} has token ids outside the model's vocabulary [0, {self.vocab_size}): {bad[:5]}"
                )
            if self.max_positions and len(ids) >= self.max_positions:
                raise UsageError(
                    f"prompt {i} has {len(ids)} tokens; the model has only {self.max_positions} positions"
                )
            checked.append(ids)
        return checked

    def _caps(
        self, prompts: list[list[int]], params: SamplingParams, caps: Sequence[int] | None
    ) -> list[int]:
        """Per prompt: most new tokens, within ``params.max_new_tokens`` and the model's positions."""
        if caps is None:
            caps = [params.max_new_tokens] * len(prompts)
        elif len(caps) != len(prompts):
            raise UsageError(f"max_new_tokens has {len(caps)} entries for {len(prompts)} prompts")
        out = []
        for prompt, cap in zip(prompts, caps):
            cap = min(int(cap), params.max_new_tokens)
            if cap < 1:
                raise UsageError(f"max_new_tokens entries must be at least 1, got {cap}")
            if self.max_positions:
                cap = min(cap, self.max_positions - len(prompt))
            out.append(cap)
        return out

    def _stop_ids(self, params: SamplingParams) -> frozenset[int]:
        generation_config = getattr(self.model, "generation_config", None)
        return collect_stop_ids(
            getattr(self.tokenizer, "eos_token_id", None),
            getattr(generation_config, "eos_token_id", None),
            params.stop_token_ids,
        )

    @contextlib.contextmanager
    def _generation_mode(self) -> Iterator[None]:
        """eval() for the duration (which also turns gradient checkpointing off), inference mode,
        and every submodule's training flag restored exactly afterwards."""
        flags = [(m, m.training) for m in self.root.modules()]
        self.root.eval()
        try:
            with torch.inference_mode():
                yield
        finally:
            for module, training in flags:
                module.training = training

    def _forward(self, input_ids, attention_mask, position_ids, cache, last_only: bool):
        kwargs: dict[str, Any] = dict(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
        )
        kwargs[self._cache_arg] = cache
        if last_only and self._keeps_logits:
            kwargs["logits_to_keep"] = 1
        out = self.model(**kwargs)
        return out.logits[:, -1, :], getattr(out, self._cache_arg)

    def _generate_chunk(
        self,
        prompts: list[list[int]],
        prompt_index: list[int],
        limits: list[int],
        params: SamplingParams,
        stop_ids: frozenset[int],
        generator: torch.Generator,
    ) -> list[Completion]:
        """Sample one completion per entry of ``prompts`` (entries of one prompt are adjacent)."""
        device = self.device
        batch = len(prompts)
        if self.options.share_prefill:
            first: dict[int, int] = {}
            source = [first.setdefault(p, len(first)) for p in prompt_index]
            unique = [prompts[prompt_index.index(p)] for p in first]
        else:
            source = list(range(batch))
            unique = prompts

        # Left-padded prefill; position ids count real tokens only.
        width = max(len(p) for p in unique)
        input_ids = torch.zeros((len(unique), width), dtype=torch.long)
        mask = torch.zeros((len(unique), width), dtype=torch.long)
        for row, ids in enumerate(unique):
            input_ids[row, width - len(ids) :] = torch.tensor(ids)
            mask[row, width - len(ids) :] = 1
        input_ids, mask = input_ids.to(device), mask.to(device)
        positions = (mask.cumsum(-1) - 1).clamp_(min=0)
        logits, cache = self._forward(input_ids, mask, positions, None, last_only=True)
        next_position = mask.sum(-1)
        if len(unique) != batch:
            index = torch.tensor(source, device=device)
            cache.batch_select_indices(index)
            logits, mask, next_position = logits[index], mask[index], next_position[index]

        tokens: list[list[int]] = [[] for _ in range(batch)]
        logprobs: list[list[float]] = [[] for _ in range(batch)]
        reasons = ["length"] * batch
        checkers = [StopChecker(stop_ids, params.stop, self.tokenizer) for _ in range(batch)]
        live = list(range(batch))  # batch position -> sequence
        done = [False] * batch
        remaining = batch
        for _step in range(max(limits)):
            chosen, chosen_logp = sample_next(
                logits, params.temperature, params.top_k, params.top_p, generator
            )
            for seq, token, logp in zip(live, chosen.tolist(), chosen_logp.tolist()):
                if done[seq]:
                    continue
                tokens[seq].append(token)
                logprobs[seq].append(logp)
                if checkers[seq].push(token):
                    done[seq] = True
                    reasons[seq] = "stop"
                    remaining -= 1
                elif len(tokens[seq]) == limits[seq]:
                    done[seq] = True
                    remaining -= 1
            if remaining == 0:
                break
            finished = len(live) - remaining
            if finished and finished >= self.options.compact_fraction * len(live):
                keep = [b for b, seq in enumerate(live) if not done[seq]]
                index = torch.tensor(keep, device=device)
                cache.batch_select_indices(index)
                chosen, mask, next_position = chosen[index], mask[index], next_position[index]
                live = [live[b] for b in keep]
            mask = torch.cat([mask, mask.new_ones((len(live), 1))], dim=1)
            logits, cache = self._forward(
                chosen[:, None], mask, next_position[:, None], cache, last_only=False
            )
            next_position = next_position + 1
        del cache
        return [
            Completion(token_ids=t, logprobs=lp, finish_reason=r)
            for t, lp, r in zip(tokens, logprobs, reasons)
        ]


# ---------------------------------------------------------------------- factory


def _load_own_model(options: HFEngineOptions, context: BuildContext, device: torch.device) -> Any:
    from transformers import AutoModelForCausalLM

    dtype_name = options.dtype or context.dtype or "float32"
    if dtype_name != "auto" and dtype_name not in _DTYPES:
        raise UsageError(f"[model] dtype {dtype_name!r} is not one of auto, {', '.join(_DTYPES)}")
    kwargs: dict[str, Any] = {"dtype": "auto" if dtype_name == "auto" else _DTYPES[dtype_name]}
    if context.gguf_file:
        kwargs["gguf_file"] = context.gguf_file
    try:
        model = AutoModelForCausalLM.from_pretrained(context.model_path, **kwargs)
    except (OSError, ValueError) as error:
        where = context.model_path + (f" (gguf_file {context.gguf_file})" if context.gguf_file else "")
        raise UsageError(f"the hf rollout engine could not load [model] path {where}: {error}") from error
    model.to(device)
    model.eval()
    model.requires_grad_(False)
    return model


def _copy_actor(actor: Any, device: torch.device, dtype: torch.dtype | None) -> Any:
    """A detached copy of the actor for another device; peft adapters are merged in."""
    model = copy.deepcopy(unwrap_module(actor))
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    if dtype is not None:
        model.to(dtype)
    model.to(device)
    model.eval()
    model.requires_grad_(False)
    return model


def build(options: HFEngineOptions, context: BuildContext | None = None) -> HFRolloutEngine:
    """The ``hf`` component's factory: share ``context.actor`` when it is on ``context.device`` (and
    the engine does not generate while the trainer trains), else load ``context.model_path`` (or
    copy the actor when no path is given)."""
    context = context or BuildContext()
    device = torch.device(context.device or "cpu")
    actor = context.actor
    if (
        actor is not None
        and options.share_actor
        and not context.concurrent
        and same_device(module_device(actor), device)
    ):
        return HFRolloutEngine(actor, tokenizer=context.tokenizer, options=options, shares_actor=True)
    if context.model_path:
        model = _load_own_model(options, context, device)
    elif actor is not None:
        dtype = _DTYPES.get(options.dtype or "")
        model = _copy_actor(actor, device, dtype)
    else:
        raise UsageError(
            "the hf rollout engine needs a model: set [model] path (and gguf_file for a GGUF file), "
            "or run it in the trainer's process so that it can share the actor"
        )
    return HFRolloutEngine(model, tokenizer=context.tokenizer, options=options, shares_actor=False)
