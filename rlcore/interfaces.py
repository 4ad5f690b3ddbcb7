"""What each component kind's object must do once its factory has built it.

These are the contracts between the trainer and plugins. They import nothing heavy:
tensors appear only in annotations. The conformance kits in :mod:`rlcore.testing`
check a plugin's objects against them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:  # pragma: no cover
    import torch


# ----------------------------------------------------------------------------- rollout


class SamplingParams(BaseModel):
    """How to sample. Every engine must honour all of these fields."""

    model_config = ConfigDict(extra="forbid")

    n: int = Field(1, ge=1, description="samples per prompt")
    temperature: float = Field(1.0, ge=0.0, description="0 means greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, ge=-1, description="-1 or 0 disables top-k")
    max_new_tokens: int = Field(256, ge=1)
    stop_token_ids: list[int] = Field(default_factory=list, description="ends a sample (EOS ids go here)")
    stop: list[str] = Field(default_factory=list, description="stop strings; the stop string is kept")
    seed: int | None = None


@dataclass
class Completion:
    """One sampled response. ``logprobs[i]`` is ``log_softmax(logits / T)`` at ``token_ids[i]``
    (T the temperature, 1 when greedy), taken before top-k / top-p truncation: the distribution
    the trainer recomputes from a plain forward pass."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length"] = "length"


@runtime_checkable
class RolloutEngine(Protocol):
    """Generates responses. ``shares_actor`` says whether the engine generates with the trainer's
    own actor module (then a weight update costs nothing and the trainer's ranks may gather the
    module for it); an engine holding its own weights sets it False."""

    shares_actor: bool

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[list[Completion]]:
        """Return ``params.n`` completions for each prompt, in prompt order."""

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load new weights (Hugging Face parameter names) from the trainer.

        Engines that serve LoRA adapters may accept a keyword-only ``lora=`` (rank, alpha and
        target modules) and then receive only the adapter tensors, named as
        ``peft.get_peft_model_state_dict`` names them. An engine that generates with the trainer's
        own module (``shares_actor = True``) must not consume the iterable.
        """

    def sleep(self) -> None:
        """Free what the engine can (KV cache, optionally weights) while the trainer runs."""

    def wake_up(self) -> None:
        """Undo :meth:`sleep`."""


# ----------------------------------------------------------------------------- rewards


@dataclass
class RewardInput:
    """What a reward function sees of one trajectory (verl's row fields)."""

    response: str
    prompt: str = ""
    ground_truth: Any = None
    data_source: str = ""
    extra_info: dict[str, Any] = field(default_factory=dict)
    group: int = 0  # the prompt's position in the batch: a prompt's samples share it (batched rewards)
    messages: list[dict[str, Any]] = field(
        default_factory=list
    )  # the prompt's chat messages, before the template


@dataclass
class RewardResult:
    score: float
    metrics: dict[str, float] = field(default_factory=dict)


class RewardFunction(Protocol):
    """Optionally also ``required_fields`` (a set of the row fields it needs) and
    ``check_data(prompts, source_name)``, which may raise :class:`rlcore.errors.RlcoreError` on
    rows it cannot score (called on every data set before training)."""

    def __call__(self, item: RewardInput) -> float | RewardResult:
        """Score one trajectory. Raising or running past the time limit scores 0 (counted)."""


class BatchRewardFunction(Protocol):
    """A reward that scores a whole batch at once: a reward model on a GPU, a judge behind an
    endpoint with its own concurrency, or a ranking of each prompt's samples (``item.group``).

    Declared by ``batched = True``. It runs in the trainer's process (not in worker processes),
    ``[reward] batch_timeout_s`` bounds the whole batch, ``sleep()`` / ``wake_up()``, when
    defined, are called after and before each batch (a reward model frees the GPU while the actor
    trains), and ``close()`` at the end of the run.
    """

    batched: bool

    def score_batch(self, items: Sequence[RewardInput]) -> Sequence[float | RewardResult]:
        """One result per item, in order. Raising scores the whole batch 0 (counted)."""


# ----------------------------------------------------------------------------- algorithm


@dataclass
class AdvantageInput:
    """Per-sample tensors an estimator may use; shapes are [B] or [B, T] (T = response length).

    token_rewards: the score on each sequence's last response token, plus any per-token
    KL penalty; zeros elsewhere. response_mask is 1 on model-generated tokens.
    """

    scores: torch.Tensor  # [B] float
    token_rewards: torch.Tensor  # [B, T] float
    response_mask: torch.Tensor  # [B, T] float/bool
    group_ids: torch.Tensor  # [B] long: samples of one prompt share an id
    values: torch.Tensor | None = None  # [B, T] critic values, when the estimator needs a critic


class AdvantageEstimator(Protocol):
    def __call__(self, batch: AdvantageInput) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(advantages, returns)``, both [B, T], zero where the mask is 0."""


@dataclass
class PolicyLossInput:
    logprobs: torch.Tensor  # [B, T] current policy, requires grad
    old_logprobs: torch.Tensor  # [B, T] policy that sampled (recomputed by the trainer)
    advantages: torch.Tensor  # [B, T]
    response_mask: torch.Tensor  # [B, T]
    rollout_logprobs: torch.Tensor | None = None  # [B, T] from the engine, for importance correction


class PolicyLoss(Protocol):
    def __call__(self, batch: PolicyLossInput) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Return the per-token loss [B, T] (aggregated by the trainer) and metrics
        (e.g. ``pg_clipfrac``, ``ppo_kl``) as scalar tensors. An optional ``loss_agg_mode``
        attribute names the aggregation the loss is defined with (overriding ``[algorithm]
        loss_agg_mode``)."""


# ----------------------------------------------------------------------------- agents and tools


@dataclass
class Prompt:
    """One dataset row ready for rollout."""

    token_ids: list[int]
    messages: list[dict[str, Any]]
    data_source: str = ""
    ground_truth: Any = None
    extra_info: dict[str, Any] = field(default_factory=dict)
    index: int = 0


@dataclass
class Trajectory:
    """One finished rollout. ``response_mask[i]`` is 1 where ``response_ids[i]`` was generated
    by the model (0 for tool output and template glue); ``rollout_logprobs`` is aligned with
    ``response_ids`` (0.0 where the mask is 0)."""

    prompt: Prompt
    response_ids: list[int]
    response_mask: list[int]
    rollout_logprobs: list[float]
    finish_reason: str = "length"
    num_turns: int = 1
    tool_calls: int = 0
    tool_errors: int = 0
    step_reward: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)
    # The trainer's policy version (optimizer steps taken) whose weights generated every token; set
    # by the trainer's scheduler, not by agent loops.
    policy_version: int | None = None


class AgentLoop(Protocol):
    def run(
        self, prompts: Sequence[Prompt], engine: RolloutEngine, params: SamplingParams
    ) -> list[Trajectory]:
        """Return ``params.n`` trajectories per prompt, grouped by prompt, in prompt order."""


@dataclass
class ToolResult:
    text: str
    reward: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    error: bool = False


class Tool(Protocol):
    """A tool with state per trajectory (verl's lifecycle): ``create`` -> ``execute`` (any number
    of calls) -> ``calc_reward`` -> ``release``, each given the trajectory's id.

    An agent loop may pass each method keyword arguments from the data row (the ``tool`` loop:
    ``extra_info.tools_kwargs = {NAME: {"create_kwargs": {...}, "execute_kwargs": ...,
    "calc_reward_kwargs": ..., "release_kwargs": ...}}``); a tool that takes none needs no such
    parameters. Optional: ``async def calc_reward(trajectory_id, **kwargs) -> float | None``, asked
    when the trajectory ends; its value adds to ``Trajectory.step_reward`` (as ``ToolResult.reward``
    does), which the trainer adds to the reward function's score.
    """

    name: str

    def schema(self) -> dict[str, Any]:
        """The OpenAI function schema: ``{"type": "function", "function": {...}}``."""

    async def create(self, trajectory_id: str) -> None: ...

    async def execute(self, trajectory_id: str, arguments: dict[str, Any]) -> ToolResult: ...

    async def release(self, trajectory_id: str) -> None: ...


# ----------------------------------------------------------------------------- launchers and metrics


@dataclass
class LaunchRequest:
    """Everything a launcher needs to start the driver elsewhere."""

    manifest_path: str  # the manifest file as the user gave it
    resolved_manifest: dict[str, Any]  # after overrides; what the driver must run
    run_dir: str
    resume: bool = False
    dry_run: bool = False
    argv: list[str] = field(default_factory=list)  # `rlcore run` arguments to repeat remotely
    # The validated manifest when the launch happens in the process that validated it (`rlcore
    # run`), so that rlcore.launching.run_driver_here trains without validating it again.
    validated: Any = field(default=None, repr=False, compare=False)


class Launcher(Protocol):
    """Built like any component, ``factory(options, context)``: ``context`` is the run's
    :class:`BuildContext` (the resolved manifest as a dict, its directory, ``run_dir``, the seed);
    nothing that needs torch is set yet."""

    def launch(self, request: LaunchRequest) -> int:
        """Run (or submit and follow) the driver; return the process exit code."""


class ScoreShaper(Protocol):
    def shape(
        self, trajectories: list[Trajectory], scores: list[float]
    ) -> tuple[list[float], dict[str, float]]:
        """A round's scores, changed (one per trajectory, in order), and metrics of the change."""


class BatchFilter(Protocol):
    """Implements ``select`` (groups to keep; ``max_rounds`` rounds to fill a step), ``loss_mask``
    (trajectories whose tokens count in the loss), or both (see ``rlcore_batch_filters``)."""

    max_rounds: int

    def select(self, trajectories: list[Trajectory], scores: list[float], group_size: int) -> list[int]:
        """Indices of the groups of a round to keep."""

    def loss_mask(self, trajectories: list[Trajectory]) -> tuple[list[bool], dict[str, float]]:
        """Per trajectory whether its tokens count in the loss, and metrics."""


class MetricsSink(Protocol):
    """Where metrics go. ``log_samples(rows, step)`` is optional: validation samples
    (``[trainer] log_val_generations``), each row a dict of step, data_source, prompt, response, score."""

    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def close(self) -> None: ...


# ----------------------------------------------------------------------------- build context


class DataSource(Protocol):
    """Rows of prompts in verl's format (``prompt``, ``data_source``, ``reward_model``,
    ``extra_info``), from a source named by a prefix in ``[data] train`` / ``val``."""

    def rows(self, role: str) -> list[dict[str, Any]]:
        """The rows for ``role``: "train" or "val". A source with splits takes the role as its
        default split, so that a validation set never repeats a training item."""


@runtime_checkable
class EvalPolicy(Protocol):
    """The policy an evaluation harness scores (``rlcore eval --harness``): the run's tokenizer,
    its rollout engine for sampling, and its actor for log-likelihoods, on token ids."""

    tokenizer: Any
    max_length: int  # the longest sequence (prompt and continuation) the model takes

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[list[int]]:
        """The response token ids of each prompt (one sample each)."""

    def loglikelihood(
        self, requests: Sequence[tuple[Sequence[int], Sequence[int]]]
    ) -> list[tuple[float, bool]]:
        """For each (context ids, continuation ids): the summed log-probability of the continuation
        given the context, and whether greedy decoding would have produced it exactly."""


class EvalHarness(Protocol):
    def run(self, policy: EvalPolicy, output_dir: str) -> dict[str, Any]:
        """Evaluate ``policy``; write the harness's own files under ``output_dir``; return a JSON-able
        report whose ``"table"`` (text) is printed beside rlcore's own."""


@dataclass
class BuildContext:
    """What a factory receives beside its options. Fields a run has not set are None (or empty).

    manifest: the resolved manifest (a plain dict); manifest_dir: the directory relative paths in it
    are read from. run_dir: the run's directory (metrics sinks write there).
    model_path / gguf_file / seed: from ``[model]`` and ``[run]``. dtype: what the model computes
    in (``[model] compute_dtype`` resolved: the dtype an engine should run its weights in).
    device: where the trainer runs ("cpu", "cuda:0"). tokenizer: the run's transformers tokenizer.
    actor: the trainer's actor module, so an engine in the same process can share its parameters.
    tools: the run's tools by ``[tools.NAME]`` table name (agent loops). resume_step: the step a
    resumed run continues after (None for a fresh run). total_steps: the steps the run trains
    (``[trainer] steps``, or counted from the data under ``total_epochs``; None outside training).
    A run fills these in before it builds its first component (rlcore.trainer.roles); only
    ``actor`` arrives once the actor is built, and data sources, whose prompts the steps are
    counted from under ``total_epochs``, see no ``total_steps`` then.
    concurrent: the engine generates while the trainer trains (``[rollout] max_staleness``), so it
    must hold its own copy of the weights rather than share the actor's module.

    Build one for a manifest with :meth:`from_manifest`.
    """

    manifest: dict[str, Any] = field(default_factory=dict)
    manifest_dir: str | None = None
    run_dir: str | None = None
    model_path: str | None = None
    gguf_file: str | None = None
    dtype: str = "float32"
    device: str = "cpu"
    seed: int = 0
    tokenizer: Any = None
    actor: Any = None
    tools: dict[str, Any] = field(default_factory=dict)
    resume_step: int | None = None
    total_steps: int | None = None
    concurrent: bool = False

    @classmethod
    def from_manifest(cls, manifest: Any, **fields: Any) -> BuildContext:
        """The context of a run of ``manifest`` (an ``rlcore.manifest.loader.ResolvedManifest``):
        what the manifest says is filled in, the rest (device, dtype, tokenizer, actor, ...) comes
        from ``fields``, which may also override the model path (a converted GGUF file)."""
        core = manifest.core
        values: dict[str, Any] = dict(
            manifest=manifest.resolved_dict(),
            manifest_dir=str(manifest.base_dir),
            model_path=core.model.path,
            gguf_file=core.model.gguf_file,
            seed=core.run.seed,
            total_steps=core.trainer.steps,
            concurrent=core.rollout.max_staleness is not None,
        )
        values.update(fields)
        return cls(**values)
