"""The rollout role: the engine and the agent loop that drives it, woken for a rollout and put to
sleep after it (colocated engines free their caches while the trainer runs)."""

from __future__ import annotations

from collections.abc import Iterable

from rlcore import progress
from rlcore.interfaces import AgentLoop, Prompt, RolloutEngine, SamplingParams, Trajectory


class Rollout:
    def __init__(self, engine: RolloutEngine, agent: AgentLoop, actor):
        self.engine, self.agent, self.actor = engine, agent, actor

    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[Trajectory]:
        self.engine.wake_up()
        module = self.actor.module
        was_training = module.training
        try:
            with self.actor.gathered(), progress.phase("generating", len(prompts) * params.n, "samples"):
                trajectories = self.agent.run(prompts, self.engine, params)
                progress.advance(len(trajectories))
                return trajectories
        finally:
            module.train(was_training)
            self.engine.sleep()

    def generate_concurrently(self, prompts: list[Prompt], params: SamplingParams) -> list[Trajectory]:
        """Generate while the trainer trains (another thread): the engine holds its own weights,
        stays awake, and the actor is not touched."""
        self.engine.wake_up()
        return self.agent.run(prompts, self.engine, params)

    def sync_weights(self, named_tensors: Iterable) -> None:
        """Give the engine the actor's new weights through its ``update_weights`` (a no-op for an
        engine that shares them); LoRA adapters alone, with their spec, to an engine that loads
        adapters (``actor.engine_lora``)."""
        lora = getattr(self.actor, "engine_lora", None)
        if lora is not None:
            self.engine.update_weights(named_tensors, lora=lora)
        else:
            self.engine.update_weights(named_tensors)
