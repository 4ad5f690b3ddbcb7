"""verl key -> rlcore manifest key: every key of verl's ppo_trainer.yaml (verl b178a3cd) is either
mapped by a rule below, or explained in :data:`EXPLAINED` (why rlcore has no such key).

Each rule reads a few verl keys from a :class:`~rlcore_verl.config.VerlConfig` and writes manifest
lines that name the keys they came from; a key it cannot express goes to ``Conversion.unmapped``
with the reason, and with ``essential`` when leaving it out changes what is trained (the command
then exits 1). The DAPO recipe's keys are mapped in one place, :func:`dapo`, onto today's
``[algorithm]`` keys.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlcore.errors import UsageError
from rlcore_verl.config import VerlConfig

_REQUIRED = object()

# ----------------------------------------------------------------------------- the result


@dataclass
class Line:
    """One manifest key: ``[table] key = value``, from the verl keys in ``sources``."""

    table: str
    key: str
    value: Any
    sources: tuple[str, ...]
    given: bool  # some source was set by the user (else: verl's defaults)
    note: str = ""


@dataclass
class Unmapped:
    key: str
    reason: str
    essential: bool
    origin: str | None


@dataclass
class Options:
    """How to convert, beyond the verl keys themselves."""

    launcher: str = "auto"  # auto | local | ray | slurm
    out_dir: Path | None = None  # where the manifest goes: relative paths are rewritten for it
    cwd: Path = field(default_factory=Path.cwd)
    ray_job: bool = False  # the script submits the command with `ray job submit`
    ray_job_address: str | None = None


@dataclass
class Conversion:
    cfg: VerlConfig
    options: Options
    lines: list[Line] = field(default_factory=list)
    unmapped: list[Unmapped] = field(default_factory=list)
    handled: set[str] = field(default_factory=set)

    def put(
        self, table: str, key: str, value: Any, *sources: str, note: str = "", given: bool = False
    ) -> None:
        """``[table] key = value`` from the verl keys ``sources``; ``given``: from the user's script
        itself (its ray job submit), not from a key."""
        self.handled.update(sources)
        given = given or any(self.cfg.given(s) for s in sources)
        self.lines = [line for line in self.lines if not (line.table == table and line.key == key)]
        self.lines.append(Line(table, key, value, tuple(sources), given, note))

    def skip(self, key: str, reason: str, essential: bool = False, always: bool = False) -> None:
        """``key`` is not expressed. Reported when the user set it, or ``always`` (a default of
        verl's that rlcore cannot follow)."""
        self.handled.add(key)
        if self.cfg.given(key) or always:
            self.unmapped = [u for u in self.unmapped if u.key != key]
            self.unmapped.append(Unmapped(key, reason, essential, self.cfg.origin(key)))

    def use(self, *keys: str) -> None:
        """Keys read by a rule that need no line of their own."""
        self.handled.update(keys)

    def get(self, key: str, default: Any = None) -> Any:
        return self.cfg.get(key, default)

    def int(self, key: str, default: Any = _REQUIRED) -> int:
        return self._number(key, int, default)

    def float(self, key: str, default: Any = _REQUIRED) -> float:
        return self._number(key, float, default)

    def numbers(self, key: str, kind: type) -> list:
        """``key``'s list of numbers (betas, profiler steps); a located error otherwise."""
        values = as_list(self.cfg.get(key))
        try:
            if any(isinstance(v, bool) for v in values):
                raise ValueError
            return [kind(v) for v in values]
        except (TypeError, ValueError):
            where = self.cfg.origin(key) or "verl's default"
            raise UsageError(f"{where}: {key} = {self.cfg.get(key)!r}: expected a list of numbers") from None

    def _number(self, key: str, kind: type, default: Any) -> Any:
        """``key``'s value as ``kind``; ``default`` when it is null; a located error when it is not a number."""
        value = self.cfg.get(key)
        if value is None and default is not _REQUIRED:
            return default
        try:
            if isinstance(value, bool) or value is None:
                raise ValueError
            number = kind(value)
            if kind is int and isinstance(value, float) and not value.is_integer():
                raise ValueError
            return number
        except (TypeError, ValueError):
            where = self.cfg.origin(key) or "verl's default"
            what = "an integer" if kind is int else "a number"
            raise UsageError(f"{where}: {key} = {value!r}: expected {what}") from None

    def given(self, key: str) -> bool:
        return self.cfg.given(key)

    def value_of(self, table: str, key: str) -> Any:
        return next((line.value for line in self.lines if line.table == table and line.key == key), None)


# ----------------------------------------------------------------------------- helpers

A = "actor_rollout_ref.actor."
R = "actor_rollout_ref.rollout."
M = "actor_rollout_ref.model."
REF = "actor_rollout_ref.ref."

NOT_SUPPORTED = "not supported by rlcore"


def as_bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    return bool(value)


def as_list(value: Any) -> list:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def rebase(path: Any, opts: Options, local_only: bool = False) -> Any:
    """A path as verl reads it (relative to where verl runs) written for the manifest's directory
    (rlcore reads paths relative to the manifest). With ``local_only`` (a model: maybe a hub id), a
    relative path is rewritten only if it exists here."""
    if (
        not isinstance(path, str)
        or not path
        or path.startswith(("/", "~"))
        or "://" in path
        or opts.out_dir is None
    ):
        return path
    here = opts.cwd / path
    if local_only and not here.exists():
        return path
    return os.path.relpath(here, opts.out_dir)


# ----------------------------------------------------------------------------- rules

Rule = Callable[[Conversion], None]
RULES: list[Rule] = []


def rule(fn: Rule) -> Rule:
    RULES.append(fn)
    return fn


@rule
def model(c: Conversion) -> None:
    path = c.get(M + "path")
    c.put("model", "path", rebase(path, c.options, local_only=True), M + "path")
    if not c.given(M + "path"):
        c.skip(M + "path", f"not set: verl's default {path!r} is written", always=True)
    if c.get(M + "tokenizer_path"):
        c.put(
            "model",
            "tokenizer",
            rebase(c.get(M + "tokenizer_path"), c.options, local_only=True),
            M + "tokenizer_path",
        )
    c.put("model", "trust_remote_code", as_bool(c.get(M + "trust_remote_code")), M + "trust_remote_code")
    c.put(
        "model",
        "gradient_checkpointing",
        as_bool(c.get(M + "enable_gradient_checkpointing")),
        M + "enable_gradient_checkpointing",
    )
    storage = {
        "fp32": "float32",
        "float32": "float32",
        "bf16": "bfloat16",
        "bfloat16": "bfloat16",
        "fp16": "float16",
    }
    compute = {"bfloat16": "auto", "bf16": "auto", "fp32": "float32", "float32": "float32"}
    model_dtype = str(c.get(A + "fsdp_config.model_dtype"))
    if model_dtype in storage:
        c.put("model", "dtype", storage[model_dtype], A + "fsdp_config.model_dtype")
    else:
        c.skip(
            A + "fsdp_config.model_dtype",
            f"{model_dtype!r}: rlcore stores weights in float32, bfloat16 or float16",
        )
    dtype = str(c.get(A + "fsdp_config.dtype"))
    if dtype in compute:
        c.put(
            "model",
            "compute_dtype",
            compute[dtype],
            A + "fsdp_config.dtype",
            note="auto: bfloat16 on CUDA over float32 masters" if compute[dtype] == "auto" else "",
        )
    else:
        c.skip(A + "fsdp_config.dtype", f"{dtype!r}: rlcore computes in bfloat16 or float32", essential=True)
    rank = c.int(M + "lora_rank", 0)
    c.use(M + "lora_rank")
    if rank > 0:
        c.put("model.lora", "rank", rank, M + "lora_rank")
        c.put("model.lora", "alpha", c.float(M + "lora_alpha"), M + "lora_alpha")
        modules = c.get(M + "target_modules")
        if isinstance(modules, str) and modules != "all-linear":
            modules = [m.strip() for m in modules.split(",") if m.strip()]
        c.put("model.lora", "target_modules", modules, M + "target_modules")
        if c.get(M + "exclude_modules"):
            c.skip(
                M + "exclude_modules",
                "rlcore's LoRA targets modules; it has no exclusion list",
                essential=True,
            )
    else:
        c.use(M + "lora_alpha", M + "target_modules", M + "exclude_modules")
    if c.get(M + "lora_adapter_path"):
        c.skip(
            M + "lora_adapter_path",
            "rlcore starts LoRA from fresh adapters; merge the adapter into the model directory first",
            essential=True,
        )
    else:
        c.use(M + "lora_adapter_path")
    for key, why in (
        (
            "custom_chat_template",
            "rlcore renders prompts with the tokenizer's own chat template; put the template "
            "in the tokenizer's files (tokenizer_config.json)",
        ),
        (
            "external_lib",
            "rlcore loads models with transformers' AutoModel; register custom code with "
            "trust_remote_code instead",
        ),
        ("hf_config_path", "rlcore reads the model's config from [model] path"),
    ):
        if c.get(M + key):
            c.skip(M + key, why, essential=True)
        else:
            c.use(M + key)
    overrides = c.cfg.table(M + "override_config")
    c.use(M + "override_config")
    for name, value in overrides.items():
        key = f"{M}override_config.{name}"
        c.handled.add(key)
        c.unmapped.append(
            Unmapped(
                key,
                f"{name} = {value!r}: rlcore does not override the model's config; edit "
                "config.json in a copy of the model directory",
                True,
                c.cfg.origin(key),
            )
        )


@rule
def data(c: Conversion) -> None:
    for verl_key, rlcore_key in (("data.train_files", "train"), ("data.val_files", "val")):
        files = as_list(c.get(verl_key))
        if len(files) == 1:
            c.put("data", rlcore_key, rebase(str(files[0]), c.options), verl_key)
        elif len(files) > 1:
            c.skip(
                verl_key,
                f"{len(files)} files ({', '.join(map(str, files))}); rlcore's [data] {rlcore_key} is one "
                "file: concatenate them into one (each row keeps its data_source; [data] source_weights fixes the "
                f"mix) and give that, e.g. {verl_key}=merged.parquet",
                essential=rlcore_key == "train",
                always=True,
            )
        else:
            c.use(verl_key)
        if not c.given(verl_key) and len(files) == 1:
            c.skip(verl_key, f"not set: verl's default {files[0]!r} is written", always=True)
    c.put("data", "prompts_per_step", c.int("data.train_batch_size"), "data.train_batch_size")
    c.put("data", "max_prompt_tokens", c.int("data.max_prompt_length"), "data.max_prompt_length")
    c.put("data", "max_response_tokens", c.int("data.max_response_length"), "data.max_response_length")
    c.put("data", "prompt_key", c.get("data.prompt_key"), "data.prompt_key")
    c.put("data", "shuffle", as_bool(c.get("data.shuffle")), "data.shuffle")
    if c.get("data.seed") is not None:
        c.put("run", "seed", c.int("data.seed"), "data.seed")
    else:
        c.use("data.seed")
    kwargs = c.cfg.table("data.apply_chat_template_kwargs")
    c.use("data.apply_chat_template_kwargs")
    if kwargs:
        c.put(
            "data",
            "chat_template_kwargs",
            kwargs,
            "data.apply_chat_template_kwargs",
            *[
                f"data.apply_chat_template_kwargs.{k}"
                for k in kwargs
                if c.given(f"data.apply_chat_template_kwargs.{k}")
            ],
        )
    limit = c.int("data.val_max_samples", -1)
    if limit > 0:
        c.put("data", "val_max_prompts", limit, "data.val_max_samples")
    else:
        c.use("data.val_max_samples")
    if c.int("data.train_max_samples", -1) > 0:
        c.skip(
            "data.train_max_samples",
            "rlcore trains on every usable row of data.train; cut the file instead",
            essential=True,
        )
    else:
        c.use("data.train_max_samples")
    if c.get("data.reward_fn_key") != "data_source":
        c.skip("data.reward_fn_key", "rlcore routes rewards by the data_source column", essential=True)
    else:
        c.use("data.reward_fn_key")
    for key in ("data.custom_cls.path", "data.sampler.class_path", "data.datagen.path"):
        if c.get(key):
            c.skip(
                key,
                "rlcore reads verl's row format from parquet or jsonl; custom dataset, sampler and "
                "data-generation classes are not supported",
                essential=True,
            )
        else:
            c.use(key)
    if c.get("data.truncation") != "error":
        c.skip(
            "data.truncation",
            "rlcore never truncates a prompt: longer ones are left out when the data loads, "
            "with a warning naming them",
        )
    else:
        c.use("data.truncation")
    if not as_bool(c.get("data.filter_overlong_prompts")):
        c.skip(
            "data.filter_overlong_prompts",
            "rlcore always leaves prompts longer than max_prompt_tokens out "
            "(verl would stop on one with truncation=error)",
        )
    else:
        c.use("data.filter_overlong_prompts")


@rule
def trainer_length(c: Conversion) -> None:
    steps = c.get("trainer.total_training_steps")
    if steps not in (None, -1):
        c.put("trainer", "steps", c.int("trainer.total_training_steps"), "trainer.total_training_steps")
        c.use("trainer.total_epochs")
    else:
        c.put("trainer", "total_epochs", c.get("trainer.total_epochs"), "trainer.total_epochs")
        c.use("trainer.total_training_steps")


@rule
def optimiser(c: Conversion) -> None:
    o = A + "optim."
    c.put("trainer", "lr", c.float(o + "lr"), o + "lr")
    c.put("trainer", "weight_decay", c.float(o + "weight_decay"), o + "weight_decay")
    c.put("trainer", "betas", c.numbers(o + "betas", float), o + "betas")
    # verl has both actor.grad_clip (read by the FSDP actor) and optim.clip_grad (the new engine's).
    clip_key = (
        o + "clip_grad" if c.given(o + "clip_grad") and not c.given(A + "grad_clip") else A + "grad_clip"
    )
    c.put("trainer", "grad_clip", c.float(clip_key), clip_key)
    c.use(o + "clip_grad", A + "grad_clip")
    c.put("trainer", "warmup_steps", warmup_steps(c, o), o + "lr_warmup_steps", o + "lr_warmup_steps_ratio")
    schedule = c.get(o + "warmup_style") or c.get(o + "lr_scheduler_type")
    c.use(o + "warmup_style", o + "lr_scheduler_type", o + "min_lr_ratio", o + "num_cycles")
    if schedule != "constant":
        key = o + "warmup_style" if c.given(o + "warmup_style") else o + "lr_scheduler_type"
        c.skip(
            key,
            f"{schedule!r}: rlcore's learning rate is constant after the warm-up",
            essential=True,
            always=True,
        )
    if str(c.get(o + "optimizer")).lower() != "adamw":
        c.skip(o + "optimizer", f"{c.get(o + 'optimizer')!r}: rlcore optimises with AdamW", essential=True)
    else:
        c.use(o + "optimizer")
    if c.get(o + "override_optimizer_config"):
        c.skip(
            o + "override_optimizer_config",
            "rlcore's AdamW takes lr, betas and weight_decay only",
            essential=True,
        )
    else:
        c.use(o + "override_optimizer_config")
    c.use(o + "optimizer_impl", o + "total_training_steps")


def warmup_steps(c: Conversion, prefix: str) -> int:
    """verl: lr_warmup_steps when positive, else lr_warmup_steps_ratio x the total steps."""
    steps = c.int(prefix + "lr_warmup_steps", -1)
    if steps > 0:
        return steps
    ratio = c.float(prefix + "lr_warmup_steps_ratio", 0.0)
    if ratio <= 0:
        return 0
    total = c.get("trainer.total_training_steps")
    if total in (None, -1):
        c.skip(
            prefix + "lr_warmup_steps_ratio",
            f"{ratio}: a fraction of the total steps, which verl counts from "
            "the data; set trainer.total_training_steps (or lr_warmup_steps) to convert it",
            essential=True,
        )
        return 0
    return int(ratio * c.int("trainer.total_training_steps"))


@rule
def batches(c: Conversion) -> None:
    """verl's mini-batch is in prompts: train_batch_size / ppo_mini_batch_size optimizer steps per
    batch. rlcore always packs sequences into rows of at most micro_batch_tokens tokens."""
    train, mini = c.int("data.train_batch_size"), c.int(A + "ppo_mini_batch_size")
    if mini <= 0 or train % mini:
        c.skip(
            A + "ppo_mini_batch_size",
            f"{mini} does not divide data.train_batch_size = {train} (verl refuses that too)",
            essential=True,
            always=True,
        )
    else:
        c.put(
            "algorithm",
            "mini_batches",
            train // mini,
            "data.train_batch_size",
            A + "ppo_mini_batch_size",
            note=f"{train} / {mini}",
        )
    c.put("algorithm", "ppo_epochs", c.int(A + "ppo_epochs"), A + "ppo_epochs")
    longest = c.int("data.max_prompt_length") + c.int("data.max_response_length")
    micro = c.get(A + "ppo_micro_batch_size_per_gpu")
    if as_bool(c.get(A + "use_dynamic_bsz")):
        tokens = c.int(A + "ppo_max_token_len_per_gpu")
        c.put(
            "trainer",
            "micro_batch_tokens",
            max(tokens, longest),
            A + "use_dynamic_bsz",
            A + "ppo_max_token_len_per_gpu",
            note="at least one whole sequence" if tokens < longest else "",
        )
        c.use(A + "ppo_micro_batch_size_per_gpu", A + "ppo_micro_batch_size")
    elif micro is not None:
        c.put(
            "trainer",
            "micro_batch_tokens",
            c.int(A + "ppo_micro_batch_size_per_gpu") * longest,
            A + "ppo_micro_batch_size_per_gpu",
            "data.max_prompt_length",
            "data.max_response_length",
            note=f"{micro} sequences x {longest} tokens",
        )
        c.use(A + "use_dynamic_bsz", A + "ppo_max_token_len_per_gpu", A + "ppo_micro_batch_size")
    else:
        c.use(A + "use_dynamic_bsz", A + "ppo_max_token_len_per_gpu", A + "ppo_micro_batch_size_per_gpu")
        c.skip(
            A + "ppo_micro_batch_size",
            "rlcore packs rows by tokens: set ppo_micro_batch_size_per_gpu or "
            "use_dynamic_bsz with ppo_max_token_len_per_gpu to convert it",
        )
    for key in (
        "log_prob_micro_batch_size",
        "log_prob_micro_batch_size_per_gpu",
        "log_prob_use_dynamic_bsz",
        "log_prob_max_token_len_per_gpu",
    ):
        for role in (REF, R):
            c.skip(
                role + key,
                "rlcore's forward passes (old, reference log-probs) use [trainer] micro_batch_tokens too",
            )


@rule
def policy_loss(c: Conversion) -> None:
    mode = c.get(A + "policy_loss.loss_mode")
    low = c.get(A + "clip_ratio_low")
    high = c.get(A + "clip_ratio_high")
    base = c.get(A + "clip_ratio")
    # verl uses clip_ratio only where clip_ratio_low / clip_ratio_high are null.
    low_key = A + "clip_ratio_low" if low is not None else A + "clip_ratio"
    high_key = A + "clip_ratio_high" if high is not None else A + "clip_ratio"
    low, high = (base if low is None else low), (base if high is None else high)
    c.use(A + "clip_ratio")
    if mode == "vanilla":
        c.put("algorithm", "policy_loss", "ppo_clip", A + "policy_loss.loss_mode")
        c.put("algorithm", "clip_ratio_low", float(low), low_key)
        c.put("algorithm", "clip_ratio_high", float(high), high_key)
        c.put("algorithm", "clip_ratio_c", c.float(A + "clip_ratio_c"), A + "clip_ratio_c")
    elif mode == "gspo":
        c.put("algorithm", "policy_loss", "gspo", A + "policy_loss.loss_mode")
        c.put("algorithm", "clip_ratio_low", float(low), low_key)
        c.put("algorithm", "clip_ratio_high", float(high), high_key)
        c.skip(A + "clip_ratio_c", "GSPO has no dual clip")
    else:
        c.skip(
            A + "policy_loss.loss_mode",
            f"{mode!r}: rlcore's policy losses are ppo_clip (verl's vanilla) and "
            "gspo; a plugin can add others (hook rlcore_policy_losses)",
            essential=True,
        )
        c.use(A + "clip_ratio_low", A + "clip_ratio_high", A + "clip_ratio_c")
    for key in ("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub", "kl_cov_ratio", "ppo_kl_coef"):
        c.skip(
            A + "policy_loss." + key,
            f"an option of verl's {key.split('_')[0]}_cov / kl losses, not of {mode!r}"
            if mode == "vanilla"
            else "an option of another verl loss mode, not mapped",
        )
    for key in ("tau_pos", "tau_neg"):
        c.skip(A + key, "an option of verl's SAPO loss, which rlcore does not have")
    agg = c.get(A + "loss_agg_mode")
    if agg in SUPPORTED_AGGREGATIONS:
        c.put("algorithm", "loss_agg_mode", agg, A + "loss_agg_mode")
    else:
        c.skip(
            A + "loss_agg_mode",
            f"{agg!r}: rlcore aggregates by {', '.join(SUPPORTED_AGGREGATIONS)}",
            essential=True,
            always=True,
        )
    factor = c.get(A + "loss_scale_factor")
    if factor is not None and agg == "seq-mean-token-sum-norm":
        c.put("algorithm", "loss_norm_length", int(factor), A + "loss_scale_factor")
    elif factor is not None:
        c.skip(A + "loss_scale_factor", "verl uses it only with loss_agg_mode = seq-mean-token-sum-norm")
    else:
        c.use(A + "loss_scale_factor")
    c.put("algorithm", "entropy_coef", c.float(A + "entropy_coeff"), A + "entropy_coeff")


SUPPORTED_AGGREGATIONS = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)
# verl's names of its advantage estimators -> rlcore's.
ESTIMATORS = {"gae": "gae", "grpo": "grpo", "rloo": "rloo", "reinforce_plus_plus": "reinforce_pp"}
# verl's KL estimators (kl_loss_type, kl_penalty) -> rlcore's kl_estimator.
KL_ESTIMATORS = {"kl": "k1", "k1": "k1", "mse": "k2", "k2": "k2", "low_var_kl": "k3", "k3": "k3"}


@rule
def advantage(c: Conversion) -> None:
    name = c.get("algorithm.adv_estimator")
    if name not in ESTIMATORS:
        c.skip(
            "algorithm.adv_estimator",
            f"{name!r}: rlcore's estimators are {', '.join(ESTIMATORS)} (in verl's "
            "names); a plugin can add others (hook rlcore_advantage_estimators)",
            essential=True,
            always=True,
        )
        c.use("algorithm.norm_adv_by_std_in_grpo", "algorithm.gamma", "algorithm.lam")
        return
    c.put("algorithm", "advantage", ESTIMATORS[name], "algorithm.adv_estimator")
    if name == "grpo":
        c.put(
            "algorithm",
            "norm_by_std",
            as_bool(c.get("algorithm.norm_adv_by_std_in_grpo")),
            "algorithm.norm_adv_by_std_in_grpo",
            note="false: Dr. GRPO",
        )
    else:
        c.skip("algorithm.norm_adv_by_std_in_grpo", f"an option of grpo, not of {name}")
    if name == "gae":
        c.put("algorithm", "gamma", c.float("algorithm.gamma"), "algorithm.gamma")
        c.put("algorithm", "lam", c.float("algorithm.lam"), "algorithm.lam")
    elif name == "reinforce_plus_plus":
        c.put("algorithm", "gamma", c.float("algorithm.gamma"), "algorithm.gamma")
        c.skip("algorithm.lam", "an option of gae")
    else:
        for key in ("algorithm.gamma", "algorithm.lam"):
            c.skip(key, f"{name} scores whole sequences: no discount")


@rule
def kl(c: Conversion) -> None:
    """rlcore has one KL term: a loss term (verl's use_kl_loss) or a reward penalty (use_kl_in_reward)."""
    in_loss, in_reward = as_bool(c.get(A + "use_kl_loss")), as_bool(c.get("algorithm.use_kl_in_reward"))
    c.use(A + "use_kl_loss", "algorithm.use_kl_in_reward")
    if in_loss and in_reward:
        c.skip(
            "algorithm.use_kl_in_reward",
            "rlcore applies one KL term, in the loss or in the reward, not both: the loss's is written",
            essential=True,
            always=True,
        )
    if in_loss:
        estimator = c.get(A + "kl_loss_type")
        c.put("algorithm", "kl_coef", c.float(A + "kl_loss_coef"), A + "use_kl_loss", A + "kl_loss_coef")
        map_kl_estimator(c, A + "kl_loss_type", estimator)
        c.use("algorithm.kl_penalty", "algorithm.kl_ctrl.kl_coef", "algorithm.kl_ctrl.type")
    elif in_reward:
        c.put("algorithm", "kl_in_reward", True, "algorithm.use_kl_in_reward")
        c.put("algorithm", "kl_coef", c.float("algorithm.kl_ctrl.kl_coef"), "algorithm.kl_ctrl.kl_coef")
        map_kl_estimator(c, "algorithm.kl_penalty", c.get("algorithm.kl_penalty"))
        if c.get("algorithm.kl_ctrl.type") != "fixed":
            c.skip(
                "algorithm.kl_ctrl.type",
                "rlcore's KL coefficient is fixed (no adaptive controller)",
                essential=True,
            )
        else:
            c.use("algorithm.kl_ctrl.type")
        c.use(A + "kl_loss_coef", A + "kl_loss_type")
    else:
        c.put(
            "algorithm",
            "kl_coef",
            0.0,
            A + "use_kl_loss",
            "algorithm.use_kl_in_reward",
            note="no reference model",
        )
        c.use(
            A + "kl_loss_coef",
            A + "kl_loss_type",
            "algorithm.kl_penalty",
            "algorithm.kl_ctrl.kl_coef",
            "algorithm.kl_ctrl.type",
        )
    for key in ("algorithm.kl_ctrl.horizon", "algorithm.kl_ctrl.target_kl"):
        c.skip(key, "options of verl's adaptive KL controller, which rlcore does not have")


def map_kl_estimator(c: Conversion, key: str, name: Any) -> None:
    if name in KL_ESTIMATORS:
        c.put("algorithm", "kl_estimator", KL_ESTIMATORS[name], key)
    else:
        c.skip(
            key,
            f"{name!r}: rlcore's KL estimators are k1 (verl's kl), k2 (mse) and k3 (low_var_kl)",
            essential=True,
            always=True,
        )


@rule
def rollout_correction(c: Conversion) -> None:
    p = "algorithm.rollout_correction."
    level, threshold = c.get(p + "rollout_is"), c.get(p + "rollout_is_threshold")
    if level in ("token", "sequence"):
        c.put("algorithm", "rollout_correction", f"{level}_truncate", p + "rollout_is")
        c.put("algorithm", "rollout_is_threshold", float(threshold), p + "rollout_is_threshold")
    elif level is None:
        c.use(p + "rollout_is", p + "rollout_is_threshold")
    else:
        c.skip(p + "rollout_is", f"{level!r}: rlcore corrects per token or per sequence", essential=True)
    if c.get(p + "rollout_rs") is not None:
        c.skip(
            p + "rollout_rs",
            'rlcore\'s rejection is rollout_correction = "token_mask" / "sequence_mask" '
            "(the ratio itself within bounds); verl's k1/k3 divergence criteria are not there",
            essential=True,
        )
    else:
        c.use(p + "rollout_rs", p + "rollout_rs_threshold")
    if as_bool(c.get(p + "bypass_mode")):
        c.skip(
            p + "bypass_mode",
            "rlcore always computes the old log-probs with the trainer (decoupled mode)",
            essential=True,
        )
    else:
        c.use(p + "bypass_mode", p + "loss_type")
    if as_bool(c.get(p + "rollout_is_batch_normalize")):
        c.skip(
            p + "rollout_is_batch_normalize",
            "rlcore does not renormalise the importance weights",
            essential=True,
        )
    else:
        c.use(p + "rollout_is_batch_normalize")


@rule
def critic(c: Conversion) -> None:
    keys = [k for k in c.cfg.values if k.startswith("critic.")]
    if c.get("algorithm.adv_estimator") != "gae":
        for key in keys:
            c.skip(key, "the estimator needs no critic")
        return
    path = c.get("critic.model.path")
    if c.given("critic.model.path") and path != c.get(M + "path"):
        c.put("critic", "path", rebase(path, c.options, local_only=True), "critic.model.path")
    else:
        c.use("critic.model.path")
    c.put("critic", "lr", c.float("critic.optim.lr"), "critic.optim.lr")
    c.put(
        "critic",
        "warmup_steps",
        warmup_steps(c, "critic.optim."),
        "critic.optim.lr_warmup_steps",
        "critic.optim.lr_warmup_steps_ratio",
    )
    c.put("critic", "value_clip", c.float("critic.cliprange_value"), "critic.cliprange_value")
    if c.get("critic.model.lora_rank") and c.int("critic.model.lora_rank") > 0:
        c.skip("critic.model.lora_rank", "rlcore's critic is trained in full", essential=True)
    shared = {
        "critic.optim.weight_decay": "[trainer] weight_decay",
        "critic.optim.betas": "[trainer] betas",
        "critic.grad_clip": "[trainer] grad_clip",
        "critic.optim.clip_grad": "[trainer] grad_clip",
        "critic.ppo_micro_batch_size_per_gpu": "[trainer] micro_batch_tokens",
        "critic.ppo_max_token_len_per_gpu": "[trainer] micro_batch_tokens",
        "critic.forward_max_token_len_per_gpu": "[trainer] micro_batch_tokens",
        "critic.ppo_mini_batch_size": "[algorithm] mini_batches",
        "critic.ppo_epochs": "[algorithm] ppo_epochs",
        "critic.model.enable_gradient_checkpointing": "[model] gradient_checkpointing",
        "critic.model.fsdp_config.param_offload": "[trainer] fsdp_offload",
        "critic.model.fsdp_config.optimizer_offload": "[trainer] fsdp_offload",
        "critic.model.trust_remote_code": "[model] trust_remote_code",
    }
    for key, where in shared.items():
        if c.given(key) and c.get(key) != c.get(_actor_twin(key)):
            c.skip(key, f"the critic shares the actor's {where}; the actor's value is used")
        else:
            c.use(key)
    for key in keys:
        if key not in c.handled:
            reason = explained(key)
            c.skip(key, reason[0] if reason else "no meaning for rlcore's critic")


def _actor_twin(critic_key: str) -> str:
    twins = {
        "critic.optim.": A + "optim.",
        "critic.grad_clip": A + "grad_clip",
        "critic.ppo_micro_batch_size_per_gpu": A + "ppo_micro_batch_size_per_gpu",
        "critic.ppo_max_token_len_per_gpu": A + "ppo_max_token_len_per_gpu",
        "critic.forward_max_token_len_per_gpu": A + "ppo_max_token_len_per_gpu",
        "critic.ppo_mini_batch_size": A + "ppo_mini_batch_size",
        "critic.ppo_epochs": A + "ppo_epochs",
        "critic.model.enable_gradient_checkpointing": M + "enable_gradient_checkpointing",
        "critic.model.fsdp_config.": A + "fsdp_config.",
        "critic.model.trust_remote_code": M + "trust_remote_code",
    }
    for prefix, twin in twins.items():
        if critic_key.startswith(prefix):
            return twin + critic_key[len(prefix) :] if prefix.endswith(".") else twin
    return critic_key


ENGINES = {"vllm": "vllm", "sglang": "sglang", "hf": "hf"}


@rule
def rollout(c: Conversion) -> None:
    name = c.get(R + "name")
    if name in ENGINES:
        engine = ENGINES[name]
        c.put("rollout", "engine", engine, R + "name")
    else:
        engine = "hf"
        why = (
            "not set (verl requires it)"
            if name == "???"
            else f"{name!r}: rlcore's engines are vllm, sglang and hf"
        )
        c.skip(R + "name", f"{why}; the manifest uses rlcore's embedded hf engine", always=True)
    c.put("rollout", "samples_per_prompt", c.int(R + "n"), R + "n")
    greedy = not as_bool(c.get(R + "do_sample"))
    c.put(
        "rollout",
        "temperature",
        0.0 if greedy else c.float(R + "temperature"),
        R + "temperature",
        R + "do_sample",
    )
    c.put("rollout", "top_p", c.float(R + "top_p"), R + "top_p")
    c.put("rollout", "top_k", c.int(R + "top_k"), R + "top_k")
    v = R + "val_kwargs."
    val_greedy = not as_bool(c.get(v + "do_sample"))
    c.put(
        "rollout",
        "val_temperature",
        0.0 if val_greedy else c.float(v + "temperature"),
        v + "temperature",
        v + "do_sample",
    )
    c.put("rollout", "val_samples_per_prompt", c.int(v + "n"), v + "n")
    for key, train_key in (("top_p", "top_p"), ("top_k", "top_k")):
        if not val_greedy and c.get(v + key) != c.get(R + train_key):
            c.skip(
                v + key,
                f"rlcore validates with [rollout] {train_key} ({c.get(R + train_key)}); a separate "
                "validation value is not supported",
                essential=False,
                always=True,
            )
        else:
            c.use(v + key)
    engine_options(c, engine)


# verl rollout keys -> the vllm / sglang engines' options (both take these names; sglang's are aliases).
ENGINE_OPTIONS = {
    "gpu_memory_utilization": "gpu_memory_utilization",
    "tensor_model_parallel_size": "tensor_parallel_size",
    "max_num_seqs": "max_num_seqs",
    "max_model_len": "max_model_len",
    "enable_prefix_caching": "enable_prefix_caching",
    "enforce_eager": "enforce_eager",
}
# verl rollout keys passed to vLLM as engine arguments.
VLLM_ENGINE_ARGS = ("max_num_batched_tokens", "enable_chunked_prefill")


def engine_options(c: Conversion, engine: str) -> None:
    keys = [*ENGINE_OPTIONS, *VLLM_ENGINE_ARGS, "logprobs_mode"]
    if engine == "hf":
        for key in keys:
            c.skip(
                R + key,
                "an option of the vllm and sglang engines; the hf engine shares the actor's weights "
                "and memory",
            )
        c.use(R + "engine_kwargs.vllm", R + "engine_kwargs.sglang")
        return
    for key, option in ENGINE_OPTIONS.items():
        value = c.get(R + key)
        if value is None:
            c.use(R + key)
            continue
        c.put("rollout", option, value, R + key)
    if engine == "vllm":
        c.put("rollout", "logprobs_mode", c.get(R + "logprobs_mode"), R + "logprobs_mode")
    else:
        c.skip(R + "logprobs_mode", "an option of the vllm engine")
    args = dict(c.cfg.table(R + f"engine_kwargs.{engine}"))
    sources = [
        R + f"engine_kwargs.{engine}",
        *[k for k in c.cfg.values if k.startswith(R + f"engine_kwargs.{engine}.")],
    ]
    if engine == "vllm":
        for key in VLLM_ENGINE_ARGS:
            args.setdefault(key, c.get(R + key))
            sources.append(R + key)
    else:
        for key in VLLM_ENGINE_ARGS:
            c.skip(R + key, "a vLLM engine argument; give SGLang's own in engine_kwargs.sglang")
    if args:
        c.put("rollout", "engine_args", args, *sources)
    else:
        c.use(*sources)
    other = "sglang" if engine == "vllm" else "vllm"
    c.skip(R + f"engine_kwargs.{other}", f"arguments of the {other} engine; the manifest uses {engine}")


@rule
def parallelism(c: Conversion) -> None:
    """FSDP offload is one key in rlcore; sequence parallelism, Megatron and TP for training are not there."""
    offload_keys = [
        A + "fsdp_config.param_offload",
        A + "fsdp_config.optimizer_offload",
        A + "fsdp_config.offload_policy",
    ]
    values = [as_bool(c.get(k)) for k in offload_keys]
    c.put("trainer", "fsdp_offload", any(values), *offload_keys)
    if any(values) and not all(values[:2]):
        on = [k.rsplit(".", 1)[1] for k, v in zip(offload_keys, values) if v]
        c.unmapped.append(
            Unmapped(
                offload_keys[0],
                f"verl offloads only {', '.join(on)}; rlcore's fsdp_offload keeps "
                "parameters, gradients and optimizer state on the CPU together",
                False,
                None,
            )
        )
    if as_bool(c.get(A + "fsdp_config.full_determinism")):
        c.put("run", "deterministic", True, A + "fsdp_config.full_determinism")
    else:
        c.use(A + "fsdp_config.full_determinism")
    for key in (
        A + "ulysses_sequence_parallel_size",
        A + "fsdp_config.ulysses_sequence_parallel_size",
        REF + "ulysses_sequence_parallel_size",
        "critic.ulysses_sequence_parallel_size",
    ):
        if c.int(key, 1) > 1:
            c.skip(
                key,
                "rlcore has no sequence parallelism (Ulysses): each rank holds whole sequences "
                "(long ones: lower micro_batch_tokens, or fsdp_offload)",
            )
        else:
            c.use(key)
    for key in (A + "strategy", "critic.strategy"):
        if str(c.get(key)).startswith("megatron"):
            c.skip(
                key,
                "rlcore trains with FSDP2, not Megatron-LM (the manifest trains the same model with FSDP2)",
            )
        else:
            c.use(key)


@rule
def reward(c: Conversion) -> None:
    manager = c.get("reward_model.reward_manager")
    c.use("reward_model.reward_manager", "reward_manager.name", "reward_manager.source")
    if c.given("reward_manager.name"):
        manager = c.get("reward_manager.name")
    if c.given("reward.reward_manager.name"):
        manager = c.get("reward.reward_manager.name")
        c.use("reward.reward_manager.name")
    path = c.get("custom_reward_function.path")
    if path:
        name = c.get("custom_reward_function.name") or "compute_score"
        c.put(
            "reward",
            "function",
            f"python:{rebase(path, c.options)}:{name}",
            "custom_reward_function.path",
            "custom_reward_function.name",
            note="verl's compute_score signature is taken as it is",
        )
        kwargs = c.cfg.table("custom_reward_function.reward_kwargs")
        if kwargs:
            c.skip(
                "custom_reward_function.reward_kwargs",
                "rlcore calls a python: reward with verl's four arguments; "
                "bind the extra keyword arguments in the file (functools.partial)",
                essential=True,
                always=True,
            )
    elif as_bool(c.get("reward_model.enable")):
        c.put("reward", "function", "reward_model", "reward_model.enable", note="rlcore-reward-model")
        c.put(
            "reward",
            "path",
            rebase(c.get("reward_model.model.path"), c.options, local_only=True),
            "reward_model.model.path",
        )
        if c.get("reward_model.micro_batch_size_per_gpu"):
            c.put(
                "reward",
                "batch_size",
                c.int("reward_model.micro_batch_size_per_gpu"),
                "reward_model.micro_batch_size_per_gpu",
            )
        if c.get("reward_model.max_length"):
            c.put("reward", "max_length", c.int("reward_model.max_length"), "reward_model.max_length")
        if as_bool(c.get("reward_model.model.trust_remote_code")):
            c.put("reward", "trust_remote_code", True, "reward_model.model.trust_remote_code")
        c.use(
            "reward_model.model.path",
            "reward_model.micro_batch_size_per_gpu",
            "reward_model.max_length",
            "reward_model.model.trust_remote_code",
            "custom_reward_function.name",
        )
    else:
        c.put(
            "reward",
            "function",
            "verl",
            "custom_reward_function.path",
            "reward_model.reward_manager",
            note="verl's default scorer: each row by its data_source (rlcore-reward-rule)",
        )
        c.use("custom_reward_function.name")
    if manager not in ("naive", "prime", "dapo"):
        c.skip(
            "reward_model.reward_manager",
            f"{manager!r}: rlcore scores each row by itself (verl's naive), in "
            "parallel worker processes (prime); other reward managers are not supported",
            essential=True,
            always=True,
        )
    if c.get("reward_manager.module.path"):
        c.skip(
            "reward_manager.module.path",
            "a custom reward manager class: write a batched reward plugin instead "
            "(batched = True, score_batch)",
            essential=True,
        )
    else:
        c.use("reward_manager.module.path", "reward_manager.module.name")
    if c.get("reward_model.sandbox_fusion.url"):
        c.skip(
            "reward_model.sandbox_fusion.url",
            "verl's code scorers are not in rlcore; the python tool's sandbox "
            "(rlcore sandbox serve) serves tool calls, not rewards",
            essential=True,
        )
    else:
        c.use("reward_model.sandbox_fusion.url")


@rule
def dapo(c: Conversion) -> None:
    """The DAPO recipe's keys -> the rlcore-algo-dapo plugin's tables: [filters.dynamic_sampling]
    (its metric, its rounds and what happens when they run out, always written, so the table is
    there), [data] gen_batch_size (over-generation) and [shapers.overlong]."""
    filtering = as_bool(c.get("algorithm.filter_groups.enable"))
    if filtering:
        c.handled.add("algorithm.filter_groups.enable")
        rounds = max(0, c.int("algorithm.filter_groups.max_num_gen_batches", 0))
        c.put(
            DYNAMIC_SAMPLING,
            "max_generation_rounds",
            rounds,
            "algorithm.filter_groups.enable",
            "algorithm.filter_groups.max_num_gen_batches",
            note="0 = unlimited" if not rounds else "",
        )
        c.put(
            DYNAMIC_SAMPLING,
            "on_exhausted",
            "raise",
            "algorithm.filter_groups.max_num_gen_batches",
            note="verl stops the run when its rounds are used up",
        )
        _filter_metric(c)
    else:
        c.use(
            "algorithm.filter_groups.enable",
            "algorithm.filter_groups.max_num_gen_batches",
            "algorithm.filter_groups.metric",
        )
    gen = c.get("data.gen_batch_size")
    c.use("data.gen_batch_size")
    if gen is not None and c.int("data.gen_batch_size") != c.int("data.train_batch_size"):
        if filtering:
            c.put(
                "data",
                "gen_batch_size",
                c.int("data.gen_batch_size"),
                "data.gen_batch_size",
                note="prompts generated a round; the step keeps prompts_per_step informative groups",
            )
        else:
            c.skip(
                "data.gen_batch_size",
                f"{gen}: without filter_groups verl trains every generated group, "
                f"{gen} a step, where rlcore trains data.train_batch_size = {c.get('data.train_batch_size')}; "
                "set data.train_batch_size to it",
                essential=True,
                always=True,
            )
    on, length, factor, sources, max_len_key = _overlong(c)
    if on:
        c.put(OVERLONG, "buffer", int(length), *sources[:2])
        c.put(OVERLONG, "penalty", float(factor), sources[2])
        max_len = c.get(max_len_key)
        if max_len is not None and c.int(max_len_key) != c.int("data.max_response_length"):
            c.skip(
                max_len_key,
                f"{max_len}: rlcore's overlong buffer ends at data.max_response_tokens "
                f"({c.get('data.max_response_length')})",
                essential=True,
            )
        else:
            c.use(max_len_key)


def _filter_metric(c: Conversion) -> None:
    """verl's filter_groups.metric -> [filters.dynamic_sampling] metric. verl's acc is the reward's
    acc field (its score, before the overlong penalty, when it returns a plain number); seq_reward
    the score with the penalty; seq_final_reward that with the KL penalty in the reward too; score
    the reward's own score field, before the penalty."""
    key = "algorithm.filter_groups.metric"
    metric = c.get(key)
    if metric in (None, "acc"):
        c.put(
            DYNAMIC_SAMPLING,
            "metric",
            "acc",
            key,
            note="" if metric else "verl's DAPO scripts' acc (the key was not set)",
        )
    elif metric == "seq_reward" or (
        metric == "seq_final_reward" and not as_bool(c.get("algorithm.use_kl_in_reward"))
    ):
        c.put(DYNAMIC_SAMPLING, "metric", "score", key, note="the score with the overlong penalty")
    elif metric == "score":
        c.put(
            DYNAMIC_SAMPLING,
            "metric",
            "acc",
            key,
            note="the reward's score before the overlong penalty, or the acc it reports (math_dapo: the same groups)",
        )
    elif metric == "seq_final_reward":
        c.skip(
            key,
            "seq_final_reward with use_kl_in_reward: rlcore filters on the score (with the overlong penalty) "
            'or the correctness, never on the KL penalty; metric = "score" is the nearest',
            essential=True,
        )
    else:
        c.skip(
            key,
            f"{metric!r}: a field of verl's reward output; rlcore's dynamic sampling filters on acc (the "
            "reward's acc, else its score) or score (with the overlong penalty)",
            essential=True,
        )


DYNAMIC_SAMPLING, OVERLONG = "filters.dynamic_sampling", "shapers.overlong"  # rlcore-algo-dapo's tables
_OVERLONG_LAYOUTS = (
    ("reward.reward_kwargs.overlong_buffer_cfg.", "reward.reward_kwargs.max_resp_len"),
    ("reward_model.reward_kwargs.overlong_buffer_cfg.", "reward_model.reward_kwargs.max_resp_len"),
    ("reward_model.overlong_buffer.", "reward_model.reward_kwargs.max_resp_len"),
)


def _overlong(c: Conversion) -> tuple[bool, Any, Any, tuple[str, str, str], str]:
    """(enabled, length, penalty factor, (enable, len, factor keys), max_resp_len key) of the DAPO
    overlong buffer, in whichever layout the command used."""
    for prefix, max_len_key in _OVERLONG_LAYOUTS:
        c.use(*(prefix + k for k in ("enable", "len", "penalty_factor", "log")), max_len_key)
    for prefix, max_len_key in _OVERLONG_LAYOUTS:
        if as_bool(c.get(prefix + "enable")):
            keys = (prefix + "enable", prefix + "len", prefix + "penalty_factor")
            return True, c.get(prefix + "len"), c.get(prefix + "penalty_factor"), keys, max_len_key
    return False, 0, 0.0, ("", "", ""), ""


@rule
def trainer(c: Conversion) -> None:
    t = "trainer."
    save = c.int(t + "save_freq", -1)
    c.put(
        "trainer",
        "save_every",
        max(save, 0),
        t + "save_freq",
        note="" if save > 0 else "verl: never; rlcore still saves at the end",
    )
    test = c.int(t + "test_freq", -1)
    c.put(
        "trainer",
        "eval_every",
        max(test, 0),
        t + "test_freq",
        note="" if test > 0 else "verl: never during training; rlcore also evaluates at the end",
    )
    c.put("trainer", "eval_before_train", as_bool(c.get(t + "val_before_train")), t + "val_before_train")
    c.put("trainer", "log_val_generations", c.int(t + "log_val_generations", 0), t + "log_val_generations")
    keep = c.get(t + "max_actor_ckpt_to_keep")
    if keep not in (None, -1) and c.int(t + "max_actor_ckpt_to_keep") > 0:
        c.put(
            "trainer", "keep_checkpoints", c.int(t + "max_actor_ckpt_to_keep"), t + "max_actor_ckpt_to_keep"
        )
    else:
        c.skip(
            t + "max_actor_ckpt_to_keep",
            "verl keeps every checkpoint; rlcore keeps [trainer] keep_checkpoints (default 2)",
        )
    c.use(t + "max_critic_ckpt_to_keep")
    loggers(c)
    run_directory(c)
    if c.int(t + "critic_warmup", 0) > 0:
        c.skip(t + "critic_warmup", "rlcore updates the actor from the first step", essential=True)
    else:
        c.use(t + "critic_warmup")
    if as_bool(c.get(t + "val_only")):
        c.skip(
            t + "val_only",
            "evaluation only is a command of its own: rlcore eval MANIFEST --checkpoint PATH",
            essential=True,
        )
    else:
        c.use(t + "val_only")
    if c.get(t + "resume_from_path"):
        c.skip(
            t + "resume_from_path",
            "rlcore run --resume continues from the run directory's newest intact "
            "checkpoint; point [run] output_dir and name at that run",
            essential=True,
        )
    else:
        c.use(t + "resume_from_path")
    mode = c.get(t + "resume_mode")
    if c.given(t + "resume_mode") and mode != "disable":
        c.skip(t + "resume_mode", f"{mode!r}: rlcore resumes when asked: rlcore run MANIFEST --resume")
    else:
        c.use(t + "resume_mode")
    if c.get(t + "device") not in ("cuda", None):
        c.skip(t + "device", f"{c.get(t + 'device')!r}: rlcore runs on CUDA GPUs or the CPU", essential=True)
    else:
        c.use(t + "device")
    profiler(c)


def loggers(c: Conversion) -> None:
    names = {"console": "console", "wandb": "wandb", "tensorboard": "tensorboard"}
    given = as_list(c.get("trainer.logger"))
    chosen = [names[n] for n in given if n in names]
    missing = [n for n in given if n not in names]
    c.put(
        "trainer",
        "loggers",
        ["jsonl", *chosen] if "jsonl" not in chosen else chosen,
        "trainer.logger",
        note="and jsonl: rlcore's metrics.jsonl",
    )
    if missing:
        c.unmapped.append(
            Unmapped(
                "trainer.logger",
                f"{', '.join(missing)}: rlcore's metrics sinks are console, jsonl, tensorboard and wandb",
                False,
                c.cfg.origin("trainer.logger"),
            )
        )
    if "wandb" in chosen:
        c.put("loggers.wandb", "project", c.get("trainer.project_name"), "trainer.project_name")
        c.put("loggers.wandb", "mode", "online", "trainer.logger", note="verl logs to wandb online")
    else:
        c.use("trainer.project_name")


def run_directory(c: Conversion) -> None:
    """verl writes checkpoints to default_local_dir (checkpoints/PROJECT/EXPERIMENT); rlcore writes
    the whole run into output_dir/name."""
    name = str(c.get("trainer.experiment_name"))
    local = c.get("trainer.default_local_dir")
    if c.given("trainer.default_local_dir") and local:
        parent, leaf = os.path.split(str(local).rstrip("/"))
        c.put("run", "name", leaf, "trainer.default_local_dir", note="the run directory is output_dir/name")
        c.put("run", "output_dir", rebase(parent or ".", c.options), "trainer.default_local_dir")
        c.use("trainer.experiment_name")
        if leaf != name and c.given("trainer.experiment_name"):
            c.unmapped.append(
                Unmapped(
                    "trainer.experiment_name",
                    f"{name!r}: the run is named after default_local_dir's last part, {leaf!r}",
                    False,
                    c.cfg.origin("trainer.experiment_name"),
                )
            )
    else:
        c.put("run", "name", name, "trainer.experiment_name")
        c.put(
            "run",
            "output_dir",
            rebase(f"checkpoints/{c.get('trainer.project_name')}", c.options),
            "trainer.default_local_dir",
            "trainer.project_name",
            note="verl's checkpoints/PROJECT",
        )


def profiler(c: Conversion) -> None:
    tool, steps = c.get("global_profiler.tool"), c.get("global_profiler.steps")
    c.use("global_profiler.tool", "global_profiler.steps")
    if tool is None:
        return
    if tool in ("torch", "torch_memory") and steps:
        key = "profile_steps" if tool == "torch" else "memory_snapshot_steps"
        c.put(
            "trainer",
            key,
            c.numbers("global_profiler.steps", int),
            "global_profiler.tool",
            "global_profiler.steps",
        )
    elif tool in ("torch", "torch_memory"):
        c.skip("global_profiler.steps", "no steps given: rlcore profiles the steps it is told", always=True)
    else:
        c.skip(
            "global_profiler.tool",
            f"{tool!r}: rlcore profiles with the torch profiler (profile_steps) and CUDA "
            "memory snapshots (memory_snapshot_steps)",
        )


@rule
def launcher(c: Conversion) -> None:
    """verl runs its workers on Ray: one GPU each, nnodes x n_gpus_per_node of them."""
    nodes, gpus = c.int("trainer.nnodes"), c.int("trainer.n_gpus_per_node")
    sources = ("trainer.nnodes", "trainer.n_gpus_per_node")
    choice = c.options.launcher
    if choice == "auto":
        choice = "ray" if (c.options.ray_job or nodes * gpus > 1) else "local"
    if choice == "local":
        c.use(*sources)
        if nodes * gpus > 1:
            c.unmapped.append(
                Unmapped(
                    "trainer.n_gpus_per_node",
                    f"{nodes} x {gpus} GPUs: the local launcher runs "
                    f"one rank; start it with torchrun --nproc-per-node {gpus}",
                    False,
                    None,
                )
            )
        return
    if choice == "slurm":
        c.put("launcher", "name", "slurm", *sources, note="rlcore-launcher-slurm")
        c.put("launcher", "nodes", nodes, "trainer.nnodes")
        c.put("launcher", "gpus_per_node", gpus, "trainer.n_gpus_per_node")
        return
    c.put("launcher", "name", "ray", *sources, note="rlcore-launcher-ray; verl's workers run on Ray too")
    c.put("launcher", "workers", nodes * gpus, *sources, note=f"{nodes} node(s) x {gpus} GPUs")
    c.put("launcher", "gpus_per_worker", 1 if gpus > 0 else 0, "trainer.n_gpus_per_node")
    if c.options.ray_job:
        c.put("launcher", "job", True, note="the script submits it with ray job submit", given=True)
        if c.options.ray_job_address:
            c.put(
                "launcher", "address", c.options.ray_job_address, note="ray job submit's address", given=True
            )
    elif nodes > 1:
        c.put(
            "launcher",
            "address",
            "auto",
            "trainer.nnodes",
            note="the running cluster (ray start on every node)",
        )


@rule
def agent(c: Conversion) -> None:
    t = R + "multi_turn."
    tools = c.get(t + "tool_config_path") or c.get("data.tool_config_path")
    enabled = (
        as_bool(c.get(t + "enable")) or bool(tools) or c.get(R + "agent.default_agent_loop") == "tool_agent"
    )
    c.use(t + "enable", "data.tool_config_path", R + "agent.default_agent_loop")
    multi_turn_keys = [k for k in c.cfg.values if k.startswith(t)]
    if not enabled:
        for key in multi_turn_keys:
            c.skip(key, "multi-turn is off (multi_turn.enable = false)")
        return
    c.put("agent", "loop", "tool", t + "enable", note="rlcore-agent")
    if tools:
        c.put(
            "agent",
            "tool_config",
            rebase(tools, c.options),
            t + "tool_config_path",
            note="verl's file format",
        )
    if c.get(t + "max_assistant_turns"):
        c.put("agent", "max_turns", c.int(t + "max_assistant_turns"), t + "max_assistant_turns")
    c.put("agent", "max_calls_per_turn", c.int(t + "max_parallel_calls"), t + "max_parallel_calls")
    fmt = c.get(t + "format")
    if fmt in ("hermes",):
        c.put("agent", "parser", fmt, t + "format")
    else:
        c.skip(t + "format", f"{fmt!r}: rlcore's tool loop parses hermes or JSON tool calls", essential=True)
    if c.get(t + "interaction_config_path"):
        c.skip(
            t + "interaction_config_path",
            "verl's interactions (a simulated user) are not in rlcore",
            essential=True,
        )
    c.skip(
        t + "max_tool_response_length",
        "rlcore cuts tool results by characters: [agent] max_tool_response_chars",
    )
    for key in multi_turn_keys:
        if key not in c.handled:
            c.skip(key, "no meaning for rlcore's tool loop")
    if c.get(R + "agent.agent_loop_config_path"):
        c.skip(
            R + "agent.agent_loop_config_path",
            "rlcore's agent loops are plugins (hook rlcore_agent_loops)",
            essential=True,
        )


# ----------------------------------------------------------------------------- keys rlcore has no use for

NO_MEANING = "no meaning in rlcore"
# (pattern, reason, essential when the user sets it): fnmatch patterns over verl's keys.
EXPLAINED: tuple[tuple[str, str, bool], ...] = (
    ("*._target_", "verl's config class name", False),
    (
        "*.profiler.*",
        "verl's per-role profiler; rlcore: [trainer] profile_steps and memory_snapshot_steps",
        False,
    ),
    (
        "global_profiler.*",
        "verl's profiler; rlcore: [trainer] profile_steps and memory_snapshot_steps",
        False,
    ),
    (
        "actor_rollout_ref.ref.*",
        "the reference is the base model under LoRA, else a frozen copy in the compute "
        "dtype; it has no options of its own",
        False,
    ),
    (
        "actor_rollout_ref.actor.fsdp_config.*",
        "FSDP2 is configured by rlcore (one shard per rank, offload by [trainer] fsdp_offload)",
        False,
    ),
    (
        "actor_rollout_ref.actor.checkpoint.*",
        "rlcore's checkpoints hold the model, optimizer and data order, written atomically",
        False,
    ),
    ("actor_rollout_ref.actor.router_replay.*", "MoE router replay is not in rlcore", False),
    ("actor_rollout_ref.actor.shuffle", "rlcore's mini-batches follow the batch order", False),
    ("actor_rollout_ref.actor.data_loader_seed", "rlcore seeds everything from [run] seed", False),
    ("actor_rollout_ref.actor.use_torch_compile", "rlcore compiles by [model] compile", False),
    ("actor_rollout_ref.actor.fsdp_config.use_torch_compile", "rlcore compiles by [model] compile", False),
    ("actor_rollout_ref.actor.entropy_*", "rlcore computes log-probs and entropy in chunks always", False),
    ("actor_rollout_ref.actor.calculate_entropy", "rlcore logs actor/entropy always", False),
    ("actor_rollout_ref.actor.use_fused_kernels", "rlcore computes log-probs in chunks always", False),
    ("actor_rollout_ref.actor.use_remove_padding", "rlcore packs sequences always", False),
    ("actor_rollout_ref.actor.rollout_n", "verl's copy of rollout.n", False),
    ("actor_rollout_ref.actor.use_prefix_grouper", "prefix grouping is not in rlcore", False),
    ("actor_rollout_ref.actor.freeze_vision_tower", "rlcore trains text models", False),
    ("actor_rollout_ref.actor.calculate_sum_pi_squared", NO_MEANING, False),
    ("actor_rollout_ref.actor.sum_pi_squared_checkpointing", NO_MEANING, False),
    ("actor_rollout_ref.model.use_shm", "rlcore loads models from disk", False),
    (
        "actor_rollout_ref.model.enable_activation_offload",
        "activation offload is not in rlcore (use gradient_checkpointing, fsdp_offload)",
        False,
    ),
    ("actor_rollout_ref.model.use_remove_padding", "rlcore packs sequences always", False),
    (
        "actor_rollout_ref.model.use_liger",
        "rlcore computes log-probs in chunks; Liger kernels are not used",
        False,
    ),
    ("actor_rollout_ref.model.use_fused_kernels", "rlcore computes log-probs in chunks always", False),
    ("actor_rollout_ref.model.fused_kernel_options.*", "rlcore computes log-probs in chunks always", False),
    ("actor_rollout_ref.model.tiled_mlp.*", "tiled MLP is not in rlcore", False),
    ("actor_rollout_ref.model.mtp.*", "multi-token prediction is not in rlcore", True),
    (
        "actor_rollout_ref.hybrid_engine",
        "rlcore's engines share the actor's devices (colocated) by default",
        False,
    ),
    ("actor_rollout_ref.nccl_timeout", NO_MEANING, False),
    (
        "actor_rollout_ref.rollout.mode",
        "rlcore's engines serve every mode (async multi-turn: [agent] loop)",
        False,
    ),
    ("actor_rollout_ref.rollout.prompt_length", "follows data.max_prompt_length in rlcore", False),
    ("actor_rollout_ref.rollout.response_length", "follows data.max_response_length in rlcore", False),
    ("actor_rollout_ref.rollout.dtype", "rlcore's engines compute in [model] compute_dtype", False),
    ("actor_rollout_ref.rollout.ignore_eos", "rlcore always stops at EOS", True),
    ("actor_rollout_ref.rollout.cudagraph_capture_sizes", NO_MEANING, False),
    (
        "actor_rollout_ref.rollout.free_cache_engine",
        "colocated engines always sleep while the trainer trains",
        False,
    ),
    (
        "actor_rollout_ref.rollout.data_parallel_size",
        "each rank drives its own engine (data-parallel rollout)",
        False,
    ),
    ("actor_rollout_ref.rollout.expert_parallel_size", "give it in engine_kwargs for vLLM", False),
    ("actor_rollout_ref.rollout.pipeline_model_parallel_size", "give it in engine_kwargs for vLLM", False),
    ("actor_rollout_ref.rollout.scheduling_policy", NO_MEANING, False),
    ("actor_rollout_ref.rollout.load_format", "rlcore's engines get the actor's weights directly", False),
    ("actor_rollout_ref.rollout.disable_log_stats", NO_MEANING, False),
    ("actor_rollout_ref.rollout.over_sample_rate", "partial rollouts are not in rlcore", True),
    ("actor_rollout_ref.rollout.multi_stage_wake_up", NO_MEANING, False),
    ("actor_rollout_ref.rollout.engine_kwargs.trtllm", "rlcore has no TensorRT-LLM engine", False),
    ("actor_rollout_ref.rollout.calculate_log_probs", "rlcore records the engine's log-probs always", False),
    ("actor_rollout_ref.rollout.agent.*", "verl's agent-loop workers; rlcore: [agent] loop", False),
    ("actor_rollout_ref.rollout.checkpoint_engine.*", "rlcore sends weights to its engines itself", False),
    ("actor_rollout_ref.rollout.trace.*", "rollout tracing is not in rlcore", False),
    ("actor_rollout_ref.rollout.skip_*", "skipping rollouts is not in rlcore", True),
    ("actor_rollout_ref.rollout.enable_rollout_routing_replay", "MoE router replay is not in rlcore", False),
    ("actor_rollout_ref.rollout.prometheus.*", "rlcore's metrics go to its loggers", False),
    ("actor_rollout_ref.rollout.quantization*", "quantised rollout is not in rlcore", True),
    ("actor_rollout_ref.rollout.mtp", "multi-token prediction is not in rlcore", False),
    ("actor_rollout_ref.rollout.layered_summon", NO_MEANING, False),
    ("data.tokenizer", "rlcore tokenizes with [model] tokenizer", False),
    ("data.use_shm", NO_MEANING, False),
    ("data.val_batch_size", "rlcore validates in the engine's batches", False),
    ("data.return_raw_input_ids", NO_MEANING, False),
    ("data.return_raw_chat", NO_MEANING, False),
    ("data.return_full_prompt", NO_MEANING, False),
    ("data.dataloader_num_workers", NO_MEANING, False),
    ("data.image_patch_size", "rlcore trains text models", False),
    ("data.validation_shuffle", NO_MEANING, False),
    ("data.filter_overlong_prompts_workers", NO_MEANING, False),
    ("data.image_key", "rlcore trains text models", False),
    ("data.video_key", "rlcore trains text models", False),
    ("data.return_multi_modal_inputs", "rlcore trains text models", False),
    ("data.trust_remote_code", NO_MEANING, False),
    ("data.custom_cls.name", "see data.custom_cls.path", False),
    ("data.sampler.class_name", "see data.sampler.class_path", False),
    ("data.datagen.name", "see data.datagen.path", False),
    ("critic.*", "no meaning for rlcore's critic", False),
    (
        "reward_model.*",
        "options of verl's reward-model worker; rlcore-reward-model has its own ([reward] function "
        '= "reward_model")',
        False,
    ),
    ("reward.*", "the DAPO recipe's reward options", False),
    ("algorithm.use_pf_ppo", "preference-feedback PPO is not in rlcore", True),
    ("algorithm.pf_ppo.*", "preference-feedback PPO is not in rlcore", False),
    ("custom_reward_function.name", "see custom_reward_function.path", False),
    ("custom_reward_function.reward_kwargs*", "see custom_reward_function.path", False),
    ("trainer.balance_batch", "rlcore packs sequences into token-balanced rows always", False),
    ("trainer.project_name", "the wandb project, with trainer.logger including wandb", False),
    (
        "trainer.rollout_data_dir",
        "rlcore writes validation samples with [trainer] log_val_generations",
        False,
    ),
    (
        "trainer.validation_data_dir",
        "rlcore writes validation samples with [trainer] log_val_generations",
        False,
    ),
    ("trainer.esi_redundant_time", "rlcore saves a checkpoint on SIGTERM/SIGUSR1", False),
    ("trainer.default_hdfs_dir", "rlcore writes checkpoints to the run directory only", False),
    ("trainer.del_local_ckpt_after_load", NO_MEANING, False),
    ("trainer.ray_wait_register_center_timeout", NO_MEANING, False),
    ("trainer.use_legacy_worker_impl", NO_MEANING, False),
    ("transfer_queue.*", "verl's transfer queue is not in rlcore", False),
    ("ray_kwargs.*", "Ray's start-up options: the ray launcher's runtime_env and address", False),
)


def explained(key: str) -> tuple[str, bool] | None:
    """Why rlcore has no key for ``key`` (and whether leaving it out matters), if the table says."""
    for pattern, reason, essential in EXPLAINED:
        if fnmatch.fnmatchcase(key, pattern):
            return reason, essential
    return None


def explained_by_prefix(key: str) -> str | None:
    """A reason for a key verl has under a subtree that is not listed key by key (profilers, _target_)."""
    for pattern in ("*._target_", "*.profiler.*", "global_profiler.*"):
        if fnmatch.fnmatchcase(key, pattern):
            return explained(key)[0]  # type: ignore[index]
    return None


def convert(cfg: VerlConfig, options: Options) -> Conversion:
    """Every rule over ``cfg``; then each key the user set that no rule read is explained, or
    reported as unknown to verl with the nearest verl key."""
    conversion = Conversion(cfg, options)
    for fn in RULES:
        fn(conversion)
    for key in cfg.given_keys():
        if key in conversion.handled or any(u.key == key for u in conversion.unmapped):
            continue
        if key in cfg.unknown:
            continue  # reported as unknown by the caller
        reason = explained(key)
        if reason is None:
            reason = ("a verl key rlcore has no rule for", True)
        conversion.skip(key, reason[0], essential=reason[1])
    return conversion
