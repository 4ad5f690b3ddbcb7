"""The component kinds, described once: hook, protocol, manifest table and field, conformance kit.

Everything else derives from this table: the registry's kinds and their hooks
(``rlcore.components.KINDS``), the manifest tables whose keys select a component and hold its
options (``rlcore.manifest.schema.COMPONENT_TABLES`` / ``COMPONENT_MAPS``), the install hints for
first-party names that are not installed, and ``docs/plugins.md``. ``tests/test_kinds.py`` checks
that the table, the hook specifications (``rlcore/hookspecs.py``) and the manifest schema agree.

A new kind is one :class:`Kind` entry here, its hook specification, its protocol in
``rlcore.interfaces`` and (when it is selected from a manifest) a field in its table. This module
imports nothing, so every layer may read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Kind:
    """One component kind.

    name:        the kind's name (``rollout_engine``), as the registry and error messages use it.
    hook:        the hook specification returning its :class:`rlcore.components.Component` records.
    description: one line for ``rlcore plugins`` and the docs.
    protocol:    ``module:Name`` of what a built component must do (``rlcore.interfaces``).
    table:       the manifest table that selects it (``rollout``), or None for a kind chosen
                 otherwise: a data source by the prefix of ``[data] train``/``val``
                 (``reasoning_gym:TASK``), an evaluation harness by ``rlcore eval --harness``.
    selector:    the key of ``table`` naming the component (``engine``); its other keys are the
                 component's options. None with ``named``: ``[table.NAME]`` sub-tables, each one
                 component with its options (``[tools.python]``).
    named:       the table holds named sub-tables rather than one selector.
    kit:         ``module:function`` of the conformance kit in ``rlcore.testing``, or None.
    first_party: names rlcore's own plugin distributions provide, for the "pip install" hint
                 when one is asked for and not installed.
    """

    name: str
    hook: str
    description: str
    protocol: str
    table: str | None = None
    selector: str | None = None
    named: bool = False
    kit: str | None = None
    first_party: dict[str, str] = field(default_factory=dict)


def _from(distribution: str, *names: str) -> dict[str, str]:
    return {name: distribution for name in names}


KINDS: tuple[Kind, ...] = (
    Kind(
        "rollout_engine",
        "rlcore_rollout_engines",
        "generates responses from prompt token ids",
        "rlcore.interfaces:RolloutEngine",
        table="rollout",
        selector="engine",
        kit="rlcore.testing.engines:check_rollout_engine",
        first_party={
            **_from("rlcore-rollout-hf", "hf"),
            **_from("rlcore-rollout-vllm", "vllm"),
            **_from("rlcore-rollout-sglang", "sglang"),
        },
    ),
    Kind(
        "advantage_estimator",
        "rlcore_advantage_estimators",
        "turns scores (and values) into per-token advantages",
        "rlcore.interfaces:AdvantageEstimator",
        table="algorithm",
        selector="advantage",
        kit="rlcore.testing.algorithms:check_advantage_estimator",
        first_party={
            **_from("rlcore-algo-grpo", "grpo", "dr_grpo", "rloo", "reinforce_pp"),
            **_from("rlcore-algo-ppo", "gae"),
        },
    ),
    Kind(
        "policy_loss",
        "rlcore_policy_losses",
        "the actor's per-token surrogate loss",
        "rlcore.interfaces:PolicyLoss",
        table="algorithm",
        selector="policy_loss",
        kit="rlcore.testing.algorithms:check_policy_loss",
        first_party=_from("rlcore-algo-grpo", "gspo"),
    ),
    Kind(
        "reward_function",
        "rlcore_reward_functions",
        "scores a finished trajectory",
        "rlcore.interfaces:RewardFunction",
        table="reward",
        selector="function",
        kit="rlcore.testing.rewards:check_reward_function",
        first_party={
            **_from("rlcore-reward-rule", "gsm8k", "math", "math_dapo", "verl", "exact_match", "format"),
            **_from("rlcore-reward-model", "reward_model", "judge"),
            **_from("rlcore-reasoning-gym", "reasoning_gym"),
            **_from("rlcore-verifiers", "verifiers"),
        },
    ),
    Kind(
        "agent_loop",
        "rlcore_agent_loops",
        "turns one prompt into trajectories by driving the engine (and tools)",
        "rlcore.interfaces:AgentLoop",
        table="agent",
        selector="loop",
        kit="rlcore.testing.agents:check_agent_loop",
        first_party={**_from("rlcore-agent", "tool"), **_from("rlcore-verifiers", "verifiers")},
    ),
    Kind(
        "tool",
        "rlcore_tools",
        "a function an agent may call during a rollout",
        "rlcore.interfaces:Tool",
        table="tools",
        named=True,
        kit="rlcore.testing.tools:assert_tool_conforms",
        first_party=_from("rlcore-agent", "python", "function", "class"),
    ),
    Kind(
        "launcher",
        "rlcore_launchers",
        "decides where the driver process runs",
        "rlcore.interfaces:Launcher",
        table="launcher",
        selector="name",
        kit="rlcore.testing.launchers:check_launcher",
        first_party=_from("rlcore-launcher-slurm", "slurm")
        | _from("rlcore-launcher-ray", "ray")
        | _from("rlcore-launcher-skypilot", "skypilot"),
    ),
    Kind(
        "metrics_sink",
        "rlcore_metrics_sinks",
        "receives the metrics of every step",
        "rlcore.interfaces:MetricsSink",
        table="loggers",
        named=True,
        kit="rlcore.testing.sinks:check_metrics_sink",
        first_party=_from("rlcore-loggers", "tensorboard", "wandb"),
    ),
    Kind(
        "eval_harness",
        "rlcore_eval_harnesses",
        "an outside evaluation harness that `rlcore eval --harness` hands the policy to",
        "rlcore.interfaces:EvalHarness",
        first_party=_from("rlcore-lm-eval", "lm_eval"),
    ),
    Kind(
        "data_source",
        "rlcore_data_sources",
        "rows of prompts named by a prefix in [data] train/val (synthetic:, reasoning_gym:, verifiers:)",
        "rlcore.interfaces:DataSource",
        first_party={
            **_from("rlcore-reasoning-gym", "reasoning_gym"),
            **_from("rlcore-verifiers", "verifiers"),
        },
    ),
    Kind(
        "score_shaper",
        "rlcore_score_shapers",
        "changes a generation round's scores before batch filters see them",
        "rlcore.interfaces:ScoreShaper",
        table="shapers",
        named=True,
        kit="rlcore.testing.shaping:check_score_shaper",
        first_party=_from("rlcore-algo-dapo", "overlong"),
    ),
    Kind(
        "batch_filter",
        "rlcore_batch_filters",
        "chooses which groups, and which responses' tokens, a step trains on",
        "rlcore.interfaces:BatchFilter",
        table="filters",
        named=True,
        kit="rlcore.testing.shaping:check_batch_filter",
        first_party=_from("rlcore-algo-dapo", "dynamic_sampling", "mask_truncated"),
    ),
)

BY_NAME: dict[str, Kind] = {kind.name: kind for kind in KINDS}
BY_HOOK: dict[str, Kind] = {kind.hook: kind for kind in KINDS}


def selectors() -> dict[str, list[tuple[str, str]]]:
    """Manifest tables whose keys select a component: table -> [(selecting key, kind)]."""
    out: dict[str, list[tuple[str, str]]] = {}
    for kind in KINDS:
        if kind.table is not None and not kind.named:
            out.setdefault(kind.table, []).append((kind.selector, kind.name))
    return out


def named_tables() -> dict[str, str]:
    """Manifest tables of named sub-tables, each one component: table -> kind."""
    return {kind.table: kind.name for kind in KINDS if kind.table is not None and kind.named}


def install_hints() -> dict[tuple[str, str], str]:
    """(kind, name) -> the first-party distribution that provides it."""
    return {(kind.name, name): dist for kind in KINDS for name, dist in kind.first_party.items()}
