"""The core tables of a manifest. Unknown keys are rejected, except in the tables that select a
component (``[rollout]``, ``[reward]``, ``[algorithm]``, ``[agent]``, ``[launcher]``), where keys the
core does not define are that component's options and are validated by its own model."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator

from rlcore import kinds as _kinds


class Table(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


class RunTable(Table):
    name: str = Field("run", min_length=1, description="name of the run; its directory is output_dir/name")
    seed: int = Field(1, ge=0)
    output_dir: str = Field(
        "runs", description="parent directory of run directories (relative to the manifest)"
    )
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto picks cuda when available")
    deterministic: bool = Field(
        False, description="deterministic torch algorithms (slower; for exact resume)"
    )
    threads: int | None = Field(None, ge=1, description="torch CPU threads (default: torch's choice)")


class LoraTable(Table):
    rank: int = Field(16, ge=1)
    alpha: float = Field(32.0, gt=0)
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    target_modules: list[str] | Literal["all-linear"] = "all-linear"


class ModelTable(Table):
    path: str = Field(
        ..., min_length=1, description="a Hugging Face model directory or hub id (relative to the manifest)"
    )
    gguf_file: str | None = Field(None, description="a GGUF file inside `path` to load the model from")
    tokenizer: str | None = Field(None, description="tokenizer path, when it differs from `path`")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32",
        description="what the trainable weights and the optimizer state are stored in; keep float32: in bfloat16 "
        "or float16, updates smaller than half a unit of the weights' precision are lost (most updates at RL "
        "learning rates)",
    )
    compute_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description="what the forward and backward passes (and the rollout engine) compute in; auto = bfloat16 on "
        "CUDA (mixed precision over float32 master weights), else the storage dtype",
    )
    trust_remote_code: bool = False
    gradient_checkpointing: bool = False
    attn_implementation: str | None = Field(
        None,
        description="the trainer's attention: a transformers name (sdpa, eager, flash_attention_2, ...) or "
        "rlcore_varlen (packed rows attended per sequence); default: rlcore_varlen on CUDA, "
        "transformers' choice elsewhere",
    )
    compile: bool | Literal["auto"] = Field(
        "auto",
        description="torch.compile the trainer's decoder layers and log-prob head (fused element-wise work); "
        "auto = on CUDA with one rank; a compiler failure falls back to uncompiled code",
    )
    share_prompts: bool | Literal["auto"] = Field(
        "auto",
        description="pack the samples of one prompt as the prompt once followed by each response, so the "
        "prompt's tokens go through the forward and backward once (same log-probs; needs the rlcore_varlen "
        "attention, which true selects); auto = where rlcore_varlen runs its flash kernel (CUDA, half-precision "
        "compute)",
    )
    lora: LoraTable | None = None

    @model_validator(mode="after")
    def _shared_prompts_need_varlen(self) -> ModelTable:
        if self.share_prompts is True and self.attn_implementation not in (None, "rlcore_varlen"):
            raise ValueError(
                f'share_prompts = true needs attn_implementation = "rlcore_varlen" (it is '
                f"{self.attn_implementation!r}): only that attention knows which keys each response sees"
            )
        return self

    @model_validator(mode="after")
    def _compute_not_wider_than_storage(self) -> ModelTable:
        if self.compute_dtype == "float32" and self.dtype != "float32":
            raise ValueError(
                f'compute_dtype = "float32" needs dtype = "float32" (weights stored in {self.dtype} cannot be '
                'computed in float32 without a float32 copy; set dtype = "float32")'
            )
        return self


class DataTable(Table):
    train: str | dict[str, Any] = Field(
        ...,
        min_length=1,
        description="parquet or jsonl file (relative to the manifest), or a data source: synthetic:<task>, "
        "reasoning_gym:<task>?size=N, or a table with source = NAME and the source's options",
    )
    val: str | dict[str, Any] | None = Field(
        None, description="validation set, same forms (a source with splits gives val its test split)"
    )
    prompts_per_step: int = Field(16, ge=1, description="prompt groups a step trains on")
    gen_batch_size: int = Field(
        0,
        ge=0,
        description="prompts generated each round, of which a batch filter's selected groups are kept until the step "
        "holds prompts_per_step ([filters.dynamic_sampling]; verl's data.gen_batch_size, 3x the train batch in its "
        "DAPO scripts); 0 = prompts_per_step",
    )
    max_prompt_tokens: int = Field(512, ge=1)
    max_response_tokens: int = Field(256, ge=1)
    val_max_prompts: int | None = Field(
        None, ge=1, description="evaluate on at most this many validation prompts"
    )
    shuffle: bool = True
    prompt_key: str = "prompt"
    source_weights: dict[str, float] = Field(
        default_factory=dict,
        description="draw each step's prompts from the data sources of data.train in these proportions "
        '({"openai/gsm8k" = 3, "lighteval/MATH" = 1}; every source needs one, 0 leaves it out); default: '
        "as they come in the shuffled data",
    )
    chat_template_kwargs: dict[str, str | int | float | bool] = Field(
        default_factory=dict,
        description="keyword arguments for the tokenizer's chat template when prompts are rendered (e.g. "
        "enable_thinking = false for Qwen3)",
    )

    @model_validator(mode="after")
    def _weights(self) -> DataTable:
        if any(w < 0 for w in self.source_weights.values()):
            raise ValueError("source_weights must not be negative")
        if self.source_weights and not any(w > 0 for w in self.source_weights.values()):
            raise ValueError("source_weights: at least one source needs a weight above 0")
        return self


class RolloutTable(Table):
    model_config = ConfigDict(extra="allow")

    engine: str | None = Field(
        None,
        description="a registered rollout engine (left out: the installed one marked default, rlcore-rollout-hf's hf)",
    )
    samples_per_prompt: int = Field(1, ge=1)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, ge=-1)
    stop: list[str] = Field(default_factory=list, description="stop strings (EOS always stops)")
    val_temperature: float = Field(0.0, ge=0.0, description="sampling temperature during validation")
    val_samples_per_prompt: int = Field(1, ge=1)
    max_staleness: int | None = Field(
        None,
        ge=0,
        le=64,
        description="generate in the background while the trainer trains, each batch at most this many optimizer "
        "steps behind the weights it trains (0: on-policy, still in the background; 1: one-step off-policy); unset: "
        "rollout and training take turns",
    )
    placement: Literal["colocated", "split"] = Field(
        "colocated",
        description='"split": the engine runs in a process of its own (on engine_device), receiving the weights in '
        "buckets after every update; with max_staleness it generates while the trainer trains, in parallel rather "
        'than in a thread. "colocated": in the trainer\'s process',
    )
    engine_device: str | list[str] | None = Field(
        None,
        description='where a split engine runs ("cpu", "cuda:1"), or one device per local rank ("cuda:4", '
        '"cuda:5", ...: each training rank drives its own engine); default: each rank\'s own device',
    )
    weight_transport: Literal["shared", "gloo"] = Field(
        "shared",
        description="how a split engine receives the weights: shared (a bucket buffer both processes map: CPU shared "
        "memory, or CUDA IPC on one GPU or the GPUs of one host) or gloo (broadcast over a two-process gloo group)",
    )
    weight_bucket_mb: int = Field(
        256, ge=1, le=65536, description="the size of one weight bucket sent to a split engine"
    )
    score_chunks: int = Field(
        1,
        ge=1,
        le=1024,
        description="generate each step's prompts in this many chunks and score each chunk while the next one "
        "generates (slow rewards: a sandbox, a judge, a reward model); 1: generate all, then score all",
    )


class RewardTable(Table):
    model_config = ConfigDict(extra="allow")

    function: str | None = Field(
        None,
        min_length=1,
        description='a registered reward function, or "python:file.py:function"; with [reward.routes], the one for '
        "rows whose data_source has no route (without it, such rows are an error)",
    )
    routes: dict[str, dict] = Field(
        default_factory=dict,
        description='[reward.routes."DATA_SOURCE"] tables: function = "NAME" and its options, scoring the rows of '
        "that data_source (as verl's default scorer routes by data source)",
    )
    timeout_s: float = Field(10.0, gt=0, description="a call running longer scores 0 and is counted")
    workers: int = Field(8, ge=1)
    batch_timeout_s: float = Field(
        600.0, gt=0, description="batched rewards (a reward model, a judge): the time limit of a whole batch"
    )


class AlgorithmTable(Table):
    model_config = ConfigDict(extra="allow")

    advantage: str | None = Field(
        None,
        description="a registered advantage estimator (left out: the installed one marked default, grpo)",
    )
    policy_loss: str = Field("ppo_clip", description="a registered policy loss")
    loss_agg_mode: Literal[
        "token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"
    ] = Field(
        "token-mean",
        description="how per-token losses add up: the mean over tokens; per sequence, its token sum (or mean) averaged "
        "over sequences; seq-mean-token-sum-norm: each token sum over data.max_response_tokens (Dr. GRPO). A policy "
        "loss defined with its own aggregation (gspo) uses that",
    )
    loss_norm_length: int | None = Field(
        None,
        ge=1,
        description="seq-mean-token-sum-norm: the constant length each sequence's token sum is divided by; "
        "default data.max_response_tokens (verl's loss_scale_factor, default its response length)",
    )
    kl_coef: float = Field(
        0.0, ge=0.0, description="weight of the KL to the reference policy (0 = no reference)"
    )
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    kl_in_reward: bool = Field(
        False, description="apply KL as a per-token reward penalty instead of a loss term"
    )
    entropy_coef: float = Field(0.0, ge=0.0)
    ppo_epochs: int = Field(1, ge=1)
    mini_batches: int = Field(1, ge=1, description="optimizer steps per rollout batch")
    rollout_correction: Literal[
        "none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"
    ] = Field(
        "none",
        description="weigh the policy loss by the trainer/engine importance ratio, per token or per sequence: "
        "truncate = min(ratio, rollout_is_threshold) (TIS); mask = the ratio inside [rollout_is_threshold_lower, "
        "rollout_is_threshold], 0 outside (MIS)",
    )
    rollout_is_threshold: float = Field(
        2.0, ge=1.0, description="upper bound of the importance ratio (rollout_correction)"
    )
    rollout_is_threshold_lower: float | None = Field(
        None,
        gt=0.0,
        le=1.0,
        description="mask modes: lower bound of the ratio; default 1 / rollout_is_threshold",
    )


class CriticTable(Table):
    path: str | None = Field(
        None,
        description="the value model's starting weights: a Hugging Face directory (relative to the manifest) of a "
        "model with the actor's tokenizer; default: [model] path",
    )
    lr: float = Field(1e-5, gt=0)
    value_clip: float = Field(0.5, gt=0, description="clip range of the value loss")
    value_coef: float = Field(0.5, gt=0)
    warmup_steps: int = Field(0, ge=0)


class TrainerTable(Table):
    steps: int | None = Field(
        None, ge=1, description="optimizer steps to train (one batch each); or total_epochs"
    )
    total_epochs: float | None = Field(
        None,
        gt=0,
        le=10_000,
        description="train for this many passes over data.train instead: steps = ceil(total_epochs x usable "
        "prompts / prompts_per_step (gen_batch_size when set)), computed once the data is loaded",
    )
    lr: float = Field(1e-6, gt=0)
    warmup_steps: int = Field(0, ge=0)
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = Field(1.0, gt=0)
    micro_batch_tokens: int = Field(
        4096,
        ge=1,
        description="token budget of one packed forward/backward row (attention over a packed row costs its length squared)",
    )
    save_every: int = Field(0, ge=0, description="0 = only at the end")
    keep_checkpoints: int = Field(
        2,
        ge=1,
        description="keep the last this many checkpoints (each holds the model and the optimizer state: about "
        "12 bytes a parameter in float32 with AdamW, 1.6 GB for a 135M model); older ones are deleted",
    )
    keep_best: int = Field(
        0,
        ge=0,
        description="also keep this many of the best checkpoints by best_metric (of the validation at the "
        "checkpoint's step), whatever their age; 0 keeps the last keep_checkpoints only",
    )
    best_metric: str = Field(
        "val/reward/mean", description="the validation metric keep_best ranks checkpoints by"
    )
    best_mode: Literal["max", "min"] = Field(
        "max", description="whether a higher or a lower best_metric is better"
    )
    eval_every: int = Field(0, ge=0, description="0 = only before and after training")
    eval_before_train: bool = True
    loggers: list[str] = Field(default_factory=lambda: ["console", "jsonl"])
    export_final: bool = Field(False, description="write the final model as a plain Hugging Face directory")
    fsdp_offload: bool = Field(
        False,
        description="keep FSDP's parameter shards, gradients and optimizer state in CPU memory (the optimizer steps "
        "on the CPU): larger models per GPU, slower steps; one rank shards with FSDP over a process group of one for it",
    )
    profile_steps: list[int] = Field(
        default_factory=list,
        description="trace these steps (1 = the first) with the torch profiler, phases labelled: "
        "profile/step_N.pt.trace.json in the run directory, for Perfetto or TensorBoard",
    )
    memory_snapshot_steps: list[PositiveInt] = Field(
        default_factory=list,
        description="record CUDA's memory history (each allocation and free, with its stack) over these steps "
        "(1 = the first) and write it at each one's end: memory/step_N.pickle in the run directory, for "
        "https://pytorch.org/memory_viz; an out-of-memory error in such a step writes memory/oom_step_N.pickle. "
        "Records nothing without CUDA",
    )
    memory_snapshot_on_oom: bool = Field(
        False,
        description="record CUDA's memory history over the whole run, so that an out-of-memory error writes it to "
        "memory/oom_step_N.pickle in the run directory (the error names the file). Costs a stack trace per "
        "allocation and free (slower steps) and host memory for the last 100,000 of them",
    )
    log_val_generations: int = Field(
        0,
        ge=0,
        le=1000,
        description="at each validation, log this many samples (prompt, response, score): to generations.jsonl "
        "beside metrics.jsonl, and as a table to tensorboard and wandb",
    )


class AgentTable(Table):
    model_config = ConfigDict(extra="allow")

    loop: str = Field("single_turn", description="a registered agent loop")


class LauncherTable(Table):
    model_config = ConfigDict(extra="allow")

    name: str = Field("local", description="a registered launcher")


class Manifest(Table):
    run: RunTable = Field(default_factory=RunTable)
    model: ModelTable
    data: DataTable
    rollout: RolloutTable = Field(default_factory=RolloutTable)
    reward: RewardTable
    algorithm: AlgorithmTable = Field(default_factory=AlgorithmTable)
    critic: CriticTable = Field(default_factory=CriticTable)
    trainer: TrainerTable
    agent: AgentTable = Field(default_factory=AgentTable)
    tools: dict[str, dict] = Field(
        default_factory=dict, description="[tools.<name>] tables: options of each tool"
    )
    loggers: dict[str, dict] = Field(
        default_factory=dict, description="[loggers.<name>] tables: options of each sink"
    )
    shapers: dict[str, dict] = Field(
        default_factory=dict,
        description="[shapers.<name>] tables: score shapers, each round's scores (overlong)",
    )
    filters: dict[str, dict] = Field(
        default_factory=dict,
        description="[filters.<name>] tables: batch filters (dynamic_sampling, mask_truncated)",
    )
    launcher: LauncherTable = Field(default_factory=LauncherTable)

    @model_validator(mode="after")
    def _correct_stale_batches(self) -> Manifest:
        """Batches generated by older weights need the behaviour/trainer importance correction; it is
        on by default when rollouts may be stale (an explicit ``rollout_correction = "none"`` stays)."""
        algo = self.algorithm
        if self.rollout.max_staleness and "rollout_correction" not in algo.model_fields_set:
            algo.rollout_correction = "token_truncate"
        return self


# Keys rlcore had and no longer has: dotted key -> what to write instead. A manifest giving one is
# refused with this message at the key's line, rather than told the key is unknown.
_DAPO = "(plugin rlcore-algo-dapo)"
RETIRED_KEYS: dict[str, str] = {
    "algorithm.dynamic_sampling": f"moved to its own table: [filters.dynamic_sampling] {_DAPO}",
    "algorithm.max_generation_rounds": f"moved: max_generation_rounds = N in [filters.dynamic_sampling] {_DAPO}",
    "algorithm.overlong_buffer": f"moved: buffer = N in [shapers.overlong] {_DAPO}",
    "algorithm.overlong_penalty": f"moved: penalty = X in [shapers.overlong] {_DAPO}",
    "algorithm.mask_truncated": f"moved to its own table: [filters.mask_truncated] {_DAPO}",
    "algorithm.tis_cap": 'was removed: tis_cap = C is rollout_correction = "token_truncate" with '
    "rollout_is_threshold = C (one code path for the truncated importance weights)",
}


# Tables whose extra keys belong to a component: table -> [(core field naming it, kind)]; and tables
# of named sub-tables, each one a component: table -> kind. Both from the table of kinds.
COMPONENT_TABLES: dict[str, list[tuple[str, str]]] = _kinds.selectors()
COMPONENT_MAPS: dict[str, str] = _kinds.named_tables()
# Selecting keys that a run cannot do without but the core gives no default: left out, they take
# the installed component marked ``default`` (the core names no plugin). Other selectors left
# None mean "none" (``[reward] function`` with only ``[reward.routes]``).
PLUGIN_DEFAULTS: frozenset[tuple[str, str]] = frozenset({("rollout", "engine"), ("algorithm", "advantage")})
