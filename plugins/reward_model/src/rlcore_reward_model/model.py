"""The ``reward_model`` reward: a sequence-classification model scoring whole conversations.

Built once per run in the trainer's process (see :class:`rlcore.interfaces.BatchRewardFunction`):
``wake_up()`` puts the model on its device before a batch, ``score_batch`` runs it in batches of
``batch_size``, ``sleep()`` moves it to host memory (``offload = "cpu"``) or drops it
(``offload = "free"``) while the actor trains.

The score of one trajectory is the logit of output ``label`` (through a sigmoid when asked),
times ``scale``, plus ``shift``; with a ``rule``, ``model_weight`` times that plus ``rule_weight``
times the rule's score.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Sequence
from pathlib import Path

from loguru import logger

from rlcore.errors import UsageError
from rlcore.interfaces import BuildContext, RewardInput, RewardResult
from rlcore_reward_model.conversation import prompt_messages
from rlcore_reward_model.options import RewardModelOptions
from rlcore_reward_model.rule import combine, load_rule

_DTYPES = ("float32", "bfloat16", "float16")


def build(options: RewardModelOptions, context: BuildContext | None = None) -> RewardModel:
    context = context or BuildContext()
    path = Path(options.path).expanduser()
    if not path.is_absolute() and context.manifest_dir:
        path = Path(context.manifest_dir) / path
    rule = load_rule(options.rule, options.rule_weight, context.manifest_dir, "reward_model")
    return RewardModel(options, path, context, rule)


class RewardModel:
    batched = True

    def __init__(self, options: RewardModelOptions, path: Path, context: BuildContext, rule=None) -> None:
        import torch

        self.options, self.path, self.rule = options, path, rule
        self.required_fields = rule.required_fields if rule is not None else frozenset()
        self.device = torch.device(context.device if options.device == "auto" else options.device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise UsageError(f"[reward] device = {options.device!r}, but this machine has no CUDA GPU")
        dtype = options.dtype
        if dtype == "auto":
            dtype = context.dtype if self.device.type != "cpu" and context.dtype in _DTYPES else "float32"
        self.dtype = getattr(torch, dtype)
        self.config = _check_directory(path, options)
        self.label_index = _label_index(self.config, options.label, path)
        self.tokenizer = _load_tokenizer(path, options)
        self.chat = options.input == "chat" or (
            options.input == "auto" and bool(self.tokenizer.chat_template)
        )
        if options.input == "chat" and not self.tokenizer.chat_template:
            raise UsageError(
                f'[reward] input = "chat", but the tokenizer of the reward model {path} has no chat template; '
                'use input = "text" (the decoded prompt followed by the response) or "auto"'
            )
        self.model = self._load()  # on the CPU: loading checks the head now, not at the first batch
        self._lock = threading.Lock()  # one batch at a time; sleep() waits for the forward pass in flight
        self._generation = (
            0  # bumped by sleep(): an abandoned (timed-out) batch stops at its next forward pass
        )
        self._warned: set[str] = set()
        # On a GPU the model starts asleep (the engine and the actor load and generate without it) unless
        # offload = "none"; the trainer wakes it up before each batch.
        self._asleep = self.device.type != "cpu" and options.offload != "none"
        if not self._asleep:
            self.model.to(self.device)
        elif options.offload == "free":
            self.model = None
        logger.info(
            "reward model {}: {} ({} outputs, label {}), {} on {}, input {}",
            path,
            type(self.model).__name__,
            self.config.num_labels,
            self.label_index,
            dtype,
            self.device,
            "rendered with its chat template" if self.chat else "the decoded prompt and the response",
        )

    # ------------------------------------------------------------------ loading

    def _load(self):
        from transformers import AutoModelForSequenceClassification

        try:
            model, info = AutoModelForSequenceClassification.from_pretrained(
                self.path,
                dtype=self.dtype,
                trust_remote_code=self.options.trust_remote_code,
                output_loading_info=True,
            )
        except (OSError, ValueError, KeyError) as exc:
            raise UsageError(
                f"[reward] path: the reward model in {self.path} cannot be loaded: {exc}"
            ) from None
        head = [k for k in info.get("missing_keys", ()) if not k.startswith(_base_prefix(model))]
        if head:
            raise UsageError(
                f"[reward] path: {self.path} has no trained classification head (the weights {', '.join(sorted(head)[:4])} "
                "are missing from its checkpoint, so they would be random); a reward model is a sequence classifier "
                "saved with its head (e.g. by TRL's RewardTrainer)"
            )
        if model.config.pad_token_id is None:
            model.config.pad_token_id = self.tokenizer.pad_token_id
        model.eval().requires_grad_(False)
        return model

    # ------------------------------------------------------------------ the batch protocol

    def wake_up(self) -> None:
        with self._lock:
            self._wake()

    def _wake(self) -> None:
        """Put the model on its device (loading it again if sleep() freed it); the lock is held."""
        if self.model is None:
            self.model = self._load()
        if self._asleep:
            self.model.to(self.device)
            self._asleep = False

    def sleep(self) -> None:
        self._generation += 1
        with self._lock:
            if self.device.type == "cpu" or self.options.offload == "none":
                return
            self._asleep = True
            import torch

            if self.options.offload == "free":
                self.model = None
            else:
                self.model.to("cpu")
            torch.cuda.empty_cache()

    def score_batch(self, items: Sequence[RewardInput]) -> list[RewardResult]:
        import torch

        generation = self._generation
        texts = [self.render(item) for item in items]
        encoded = [self._encode(text) for text in texts]
        logits: list[float] = []
        with self._lock:
            self._wake()  # a no-op after the trainer's wake_up(); a direct call may come without it
            with torch.inference_mode():
                # Longest first: a batch holds sequences of similar length, and memory runs out early if at all.
                order = sorted(range(len(items)), key=lambda i: -len(encoded[i][0]))
                values = [0.0] * len(items)
                for start in range(0, len(order), self.options.batch_size):
                    if generation != self._generation:
                        raise TimeoutError("abandoned: the reward batch ran past [reward] timeout_s")
                    chunk = order[start : start + self.options.batch_size]
                    out = self._forward([encoded[i][0] for i in chunk])
                    for i, value in zip(chunk, out):
                        values[i] = value
                logits = values
        metrics = []
        scores = []
        for (_, truncated), logit in zip(encoded, logits):
            x = 1.0 / (1.0 + math.exp(-logit)) if self.options.sigmoid else logit
            score = self.options.scale * x + self.options.shift
            scores.append(score)
            metrics.append({"rm_score": score, "rm_logit": logit, "rm_truncated": float(truncated)})
        return combine(scores, metrics, items, self.rule, self.options.model_weight)

    # ------------------------------------------------------------------ input

    def render(self, item: RewardInput) -> str:
        """The text the reward model reads for ``item`` (see the README's "What the model reads")."""
        if not self.chat:
            return (item.prompt or "") + item.response
        messages, found = prompt_messages(item)
        if found == "text" and "text" not in self._warned:
            self._warned.add("text")
            logger.warning(
                "reward model: the prompt is not in a chat format rlcore can read back (ChatML, Llama 3, Gemma), so "
                'the whole decoded prompt is one user message for {}\'s chat template; set input = "text" to give '
                "the model the decoded prompt and response as they are",
                self.path,
            )
        messages = [*messages, {"role": "assistant", "content": item.response}]
        return self.tokenizer.apply_chat_template(messages, tokenize=False)

    def _encode(self, text: str) -> tuple[list[int], bool]:
        bos = self.tokenizer.bos_token
        special = not (bos and text.startswith(bos))  # a rendered template already holds its BOS
        ids = self.tokenizer(text, add_special_tokens=special)["input_ids"]
        limit = self.options.max_length
        if len(ids) <= limit:
            return ids, False
        return (ids[-limit:] if self.options.truncation == "left" else ids[:limit]), True

    def _forward(self, sequences: list[list[int]]) -> list[float]:
        import torch

        pad = self.model.config.pad_token_id
        width = max(len(s) for s in sequences)
        ids = torch.full((len(sequences), width), pad, dtype=torch.long)
        mask = torch.zeros((len(sequences), width), dtype=torch.long)
        for row, seq in enumerate(sequences):
            ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
            mask[row, : len(seq)] = 1
        device = next(self.model.parameters()).device
        logits = self.model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
        return logits[:, self.label_index].float().tolist()


# ---------------------------------------------------------------------- build-time checks


def _check_directory(path: Path, options: RewardModelOptions):
    """The model's config, after checking the directory holds a sequence classifier."""
    from transformers import AutoConfig

    if not path.is_dir():
        raise UsageError(f"[reward] path: the reward model directory {str(path)!r} does not exist")
    config_file = path / "config.json"
    if not config_file.is_file():
        raise UsageError(
            f"[reward] path: {path} has no config.json; expected a Hugging Face model directory "
            "(save_pretrained's output)"
        )
    try:
        raw = json.loads(config_file.read_text(encoding="utf-8"))
        config = AutoConfig.from_pretrained(path, trust_remote_code=options.trust_remote_code)
    except (OSError, ValueError, KeyError) as exc:
        raise UsageError(f"[reward] path: the config of {path} cannot be read: {exc}") from None
    architectures = raw.get("architectures") or []
    classifier = [a for a in architectures if a.endswith("ForSequenceClassification")]
    if architectures and not classifier:
        hint = (
            " (a generative model: score with it through the judge reward, served by vLLM or rlcore serve)"
            if any(a.endswith(("ForCausalLM", "ForConditionalGeneration")) for a in architectures)
            else ""
        )
        raise UsageError(
            f"[reward] path: {path} holds a {', '.join(architectures)}, not a sequence-classification model{hint}; "
            "the reward_model reward needs a model with a classification head, e.g. LlamaForSequenceClassification "
            "as TRL's RewardTrainer saves it"
        )
    return config


def _label_index(config, label: int | str, path: Path) -> int:
    n = int(config.num_labels)
    names = {str(v): int(k) for k, v in (getattr(config, "id2label", None) or {}).items()}
    if isinstance(label, str):
        if label.lstrip("-").isdigit():
            label = int(label)
        elif label in names:
            return names[label]
        else:
            raise UsageError(
                f"[reward] label = {label!r}: the reward model {path} has no output of that name; its "
                f"outputs (id2label): {', '.join(f'{i}: {n!r}' for n, i in sorted(names.items(), key=lambda x: x[1]))}"
            )
    if not 0 <= label < n:
        raise UsageError(
            f"[reward] label = {label}: the reward model {path} has {n} output{'s' if n != 1 else ''} "
            f"(num_labels = {n}), so label must be 0{f' to {n - 1}' if n > 1 else ''}"
        )
    return label


def _load_tokenizer(path: Path, options: RewardModelOptions):
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=options.trust_remote_code)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(
            f"[reward] path: the tokenizer of the reward model {path} cannot be loaded: {exc}"
        ) from None
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token_id is None:
            raise UsageError(
                f"[reward] path: the tokenizer of {path} has neither a pad nor an end-of-sequence token"
            )
        tokenizer.pad_token = tokenizer.eos_token  # as TRL's RewardTrainer does
    return tokenizer


def _base_prefix(model) -> str:
    return getattr(model, "base_model_prefix", "") or "\0"
