"""Hook specifications: the plugin author's reference manual.

Every hook is plural and returns a list of :class:`rlcore.components.Component`
records. Implement one with ``@rlcore.hookimpl`` in a module that your distribution
names under the ``rlcore`` entry-point group::

    # pyproject.toml
    [project.entry-points.rlcore]
    my_reward = "rlcore_my_reward.plugin"

    # rlcore_my_reward/plugin.py  -- import nothing heavy here
    import rlcore
    from rlcore.components import Component, Options

    class LengthOptions(Options):
        target: int = 100

    @rlcore.hookimpl
    def rlcore_reward_functions():
        return [Component(name="length", factory="rlcore_my_reward.impl:make",
                          options=LengthOptions, description="rewards responses near a target length")]

The factory is imported only when a run builds the component and is called as
``factory(options, context)`` with the validated options and a
:class:`rlcore.interfaces.BuildContext`. What it returns must satisfy the protocol for
its kind in :mod:`rlcore.interfaces`. Hooks take no arguments today; arguments added
later will be optional to declare, as pluggy allows.

Each hook's example below is a first-party plugin's real record (tests/test_plugin_docs.py checks
them against the registry); ``rlcore plugins --verbose`` shows where every installed component's
factory lives.
"""

from __future__ import annotations

import pluggy

PROJECT = "rlcore"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def rlcore_rollout_engines() -> list:
    """Rollout engines: objects with ``generate(prompts, params) -> list[list[Completion]]``,
    ``update_weights(named_tensors)``, ``sleep()`` and ``wake_up()``
    (:class:`rlcore.interfaces.RolloutEngine`).

    Selected by ``[rollout] engine = "<name>"``; the engine's own options are the other
    keys of ``[rollout]`` that the core does not define.

    Example: ``Component(name="hf", factory="rlcore_rollout_hf.engine:build", options=HFEngineOptions,
    needs={"actor_model", "tokenizer"})``.
    """


@hookspec
def rlcore_advantage_estimators() -> list:
    """Advantage estimators: callables ``(AdvantageInput) -> (advantages, returns)``.

    Selected by ``[algorithm] advantage = "<name>"``. Declare ``needs={"critic"}`` when the
    estimator uses ``AdvantageInput.values``; the trainer then builds a critic.

    Example: ``Component(name="grpo", factory="rlcore_algo_grpo.estimators:build_grpo", options=GRPOOptions,
    needs={"groups"})``.
    """


@hookspec
def rlcore_policy_losses() -> list:
    """Policy losses: callables ``(PolicyLossInput) -> (per_token_loss, metrics)``.

    Selected by ``[algorithm] policy_loss = "<name>"``. The objective
    (:func:`rlcore.algorithms.objective.policy_objective`) weighs the per-token loss by the
    rollout correction, aggregates it by ``[algorithm] loss_agg_mode`` and adds the KL and
    entropy terms itself. A loss defined with its own aggregation (GSPO's sequence mean) sets the
    callable's ``loss_agg_mode`` attribute to it, which then wins over the table's.

    Example: ``Component(name="ppo_clip", factory="rlcore.algorithms.losses:build_ppo_clip", options=PPOClipOptions)``.
    """


@hookspec
def rlcore_reward_functions() -> list:
    """Reward functions: callables ``(RewardInput) -> float | RewardResult``.

    Selected by ``[reward] function = "<name>"`` (or ``"python:path.py:function"`` for a
    user's function, which needs no plugin). Run in worker processes under ``[reward] timeout_s``:
    a call that raises or runs too long scores 0 and is counted. The callable may declare
    ``required_fields`` (e.g. ``{"ground_truth"}``); rows lacking them are rejected before training.
    It may also define ``check_data(prompts, source_name)``, called on every data set (each
    :class:`rlcore.interfaces.Prompt`, ``source_name`` the file) before training: raise
    :class:`rlcore.errors.RlcoreError` naming the row to refuse rows it cannot score.

    Example: ``Component(name="gsm8k", factory="rlcore_reward_rule.gsm8k:build", options=GSM8KOptions)``.
    """


@hookspec
def rlcore_agent_loops() -> list:
    """Agent loops: objects with ``run(prompts, engine, params) -> list[Trajectory]``.

    Selected by ``[agent] loop = "<name>"`` (default ``single_turn``).

    Example: ``Component(name="tool", factory="rlcore_agent.loop:build", options=ToolLoopOptions,
    needs={"tokenizer"})``.
    """


@hookspec
def rlcore_tools() -> list:
    """Tools an agent loop may offer the model (:class:`rlcore.interfaces.Tool`).

    Enabled by ``[tools.<name>]`` tables whose keys are the tool's options.

    Example: ``Component(name="python", factory="rlcore_agent.python_tool:build", options=PythonToolOptions)``.
    """


@hookspec
def rlcore_launchers() -> list:
    """Launchers: objects with ``launch(LaunchRequest) -> int`` (an exit code).

    Selected by ``[launcher] name = "<name>"`` (default ``local``); the launcher's options are
    the other keys of ``[launcher]``. Its factory receives, like every other, the run's
    :class:`rlcore.interfaces.BuildContext` (the resolved manifest as a dict, ``manifest_dir``,
    ``run_dir``, ``seed``; nothing built yet). ``rlcore.launching`` has what launchers share.

    Example: ``Component(name="slurm", factory="rlcore_launcher_slurm.launcher:build", options=SlurmOptions)``.
    """


@hookspec
def rlcore_metrics_sinks() -> list:
    """Metrics sinks: objects with ``log(metrics, step)`` and ``close()``.

    Enabled by ``[trainer] loggers = ["console", "jsonl", ...]``; a sink's options live in
    ``[loggers.<name>]``.

    Example: ``Component(name="wandb", factory="rlcore_loggers.sinks:wandb", options=WandbOptions)``.
    """


@hookspec
def rlcore_data_sources() -> list:
    """Data sources: where ``[data] train`` and ``val`` rows come from when they are not files.

    Selected by a prefix: ``train = "NAME:ARGS?key=value&..."`` picks the source ``NAME``; the
    text after the colon (up to ``?``) is the option the record names as ``target_option`` and the
    query keys are its other options. The table form, ``[data.train] source = "NAME"`` with the
    options as keys, says the same. Options are validated by the record's ``options`` model at
    ``rlcore validate`` (which imports no torch: keep the model's validators light).
    The factory returns a :class:`rlcore.interfaces.DataSource`: ``rows(role)`` gives verl-format
    rows for ``role`` "train" or "val" (a source with splits makes the role its default split, so
    the two never share an item).

    Example: ``Component(name="reasoning_gym", factory="rlcore_reasoning_gym.source:build",
    options=ReasoningGymSourceOptions, target_option="task")``.
    """


@hookspec
def rlcore_score_shapers() -> list:
    """Score shapers: objects with ``shape(trajectories, scores) -> (scores, metrics)``.

    Enabled by a ``[shapers.<name>]`` table (its keys are the shaper's options); each runs, in
    the manifest's order, on every generation round's scores before batch filters see them
    (DAPO's overlong penalty). ``metrics`` (name -> float) are averaged over a step's rounds.

    Example: ``Component(name="overlong", factory="rlcore_algo_dapo.shapers:build_overlong", options=OverlongOptions)``.
    """


@hookspec
def rlcore_eval_harnesses() -> list:
    """Evaluation harnesses: objects with ``run(policy, output_dir) -> dict`` (a JSON-able report,
    with its ``"table"``, the harness's own text report), where ``policy`` is an
    :class:`rlcore.interfaces.EvalPolicy`: the run's own rollout engine and actor around the chosen
    checkpoint or export, token in and token out.

    Selected by ``rlcore eval MANIFEST --harness NAME``; ``--tasks a,b`` becomes the option
    ``tasks`` and ``--harness-option KEY=VALUE`` the others, validated by the record's ``options``.

    Example: ``Component(name="lm_eval", factory="rlcore_lm_eval.harness:build", options=LmEvalOptions)``.
    """


@hookspec
def rlcore_batch_filters() -> list:
    """Batch filters: objects choosing what of a step's generations it trains on, with either or
    both of two methods.

    ``select(trajectories, scores, group_size) -> list[int]``: the groups of a round to keep (a
    group is the ``group_size`` samples of one prompt; ``scores`` are the shaped ones). A filter
    with ``reward_items = True`` is called with ``reward_items=`` too: per sample, the reward's own
    per-item metrics (an ``acc``, ...) and ``score``, its score before any shaper. With
    ``max_rounds`` (an int attribute; 0 unlimited) other than 1 the trainer generates more rounds,
    each ``[data] gen_batch_size`` prompts, until the step holds ``[data] prompts_per_step``
    groups; short of them when the rounds run out it pads with groups left out, which count
    neither in the loss nor in its divisor (a mini-batch of padding only makes no optimizer step:
    ``actor/empty_mini_batches``), or, when a filter's ``on_exhausted`` is ``"raise"``, stops the
    run (DAPO's dynamic sampling; metrics ``dynamic_sampling/*``).
    ``loss_mask(trajectories) -> (keep, metrics)``: per trajectory, whether its tokens count in
    the loss (DAPO's overlong filtering).

    Enabled by a ``[filters.<name>]`` table (its keys are the filter's options), in the manifest's order.

    Example: ``Component(name="dynamic_sampling", factory="rlcore_algo_dapo.filters:build_dynamic_sampling",
    options=DynamicSamplingOptions, needs={"groups"})``.
    """


@hookspec
def rlcore_commands() -> list:
    """Extra ``rlcore`` sub-commands: a list of :class:`rlcore.components.Command` records.

    ``configure(parser)`` adds the command's arguments to its argparse parser; ``run(args)``
    returns an exit code. Name both as ``"module:function"`` strings (or pass callables): a
    string is imported only when that command runs or shows its help, so registering stays
    light, and a module that fails to import makes only its own command report the error.
    Raise :class:`rlcore.errors.RlcoreError` for expected failures. rlcore's own ``data``,
    ``eval`` and ``plot`` commands are registered this way (:mod:`rlcore.builtin`), and so is
    ``serve`` (the ``rlcore-serve`` plugin).

    Example: ``Command(name="jobs", help="list rlcore's SLURM jobs, or cancel one",
    configure="rlcore_launcher_slurm.cli:configure", run="rlcore_launcher_slurm.cli:run")``.
    """
