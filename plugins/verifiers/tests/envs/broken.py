"""An Env whose own code fails after the model's first turn (the episode's outcome, not the run's)."""

import verifiers.v1 as vf


class PlainTaskset(vf.Taskset[vf.Task, vf.TasksetConfig]):
    def load(self):
        yield vf.Task(vf.TaskData(prompt="Say hi."), self.config.task)


class BrokenEnv(vf.Env[vf.SingleAgentEnvConfig]):
    async def run(self, task, agents):
        async with agents.agent.interaction(task) as chat:
            await chat.turn()
            raise RuntimeError("the referee fell over")


__all__ = ["PlainTaskset", "BrokenEnv"]
